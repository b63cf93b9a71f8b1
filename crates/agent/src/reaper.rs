//! Child reaping that never steals an exit status.
//!
//! Two modes:
//! * [`ReapMode::PerChild`] (an ordinary process, in-process tests): each
//!   spawned child gets a small thread blocked in `waitpid(pid)`. Nothing ever
//!   calls `waitpid(-1)`, so children the embedding program spawns itself are
//!   left alone.
//! * [`ReapMode::All`] (PID 1, or `--subreaper`): orphans are re-parented to us
//!   and must be reaped, so one thread owns *every* wait: it sleeps in
//!   `sigtimedwait(SIGCHLD)` and then drains `waitpid(-1, WNOHANG)`, handing
//!   each status to the exec that registered the pid and discarding the rest.
//!   Spawning and registering a pid happen under the same lock the reaper holds
//!   while reaping, so a child that exits instantly cannot be reaped before
//!   its exec is registered. SIGCHLD must be blocked in every thread (see
//!   [`block_signals`]) so the reaper thread can wait for it.
//!
//! Either way a spawned child's status arrives on a channel, and the write end
//! of a pipe is dropped at the same moment so the exec's `poll` loop wakes up.

use std::collections::HashMap;
use std::io;
use std::os::fd::{FromRawFd, OwnedFd};
use std::process::{Child, Command};
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread;
use std::time::Duration;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReapMode {
    PerChild,
    All,
}

/// Where a child's wait status goes.
struct Waiter {
    tx: Sender<libc::c_int>,
    /// Dropping this (the write end of a pipe) makes the read end readable.
    _wake: OwnedFd,
}

impl Waiter {
    fn deliver(self, status: libc::c_int) {
        let _ = self.tx.send(status);
        // `self._wake` drops here, after the status is in the channel.
    }
}

/// Exit notification for one child.
pub struct ExitWatch {
    pub status: Receiver<libc::c_int>,
    /// Becomes readable (EOF) once `status` holds the wait status.
    pub wake: OwnedFd,
}

pub struct Reaper {
    mode: ReapMode,
    waiters: Mutex<HashMap<libc::pid_t, Waiter>>,
}

impl Reaper {
    /// Create a reaper; in [`ReapMode::All`] this starts the reaper thread,
    /// and SIGCHLD must already be blocked (see [`block_signals`]).
    pub fn new(mode: ReapMode) -> io::Result<Arc<Self>> {
        let reaper = Arc::new(Reaper {
            mode,
            waiters: Mutex::new(HashMap::new()),
        });
        if mode == ReapMode::All {
            let r = reaper.clone();
            thread::Builder::new()
                .name("reaper".into())
                .spawn(move || r.reap_all_loop())?;
        }
        Ok(reaper)
    }

    fn waiters(&self) -> MutexGuard<'_, HashMap<libc::pid_t, Waiter>> {
        self.waiters.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Spawn `cmd` and arrange for its exit status to be delivered.
    pub fn spawn(&self, cmd: &mut Command) -> io::Result<(Child, ExitWatch)> {
        let (wake_r, wake_w) = pipe()?;
        let (tx, rx) = mpsc::channel();
        let waiter = Waiter { tx, _wake: wake_w };
        let child = match self.mode {
            ReapMode::All => {
                // Hold the lock across spawn + register: the reaper cannot
                // collect this child before we know it is ours.
                let mut waiters = self.waiters();
                let child = cmd.spawn()?;
                waiters.insert(child.id() as libc::pid_t, waiter);
                child
            }
            ReapMode::PerChild => {
                let child = cmd.spawn()?;
                let pid = child.id() as libc::pid_t;
                thread::Builder::new()
                    .name(format!("wait-{pid}"))
                    .spawn(move || waiter.deliver(wait_for(pid)))
                    .inspect_err(|_| {
                        // Without a waiter the child would become a zombie; it
                        // is killed and reaped here rather than leaked.
                        unsafe { libc::kill(pid, libc::SIGKILL) };
                        let _ = wait_for(pid);
                    })?;
                child
            }
        };
        Ok((
            child,
            ExitWatch {
                status: rx,
                wake: wake_r,
            },
        ))
    }

    fn reap_all_loop(&self) {
        let set = sigset(&[libc::SIGCHLD]);
        // Also make sure this thread has it blocked, whatever the caller did.
        unsafe { libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut()) };
        let tick = libc::timespec {
            tv_sec: 1,
            tv_nsec: 0,
        };
        loop {
            // SIGCHLD is not queued (several exits can merge into one signal),
            // hence the drain loop below; the timeout is a safety net in case
            // a signal was consumed elsewhere.
            unsafe { libc::sigtimedwait(&set, std::ptr::null_mut(), &tick) };
            let mut waiters = self.waiters();
            loop {
                let mut status = 0;
                let pid = unsafe { libc::waitpid(-1, &mut status, libc::WNOHANG) };
                if pid <= 0 {
                    break;
                }
                if let Some(w) = waiters.remove(&pid) {
                    w.deliver(status);
                }
            }
        }
    }
}

/// Blocking `waitpid` for one pid, retrying on EINTR.
fn wait_for(pid: libc::pid_t) -> libc::c_int {
    loop {
        let mut status = 0;
        let r = unsafe { libc::waitpid(pid, &mut status, 0) };
        if r == pid {
            return status;
        }
        if r < 0 && io::Error::last_os_error().raw_os_error() != Some(libc::EINTR) {
            // ECHILD: someone else reaped it. Report "killed by SIGKILL"
            // rather than hang the exec forever.
            return libc::SIGKILL;
        }
    }
}

fn sigset(signals: &[libc::c_int]) -> libc::sigset_t {
    unsafe {
        let mut set = std::mem::zeroed::<libc::sigset_t>();
        libc::sigemptyset(&mut set);
        for &s in signals {
            libc::sigaddset(&mut set, s);
        }
        set
    }
}

/// Block `signals` in the calling thread, and so in every thread it spawns
/// later. Call first thing in `main`, before any thread exists. Children
/// spawned through `std::process::Command` get an empty mask again.
pub fn block_signals(signals: &[libc::c_int]) -> io::Result<()> {
    let set = sigset(signals);
    let r = unsafe { libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut()) };
    if r != 0 {
        return Err(io::Error::from_raw_os_error(r));
    }
    Ok(())
}

/// Wait (in a dedicated thread) for any of `signals`, which must be blocked,
/// and call `handler` with each one received.
pub fn handle_signals(
    signals: &'static [libc::c_int],
    handler: impl Fn(libc::c_int) + Send + 'static,
) -> io::Result<()> {
    thread::Builder::new()
        .name("signals".into())
        .spawn(move || {
            let set = sigset(signals);
            loop {
                let mut sig = 0;
                if unsafe { libc::sigwait(&set, &mut sig) } == 0 {
                    handler(sig);
                } else {
                    thread::sleep(Duration::from_millis(100));
                }
            }
        })?;
    Ok(())
}

/// A close-on-exec pipe: (read end, write end).
pub fn pipe() -> io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0; 2];
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: pipe2 just returned these two fresh descriptors.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}
