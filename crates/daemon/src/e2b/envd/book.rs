//! What envd knows of a process and zygote's agent does not: the `envs`, `cwd` and
//! `tag` it was started with (the agent keeps argv only), for `List` and for picking a
//! process by tag.
//!
//! Kept in the daemon's memory, per sandbox, for the processes `Start` spawned (the
//! terminals keep theirs in [`super::pty::Ptys`]). An entry names its process by pid
//! *and* start time, so a later process that reuses the pid never inherits it. Entries
//! go when `List` finds their process ended, when their sandbox is no longer running
//! (checked at each `Start`), and the oldest go first past [`MAX_BOOKED_PER_SANDBOX`];
//! a daemon restart forgets them all (the processes run on, shown by argv alone).
use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;

use super::pty::Details;

/// Processes whose details one sandbox keeps.
pub const MAX_BOOKED_PER_SANDBOX: usize = 1024;

/// One process's details and when it started (the agent's `started_at_ms`).
struct Entry {
    started_at_ms: u64,
    seq: u64,
    details: Details,
}

#[derive(Default)]
struct Sandbox {
    entries: BTreeMap<u32, Entry>,
    next_seq: u64,
}

/// The details of the processes envd started, per sandbox.
#[derive(Default)]
pub struct ProcessBook {
    sandboxes: Mutex<HashMap<String, Sandbox>>,
}

impl ProcessBook {
    fn with<T>(&self, f: impl FnOnce(&mut HashMap<String, Sandbox>) -> T) -> T {
        let mut guard = self.sandboxes.lock().unwrap_or_else(|p| p.into_inner());
        f(&mut guard)
    }

    /// Keeps `details` for process `pid` of sandbox `id`, started at `started_at_ms`.
    pub fn record(&self, id: &str, pid: u32, started_at_ms: u64, details: Details) {
        self.with(|s| {
            let sandbox = s.entry(id.to_string()).or_default();
            if !sandbox.entries.contains_key(&pid)
                && sandbox.entries.len() >= MAX_BOOKED_PER_SANDBOX
            {
                let oldest = sandbox.entries.iter().min_by_key(|(_, e)| e.seq);
                if let Some(pid) = oldest.map(|(pid, _)| *pid) {
                    sandbox.entries.remove(&pid);
                }
            }
            sandbox.next_seq += 1;
            let seq = sandbox.next_seq;
            sandbox.entries.insert(
                pid,
                Entry {
                    started_at_ms,
                    seq,
                    details,
                },
            );
        });
    }

    /// The details of process `pid` started at `started_at_ms`, if envd started it.
    pub fn details(&self, id: &str, pid: u32, started_at_ms: u64) -> Option<Details> {
        self.with(|s| {
            let entry = s.get(id)?.entries.get(&pid)?;
            (entry.started_at_ms == started_at_ms).then(|| entry.details.clone())
        })
    }

    /// Forgets sandbox `id`'s processes other than `running` (pid, start time).
    pub fn keep_only(&self, id: &str, running: &[(u32, u64)]) {
        self.with(|s| {
            if let Some(sandbox) = s.get_mut(id) {
                sandbox
                    .entries
                    .retain(|pid, e| running.contains(&(*pid, e.started_at_ms)));
                if sandbox.entries.is_empty() {
                    s.remove(id);
                }
            }
        });
    }

    /// Forgets every sandbox for which `gone` holds.
    pub fn forget_sandboxes(&self, gone: impl Fn(&str) -> bool) {
        self.with(|s| s.retain(|id, _| !gone(id)));
    }

    /// The process (pid, start time) of sandbox `id` started with `tag` (the newest
    /// when several were).
    pub fn by_tag(&self, id: &str, tag: &str) -> Option<(u32, u64)> {
        self.with(|s| {
            s.get(id)?
                .entries
                .iter()
                .filter(|(_, e)| e.details.tag.as_deref() == Some(tag))
                .max_by_key(|(_, e)| e.seq)
                .map(|(pid, e)| (*pid, e.started_at_ms))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tagged(tag: &str) -> Details {
        Details {
            tag: Some(tag.into()),
            ..Default::default()
        }
    }

    #[test]
    fn entries_name_a_process_by_pid_and_start_and_stay_bounded() {
        let book = ProcessBook::default();
        book.record("a", 7, 100, tagged("t"));
        assert_eq!(book.by_tag("a", "t"), Some((7, 100)));
        assert!(book.details("a", 7, 100).is_some());
        // The same pid, started later: not the recorded process.
        assert!(book.details("a", 7, 101).is_none());
        assert!(book.by_tag("b", "t").is_none());
        book.keep_only("a", &[(7, 101)]);
        assert!(book.by_tag("a", "t").is_none());

        for pid in 0..(MAX_BOOKED_PER_SANDBOX as u32 + 5) {
            book.record("a", pid, 1, tagged(&pid.to_string()));
        }
        assert!(book.by_tag("a", "0").is_none(), "the oldest went first");
        let last = MAX_BOOKED_PER_SANDBOX as u32 + 4;
        assert_eq!(book.by_tag("a", &last.to_string()), Some((last, 1)));
        book.forget_sandboxes(|id| id == "a");
        assert!(book.by_tag("a", &last.to_string()).is_none());
    }
}
