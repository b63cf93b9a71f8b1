//! BRANCH: fork the VMM process so each child continues the paused VM independently.
//!
//! Guest RAM is private anonymous memory, so fork(2) gives every child a copy-on-write
//! view of it at the same host address. The parent quiesces all its threads (vCPUs out
//! of KVM_RUN and parked, event thread parked: no locks held), captures `VmState`,
//! forks, and resumes at once. Each child is single-threaded after fork: it unmaps the
//! parent's kvm_run pages and closes every inherited fd (KVM objects, eventfds, sockets,
//! listeners), builds a new KVM VM over the inherited memory, restores the state, starts
//! new threads, reports readiness over a pipe, then runs the caller's child main.
use std::os::fd::RawFd;
use std::time::{Duration, Instant};

use super::{RestoreConfig, Vmm, VmmError};
use crate::devices::serial::SerialOut;
use crate::persist::VmState;

/// What a branch child does once its VM runs. Its return value is the exit status.
pub type ChildMain<'a> = &'a dyn Fn(ChildContext) -> i32;

pub struct BranchRequest<'a> {
    /// Number of children to create.
    pub count: usize,
    /// Console sink for child `i`.
    pub child_serial: &'a dyn Fn(usize) -> SerialOut,
    /// Runs in each child after its VM is running; never returns to the caller.
    pub child_main: ChildMain<'a>,
    /// File descriptors children keep open besides stdin/stdout/stderr.
    pub keep_fds: Vec<RawFd>,
    /// How long to wait for all children to report running.
    pub ready_timeout: Duration,
}

/// Handed to the child main.
pub struct ChildContext {
    pub index: usize,
    pub vmm: Vmm,
}

#[derive(Debug, Clone)]
pub struct BranchedChild {
    pub index: usize,
    pub pid: libc::pid_t,
    /// From the request to this child's VM running.
    pub ready_after: Duration,
}

#[derive(Debug, Clone)]
pub struct BranchReport {
    pub children: Vec<BranchedChild>,
    /// How long the parent's vCPUs were stopped.
    pub pause: Duration,
    /// Part of the pause spent capturing state (vCPUs + platform).
    pub capture: Duration,
    /// Part of the pause spent in fork(2), summed over children.
    pub fork: Duration,
}

#[derive(Debug, thiserror::Error)]
pub enum BranchError {
    #[error("cannot branch: {0}")]
    Vmm(#[from] VmmError),
    #[error("count must be at least 1")]
    ZeroCount,
    #[error("creating the readiness pipe failed: {0}")]
    Pipe(std::io::Error),
    #[error("fork failed after {made} children: {source}")]
    Fork { made: usize, source: std::io::Error },
    #[error("child {index} (pid {pid}) failed to start its VM (status {status}); see its stderr")]
    ChildFailed {
        index: usize,
        pid: libc::pid_t,
        status: i32,
    },
    #[error("{missing} of {count} children did not report running within {timeout:?}")]
    ChildTimeout {
        missing: usize,
        count: usize,
        timeout: Duration,
    },
}

/// Readiness record a child writes: index and status (0 = VM running). 8 bytes is below
/// PIPE_BUF, so records from concurrent children never interleave.
fn encode_ready(index: usize, status: i32) -> [u8; 8] {
    let mut b = [0u8; 8];
    b[..4].copy_from_slice(&(index as u32).to_le_bytes());
    b[4..].copy_from_slice(&status.to_le_bytes());
    b
}

fn decode_ready(b: &[u8; 8]) -> (usize, i32) {
    let index = u32::from_le_bytes(b[..4].try_into().unwrap()) as usize;
    let status = i32::from_le_bytes(b[4..].try_into().unwrap());
    (index, status)
}

/// Close every fd ≥ 3 except `keep`, with close_range(2) over the gaps.
fn close_fds_except(keep: &mut [RawFd]) {
    keep.sort_unstable();
    let mut start: u32 = 3;
    for &fd in keep.iter().filter(|&&fd| fd >= 3) {
        let fd = fd as u32;
        if fd > start {
            // SAFETY: closing descriptors we no longer use; no Rust object in this child
            // will touch them again (the parent's objects are never dropped here).
            unsafe { libc::syscall(libc::SYS_close_range, start, fd - 1, 0) };
        }
        start = fd + 1;
    }
    // SAFETY: as above.
    unsafe { libc::syscall(libc::SYS_close_range, start, u32::MAX, 0) };
}

fn write_ready(fd: RawFd, index: usize, status: i32) {
    let rec = encode_ready(index, status);
    // SAFETY: writing a small buffer to a pipe we own.
    unsafe { libc::write(fd, rec.as_ptr().cast(), rec.len()) };
}

impl Vmm {
    /// Fork `req.count` children that continue this VM. Returns in the parent only.
    pub fn branch(&mut self, req: &BranchRequest) -> Result<BranchReport, BranchError> {
        if req.count == 0 {
            return Err(BranchError::ZeroCount);
        }
        let started = Instant::now();
        let was_paused = self.paused;
        let state = self.pause_and_capture()?;
        let captured = started.elapsed();

        let mut fds = [0 as RawFd; 2];
        // SAFETY: plain pipe creation.
        if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
            let err = std::io::Error::last_os_error();
            if !was_paused {
                self.resume()?;
            }
            return Err(BranchError::Pipe(err));
        }
        let (ready_r, ready_w) = (fds[0], fds[1]);

