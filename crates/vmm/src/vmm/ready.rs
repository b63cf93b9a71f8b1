//! The readiness pipe between branch children and the VMM that asked for them.
//!
//! Each child writes one fixed-size record once its VM runs (or failed to): index,
//! status, pid, its own rebuild time and the CLOCK_MONOTONIC instant it became ready.
//! Records are smaller than PIPE_BUF, so concurrent writers never interleave, and the
//! timestamp makes "ready after" exact even when the parent reads the pipe late.
use std::os::fd::RawFd;
use std::time::{Duration, Instant};

pub const RECORD_LEN: usize = 32;

/// CLOCK_MONOTONIC in nanoseconds: comparable across processes on one host.
pub fn mono_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: writing into a local timespec.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReadyRecord {
    pub index: u32,
    /// 0: VM running; otherwise a failure code.
    pub status: i32,
    pub pid: i32,
    pub restore_ns: u64,
    pub ready_mono_ns: u64,
    /// Warm branch with verification only: guest pages that differed from the
    /// parent's at the branch instant (saturating).
    pub mismatches: u32,
}

impl ReadyRecord {
    pub fn encode(&self) -> [u8; RECORD_LEN] {
        let mut b = [0u8; RECORD_LEN];
        b[..4].copy_from_slice(&self.index.to_le_bytes());
        b[4..8].copy_from_slice(&self.status.to_le_bytes());
        b[8..12].copy_from_slice(&self.pid.to_le_bytes());
        b[12..16].copy_from_slice(&self.mismatches.to_le_bytes());
        b[16..24].copy_from_slice(&self.restore_ns.to_le_bytes());
        b[24..32].copy_from_slice(&self.ready_mono_ns.to_le_bytes());
        b
    }

    pub fn decode(b: &[u8; RECORD_LEN]) -> Self {
        let u32_at = |i: usize| u32::from_le_bytes(b[i..i + 4].try_into().unwrap());
        let u64_at = |i: usize| u64::from_le_bytes(b[i..i + 8].try_into().unwrap());
        Self {
            index: u32_at(0),
            status: u32_at(4) as i32,
            pid: u32_at(8) as i32,
            restore_ns: u64_at(16),
            ready_mono_ns: u64_at(24),
            mismatches: u32_at(12),
        }
    }

    /// Write this record to the pipe (child side).
    pub fn send(&self, fd: RawFd) {
        let rec = self.encode();
        // SAFETY: writing a small buffer to a pipe we own.
        unsafe { libc::write(fd, rec.as_ptr().cast(), rec.len()) };
    }
}

pub enum WaitError {
    /// Not every child reported before the deadline (or all writers closed the pipe).
    Timeout { received: Vec<ReadyRecord> },
    /// A child reported failure.
    Failed { record: ReadyRecord },
}

/// Read `count` records, failing fast on the first failure.
pub fn wait_for(fd: RawFd, count: usize, deadline: Instant) -> Result<Vec<ReadyRecord>, WaitError> {
    let mut got: Vec<ReadyRecord> = Vec::with_capacity(count);
    let mut buf = [0u8; RECORD_LEN];
    while got.len() < count {
        let left = deadline.saturating_duration_since(Instant::now());
        let mut pfd = libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        };
        let ms = left.as_millis().min(i32::MAX as u128) as i32;
        // SAFETY: polling one fd we own.
        let n = unsafe { libc::poll(&mut pfd, 1, ms) };
        if n < 0 && std::io::Error::last_os_error().kind() == std::io::ErrorKind::Interrupted {
            continue;
        }
        if n <= 0 {
            return Err(WaitError::Timeout { received: got });
        }
        // SAFETY: reading into a stack buffer.
        let r = unsafe { libc::read(fd, buf.as_mut_ptr().cast(), buf.len()) };
        if r != RECORD_LEN as isize {
            // EOF: every writer is gone without reporting (crashed).
            return Err(WaitError::Timeout { received: got });
        }
        let record = ReadyRecord::decode(&buf);
        if record.status != 0 {
            return Err(WaitError::Failed { record });
        }
        got.push(record);
    }
    got.sort_by_key(|r| r.index);
    Ok(got)
}

/// Time from `start_ns` (CLOCK_MONOTONIC) to a child's ready instant.
pub fn since(start_ns: u64, ready_ns: u64) -> Duration {
    Duration::from_nanos(ready_ns.saturating_sub(start_ns))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_round_trip() {
        let r = ReadyRecord {
            index: 999,
            status: -5,
            pid: 4242,
            restore_ns: 1_234_567,
            ready_mono_ns: u64::MAX - 3,
            mismatches: 77,
        };
        assert_eq!(ReadyRecord::decode(&r.encode()), r);
    }

    #[test]
    fn waits_for_all_and_stops_on_failure_or_eof() {
        let mut fds = [0; 2];
        assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
        let ok = |index| ReadyRecord {
            index,
            status: 0,
            pid: 1,
            restore_ns: 0,
            ready_mono_ns: mono_ns(),
            mismatches: 0,
        };
        ok(1).send(fds[1]);
        ok(0).send(fds[1]);
        let deadline = Instant::now() + Duration::from_secs(5);
        let got = wait_for(fds[0], 2, deadline).ok().unwrap();
        assert_eq!(got.iter().map(|r| r.index).collect::<Vec<_>>(), vec![0, 1]);
        ReadyRecord { status: 3, ..ok(2) }.send(fds[1]);
        assert!(matches!(
            wait_for(fds[0], 1, deadline),
            Err(WaitError::Failed { record }) if record.status == 3
        ));
        unsafe { libc::close(fds[1]) };
        assert!(matches!(
            wait_for(fds[0], 1, deadline),
            Err(WaitError::Timeout { .. })
        ));
        unsafe { libc::close(fds[0]) };
    }
}
