//! Watching a directory: the agent streams the changes the kernel (inotify) reports
//! under it until the host sends `unwatch` or goes away.
//!
//! `watch` is answered with `watch_started` once the directory is watched (or with an
//! error: not found, not a directory, a limit), then with `watch_events` frames as
//! changes happen, and ends with `ok` after an `unwatch` naming it. Names are relative
//! to the watched directory ('/'-separated below it when `recursive`), never absolute,
//! so a reader never learns more of the guest's tree than it asked about.
//!
//! Everything is bounded: watches per watcher ([`MAX_WATCHES_PER_WATCHER`]) and per
//! agent ([`MAX_WATCHES_TOTAL`]), watchers per agent ([`MAX_WATCHERS`]), events per
//! frame ([`MAX_EVENTS_PER_FRAME`]). Events the kernel could not queue, or that
//! happen in a new subdirectory the limits do not let the agent watch, are not
//! silently lost: an [`WatchEventKind::Overflow`] event says so.

use serde::{Deserialize, Serialize};

/// Watchers open at once in one guest, over every connection.
pub const MAX_WATCHERS: usize = 64;

/// Directories one recursive watcher watches at most.
pub const MAX_WATCHES_PER_WATCHER: usize = 8192;

/// Directories watched at most over every watcher of the guest.
pub const MAX_WATCHES_TOTAL: usize = 32768;

/// Most events one `watch_events` frame carries.
pub const MAX_EVENTS_PER_FRAME: usize = 1024;

/// Watch the absolute directory `path`; with `recursive`, every directory below it
/// too, including ones created while it is watched.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WatchRequest {
    pub path: String,
    #[serde(default)]
    pub recursive: bool,
}

/// End the watch started by the `watch` request `watch_id` on the same connection.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct UnwatchRequest {
    pub watch_id: u64,
}

/// What happened to an entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum WatchEventKind {
    /// Created, or moved in (inotify IN_CREATE, IN_MOVED_TO).
    Create,
    /// Its contents changed (IN_MODIFY).
    Write,
    /// Removed (IN_DELETE, IN_DELETE_SELF).
    Remove,
    /// Moved away from this name (IN_MOVED_FROM, IN_MOVE_SELF).
    Rename,
    /// Its metadata changed: mode, owner, times (IN_ATTRIB).
    Chmod,
    /// Events were lost: the queue was full (`name` empty), or the directory `name`
    /// could not be watched (a limit was reached), so changes in it are not reported.
    Overflow,
}

impl WatchEventKind {
    /// The name on the wire.
    pub fn as_str(self) -> &'static str {
        match self {
            WatchEventKind::Create => "create",
            WatchEventKind::Write => "write",
            WatchEventKind::Remove => "remove",
            WatchEventKind::Rename => "rename",
            WatchEventKind::Chmod => "chmod",
            WatchEventKind::Overflow => "overflow",
        }
    }
}

/// One change: the entry's name relative to the watched directory ("" for the
/// directory itself) and what happened to it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WatchEvent {
    pub name: String,
    pub kind: WatchEventKind,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Request, RequestFrame, Response, ResponseFrame};

    #[test]
    fn watch_frames_have_their_documented_shapes() {
        let req: RequestFrame =
            serde_json::from_str(r#"{"id":3,"type":"watch","path":"/tmp","recursive":true}"#)
                .unwrap();
        assert_eq!(
            req.request,
            Request::Watch(WatchRequest {
                path: "/tmp".into(),
                recursive: true
            })
        );
        let ev = ResponseFrame {
            id: 3,
            response: Response::WatchEvents {
                events: vec![WatchEvent {
                    name: "a/b".into(),
                    kind: WatchEventKind::Chmod,
                }],
            },
        };
        assert_eq!(
            serde_json::to_string(&ev).unwrap(),
            r#"{"id":3,"type":"watch_events","events":[{"name":"a/b","kind":"chmod"}]}"#
        );
        assert!(!ev.response.is_terminal());
        assert!(!Response::WatchStarted.is_terminal());
        assert!(Request::TYPES.contains(&"unwatch"));
    }
}
