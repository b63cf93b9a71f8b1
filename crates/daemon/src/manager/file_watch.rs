//! Watching a guest directory: the agent's `watch` stream (inotify in the guest),
//! bridged to async callers (the REST route, E2B's WatchDir and watchers) through a
//! bounded channel.
//!
//! The agent client is blocking: one blocking-pool thread takes the agent's events as
//! they arrive and offers each to the channel without waiting. The agent connection's
//! own queue is unbounded, so the thread must never stop taking: when the caller reads
//! too slowly and the channel is full, events are dropped and one `overflow` event is
//! put in their place as soon as there is room, so memory stays bounded and the
//! caller knows it missed some. The thread notices a caller that went away (the
//! receiver dropped) within [`POLL`], drops its handle, and that ends the watch in the
//! guest (`unwatch`).
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc::{self, error::TrySendError};
use zygote_proto::client::{WatchHandle, WatchNext};
use zygote_proto::watch::{WatchEventKind, WatchRequest};

use super::Manager;
use crate::error::{Error, Result};
use crate::model::{validate_guest_path, FileWatchEvent};

/// Events buffered between the guest and a slow reader.
pub const WATCH_QUEUE: usize = 1024;

/// How often the pump looks whether its reader is still there while nothing happens.
const POLL: Duration = Duration::from_millis(500);

impl Manager {
    /// Watches the guest directory `path` of sandbox `id`. Returns once the agent
    /// watches it (errors before that: no such sandbox or directory, not a directory,
    /// a guest limit); the events then arrive on the receiver, ended by `End` or
    /// `Error`. Dropping the receiver ends the watch.
    pub async fn watch_dir(
        self: &Arc<Self>,
        id: &str,
        path: String,
        recursive: bool,
    ) -> Result<mpsc::Receiver<FileWatchEvent>> {
        validate_guest_path(&path)?;
        let client = self.agent(id).await?;
        let req = WatchRequest { path, recursive };
        // If this future is dropped meanwhile, the handle is dropped with the blocking
        // task's result, which ends the watch.
        let handle = self
            .blocking(move || client.watch(req))
            .await?
            .map_err(Error::agent)?;
        let (tx, rx) = mpsc::channel(WATCH_QUEUE);
        tokio::task::spawn_blocking(move || pump(handle, tx));
        Ok(rx)
    }
}

/// The blocking side: agent events into `tx` until the watch ends or nobody reads.
fn pump(mut handle: WatchHandle, tx: mpsc::Sender<FileWatchEvent>) {
    let mut lost = false;
    loop {
        if tx.is_closed() {
            return; // dropping the handle ends the watch in the guest
        }
        let events = match handle.next(POLL) {
            Ok(WatchNext::Events(events)) => events,
            Ok(WatchNext::Idle) => Vec::new(),
            Ok(WatchNext::Ended) => {
                let _ = tx.blocking_send(FileWatchEvent::End);
                return;
            }
            Err(e) => {
                let body = Error::agent(e).body();
                let _ = tx.blocking_send(FileWatchEvent::Error {
                    code: body.error.code,
                    message: body.error.message,
                });
                return;
            }
        };
        if lost {
            lost = !offer(&tx, overflow());
        }
        for ev in events {
            let ev = FileWatchEvent::Event {
                name: ev.name,
                kind: ev.kind.as_str().into(),
            };
            if lost || !offer(&tx, ev) {
                lost = true;
            }
        }
    }
}

fn overflow() -> FileWatchEvent {
    FileWatchEvent::Event {
        name: String::new(),
        kind: WatchEventKind::Overflow.as_str().into(),
    }
}

/// Put `ev` in the channel if there is room now (a closed channel counts as taken:
/// the loop notices it).
fn offer(tx: &mpsc::Sender<FileWatchEvent>, ev: FileWatchEvent) -> bool {
    !matches!(tx.try_send(ev), Err(TrySendError::Full(_)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_full_queue_drops_events_and_offers_one_overflow_in_their_place() {
        let (tx, mut rx) = mpsc::channel(2);
        let ev = |n: &str| FileWatchEvent::Event {
            name: n.into(),
            kind: "create".into(),
        };
        assert!(offer(&tx, ev("a")));
        assert!(offer(&tx, ev("b")));
        assert!(!offer(&tx, ev("c")), "the queue is full");
        assert_eq!(rx.try_recv().unwrap(), ev("a"));
        assert!(offer(&tx, overflow()));
        assert_eq!(rx.try_recv().unwrap(), ev("b"));
        assert_eq!(rx.try_recv().unwrap(), overflow());
        drop(rx);
        assert!(offer(&tx, ev("d")), "a closed channel is not full");
    }
}
