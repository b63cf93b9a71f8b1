//! Proof that a probe guest runs: its heartbeat (a counter the `spin` scenario keeps
//! storing in the mailbox page) advanced in *this* VM's memory after a given moment.
//!
//! "The VM was rebuilt and its vCPU threads started" (what a branch child reports) does
//! not show that guest code executes: KVM may still fail the first entry, or take long
//! to fault the guest's pages in. A branch child that waits here, in its own process and
//! over its own copy of guest RAM, shows that its guest made progress after the branch:
//! the first value it reads is at least the value at the branch point (the child's
//! memory starts as the parent's at the pause), so any larger value was written by the
//! child's guest since.
//!
//! Children tell the process that branched them through a [`ProgressBoard`]: a shared
//! anonymous mapping with one slot per child, which survives fork(2) without any file
//! descriptor (branch children close every fd they were not told to keep).
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use super::{read_mailbox_word, ProbeError};
use crate::memory::GuestRam;
/// CLOCK_MONOTONIC in ns, the clock of [`Progress::seen_mono_ns`] and of branch
/// readiness: take it just before a branch to measure from the request.
pub use crate::vmm::ready::mono_ns;
use zygote_probe_abi as abi;

/// The guest made progress: its heartbeat went from `before` to `after`, and the host saw
/// it at `seen_mono_ns` (CLOCK_MONOTONIC, comparable across processes).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Progress {
    pub before: u64,
    pub after: u64,
    pub seen_mono_ns: u64,
}

impl Progress {
    /// Time from `start_mono_ns` until the progress was seen.
    pub fn since(&self, start_mono_ns: u64) -> Duration {
        crate::vmm::ready::since(start_mono_ns, self.seen_mono_ns)
    }
}

/// The probe's heartbeat, read out of guest RAM.
pub fn heartbeat(ram: &GuestRam) -> Result<u64, ProbeError> {
    read_mailbox_word(ram, abi::MAILBOX_OFF_HEARTBEAT)
}

/// Read the heartbeat, then wait until it is larger: proof that guest code ran after this
/// call began. Sleeps [`POLL`] between reads rather than spinning or yielding: on a host
/// with few cores and many branch children, a polling loop would take CPU from the very
/// vCPU threads it waits for. The price is that progress is seen up to about one poll
/// (plus timer slack, ~0.1 ms in all) late. Fails with [`ProbeError::Stalled`] after
/// `timeout`.
pub fn wait_for_progress(ram: &GuestRam, timeout: Duration) -> Result<Progress, ProbeError> {
    wait_beyond(ram, heartbeat(ram)?, timeout)
}

/// Waits until the heartbeat is larger than `before`, a value read earlier.
fn wait_beyond(ram: &GuestRam, before: u64, timeout: Duration) -> Result<Progress, ProbeError> {
    let started = Instant::now();
    loop {
        let now = heartbeat(ram)?;
        if now > before {
            return Ok(Progress {
                before,
                after: now,
                seen_mono_ns: mono_ns(),
            });
        }
        if started.elapsed() >= timeout {
            return Err(ProbeError::Stalled {
                heartbeat: before,
                waited: timeout,
            });
        }
        std::thread::sleep(POLL);
    }
}

/// Interval between heartbeat reads in [`wait_for_progress`].
pub const POLL: Duration = Duration::from_micros(50);

/// What one child posted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Posted {
    Proven(Progress),
    /// The heartbeat did not move within the child's timeout (value it stayed at).
    Stalled {
        heartbeat: u64,
    },
    /// The child could not read its guest memory.
    Unreadable,
}

const SLOT_EMPTY: u64 = 0;
const SLOT_PROVEN: u64 = 1;
const SLOT_STALLED: u64 = 2;
const SLOT_UNREADABLE: u64 = 3;

