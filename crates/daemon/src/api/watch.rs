//! `GET /v1/sandboxes/{id}/files/watch`: a guest directory's changes as an NDJSON
//! stream (`Manager::watch_dir`), with a `keepalive` line after [`KEEPALIVE`] of
//! silence: writing it is how a client that left without closing cleanly is noticed,
//! so its watch does not hold a guest watcher forever.
use std::time::Duration;

use axum::extract::{Path, State};
use axum::response::Response;
use tokio::sync::mpsc;

use super::ndjson::ndjson;
use super::{ApiQuery, AppState};
use crate::error::{ErrorBody, Result};
use crate::model::{FileWatchEvent, WatchQuery};

/// Silence after which a `keepalive` line is sent.
pub const KEEPALIVE: Duration = Duration::from_secs(15);

#[utoipa::path(get, path = "/v1/sandboxes/{id}/files/watch", tag = "files",
    params(("id" = String, Path, description = "Sandbox id"), WatchQuery),
    responses((status = 200, description = "NDJSON, one line per change as it happens: \
                `started` first, then `event` lines (`name` relative to the directory, \
                `kind` create/write/remove/rename/chmod/overflow), `keepalive` after 15 s \
                of silence; ends with `end` (the directory was removed) or `error`, or \
                when the client closes the connection", body = FileWatchEvent,
                content_type = "application/x-ndjson"),
              (status = 400, description = "Not an absolute path, or not a directory \
                (invalid_argument, guest_bad_request)", body = ErrorBody),
              (status = 404, description = "No such sandbox, or no such directory \
                (guest_not_found)", body = ErrorBody),
              (status = 409, description = "Sandbox not running", body = ErrorBody),
              (status = 429, description = "The guest runs as many watchers as it may (64), \
                or the tree has more directories than one watcher watches (8192): \
                guest_limit_reached, the message names the limit", body = ErrorBody),
              (status = 502, description = "The sandbox's agent cannot be reached \
                (agent_unreachable) or sent a malformed reply (agent_malformed_reply)", body = ErrorBody)))]
pub async fn watch(
    State(st): State<AppState>,
    Path(id): Path<String>,
    ApiQuery(q): ApiQuery<WatchQuery>,
) -> Result<Response> {
    let recursive = q.recursive.unwrap_or(false);
    let events = st.manager.watch_dir(&id, q.path, recursive).await?;
    let (tx, rx) = mpsc::channel(16);
    tokio::spawn(forward(events, tx));
    Ok(ndjson(rx))
}

/// `started`, the watch's events and keepalives, until the end or the client leaves
/// (then `events` is dropped, which ends the watch).
async fn forward(mut events: mpsc::Receiver<FileWatchEvent>, tx: mpsc::Sender<FileWatchEvent>) {
    if tx.send(FileWatchEvent::Started).await.is_err() {
        return;
    }
    loop {
        let line = tokio::select! {
            ev = events.recv() => match ev {
                Some(ev) => ev,
                None => return,
            },
            _ = tokio::time::sleep(KEEPALIVE) => FileWatchEvent::Keepalive,
            _ = tx.closed() => return,
        };
        let last = line.is_terminal();
        if tx.send(line).await.is_err() || last {
            return;
        }
    }
}
