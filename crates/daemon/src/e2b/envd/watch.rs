//! envd's directory watching (`filesystem.Filesystem`), on zygote's native watch
//! (`Manager::watch_dir`: inotify in the guest's agent).
//!
//! - `WatchDir` (server stream; the async Python SDK and the JS SDK): `start`, then a
//!   `filesystem` event per change, `keepalive` after `Keepalive-Ping-Interval` seconds
//!   of silence; `connect-timeout-ms` (the SDK's watch `timeout`) ends it with
//!   `deadline_exceeded`. A client that goes away drops the stream, and with it the
//!   guest's watch.
//! - `CreateWatcher` / `GetWatcherEvents` / `RemoveWatcher` (unary; the sync Python SDK
//!   polls): a watcher is a task that takes the watch's events into a buffer kept here,
//!   in the daemon, under a random id (`w` + hex, as envd's `w` + id). Bounded: at most
//!   [`MAX_WATCHERS_PER_SANDBOX`] per sandbox (then `resource_exhausted`) and
//!   [`WATCHER_BUFFER`] events per watcher (then the newest are dropped and one
//!   `EVENT_TYPE_UNSPECIFIED` event marks the loss, which the SDK skips). A watcher is
//!   only found through the sandbox it was made in, and goes with that sandbox: its task
//!   removes it when the watch ends and the sandbox is gone, and every `CreateWatcher`
//!   drops the watchers of sandboxes that no longer exist.
//!
//! Names are relative to the watched directory (the directory itself is `.`, as Go's
//! `filepath.Rel` gives envd). Errors are envd's (I:packages/envd/internal/services/
//! filesystem/watch.go): a missing path is `not_found` `path P not found: stat P: no
//! such file or directory`; a file is `invalid_argument` `path P not a directory:
//! %!w(<nil>)` (envd wraps a nil error there, and Go prints it so); an unknown watcher
//! id is `not_found` `watcher with id W not found`. `includeEntry` is accepted, but the
//! events carry no `entry` yet (envd leaves it out when it cannot stat one too).
use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use axum::body::Body;
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use bytes::Bytes;
use futures_util::StreamExt;
use serde::{Deserialize, Serialize};
use tokio::sync::mpsc;
use tokio::time::Instant;

use super::connect::{self, Code, ConnectError};
use crate::error::Error;
use crate::manager::Manager;
use crate::model::FileWatchEvent;

/// Watchers (`CreateWatcher`) one sandbox may have at once.
pub const MAX_WATCHERS_PER_SANDBOX: usize = 16;

/// Events one watcher keeps until `GetWatcherEvents` takes them.
pub const WATCHER_BUFFER: usize = 4096;

/// `WatchDirRequest` and `CreateWatcherRequest` (the same fields), as proto3 JSON.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct WatchRequest {
    path: String,
    #[serde(default)]
    recursive: bool,
    #[serde(default, rename = "includeEntry")]
    _include_entry: bool,
    #[serde(default, rename = "allowNetworkMounts")]
    _allow_network_mounts: bool,
}

/// `GetWatcherEventsRequest` and `RemoveWatcherRequest`.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct WatcherRequest {
    watcher_id: String,
}

/// `FilesystemEvent`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct FilesystemEvent {
    name: String,
    #[serde(rename = "type")]
    kind: &'static str,
}

/// `WatchDirResponse`: its oneof `event` is the message's own field, so the JSON is
/// `{"start": {}}`, `{"filesystem": FilesystemEvent}` or `{"keepalive": {}}`.
#[derive(Debug, Serialize)]
#[serde(rename_all = "lowercase")]
enum WatchDirResponse {
    Start {},
    Filesystem(FilesystemEvent),
    Keepalive {},
}

/// The unary procedures of the watcher API.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unary {
    CreateWatcher,
    GetWatcherEvents,
    RemoveWatcher,
}

/// A zygote event as envd's `FilesystemEvent` (None: not a change).
fn envd_event(ev: &FileWatchEvent) -> Option<FilesystemEvent> {
    let FileWatchEvent::Event { name, kind } = ev else {
        return None;
    };
    let kind = match kind.as_str() {
        "create" => "EVENT_TYPE_CREATE",
        "write" => "EVENT_TYPE_WRITE",
        "remove" => "EVENT_TYPE_REMOVE",
        "rename" => "EVENT_TYPE_RENAME",
        "chmod" => "EVENT_TYPE_CHMOD",
        // `overflow` (events lost), and kinds a newer agent may add.
        _ => "EVENT_TYPE_UNSPECIFIED",
    };
    let name = if name.is_empty() { "." } else { name };
    Some(FilesystemEvent {
        name: name.to_string(),
        kind,
    })
}

