//! Each sandbox's event log: what the daemon did to it and in it (created, branched,
//! paused, a command run and how it ended, its network policy changed, its VM died),
//! one JSON line per event in `<state>/events/<sandbox>.jsonl`. Read by
//! `GET /v1/sandboxes/{id}/events` and E2B's sandbox logs.
//!
//! Why a file per sandbox and not the database: events are many small appends that
//! must never fail or slow the operation they describe (a full disk loses events,
//! not the operation), and they go with the sandbox: [`EventLog::remove`] when it is
//! deleted. Bounded: once a log passes [`MAX_LOG_BYTES`] its older half is dropped,
//! so a sandbox running a command a second cannot grow the daemon's disk. A line torn
//! by a crash mid-append is skipped when read.
//!
//! Each event is also handed to the daemon-wide stream ([`crate::event_stream`],
//! `GET /v1/events`), written or not.
//!
//! What goes in is the daemon's own words plus the caller's (commands, names); guest
//! output never does. Every text is cut to [`MAX_TEXT`] bytes.
use std::collections::BTreeMap;
use std::io::Write;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use crate::event_stream::EventHub;
use crate::model::{EventLevel, EventOrder, EventsQuery, SandboxEvent};

/// A log past this many bytes drops its older half.
pub const MAX_LOG_BYTES: u64 = 1024 * 1024;
/// Bytes of a message or a field value at most (longer ones are cut, marked `…`).
pub const MAX_TEXT: usize = 1024;

pub struct EventLog {
    dir: PathBuf,
    hub: EventHub,
    /// One writer at a time: appends and the compaction that rewrites a log.
    write: Mutex<()>,
}

impl EventLog {
    pub fn new(dir: PathBuf) -> EventLog {
        EventLog {
            dir,
            hub: EventHub::default(),
            write: Mutex::new(()),
        }
    }

    fn path(&self, sandbox: &str) -> Option<PathBuf> {
        log_path(&self.dir, sandbox)
    }

    /// Appends an event to `sandbox`'s log. Never fails the caller: a log that cannot
    /// be written is reported in the daemon's own log and the event is lost.
    pub fn record(
        &self,
        sandbox: &str,
        level: EventLevel,
        message: &str,
        fields: &[(&str, String)],
    ) {
        let event = entry(level, message, fields);
        if let Some(path) = self.path(sandbox) {
            let _held = self.write.lock().unwrap_or_else(|p| p.into_inner());
            if let Err(e) = append(&self.dir, &path, &event) {
                tracing::warn!(sandbox, "event log: {e}");
            }
        }
        self.hub.publish(sandbox, event);
    }

    /// Hands an event to the daemon-wide stream only: one about a sandbox whose log is
    /// gone or not yet worth keeping (`sandbox deleted`, `sandbox creating`).
    pub fn announce(
        &self,
        sandbox: &str,
        level: EventLevel,
        message: &str,
        fields: &[(&str, String)],
    ) {
        self.hub.publish(sandbox, entry(level, message, fields));
    }

    /// The daemon-wide stream every recorded or announced event goes to.
    pub fn hub(&self) -> &EventHub {
        &self.hub
    }

    /// The events of `sandbox` that `q` asks for, in its order, at most its limit.
    pub fn read(&self, sandbox: &str, q: &EventsQuery) -> Vec<SandboxEvent> {
        let Some(text) = self.path(sandbox).and_then(|p| std::fs::read(p).ok()) else {
            return Vec::new();
        };
        let matching = text
            .split(|b| *b == b'\n')
            .filter_map(|line| serde_json::from_slice::<SandboxEvent>(line).ok())
            .filter(|e| q.matches(e));
        match q.order.unwrap_or_default() {
            EventOrder::Asc => matching.take(q.limit()).collect(),
            EventOrder::Desc => {
                let all: Vec<_> = matching.collect();
                all.into_iter().rev().take(q.limit()).collect()
            }
        }
    }

