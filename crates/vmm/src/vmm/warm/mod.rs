//! Warm spawners: BRANCH without a fork(2) or a VM build on the critical path.
//!
//! A fork-path branch ([`super::branch`]) pauses the parent for one fork, then the child
//! builds a new KVM VM before its guest runs. A KVM VM belongs to the process (the mm)
//! that created it, so it cannot be made before the child exists; but the child can
//! exist before the branch. A *warm spawner* is forked from the VMM ahead of any branch
//! ([`Vmm::prepare_spawner`]) and at once builds all of a child that does not depend
//! on the state: the KVM VM with memory slots over its copy-on-write view of guest
//! RAM, irqchip, PIT, vCPUs. Then it reports itself built and waits on its socket.
//!
//! Its copy of guest RAM is the parent's at the spawner's fork, so from the moment
//! before that fork the parent tracks every page written: KVM's dirty log (the
//! guest's writes) and vm-memory's bitmap (the VMM's own, e.g. virtio devices filling
//! buffers), both read through [`Vmm::drain_dirty`], which adds them to each
//! spawner's bitmap. [`Vmm::branch_warm`] pauses the parent and captures the state as
//! a fork-path branch does, reads the logs a last time, writes exactly the pages in
//! the spawner's bitmap from the paused parent into the spawner with
//! process_vm_writev(2) (the spawner is our child: same addresses, no ptrace rights
//! needed beyond a parent's), sends the state and the child's description, and
//! resumes. The spawner restores the state into its ready VM and runs: it is the child.
//! The copy-on-write root disk is handled the same way, at page grain: the spawner's
//! copy is the parent's at its fork, the parent records the disk pages it writes since
//! (drained with the RAM logs), and the branch sends just those pages for the spawner
//! to write over its copy and adopt (`inherit`); the overlay is never sent whole.
//!
//! What a spawner costs while it waits: its memory holds the old copy of every page
//! the parent has rewritten since its fork (`stale_pages`), and the parent runs with
//! KVM's dirty log on. [`Vmm::spawners`] reports both; the caller bounds them by
//! dropping a stale spawner and preparing a fresh one (off the critical path), and
//! uses the fork path when no spawner is ready or one would copy more than a fork
//! costs. A missed page would be silent memory corruption in the child, so a branch
//! can be asked to verify: the parent sends a witness copy of its RAM at the branch
//! instant and the spawner counts the pages where its own differ before it runs.
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use super::branch::{BranchedChild, ChildContext};
use super::inherit::{DiskLag, DiskPages};
use super::ready::{self, WaitError};
use super::{Vmm, VmmError};
use crate::devices::serial::SerialOut;
use crate::devices::virtio::persist::DeviceHostConfig;

pub mod cost;
mod spawner;
pub(crate) mod wire;

/// What a spawner is told at its branch, besides the VM: the caller's own bytes
/// (e.g. a serialized child description) and file descriptors (e.g. its listener).
pub struct Payload {
    pub bytes: Vec<u8>,
    pub fds: Vec<OwnedFd>,
}

/// Host resources of the child a spawner becomes, worked out in the spawner from the
/// branch's payload.
pub struct ChildSetup {
    pub serial: SerialOut,
    /// Its own vsock socket, tap, disk files.
    pub devices: DeviceHostConfig,
    /// A cgroup (v2 directory) joined when the branch arrives. The VM was built
    /// before, in the spawner's cgroup (`SpawnerSetup::cgroup`): KVM's memory for it
    /// stays charged there; everything after (the guest's copies of pages, threads) is
    /// the child's.
    pub cgroup: Option<PathBuf>,
    /// A network namespace joined before the devices' host resources are opened.
    pub netns: Option<PathBuf>,
}