fn parse<'a, T: Deserialize<'a>>(json: &'a [u8], what: &str) -> Result<T, ConnectError> {
    serde_json::from_slice(json)
        .map_err(|e| ConnectError::new(Code::InvalidArgument, format!("{what}: {e}")))
}

/// Starts the native watch, with its errors in envd's words.
async fn open(
    manager: &Arc<Manager>,
    id: &str,
    req: &WatchRequest,
) -> Result<mpsc::Receiver<FileWatchEvent>, ConnectError> {
    let path = &req.path;
    if !path.starts_with('/') {
        return Err(ConnectError::new(
            Code::InvalidArgument,
            format!("path '{path}' is relative: zygote's envd takes absolute paths only (for now)"),
        ));
    }
    manager
        .watch_dir(id, path.clone(), req.recursive)
        .await
        .map_err(|e| watch_error(path, &e))
}

fn watch_error(path: &str, e: &Error) -> ConnectError {
    match e.status_code() {
        (StatusCode::NOT_FOUND, "guest_not_found") => ConnectError::new(
            Code::NotFound,
            format!("path {path} not found: stat {path}: no such file or directory"),
        ),
        (StatusCode::BAD_REQUEST, "guest_bad_request") if e.to_string().contains("directory") => {
            ConnectError::new(
                Code::InvalidArgument,
                format!("path {path} not a directory: %!w(<nil>)"),
            )
        }
        _ => ConnectError::from_zygote(e),
    }
}

/// Serves `WatchDir` for sandbox `id`.
pub async fn watch_dir(
    manager: &Arc<Manager>,
    id: &str,
    headers: &HeaderMap,
    body: &[u8],
) -> Response {
    let opened = async {
        let req: WatchRequest = parse(connect::single_message(body)?, "WatchDirRequest")?;
        let deadline = connect::timeout_ms(headers)?
            .filter(|&t| t > 0)
            .map(|t| Instant::now() + Duration::from_millis(t));
        Ok::<_, ConnectError>((open(manager, id, &req).await?, deadline))
    };
    let (events, deadline) = match opened.await {
        Ok(o) => o,
        Err(e) => return e.stream_response(),
    };
    let (tx, rx) = mpsc::channel::<Bytes>(16);
    tokio::spawn(pump_stream(
        events,
        tx,
        connect::keepalive_interval(headers),
        deadline,
    ));
    let stream =
        tokio_stream::wrappers::ReceiverStream::new(rx).map(Ok::<Bytes, std::convert::Infallible>);
    connect::stream_response(Body::from_stream(stream))
}

/// `start`, the watch's events and keepalives as envelopes, then the end-stream one.
async fn pump_stream(
    mut events: mpsc::Receiver<FileWatchEvent>,
    tx: mpsc::Sender<Bytes>,
    keepalive: Duration,
    deadline: Option<Instant>,
) {
    let message = |event: WatchDirResponse| connect::message(&event);
    if tx.send(message(WatchDirResponse::Start {})).await.is_err() {
        return;
    }
    let past_deadline = async move {
        match deadline {
            Some(d) => tokio::time::sleep_until(d).await,
            None => std::future::pending().await,
        }
    };
    tokio::pin!(past_deadline);
    loop {
        let out = tokio::select! {
            ev = events.recv() => match ev {
                Some(FileWatchEvent::Error { message, .. }) => {
                    let e = ConnectError::new(Code::Internal, format!("watcher error: {message}"));
                    let _ = tx.send(e.end_stream()).await;
                    return;
                }
                // The directory is gone (or the watch ended): a clean end.
                Some(FileWatchEvent::End) | None => {
                    let _ = tx.send(connect::end_stream_ok()).await;
                    return;
                }
                Some(ev) => match envd_event(&ev) {
                    Some(fs) => message(WatchDirResponse::Filesystem(fs)),
                    None => continue,
                },
            },
            _ = &mut past_deadline => {
                let late = ConnectError::new(Code::DeadlineExceeded, "context deadline exceeded");
                let _ = tx.send(late.end_stream()).await;
                return;
            }
            _ = tokio::time::sleep(keepalive) => message(WatchDirResponse::Keepalive {}),
            _ = tx.closed() => return,
        };
        if tx.send(out).await.is_err() {
            return;
        }
    }
}