    /// Deletes `sandbox`'s log (the sandbox is gone).
    pub fn remove(&self, sandbox: &str) {
        let Some(path) = self.path(sandbox) else {
            return;
        };
        let _held = self.write.lock().unwrap_or_else(|p| p.into_inner());
        if let Err(e) = std::fs::remove_file(&path) {
            if e.kind() != std::io::ErrorKind::NotFound {
                tracing::warn!(sandbox, "removing its event log: {e}");
            }
        }
    }
}

impl EventLog {
    /// Deletes the logs of sandboxes `exists` says are gone (a crash between a
    /// sandbox's record going and its log going leaves one behind).
    pub fn remove_orphans(&self, exists: impl Fn(&str) -> bool) {
        remove_orphan_logs(&self.dir, &self.write, exists);
    }
}

/// Deletes the `<sandbox>.jsonl` logs in `dir` of sandboxes `exists` says are gone,
/// each with `write` held.
pub(crate) fn remove_orphan_logs(dir: &Path, write: &Mutex<()>, exists: impl Fn(&str) -> bool) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let name = e.file_name();
        let name = name.to_string_lossy();
        let sandbox = name.strip_suffix(".jsonl").unwrap_or(&name);
        if !exists(sandbox) {
            let _held = write.lock().unwrap_or_else(|p| p.into_inner());
            let _ = std::fs::remove_file(e.path());
        }
    }
}

/// `<dir>/<sandbox>.jsonl`, for ids of the daemon's own (`sb-<hex>`); anything else
/// never names a file.
pub(crate) fn log_path(dir: &Path, sandbox: &str) -> Option<PathBuf> {
    let safe = !sandbox.is_empty()
        && sandbox.len() <= 64
        && sandbox
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
    safe.then(|| dir.join(format!("{sandbox}.jsonl")))
}

/// Appends `event` as one JSON line to the log at `path`, keeping it under
/// [`MAX_LOG_BYTES`]. Called with the log's writer lock held.
pub(crate) fn append(
    dir: &Path,
    path: &Path,
    event: &impl serde::Serialize,
) -> std::io::Result<()> {
    std::fs::create_dir_all(dir)?;
    let mut line = serde_json::to_vec(event).map_err(std::io::Error::other)?;
    line.push(b'\n');
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .read(true)
        .append(true)
        .open(path)?;
    // A line a crash tore ends here first, so that it alone is lost (readers skip it).
    let len = f.metadata()?.len();
    let mut last = [0u8];
    if len > 0 && f.read_at(&mut last, len - 1)? == 1 && last[0] != b'\n' {
        line.insert(0, b'\n');
    }
    // One write: a crash tears at most this line.
    f.write_all(&line)?;
    if f.metadata()?.len() > MAX_LOG_BYTES {
        drop(f);
        compact(path)?;
    }
    Ok(())
}

/// Keeps the newer half of the log at `path` (whole lines), replacing it atomically.
/// Called with [`EventLog::write`] held.
fn compact(path: &Path) -> std::io::Result<()> {
    let text = std::fs::read(path)?;
    let half = text.len() / 2;
    let start = text[half..]
        .iter()
        .position(|b| *b == b'\n')
        .map_or(text.len(), |i| half + i + 1);
    // One name is enough: the caller holds the only writer of this daemon's logs.
    let tmp = path.with_extension("jsonl.compacting");
    std::fs::write(&tmp, &text[start..])?;
    std::fs::rename(&tmp, path)
}

fn cut(s: &str) -> String {
    if s.len() <= MAX_TEXT {
        return s.to_string();
    }
    let mut end = MAX_TEXT;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &s[..end])
}

fn entry(level: EventLevel, message: &str, fields: &[(&str, String)]) -> SandboxEvent {
    SandboxEvent {
        ts_ms: now_ms(),
        level,
        message: cut(message),
        fields: fields
            .iter()
            .map(|(k, v)| (cut(k), cut(v)))
            .collect::<BTreeMap<_, _>>(),
    }
}

pub(crate) fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

#[cfg(test)]
#[path = "event_log_tests.rs"]
mod tests;
