//! Facts about host processes from /proc: identity (pid + start time, so a
//! recycled pid is never mistaken for our VM) and memory sharing.
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// A process identified robustly: pids are recycled, but (pid, start time
/// in clock ticks since boot) is unique for the life of the host.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProcId {
    pub pid: u32,
    pub start_time: u64,
}

impl ProcId {
    /// The identity of the running process `pid`, if there is one.
    pub fn of(pid: u32) -> Option<ProcId> {
        start_time(pid).map(|start_time| ProcId { pid, start_time })
    }

    /// Whether this exact process still exists (zombies count as gone).
    pub fn is_alive(&self) -> bool {
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{}/stat", self.pid)) else {
            return false;
        };
        match parse_stat(&stat) {
            Some((state, start)) => start == self.start_time && state != 'Z' && state != 'X',
            None => false,
        }
    }

    /// Waits up to `limit` for the process to end (polling: it need not be our child).
    pub fn wait_gone(&self, limit: std::time::Duration) {
        let deadline = std::time::Instant::now() + limit;
        while self.is_alive() && std::time::Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
    }

    /// Sends `signal` if the process is still this one. Returns whether it was sent.
    pub fn signal(&self, signal: i32) -> bool {
        if !self.is_alive() {
            return false;
        }
        // SAFETY: kill(2) has no memory-safety preconditions.
        unsafe { libc::kill(self.pid as libc::pid_t, signal) == 0 }
    }
}

fn start_time(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    parse_stat(&stat).map(|(_, start)| start)
}

/// (state, starttime) from a /proc/<pid>/stat line. The command name (field
/// 2) may contain spaces and parentheses, so fields are counted from the
/// last ')'.
fn parse_stat(stat: &str) -> Option<(char, u64)> {
    let rest = &stat[stat.rfind(')')? + 1..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // After the name: state is field 3 overall, starttime field 22.
    let state = fields.first()?.chars().next()?;
    let start = fields.get(22 - 3)?.parse().ok()?;
    Some((state, start))
}

/// Resident memory of a process split into pages shared with other
/// processes and pages private to it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct MemoryUse {
    pub rss: u64,
    pub shared: u64,
    pub private: u64,
}

/// From /proc/<pid>/smaps_rollup (kB values converted to bytes).
pub fn memory_use(pid: u32) -> Option<MemoryUse> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/smaps_rollup")).ok()?;
    Some(parse_smaps_rollup(&text))
}

pub fn parse_smaps_rollup(text: &str) -> MemoryUse {
    let mut m = MemoryUse::default();
    for line in text.lines() {
        let mut parts = line.split_whitespace();
        let (Some(key), Some(val)) = (parts.next(), parts.next()) else {
            continue;
        };
        let Ok(kb) = val.parse::<u64>() else { continue };
        let bytes = kb * 1024;
        match key {
            "Rss:" => m.rss = bytes,
            "Shared_Clean:" | "Shared_Dirty:" => m.shared += bytes,
            "Private_Clean:" | "Private_Dirty:" => m.private += bytes,
            _ => {}
        }
    }
    m
}

/// The files `pid` has open (the targets of /proc/<pid>/fd; sockets, pipes and
/// anonymous files, which have no path, are left out).
pub fn open_files(pid: u32) -> Vec<PathBuf> {
    let Ok(fds) = std::fs::read_dir(format!("/proc/{pid}/fd")) else {
        return Vec::new();
    };
    fds.flatten()
        .filter_map(|fd| std::fs::read_link(fd.path()).ok())
        .filter(|target| target.is_absolute())
        .collect()
}

/// Processes (other than this one) with a file under `dir` open.
pub fn holding_files_under(dir: &Path) -> Vec<ProcId> {
    let me = std::process::id();
    let Ok(procs) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    procs
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|&pid| pid != me)
        .filter(|&pid| open_files(pid).iter().any(|f| f.starts_with(dir)))
        .filter_map(ProcId::of)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn open_files_are_seen_with_their_holder() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("held");
        let held = std::fs::File::create(&path).unwrap();
        assert!(open_files(std::process::id()).contains(&path));
        // This process is never reported as a holder: nothing may kill the daemon.
        assert!(holding_files_under(dir.path()).is_empty());
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .stdout(held.try_clone().unwrap())
            .spawn()
            .unwrap();
        let holders = holding_files_under(dir.path());
        let _ = child.kill();
        let _ = child.wait();
        assert_eq!(
            holders.iter().map(|p| p.pid).collect::<Vec<_>>(),
            [child.id()]
        );
    }

    #[test]
    fn stat_with_odd_command_name() {
        let line = "42 (a) b (c)) S 1 42 42 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 1 0 987654 1000 10";
        assert_eq!(parse_stat(line), Some(('S', 987654)));
        assert_eq!(parse_stat("garbage"), None);
    }

    #[test]
    fn own_process_identity() {
        let me = ProcId::of(std::process::id()).expect("we exist");
        assert!(me.is_alive());
        let recycled = ProcId {
            start_time: me.start_time + 1,
            ..me
        };
        assert!(
            !recycled.is_alive(),
            "a different start time is a different process"
        );
        assert!(!recycled.signal(0));
    }

    #[test]
    fn smaps_rollup_sums() {
        let text = "00400000-7fff [rollup]\nRss:  300 kB\nPss: 200 kB\nShared_Clean: 100 kB\n\
                    Shared_Dirty: 20 kB\nPrivate_Clean: 30 kB\nPrivate_Dirty: 150 kB\n";
        let m = parse_smaps_rollup(text);
        assert_eq!(m.rss, 300 * 1024);
        assert_eq!(m.shared, 120 * 1024);
        assert_eq!(m.private, 180 * 1024);
        assert!(memory_use(std::process::id()).is_some_and(|m| m.rss > 0));
    }
}