/// How to make a spawner. The closures run in the spawner, which is forked inside
/// [`Vmm::prepare_spawner`] and never returns from it: whatever they borrow is
/// still there, as it was at the fork.
pub struct SpawnerSetup<'a> {
    /// A cgroup (v2 directory) the spawner joins before building its VM, so that the
    /// VM (and KVM's per-VM threads) is accounted there: the future child's.
    pub cgroup: Option<PathBuf>,
    /// The child's host resources, from the branch's payload.
    pub child: &'a dyn Fn(&mut Payload) -> ChildSetup,
    /// Runs once the child's VM runs; its return value is the exit status.
    pub child_main: &'a dyn Fn(ChildContext, Payload) -> i32,
    /// File descriptors the spawner keeps open besides stdin/stdout/stderr.
    pub keep_fds: Vec<RawFd>,
}

/// A default for [`WarmBranchRequest::max_pages`]: on this bench host writing a page
/// into a spawner costs about 1.6 us and forking a 1 GiB VMM about 4 ms, so past some
/// 2500 pages the fork path pauses the guest less (`zygote bench branch`).
pub const DEFAULT_MAX_PAGES: u64 = 2048;

/// Catch-up rounds before a warm branch pauses, and the stale pages below which the
/// pause may as well copy them itself.
const CATCH_UP_ROUNDS: usize = 2;
const CATCH_UP_BELOW: u64 = 256;

pub struct WarmBranchRequest<'a> {
    pub payload: &'a [u8],
    pub fds: &'a [RawFd],
    /// How long to wait for the child to report running.
    pub ready_timeout: Duration,
    /// Refuse (`TooStale`, before pausing) when the best spawner would need more pages
    /// written than this: the fork path is cheaper then.
    pub max_pages: u64,
    /// Also refuse when, by what this VMM has measured (its copies, forks and spawner
    /// builds, `cost`), writing the pages would take longer than a fork and a VM build.
    pub by_cost: bool,
    /// Compare the child's RAM with a witness copy of the parent's before it runs
    /// (copies all RAM during the pause: a test mode).
    pub verify: bool,
}

#[derive(Debug, Clone)]
pub struct WarmReport {
    pub child: BranchedChild,
    /// How long the parent's vCPUs were stopped.
    pub pause: Duration,
    /// Parts of the pause: stopping vCPUs and capturing state; reading the dirty logs;
    /// writing the pages into the spawner; resuming.
    pub capture: Duration,
    pub dirty_read: Duration,
    pub copy: Duration,
    pub resume: Duration,
    /// After the pause: sending the state (and the devices' private data) to the
    /// spawner, and how many bytes that was.
    pub send: Duration,
    pub state_bytes: u64,
    /// Pages written into the spawner during the pause.
    pub pages_copied: u64,
    /// Before the pause, while the guest ran: pages written into the spawner to catch
    /// it up, and how long that took (part of the request's latency, not the pause).
    pub pages_caught_up: u64,
    pub catch_up: Duration,
    /// How long the spawner had waited since its fork.
    pub spawner_age: Duration,
    /// With `verify`: pages of the child's RAM that differed from the parent's.
    pub memory_mismatches: Option<u64>,
}

/// A waiting spawner as [`Vmm::spawners`] reports it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct SpawnerInfo {
    pub pid: libc::pid_t,
    /// Its VM is built: a branch can use it.
    pub ready: bool,
    /// Pages the parent has written since its fork: what a branch would copy, and
    /// (at most) the old pages it keeps alive meanwhile.
    pub stale_pages: u64,
    pub age_ms: u64,
}

