//! Namespaces made ahead (issue 36): a sandbox's network is mostly set-up that does not
//! depend on the sandbox (a namespace, a slot's veth pair and host route, the tap, the
//! sysctls), a handful of `ip` runs that cost tens of milliseconds on a host and
//! hundreds in a slow VM. The daemon keeps a few such *spare* namespaces ready
//! (`zygote-<instance>-spare-<hex>`), so that a create or a branch child only renames
//! one (`host::rename_netns`: a bind mount, no process) and starts its resolver. A spare
//! already holds the rules of the default policy (egress, no lists, no secrets: what
//! most sandboxes have); a sandbox with another policy loads its own (one `nft` run,
//! ~20 ms of the ~30 a whole set-up costs on a host). No VM uses a spare's tap before
//! its sandbox's rules are in, so what a spare's rules allow never reaches a guest. A
//! spare taken is replaced on a thread of its own, off the caller's path.
//!
//! A spare is a namespace nobody's record names: a daemon killed with spares ready leaves
//! them to the next start's sweep (`Network::sweep`), which removes every namespace of
//! its instance that no sandbox owns.
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use crate::plan::{self, SlotPlan};
use crate::{claim_slot, getrandom_fill, host, Attachment, NetError};

/// The rules a spare is made with, by its slot.
pub(crate) type SpareRules = Box<dyn Fn(&SlotPlan) -> String + Send + Sync>;

/// A namespace made ahead, and the ruleset loaded in it.
pub(crate) struct Spare {
    pub(crate) att: Attachment,
    pub(crate) rules: String,
}

/// The ready spares and how many to keep.
pub(crate) struct Spares {
    /// `zygote-<instance>-`.
    prefix: String,
    rules: SpareRules,
    want: AtomicUsize,
    ready: Mutex<Vec<Spare>>,
    /// A refill thread runs.
    filling: AtomicBool,
}

impl Spares {
    pub(crate) fn new(prefix: String, rules: SpareRules) -> Arc<Spares> {
        Arc::new(Spares {
            prefix,
            rules,
            want: AtomicUsize::new(0),
            ready: Mutex::new(Vec::new()),
            filling: AtomicBool::new(false),
        })
    }

    /// A ready namespace, if one is.
    pub(crate) fn take(&self) -> Option<Spare> {
        self.ready.lock().unwrap_or_else(|e| e.into_inner()).pop()
    }

    pub(crate) fn names(&self) -> Vec<String> {
        let ready = self.ready.lock().unwrap_or_else(|e| e.into_inner());
        ready.iter().map(|s| s.att.netns.clone()).collect()
    }

    pub(crate) fn ready_count(&self) -> usize {
        self.ready.lock().unwrap_or_else(|e| e.into_inner()).len()
    }

    /// Keeps `n` ready from now on (0: none; those ready go).
    pub(crate) fn keep(self: &Arc<Self>, n: usize) {
        self.want.store(n, Ordering::SeqCst);
        if n == 0 {
            self.release();
        } else {
            self.refill();
        }
    }

    /// Brings the ready ones up to what is wanted, on a thread of its own (one at a
    /// time; a failure is logged and the thread stops: the next take tries again).
    pub(crate) fn refill(self: &Arc<Self>) {
        if self.ready_count() >= self.want.load(Ordering::SeqCst)
            || self.filling.swap(true, Ordering::SeqCst)
        {
            return;
        }
        let me = self.clone();
        std::thread::spawn(move || {
            while me.ready_count() < me.want.load(Ordering::SeqCst) {
                let mut b = [0u8; 6];
                let _ = getrandom_fill(&mut b);
                let netns = format!("{}spare-{}", me.prefix, hex::encode(b));
                let mut loaded = String::new();
                let made = build(&netns, &mut |p| {
                    loaded = (me.rules)(p);
                    loaded.clone()
                });
                match made {
                    // Released meanwhile (the daemon stops): not kept.
                    Ok(att) if me.want.load(Ordering::SeqCst) == 0 => {
                        host::remove(&att.netns, Some(&att.plan().host_link));
                    }
                    Ok(att) => me
                        .ready
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .push(Spare { att, rules: loaded }),
                    Err(e) => {
                        tracing::warn!("network: making a spare namespace: {e}");
                        break;
                    }
                }
            }
            me.filling.store(false, Ordering::SeqCst);
        });
    }

    /// Removes the ready ones (the daemon stops, or keeps none), after waiting a little
    /// for a refill under way (which then removes what it made instead of keeping it),
    /// so that a stopping daemon does not leave one half made.
    pub(crate) fn release(&self) {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(2);
        while self.filling.load(Ordering::SeqCst) && std::time::Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        let gone = std::mem::take(&mut *self.ready.lock().unwrap_or_else(|e| e.into_inner()));
        for s in gone {
            host::remove(&s.att.netns, Some(&s.att.plan().host_link));
        }
    }
}

/// Makes namespace `netns` with a slot's links, the tap, the sysctls, the host route and
/// `rules(plan)`. On error nothing is left.
pub(crate) fn build(
    netns: &str,
    rules: &mut dyn FnMut(&SlotPlan) -> String,
) -> Result<Attachment, NetError> {
    host::run("ip", &["netns", "add", netns], None)?;
    let made = claim_slot(netns).and_then(|p| {
        let rest = host::in_netns(netns, plan::NS_SYSCTL_SCRIPT, None)
            .and_then(|()| {
                host::run(
                    "ip",
                    &["-n", netns, "-batch", "-"],
                    Some(&plan::ns_link_cmds(&p)),
                )
            })
            .and_then(|()| host::nft(Some(netns), &rules(&p)))
            .and_then(|()| {
                host::run(
                    "ip",
                    &[
                        "route",
                        "add",
                        &format!("{}/32", p.guest),
                        "via",
                        &p.ns_addr.to_string(),
                        "dev",
                        &p.host_link,
                    ],
                    None,
                )
            });
        match rest {
            Ok(()) => Ok(Attachment {
                slot: p.slot,
                netns: netns.to_string(),
            }),
            Err(e) => {
                host::remove(netns, Some(&p.host_link));
                Err(e)
            }
        }
    });
    if made.is_err() {
        host::remove(netns, None);
    }
    made
}