/// One watcher's events until they are taken, and how its watch ended.
#[derive(Default)]
struct Buffer {
    events: VecDeque<FilesystemEvent>,
    /// Events were dropped since the last take (the loss is marked once).
    lost: bool,
    /// The watch broke: `GetWatcherEvents` answers this from now on (as envd).
    error: Option<ConnectError>,
}

impl Buffer {
    fn push(&mut self, ev: FilesystemEvent) {
        if self.events.len() + 1 < WATCHER_BUFFER {
            self.events.push_back(ev);
        } else if !self.lost {
            self.lost = true;
            self.events.push_back(FilesystemEvent {
                name: String::new(),
                kind: "EVENT_TYPE_UNSPECIFIED",
            });
        }
    }

    fn take(&mut self) -> Vec<FilesystemEvent> {
        self.lost = false;
        self.events.drain(..).collect()
    }
}

struct Watcher {
    sandbox: String,
    buffer: Arc<Mutex<Buffer>>,
    task: tokio::task::AbortHandle,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// The daemon's watchers (`CreateWatcher`), over every sandbox.
#[derive(Default)]
pub struct Watchers {
    map: Mutex<HashMap<String, Watcher>>,
}

impl Drop for Watchers {
    fn drop(&mut self) {
        for w in lock(&self.map).values() {
            w.task.abort();
        }
    }
}

fn unknown(watcher_id: &str) -> ConnectError {
    ConnectError::new(
        Code::NotFound,
        format!("watcher with id {watcher_id} not found"),
    )
}

impl Watchers {
    /// Serves one unary watcher procedure for sandbox `id`; the JSON answer.
    pub async fn serve(
        self: &Arc<Self>,
        manager: &Arc<Manager>,
        id: &str,
        unary: Unary,
        body: &[u8],
    ) -> Result<serde_json::Value, ConnectError> {
        match unary {
            Unary::CreateWatcher => {
                let req: WatchRequest = parse(body, "CreateWatcherRequest")?;
                let watcher_id = self.create(manager, id, &req).await?;
                Ok(serde_json::json!({ "watcherId": watcher_id }))
            }
            Unary::GetWatcherEvents => {
                let req: WatcherRequest = parse(body, "GetWatcherEventsRequest")?;
                let events = self.take(id, &req.watcher_id)?;
                Ok(serde_json::json!({ "events": events }))
            }
            Unary::RemoveWatcher => {
                let req: WatcherRequest = parse(body, "RemoveWatcherRequest")?;
                self.remove(id, &req.watcher_id)?;
                Ok(serde_json::json!({}))
            }
        }
    }

    fn count(&self, sandbox: &str) -> usize {
        lock(&self.map)
            .values()
            .filter(|w| w.sandbox == sandbox)
            .count()
    }

    fn too_many() -> ConnectError {
        ConnectError::new(
            Code::ResourceExhausted,
            format!(
                "this sandbox has {MAX_WATCHERS_PER_SANDBOX} watchers, the most zygote keeps: \
                 remove one first (RemoveWatcher)"
            ),
        )
    }

    async fn create(
        self: &Arc<Self>,
        manager: &Arc<Manager>,
        id: &str,
        req: &WatchRequest,
    ) -> Result<String, ConnectError> {
        self.prune(manager);
        if self.count(id) >= MAX_WATCHERS_PER_SANDBOX {
            return Err(Self::too_many());
        }
        let events = open(manager, id, req).await?;
        let watcher_id = format!("w{}", crate::ids::random_hex(10));
        let buffer = Arc::new(Mutex::new(Buffer::default()));
        let mut map = lock(&self.map);
        // Checked again: other creates may have finished while this one waited.
        if map.values().filter(|w| w.sandbox == id).count() >= MAX_WATCHERS_PER_SANDBOX {
            return Err(Self::too_many()); // dropping `events` ends the guest's watch
        }
        let task = tokio::spawn(collect(
            events,
            buffer.clone(),
            Arc::downgrade(self),
            manager.clone(),
            watcher_id.clone(),
        ));
        map.insert(
            watcher_id.clone(),
            Watcher {
                sandbox: id.to_string(),
                buffer,
                task: task.abort_handle(),
            },
        );
        Ok(watcher_id)
    }

    fn take(&self, id: &str, watcher_id: &str) -> Result<Vec<FilesystemEvent>, ConnectError> {
        let map = lock(&self.map);
        let w = map
            .get(watcher_id)
            .filter(|w| w.sandbox == id)
            .ok_or_else(|| unknown(watcher_id))?;
        let mut buffer = lock(&w.buffer);
        if let Some(e) = &buffer.error {
            return Err(e.clone());
        }
        Ok(buffer.take())
    }