#[derive(Debug, thiserror::Error)]
pub enum WarmError {
    #[error("cannot branch: {0}")]
    Vmm(#[from] VmmError),
    #[error("no warm spawner is ready")]
    NoSpawner,
    #[error("the readiest warm spawner is {pages} pages behind (at most {max} asked, or a fork is cheaper)")]
    TooStale { pages: u64, max: u64 },
    #[error("warm spawner socket: {0}")]
    Socket(std::io::Error),
    #[error("fork failed: {0}")]
    Fork(std::io::Error),
    #[error("writing {pages} pages into spawner {pid} failed: {source}")]
    Copy {
        pid: libc::pid_t,
        pages: u64,
        source: std::io::Error,
    },
    #[error("making the witness copy failed: {0}")]
    Witness(std::io::Error),
    #[error("the child (pid {pid}) failed to start its VM (status {status}); see its stderr")]
    ChildFailed { pid: libc::pid_t, status: i32 },
    #[error("the child (pid {pid}) did not report running within {timeout:?}")]
    ChildTimeout { pid: libc::pid_t, timeout: Duration },
}

/// The parent's handle on a waiting spawner. Dropping it ends the spawner.
pub(crate) struct Spawner {
    pid: libc::pid_t,
    sock: UnixStream,
    /// Pages written since its fork.
    dirty: Vec<u64>,
    /// Per virtio device, how far its copy of a copy-on-write disk is behind (see
    /// `inherit`).
    disks: Vec<DiskLag>,
    ready: bool,
    forked_at: Instant,
}

impl Spawner {
    pub(super) fn note_dirty(&mut self, fresh: &[u64]) {
        super::dirty::or_into(&mut self.dirty, fresh);
    }

    pub(super) fn note_disk_writes(&mut self, device: usize, written: &[u64]) {
        if self.disks.len() <= device {
            self.disks.resize(device + 1, DiskLag::default());
        }
        self.disks[device].note(written);
    }

    /// Pages a branch through it would write now: RAM and disk.
    fn stale_pages(&self) -> u64 {
        super::dirty::count(&self.dirty)
            + self
                .disks
                .iter()
                .map(|d| super::dirty::count(&d.unsent))
                .sum::<u64>()
    }

    /// Read its "built" report if it has come. Err: it is gone (died, or failed to
    /// build): its end of the socket is closed.
    fn poll_ready(&mut self) -> Result<bool, ()> {
        let mut b = 0u8;
        // SAFETY: a one-byte non-blocking read into a local.
        let n = unsafe {
            libc::recv(
                self.sock.as_raw_fd(),
                (&mut b as *mut u8).cast(),
                1,
                libc::MSG_DONTWAIT,
            )
        };
        match n {
            1 if b == wire::BUILT && !self.ready => {
                self.ready = true;
                Ok(true)
            }
            n if n < 0
                && std::io::Error::last_os_error().kind() == std::io::ErrorKind::WouldBlock =>
            {
                Ok(self.ready)
            }
            _ => Err(()),
        }
    }

    /// It has become a child: no longer ours to kill on drop. Returns its socket.
    fn into_child(self) -> UnixStream {
        let this = std::mem::ManuallyDrop::new(self);
        // SAFETY: `this` is never used or dropped again, so each field moved out here
        // is owned exactly once (pid, ready and forked_at are plain values).
        unsafe {
            drop(std::ptr::read(&this.dirty));
            drop(std::ptr::read(&this.disks));
            std::ptr::read(&this.sock)
        }
    }

    fn info(&self) -> SpawnerInfo {
        SpawnerInfo {
            pid: self.pid,
            ready: self.ready,
            stale_pages: self.stale_pages(),
            age_ms: self.forked_at.elapsed().as_millis() as u64,
        }
    }
}

impl Drop for Spawner {
    fn drop(&mut self) {
        // SAFETY: ending and reaping our own child.
        unsafe {
            libc::kill(self.pid, libc::SIGKILL);
            libc::waitpid(self.pid, std::ptr::null_mut(), 0);
        }
    }
}

impl Vmm {
    /// Fork a warm spawner (see the module doc). Pauses the guest for the fork; the
    /// spawner builds its VM afterwards, while the guest runs. Returns its pid.
    pub fn prepare_spawner(&mut self, setup: &SpawnerSetup) -> Result<libc::pid_t, WarmError> {
        self.ensure_running()?;
        let (ours, theirs) = UnixStream::pair().map_err(WarmError::Socket)?;
        let was_paused = self.paused;
        self.pause()?;
        // Every write from here on is in the logs, and so in the new spawner's bitmap.
        let tracked = self.ensure_kvm_log();
        if let Err(e) = tracked {
            if !was_paused {
                self.resume()?;
            }
            return Err(e.into());
        }
        // SAFETY: getpid cannot fail.
        let parent = unsafe { libc::getpid() };
        let fork_started = Instant::now();
        // SAFETY: every other thread of this VMM is parked holding no locks; the child
        // never returns into the caller's frames.
        let pid = unsafe { libc::fork() };
        if pid == 0 {
            drop(ours);
            self.become_warm_spawner(theirs, setup, parent);
        }
        self.warm_costs.forked(fork_started.elapsed());
        let fork_err = (pid < 0).then(std::io::Error::last_os_error);
        let resumed = if was_paused { Ok(()) } else { self.resume() };
        drop(theirs);
        if let Some(e) = fork_err {
            resumed?;
            return Err(WarmError::Fork(e));
        }
        self.spawners.push(Spawner {
            pid,
            sock: ours,
            dirty: Vec::new(),
            disks: Vec::new(),
            ready: false,
            forked_at: Instant::now(),
        });
        resumed?;
        Ok(pid)
    }

