//! File descriptors: how many the agent may hold, and who may take them.
//!
//! Everything the agent does holds descriptors: a background process five (the pipes
//! of its stdin, stdout and stderr, and the reaper's exit pipe), a pty about as many
//! (its master, a wake-up pipe, the exit pipe), a running exec five, a connection two or
//! three, a file request one. With the limit the kernel gives init (1024), about 200
//! background processes used them all up, and from then on every exec, pty and spawn
//! failed with EMFILE until some were killed (issue 33).
//!
//! Two measures. At start the agent raises its own RLIMIT_NOFILE ([`raise_limit`]);
//! the programs it starts get the limit it was started with back ([`restore_for_child`]:
//! a program that uses select(2) misbehaves above 1024 descriptors, and may raise its
//! own limit up to the raised hard limit if it wants more). And the long-lived holders,
//! background processes and ptys, are admitted only while that leaves [`RESERVE`]
//! descriptors free ([`admit`]): beyond it they are refused with `limit_reached`, and
//! what is left keeps serving execs, file requests and new connections, which are not
//! checked. The count is the kernel's (`/proc/self/fd`), so it cannot drift.
use std::sync::atomic::{AtomicU64, Ordering};

use zygote_proto::{ErrorBody, ErrorCode};

/// The limit the agent raises itself to (at most; the kernel's `nr_open` caps it).
pub const RAISED_LIMIT: u64 = 65536;

/// Descriptors kept free for execs, file requests and connections: background
/// processes and ptys are refused once they would leave fewer.
pub const RESERVE: usize = 64;

/// What one background process or pty may hold, counting the pipes a start opens for a
/// moment (std's spawn uses up to eight before it closes the child's ends).
pub const LONG_LIVED_COST: usize = 12;

/// The soft limit the agent started with, given back to its programs (0: unchanged).
static CHILD_SOFT_LIMIT: AtomicU64 = AtomicU64::new(0);

/// The descriptor limits before and after [`raise_limit`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    pub started_with: u64,
    pub now: u64,
}

fn get() -> Option<libc::rlimit> {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes into the struct we pass.
    (unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } == 0).then_some(lim)
}

fn set(cur: u64, max: u64) -> bool {
    let lim = libc::rlimit {
        rlim_cur: cur as libc::rlim_t,
        rlim_max: max as libc::rlim_t,
    };
    // SAFETY: setrlimit reads the struct we pass.
    unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &lim) == 0 }
}

/// The kernel's ceiling for any process's limit.
fn nr_open() -> u64 {
    std::fs::read_to_string("/proc/sys/fs/nr_open")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(RAISED_LIMIT)
}

/// Raises the agent's own limit to [`RAISED_LIMIT`] (both soft and hard, which needs
/// privilege: the agent runs as root in a guest), else its soft limit to its hard one;
/// remembers the soft limit it started with for the programs it starts.
pub fn raise_limit() -> Limits {
    let Some(start) = get() else {
        return Limits {
            started_with: 0,
            now: 0,
        };
    };
    let (started_with, hard) = (start.rlim_cur, start.rlim_max);
    let target = RAISED_LIMIT.min(nr_open());
    if started_with >= target || !set(target, target.max(hard)) {
        set(hard, hard);
    }
    let now = get().map_or(started_with, |l| l.rlim_cur);
    if now > started_with {
        CHILD_SOFT_LIMIT.store(started_with, Ordering::Relaxed);
    }
    Limits { started_with, now }
}

/// In a child between fork and exec: the soft limit the agent started with (the hard
/// limit stays as it is). Only async-signal-safe calls.
pub(crate) fn restore_for_child() {
    let soft = CHILD_SOFT_LIMIT.load(Ordering::Relaxed);
    if soft == 0 {
        return;
    }
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit/setrlimit are plain system calls on structs we own.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) == 0 {
            lim.rlim_cur = (soft as libc::rlim_t).min(lim.rlim_max);
            libc::setrlimit(libc::RLIMIT_NOFILE, &lim);
        }
    }
}

/// Descriptors the agent holds now (None where /proc is not mounted).
pub(crate) fn open_count() -> Option<usize> {
    // The directory's own descriptor is among the entries: not counted.
    let entries = std::fs::read_dir("/proc/self/fd").ok()?;
    Some(entries.count().saturating_sub(1))
}

/// Admits one more long-lived holder of descriptors (`what`: "background process",
/// "pty") if it leaves [`RESERVE`] free, else `limit_reached` saying which limit.
pub(crate) fn admit(what: &str) -> Result<(), ErrorBody> {
    let (Some(open), Some(lim)) = (open_count(), get()) else {
        return Ok(());
    };
    let limit = lim.rlim_cur as usize;
    if open + LONG_LIVED_COST + RESERVE <= limit {
        return Ok(());
    }
    Err(ErrorBody::new(
        ErrorCode::LimitReached,
        format!(
            "no {what} started: the agent holds {open} of its {limit} file descriptors, and \
             {RESERVE} stay free for execs and file requests; end some background processes \
             or terminals first"
        ),
    ))
}
