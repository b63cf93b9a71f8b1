//! Whether a guest's TCP connection on a port that name rules cover may go out (pure;
//! unit-tested here), and the book of DNS answers that vouches for addresses.
//!
//! A connection is judged by every policy in force (two while one changes) and goes
//! out only if each allows it. A policy refuses: `network: none`; a destination never
//! reachable (link-local, the sandboxes' own ranges); one its `deny_out` lists by
//! address, or by name (the name the connection gives: TLS SNI or HTTP Host). With
//! no allow list it allows the rest. With one, it allows an address its CIDRs list;
//! otherwise the connection must name a host that an allow rule names on this port,
//! *and* the address must be one that this sandbox's resolver got in an answer for
//! that very name ([`AnswerBook`]). So naming `pypi.org` in SNI while connecting to
//! any other address is refused (the forged-SNI case), and an answer for a name stops
//! vouching once the name no longer passes (a policy change).
use std::collections::HashMap;
use std::net::Ipv4Addr;
use std::time::{Duration, Instant};

use ipnet::Ipv4Net;
use zygote_api::model::{NetworkMode, NetworkPolicy};

use crate::plan::{GUEST_NET, GUEST_PREFIX, LINK_LOCAL, LINK_NET, LINK_PREFIX};

/// Addresses (with the names they answered for) a sandbox's book holds at most.
pub const MAX_ANSWERS: usize = 4096;
/// An answer vouches at least this long (a TTL of 0 must still let the guest
/// connect right after asking) and at most this long.
pub const MIN_VOUCH: Duration = Duration::from_secs(30);
pub const MAX_VOUCH: Duration = Duration::from_secs(3600);

/// The A records this sandbox's resolver passed to its guest: address -> names (as
/// asked) with the time each stops vouching.
#[derive(Debug, Default)]
pub struct AnswerBook {
    by_addr: HashMap<Ipv4Addr, Vec<(String, Instant)>>,
    entries: usize,
}

impl AnswerBook {
    pub fn record(&mut self, name: &str, addresses: &[(Ipv4Addr, u32)], now: Instant) {
        for (addr, ttl) in addresses {
            let until = now + Duration::from_secs(u64::from(*ttl)).clamp(MIN_VOUCH, MAX_VOUCH);
            let names = self.by_addr.entry(*addr).or_default();
            match names.iter_mut().find(|(n, _)| n == name) {
                Some(entry) => entry.1 = entry.1.max(until),
                None => {
                    names.push((name.to_string(), until));
                    self.entries += 1;
                }
            }
            if self.entries > MAX_ANSWERS {
                self.prune(now);
            }
        }
    }

    /// Drops what no longer vouches and, of the rest, all but the half of
    /// [`MAX_ANSWERS`] that vouches longest.
    fn prune(&mut self, now: Instant) {
        let mut all: Vec<(Instant, Ipv4Addr, String)> = self
            .by_addr
            .drain()
            .flat_map(|(addr, names)| names.into_iter().map(move |(n, u)| (u, addr, n)))
            .filter(|(until, _, _)| *until > now)
            .collect();
        all.sort_by_key(|(until, _, _)| *until);
        let keep = all.split_off(all.len().saturating_sub(MAX_ANSWERS / 2));
        self.entries = keep.len();
        for (until, addr, name) in keep {
            self.by_addr.entry(addr).or_default().push((name, until));
        }
    }

    /// Whether an answer for `name` gave `addr` and still vouches.
    pub fn vouches(&self, addr: Ipv4Addr, name: &str, now: Instant) -> bool {
        self.by_addr
            .get(&addr)
            .is_some_and(|names| names.iter().any(|(n, until)| n == name && *until > now))
    }

    pub fn len(&self) -> usize {
        self.entries
    }

    pub fn is_empty(&self) -> bool {
        self.entries == 0
    }
}

/// A connection to judge.
#[derive(Debug, Clone)]
pub struct Attempt<'a> {
    pub addr: Ipv4Addr,
    pub port: u16,
    /// The host it names (SNI or Host), or why it names none.
    pub name: Result<&'a str, String>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    Allowed(String),
    Refused(String),
}

fn never_reachable(addr: Ipv4Addr) -> bool {
    let ranges = [
        LINK_LOCAL.parse::<Ipv4Net>().expect("a CIDR"),
        Ipv4Net::new(GUEST_NET, GUEST_PREFIX).expect("a prefix"),
        Ipv4Net::new(LINK_NET, LINK_PREFIX).expect("a prefix"),
    ];
    ranges.iter().any(|r| r.contains(&addr)) || addr.is_loopback() || addr.is_unspecified()
}

/// The verdict of every policy of `policies` on `a`; `vouched(addr, name)`: whether the
/// sandbox's DNS answers for `name` gave `addr`.
pub fn judge(
    policies: &[NetworkPolicy],
    a: &Attempt<'_>,
    vouched: impl Fn(Ipv4Addr, &str) -> bool,
) -> Verdict {
    let mut last = Verdict::Refused("no policy".into());
    for p in policies {
        last = judge_one(p, a, &vouched);
        if let Verdict::Refused(_) = last {
            return last;
        }
    }
    last
}

fn judge_one(
    p: &NetworkPolicy,
    a: &Attempt<'_>,
    vouched: &impl Fn(Ipv4Addr, &str) -> bool,
) -> Verdict {
    let refuse = |why: String| Verdict::Refused(why);
    if p.mode == NetworkMode::None {
        return refuse("network is \"none\"".into());
    }
    if never_reachable(a.addr) {
        return refuse(format!("{} is never reachable from a sandbox", a.addr));
    }
    if p.deny_out.iter().any(|n| n.contains(&a.addr)) {
        return refuse(format!("deny_out lists {}", a.addr));
    }
    if let Ok(name) = a.name {
        if let Some(rule) = p.deny_names.iter().find(|r| r.matches(name)) {
            return refuse(format!("deny_out names {name} ({rule})"));
        }
    }
    let Some(cidrs) = &p.allow_out else {
        return Verdict::Allowed("not denied".into());
    };
    if cidrs.iter().any(|n| n.contains(&a.addr)) {
        return Verdict::Allowed(format!("allow_out lists {}", a.addr));
    }
    let name = match &a.name {
        Ok(name) => *name,
        Err(why) => return refuse(format!("no host named ({why})")),
    };
    let Some(rule) = p.allow_names.iter().find(|r| r.matches_on(name, a.port)) else {
        return refuse(format!("allow_out does not name {name} on port {}", a.port));
    };
    if !vouched(a.addr, name) {
        return refuse(format!(
            "{} is not in this sandbox's DNS answers for {name}",
            a.addr
        ));
    }
    Verdict::Allowed(format!("allow_out names {name} ({rule})"))
}

/// The TCP ports name rules of `policies` cover (sorted, no repeats).
pub fn named_ports<'a>(policies: impl IntoIterator<Item = &'a NetworkPolicy>) -> Vec<u16> {
    let mut ports: Vec<u16> = policies
        .into_iter()
        .flat_map(|p| p.allow_names.iter().chain(&p.deny_names))
        .flat_map(|r| r.ports().to_vec())
        .collect();
    ports.sort_unstable();
    ports.dedup();
    ports
}

#[cfg(test)]
#[path = "judge_tests.rs"]
mod tests;