    /// The waiting spawners, after reading their reports (a spawner that died is
    /// dropped) and the dirty logs (so `stale_pages` is current).
    pub fn spawners(&mut self) -> Result<Vec<SpawnerInfo>, VmmError> {
        self.poll_spawners();
        if !self.spawners.is_empty() && self.exit.is_none() {
            // Safe while the guest runs: a page written during the read is in the next.
            self.drain_dirty()?;
        }
        Ok(self.spawners.iter().map(Spawner::info).collect())
    }

    /// Catch every ready spawner up with the running guest (see `catch_up`), so that
    /// its stale pages, the memory they hold and the next branch's copy stay small.
    /// Returns the pages written. A spawner that fails is dropped.
    pub fn catch_up_spawners(&mut self) -> Result<u64, WarmError> {
        self.ensure_running()?;
        self.poll_spawners();
        if self.paused {
            return Ok(0);
        }
        self.drain_dirty()?;
        let mut total = 0;
        let mut i = 0;
        while i < self.spawners.len() {
            if !self.spawners[i].ready {
                i += 1;
                continue;
            }
            let before = self.spawners.len();
            match self.catch_up(i) {
                Ok(n) => total += n,
                Err(WarmError::Copy { pid, source, .. }) if self.spawners.len() < before => {
                    tracing::warn!(pid, %source, "warm spawner dropped: catching it up failed");
                    continue; // removed: `i` is the next one now
                }
                Err(e) => return Err(e),
            }
            i += 1;
        }
        Ok(total)
    }

    /// Read the spawners' reports: drop those gone, note how long the newly built took
    /// (from their fork to the report being seen: an upper bound).
    fn poll_spawners(&mut self) {
        let mut built = Vec::new();
        self.spawners.retain_mut(|s| {
            let was = s.ready;
            let ok = s.poll_ready().is_ok();
            if ok && s.ready && !was {
                built.push(s.forked_at.elapsed());
            }
            ok
        });
        for took in built {
            self.warm_costs.built(took);
        }
    }

    /// The waiting spawners as last seen, without reading the dirty logs (`stale_pages`
    /// as of the last read: the served loop reads them every 50 ms).
    pub fn spawners_as_last_read(&mut self) -> Vec<SpawnerInfo> {
        self.poll_spawners();
        self.spawners.iter().map(Spawner::info).collect()
    }

    /// What this VMM has measured of copies into spawners, forks and VM builds.
    pub fn warm_costs(&self) -> &cost::CostModel {
        &self.warm_costs
    }

    /// Spawners kept (ready or building), as of the last look at them.
    pub fn spawner_count(&self) -> usize {
        self.spawners.len()
    }

    /// End the spawner `pid`. False: no such spawner.
    pub fn drop_spawner(&mut self, pid: libc::pid_t) -> bool {
        let before = self.spawners.len();
        self.spawners.retain(|s| s.pid != pid);
        self.spawners.len() < before
    }

