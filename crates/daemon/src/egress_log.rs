//! Each sandbox's egress record: every connection its guest made through the daemon's
//! egress proxy (refused, or opened and then closed or cut), one JSON line per entry in
//! `<state>/egress/<sandbox>.jsonl`, bounded like the event log (past
//! [`crate::event_log::MAX_LOG_BYTES`] the older half goes). Read by
//! `GET /v1/sandboxes/{id}/egress`; `?follow=true` also streams entries as they are
//! written (a broadcast channel: a reader too slow for [`FOLLOW_BUFFER`] entries
//! misses some, never holding up the proxy).
//!
//! What goes in is the proxy's own judgement plus what the guest's connection named
//! (host, HTTP method and path), each cut to a bound before it is written.
use std::path::PathBuf;
use std::sync::Mutex;

use tokio::sync::broadcast;

use crate::event_log::{append, log_path, remove_orphan_logs, MAX_TEXT};
use crate::model::EgressEntry;

/// Entries a following reader may lag behind before it misses some.
pub const FOLLOW_BUFFER: usize = 1024;

pub struct EgressLog {
    dir: PathBuf,
    write: Mutex<()>,
    live: broadcast::Sender<EgressEntry>,
}

impl EgressLog {
    pub fn new(dir: PathBuf) -> EgressLog {
        EgressLog {
            dir,
            write: Mutex::new(()),
            live: broadcast::channel(FOLLOW_BUFFER).0,
        }
    }

    /// Appends `entry` to its sandbox's record and to the followers. Never fails the
    /// caller (a record that cannot be written is reported in the daemon's log).
    pub fn record(&self, entry: &EgressEntry) {
        let mut entry = entry.clone();
        for text in [&mut entry.reason]
            .into_iter()
            .chain(entry.host.as_mut())
            .chain(entry.method.as_mut())
            .chain(entry.path.as_mut())
        {
            if text.len() > MAX_TEXT {
                let mut end = MAX_TEXT;
                while !text.is_char_boundary(end) {
                    end -= 1;
                }
                text.truncate(end);
            }
        }
        let Some(path) = log_path(&self.dir, &entry.sandbox) else {
            return;
        };
        {
            let _held = self.write.lock().unwrap_or_else(|p| p.into_inner());
            if let Err(e) = append(&self.dir, &path, &entry) {
                tracing::warn!(sandbox = %entry.sandbox, "egress record: {e}");
            }
        }
        let _ = self.live.send(entry);
    }

    /// The last `limit` entries of `sandbox`, oldest first.
    pub fn read(&self, sandbox: &str, limit: usize) -> Vec<EgressEntry> {
        let Some(text) = log_path(&self.dir, sandbox).and_then(|p| std::fs::read(p).ok()) else {
            return Vec::new();
        };
        let all: Vec<EgressEntry> = text
            .split(|b| *b == b'\n')
            .filter_map(|line| serde_json::from_slice(line).ok())
            .collect();
        let skip = all.len().saturating_sub(limit);
        all.into_iter().skip(skip).collect()
    }

    /// New entries of every sandbox from now on.
    pub fn subscribe(&self) -> broadcast::Receiver<EgressEntry> {
        self.live.subscribe()
    }

    pub fn remove(&self, sandbox: &str) {
        if let Some(path) = log_path(&self.dir, sandbox) {
            let _held = self.write.lock().unwrap_or_else(|p| p.into_inner());
            let _ = std::fs::remove_file(path);
        }
    }

    /// Deletes the records of sandboxes `exists` says are gone.
    pub fn remove_orphans(&self, exists: impl Fn(&str) -> bool) {
        remove_orphan_logs(&self.dir, &self.write, exists);
    }
}