    fn remove(&self, id: &str, watcher_id: &str) -> Result<(), ConnectError> {
        let mut map = lock(&self.map);
        match map.get(watcher_id) {
            Some(w) if w.sandbox == id => {}
            _ => return Err(unknown(watcher_id)),
        }
        if let Some(w) = map.remove(watcher_id) {
            // The task holds the watch's receiver: ending it ends the guest's watch.
            w.task.abort();
        }
        Ok(())
    }

    /// Drops the watchers of sandboxes that no longer exist.
    fn prune(&self, manager: &Manager) {
        lock(&self.map).retain(|_, w| {
            let alive = sandbox_exists(manager, &w.sandbox);
            if !alive {
                w.task.abort();
            }
            alive
        });
    }
}

fn sandbox_exists(manager: &Manager, id: &str) -> bool {
    manager
        .get(id)
        .is_ok_and(|s| !matches!(s.state.as_str(), "dead" | "deleting"))
}

/// A watcher's task: the watch's events into its buffer until the watch ends; then, if
/// its sandbox is gone, the watcher goes too.
async fn collect(
    mut events: mpsc::Receiver<FileWatchEvent>,
    buffer: Arc<Mutex<Buffer>>,
    watchers: std::sync::Weak<Watchers>,
    manager: Arc<Manager>,
    watcher_id: String,
) {
    while let Some(ev) = events.recv().await {
        match &ev {
            FileWatchEvent::Error { message, .. } => {
                let e = ConnectError::new(Code::Internal, format!("watcher error: {message}"));
                lock(&buffer).error = Some(e);
                break;
            }
            FileWatchEvent::End => break,
            _ => {
                if let Some(fs) = envd_event(&ev) {
                    lock(&buffer).push(fs);
                }
            }
        }
    }
    if let Some(watchers) = watchers.upgrade() {
        let mut map = lock(&watchers.map);
        let gone = map
            .get(&watcher_id)
            .is_some_and(|w| !sandbox_exists(&manager, &w.sandbox));
        if gone {
            map.remove(&watcher_id);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_and_requests_have_envd_shapes() {
        let ev = |name: &str, kind: &str| FileWatchEvent::Event {
            name: name.into(),
            kind: kind.into(),
        };
        let fs = envd_event(&ev("a/b", "chmod")).unwrap();
        let msg = WatchDirResponse::Filesystem(fs);
        assert_eq!(
            serde_json::to_string(&msg).unwrap(),
            r#"{"filesystem":{"name":"a/b","type":"EVENT_TYPE_CHMOD"}}"#
        );
        let start = WatchDirResponse::Start {};
        assert_eq!(serde_json::to_string(&start).unwrap(), r#"{"start":{}}"#);
        assert_eq!(envd_event(&ev("", "remove")).unwrap().name, ".");
        assert_eq!(
            envd_event(&ev("", "overflow")).unwrap().kind,
            "EVENT_TYPE_UNSPECIFIED"
        );
        assert_eq!(envd_event(&FileWatchEvent::Keepalive), None);
        let req: WatchRequest = serde_json::from_str(
            r#"{"path":"/w","recursive":true,"includeEntry":true,"allowNetworkMounts":false}"#,
        )
        .unwrap();
        assert!(req.recursive);
        let w: WatcherRequest = serde_json::from_str(r#"{"watcherId":"w1"}"#).unwrap();
        assert_eq!(w.watcher_id, "w1");
    }

    #[test]
    fn a_full_buffer_keeps_the_oldest_and_marks_the_loss_once() {
        let mut b = Buffer::default();
        for i in 0..WATCHER_BUFFER + 10 {
            b.push(FilesystemEvent {
                name: i.to_string(),
                kind: "EVENT_TYPE_CREATE",
            });
        }
        let got = b.take();
        assert_eq!(got.len(), WATCHER_BUFFER);
        assert_eq!(got[0].name, "0");
        assert_eq!(got.last().unwrap().kind, "EVENT_TYPE_UNSPECIFIED");
        assert_eq!(
            got.iter()
                .filter(|e| e.kind == "EVENT_TYPE_UNSPECIFIED")
                .count(),
            1
        );
        b.push(FilesystemEvent {
            name: "after".into(),
            kind: "EVENT_TYPE_WRITE",
        });
        assert_eq!(b.take().len(), 1, "taking resets the loss");
    }
}