    /// Branch into one child through a ready spawner (the one with the fewest stale
    /// pages). The spawner becomes the child: prepare another for the next branch.
    pub fn branch_warm(&mut self, req: &WarmBranchRequest) -> Result<WarmReport, WarmError> {
        self.ensure_running()?;
        self.poll_spawners();
        // Read the logs while the guest still runs: the paused read then finds only
        // what was written since, and the choice below sees the spawners' real cost.
        if !self.paused {
            self.drain_dirty()?;
        }
        let Some(pos) = (0..self.spawners.len())
            .filter(|&i| self.spawners[i].ready)
            .min_by_key(|&i| self.spawners[i].stale_pages())
        else {
            return Err(WarmError::NoSpawner);
        };
        let stale = self.spawners[pos].stale_pages();
        let costly = req.by_cost && self.warm_costs.fork_is_cheaper(stale) == Some(true);
        if stale > req.max_pages || costly {
            return Err(WarmError::TooStale {
                pages: stale,
                max: req.max_pages,
            });
        }
        let requested = Instant::now();
        // "Ready after" counts from here: the catch-up is on the request's path.
        let start_ns = ready::mono_ns();
        let pages_caught_up = if self.paused { 0 } else { self.catch_up(pos)? };
        let catch_up = requested.elapsed();
        let started = Instant::now();
        let was_paused = self.paused;
        let state = self.pause_and_capture()?;
        let capture = started.elapsed();
        // The last read of the logs, while the spawner is still listed to be told.
        let t = Instant::now();
        let drained = self.drain_dirty();
        let dirty_read = t.elapsed();
        let mut spawner = self.spawners.remove(pos);
        let paused_work = drained
            .map_err(WarmError::from)
            .and_then(|_| self.copy_to_spawner(&mut spawner, req));
        let resume_started = Instant::now();
        let resumed = if was_paused { Ok(()) } else { self.resume() };
        let pause = started.elapsed();
        let resume = resume_started.elapsed();
        // The pages are in place; the state is plain data and goes while the guest runs.
        let t = Instant::now();
        let sent = paused_work.and_then(|paused| {
            let Paused {
                copy,
                pages,
                disk_pages,
                witness,
            } = paused;
            // The witness's memfd must stay open until the message is sent.
            let (witness_ram, witness_device_data) = match witness {
                Some(w) => (Some(w.ram), Some(w.device_data)),
                None => (None, None),
            };
            let mut fds = req.fds.to_vec();
            fds.extend(witness_ram.as_ref().map(AsRawFd::as_raw_fd));
            let go = wire::Go {
                state,
                disk_pages,
                witness_device_data,
                payload: req.payload.to_vec(),
                start_ns,
            };
            let bytes = wire::send_go(&spawner.sock, &go, &fds).map_err(WarmError::Socket)?;
            Ok((copy, pages, bytes))
        });
        let send = t.elapsed();
        let (copy, pages_copied, state_bytes) = match sent {
            Ok(w) => w,
            Err(e) => {
                drop(spawner); // kills it: it may hold half the pages
                resumed?;
                return Err(e);
            }
        };
        resumed?;
        // From here it is a child like a fork-path one.
        let pid = spawner.pid;
        let spawner_age = spawner.forked_at.elapsed();
        let sock = spawner.into_child();
        self.children.push(pid);
        let waited = ready::wait_for(sock.as_raw_fd(), 1, started + req.ready_timeout);
        drop(sock);
        let record = match waited {
            Ok(mut r) => r.remove(0),
            Err(e) => {
                // SAFETY: killing our own child.
                unsafe { libc::kill(pid, libc::SIGKILL) };
                self.reap_children(true);
                return Err(match e {
                    WaitError::Failed { record } => WarmError::ChildFailed {
                        pid,
                        status: record.status,
                    },
                    WaitError::Timeout { .. } => WarmError::ChildTimeout {
                        pid,
                        timeout: req.ready_timeout,
                    },
                });
            }
        };
        Ok(WarmReport {
            child: BranchedChild {
                index: 0,
                pid: record.pid,
                ready_after: ready::since(start_ns, record.ready_mono_ns),
                restore: Duration::from_nanos(record.restore_ns),
            },
            pause,
            capture,
            dirty_read,
            copy,
            send,
            resume,
            pages_copied,
            pages_caught_up,
            catch_up,
            state_bytes,
            spawner_age,
            memory_mismatches: req.verify.then_some(u64::from(record.mismatches)),
        })
    }