/// One child's slot. `state` is written last (Release) and read first (Acquire), so a
/// reader that sees a non-empty state sees the fields written before it.
#[repr(C)]
struct Slot {
    state: AtomicU64,
    before: AtomicU64,
    after: AtomicU64,
    seen_mono_ns: AtomicU64,
}

/// Slots in memory shared across fork(2), one per branch child.
pub struct ProgressBoard {
    slots: *mut Slot,
    len: usize,
}

// SAFETY: the mapping is only accessed through the atomics in each slot.
unsafe impl Send for ProgressBoard {}
// SAFETY: as above.
unsafe impl Sync for ProgressBoard {}

impl ProgressBoard {
    /// A board with `len` empty slots.
    pub fn new(len: usize) -> std::io::Result<Self> {
        let bytes = len.max(1) * std::mem::size_of::<Slot>();
        // SAFETY: a fresh shared anonymous mapping (zero-filled, i.e. every slot empty);
        // checked below, unmapped on drop.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                bytes,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error());
        }
        Ok(Self {
            slots: p.cast(),
            len,
        })
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    fn slot(&self, index: usize) -> &Slot {
        assert!(index < self.len, "progress slot {index} of {}", self.len);
        // SAFETY: in bounds of the mapping, which lives as long as `self`; zeroed memory
        // is a valid `Slot` of atomics.
        unsafe { &*self.slots.add(index) }
    }

    /// Mark every slot empty again (between branches; no child may be posting).
    pub fn clear(&self) {
        for i in 0..self.len {
            self.slot(i).state.store(SLOT_EMPTY, Ordering::Release);
        }
    }

    /// Child side: post the outcome of [`wait_for_progress`] for child `index`.
    pub fn post(&self, index: usize, outcome: &Result<Progress, ProbeError>) {
        let slot = self.slot(index);
        let state = match outcome {
            Ok(p) => {
                slot.before.store(p.before, Ordering::Relaxed);
                slot.after.store(p.after, Ordering::Relaxed);
                slot.seen_mono_ns.store(p.seen_mono_ns, Ordering::Relaxed);
                SLOT_PROVEN
            }
            Err(ProbeError::Stalled { heartbeat, .. }) => {
                slot.before.store(*heartbeat, Ordering::Relaxed);
                SLOT_STALLED
            }
            Err(_) => SLOT_UNREADABLE,
        };
        slot.state.store(state, Ordering::Release);
    }

    /// What child `index` posted, if anything yet.
    pub fn get(&self, index: usize) -> Option<Posted> {
        let slot = self.slot(index);
        match slot.state.load(Ordering::Acquire) {
            SLOT_PROVEN => Some(Posted::Proven(Progress {
                before: slot.before.load(Ordering::Relaxed),
                after: slot.after.load(Ordering::Relaxed),
                seen_mono_ns: slot.seen_mono_ns.load(Ordering::Relaxed),
            })),
            SLOT_STALLED => Some(Posted::Stalled {
                heartbeat: slot.before.load(Ordering::Relaxed),
            }),
            SLOT_UNREADABLE => Some(Posted::Unreadable),
            _ => None,
        }
    }

    /// Parent side: wait until every slot is posted or `deadline` passes (children that
    /// died never post), polling every `poll`. Posts carry their own timestamps, so the
    /// polling interval does not change the measured times.
    pub fn collect(&self, deadline: Instant, poll: Duration) -> Vec<Option<Posted>> {
        loop {
            let all: Vec<Option<Posted>> = (0..self.len).map(|i| self.get(i)).collect();
            if all.iter().all(Option::is_some) || Instant::now() >= deadline {
                return all;
            }
            std::thread::sleep(poll);
        }
    }
}

impl Drop for ProgressBoard {
    fn drop(&mut self) {
        let bytes = self.len.max(1) * std::mem::size_of::<Slot>();
        // SAFETY: unmapping our own mapping; no reference into it outlives `self`.
        unsafe { libc::munmap(self.slots.cast(), bytes) };
    }
}

#[cfg(test)]
#[path = "progress_tests.rs"]
mod tests;