        let mut pids = Vec::with_capacity(req.count);
        let mut fork_time = Duration::ZERO;
        let mut fork_err = None;
        for index in 0..req.count {
            let t = Instant::now();
            // SAFETY: every other thread of this VMM is parked holding no locks; the child
            // only runs `child_after_fork`, which never returns into the caller's frames.
            let pid = unsafe { libc::fork() };
            if pid == 0 {
                self.child_after_fork(&state, index, ready_w, req);
            }
            fork_time += t.elapsed();
            if pid < 0 {
                fork_err = Some(std::io::Error::last_os_error());
                break;
            }
            pids.push(pid);
        }
        // SAFETY: the parent no longer writes readiness records.
        unsafe { libc::close(ready_w) };
        let resumed = if was_paused { Ok(()) } else { self.resume() };
        let pause = started.elapsed();
        self.children.extend_from_slice(&pids);

        let result = (|| {
            if let Some(source) = fork_err {
                return Err(BranchError::Fork {
                    made: pids.len(),
                    source,
                });
            }
            resumed?;
            let children = wait_ready(ready_r, &pids, started, req.ready_timeout)?;
            Ok(BranchReport {
                children,
                pause,
                capture: captured,
                fork: fork_time,
            })
        })();
        // SAFETY: done with the read end.
        unsafe { libc::close(ready_r) };
        if result.is_err() {
            // Don't leave half-started children behind.
            for &pid in &pids {
                // SAFETY: signalling our own children.
                unsafe { libc::kill(pid, libc::SIGKILL) };
            }
            self.reap_children(true);
        }
        result
    }

    /// Runs in the child: never returns.
    fn child_after_fork(
        &mut self,
        state: &VmState,
        index: usize,
        ready_w: RawFd,
        req: &BranchRequest,
    ) -> ! {
        let code = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            for v in &self.vcpus {
                let m = v.kvm_run_mapping();
                // SAFETY: the parent's kvm_run pages; no thread in this process uses them.
                unsafe { libc::munmap(m.addr as *mut libc::c_void, m.size) };
            }
            let mut keep = req.keep_fds.clone();
            keep.push(ready_w);
            close_fds_except(&mut keep);
            // This child's own children list starts empty.
            self.children.clear();
            let cfg = RestoreConfig {
                serial_out: (req.child_serial)(index),
                start_paused: false,
            };
            match Vmm::restore(self.ram.clone(), state, cfg) {
                Ok(vmm) => {
                    write_ready(ready_w, index, 0);
                    // SAFETY: readiness is reported; the child main doesn't need the pipe.
                    unsafe { libc::close(ready_w) };
                    (req.child_main)(ChildContext { index, vmm })
                }
                Err(e) => {
                    eprintln!("zygote: branch child {index}: {e}");
                    write_ready(ready_w, index, 1);
                    1
                }
            }
        }))
        .unwrap_or(101);
        // SAFETY: leave without running the parent's destructors or atexit handlers.
        unsafe { libc::_exit(code) }
    }

    /// Reap exited branch children; with `block`, wait for all of them.
    pub fn reap_children(&mut self, block: bool) -> Vec<(libc::pid_t, i32)> {
        let mut reaped = Vec::new();
        self.children.retain(|&pid| {
            let mut status = 0;
            let flags = if block { 0 } else { libc::WNOHANG };
            // SAFETY: waiting on our own child.
            let r = unsafe { libc::waitpid(pid, &mut status, flags) };
            if r == pid || r < 0 {
                reaped.push((pid, status));
                false
            } else {
                true
            }
        });
        reaped
    }

    /// Branch children started by this VMM and not yet reaped.
    pub fn children(&self) -> &[libc::pid_t] {
        &self.children
    }
}

fn wait_ready(
    fd: RawFd,
    pids: &[libc::pid_t],
    started: Instant,
    timeout: Duration,
) -> Result<Vec<BranchedChild>, BranchError> {
    let mut out: Vec<BranchedChild> = Vec::with_capacity(pids.len());
    let deadline = started + timeout;
    let mut buf = [0u8; 8];
    while out.len() < pids.len() {
        let left = deadline.saturating_duration_since(Instant::now());
        let mut pfd = libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: polling one fd we own.
        let n = unsafe { libc::poll(&mut pfd, 1, left.as_millis().min(i32::MAX as u128) as i32) };
        if n <= 0 {
            if n < 0 && std::io::Error::last_os_error().kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            return Err(BranchError::ChildTimeout {
                missing: pids.len() - out.len(),
                count: pids.len(),
                timeout,
            });
        }
        // SAFETY: reading into a stack buffer.
        let r = unsafe { libc::read(fd, buf.as_mut_ptr().cast(), buf.len()) };
        if r != buf.len() as isize {
            // EOF: every child closed its end without reporting (crashed).
            return Err(BranchError::ChildTimeout {
                missing: pids.len() - out.len(),
                count: pids.len(),
                timeout,
            });
        }
        let (index, status) = decode_ready(&buf);
        let pid = pids.get(index).copied().unwrap_or(-1);
        if status != 0 {
            return Err(BranchError::ChildFailed { index, pid, status });
        }
        out.push(BranchedChild {
            index,
            pid,
            ready_after: started.elapsed(),
        });
    }
    out.sort_by_key(|c| c.index);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ready_records_round_trip() {
        assert_eq!(decode_ready(&encode_ready(7, 0)), (7, 0));
        assert_eq!(decode_ready(&encode_ready(1023, -5)), (1023, -5));
    }
}