    /// Bring spawner `pos` close to the running guest before the pause, as a live
    /// migration's pre-copy does: write the pages in its bitmap while the guest runs,
    /// then read the logs again. A page written during the copy was written after the
    /// read that listed it, so the next read lists it again: nothing is lost, and the
    /// pause copies only what the guest wrote during the last round.
    fn catch_up(&mut self, pos: usize) -> Result<u64, WarmError> {
        let mut total = 0;
        for _ in 0..CATCH_UP_ROUNDS {
            let s = &mut self.spawners[pos];
            if s.stale_pages() <= CATCH_UP_BELOW {
                break;
            }
            let pages = std::mem::take(&mut s.dirty);
            let mut disks = std::mem::take(&mut s.disks);
            let pid = s.pid;
            let t = Instant::now();
            let copied = wire::copy_pages(pid, &self.ram, &pages)
                .and_then(|n| Ok(n + self.copy_disk_pages(pid, &mut disks)?));
            self.spawners[pos].disks = disks;
            match copied {
                Ok(n) => {
                    self.warm_costs.copied(n, t.elapsed());
                    total += n;
                }
                Err(source) => {
                    // Its bitmap is gone and its memory half-written: it cannot serve.
                    let s = self.spawners.remove(pos);
                    return Err(WarmError::Copy {
                        pid: s.pid,
                        pages: super::dirty::count(&pages),
                        source,
                    });
                }
            }
            self.drain_dirty()?;
        }
        Ok(total)
    }

    /// The paused part of a warm branch: the pages, the disk pages written since the
    /// spawner's fork and, when verifying, the witness.
    fn copy_to_spawner(
        &mut self,
        spawner: &mut Spawner,
        req: &WarmBranchRequest,
    ) -> Result<Paused, WarmError> {
        let t = Instant::now();
        let pages = wire::copy_pages(spawner.pid, &self.ram, &spawner.dirty).map_err(|source| {
            WarmError::Copy {
                pid: spawner.pid,
                pages: super::dirty::count(&spawner.dirty),
                source,
            }
        })?;
        let disk_copied = self
            .copy_disk_pages(spawner.pid, &mut spawner.disks)
            .map_err(|source| WarmError::Copy {
                pid: spawner.pid,
                pages: spawner.stale_pages(),
                source,
            })?;
        let pages = pages + disk_copied;
        let copy = t.elapsed();
        self.warm_costs.copied(pages, copy);
        let disk_pages = spawner
            .disks
            .iter()
            .enumerate()
            .filter(|(_, l)| super::dirty::count(&l.written) > 0)
            .map(|(i, l)| DiskPages {
                device: i as u32,
                pages: super::dirty::runs(&l.written)
                    .flat_map(|(first, n)| first..first + n)
                    .collect(),
            })
            .collect();
        let witness = if req.verify {
            Some(Witness {
                ram: wire::witness(&self.ram).map_err(WarmError::Witness)?,
                device_data: self
                    .device_private_data()
                    .map_err(|e| VmmError::Device(format!("reading device data: {e}")))?,
            })
        } else {
            None
        };
        Ok(Paused {
            copy,
            pages,
            disk_pages,
            witness,
        })
    }
}

/// What the paused part of a warm branch gathered for the spawner.
struct Paused {
    /// Writing the pages (RAM and disk) into the spawner: how long, how many.
    copy: Duration,
    pages: u64,
    disk_pages: Vec<DiskPages>,
    witness: Option<Witness>,
}

/// The parent at the branch instant, for a verifying spawner to compare against.
struct Witness {
    /// A copy of its RAM (a memfd).
    ram: OwnedFd,
    /// Every device's private data, whole (the disks' overlays).
    device_data: Vec<Vec<u8>>,
}
