//! E2B's volume content API (`Volume.read_file`, `write_file`, `list`, `make_dir`,
//! `get_info`, `update_metadata`, `remove`): `/volumecontent/{id}/{file,dir,path}`,
//! served under `/e2b` (the SDK's `E2B_VOLUME_API_URL` is the same as `E2B_API_URL`).
//!
//! Auth is the volume's own token (`Authorization: Bearer`, from VolumeAndToken),
//! compared in constant time; the daemon's token is not taken here, and neither
//! reaches a guest. The files are reached through a guest that has the volume
//! mounted (`crate::manager::volume_guest`): the host never mounts a volume.
use axum::extract::{Path, Query, Request, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use serde::{Deserialize, Serialize};
use tokio_stream::wrappers::ReceiverStream;
use zygote_proto::{FileKind, Metadata, Owner, TreeOp};

use super::{json_body, ControlError};
use crate::api::AppState;
use crate::e2b::time::rfc3339;
use crate::error::Error;
use crate::manager::{FileBody, VolumeGuest};
use crate::model::MAX_FILE_BYTES;
use crate::token::token_matches;

/// The deepest `GET dir` listing (E2B's default is 1).
const MAX_DEPTH: u32 = 16;
/// Entries one listing returns at most (the daemon holds them all in memory).
const MAX_ENTRIES: usize = 10_000;

/// The routes (they authenticate by volume token, not by the API key).
pub(super) fn router() -> Router<AppState> {
    Router::new()
        .route("/volumecontent/{id}/file", get(read_file).put(write_file))
        .route("/volumecontent/{id}/dir", get(list_dir).post(make_dir))
        .route(
            "/volumecontent/{id}/path",
            get(stat).patch(set_metadata).delete(remove),
        )
}

/// VolumeEntryStat.
#[derive(Debug, Serialize)]
struct EntryStat {
    name: String,
    #[serde(rename = "type")]
    kind: &'static str,
    path: String,
    size: u64,
    mode: u32,
    uid: u32,
    gid: u32,
    atime: String,
    mtime: String,
    ctime: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    target: Option<String>,
}

fn entry(path: &str, m: &Metadata) -> EntryStat {
    let kind = match m.kind {
        FileKind::File => "file",
        FileKind::Dir => "directory",
        FileKind::Symlink => "symlink",
        _ => "unknown",
    };
    // The agent reports the modification time only: E2B's three times show it.
    let t = rfc3339(u64::try_from(m.mtime).unwrap_or(0));
    EntryStat {
        name: path.rsplit('/').next().unwrap_or_default().to_string(),
        kind,
        path: if path.is_empty() {
            "/".into()
        } else {
            path.to_string()
        },
        size: m.size,
        mode: m.mode,
        uid: m.uid,
        gid: m.gid,
        atime: t.clone(),
        mtime: t.clone(),
        ctime: t,
        target: m.symlink_target.clone(),
    }
}

#[derive(Debug, Deserialize)]
struct PathQuery {
    path: String,
    depth: Option<u32>,
    uid: Option<u32>,
    gid: Option<u32>,
    mode: Option<u32>,
    force: Option<bool>,
}

#[derive(Debug, Default, Deserialize)]
struct MetadataPatch {
    uid: Option<u32>,
    gid: Option<u32>,
    mode: Option<u32>,
}

/// The volume `id` if `headers` carry its token (one answer for a wrong token and an
/// unknown volume: nothing tells which volumes exist), and the guest serving it.
async fn authorized(
    st: &AppState,
    id: &str,
    headers: &HeaderMap,
) -> Result<VolumeGuest, ControlError> {
    let given = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| {
            v.strip_prefix("Bearer ")
                .or_else(|| v.strip_prefix("bearer "))
        })
        .map(str::trim)
        .unwrap_or_default();
    let known = st.manager.volume_with_token(id).ok().filter(|v| v.id == id);
    let ok = known
        .as_ref()
        .is_some_and(|v| token_matches(given.as_bytes(), v.token.as_bytes()));
    if !ok {
        return Err(ControlError::InvalidVolumeToken);
    }
    Ok(st.manager.volume_guest(id).await?)
}

/// The volume-relative form of `path` (`/` for the root), and its guest path.
fn paths(g: &VolumeGuest, path: &str) -> Result<(String, String), ControlError> {
    let guest = g
        .guest_path(path)
        .map_err(|e| ControlError::BadRequest(e.to_string()))?;
    let rel = guest[g.root.trim_end_matches('/').len()..].to_string();
    Ok((if rel.is_empty() { "/".into() } else { rel }, guest))
}

/// A guest error about `path`, E2B's 404 when it does not exist.
fn about_path(path: &str, e: Error) -> ControlError {
    match e.status_code().1 {
        "guest_not_found" => ControlError::PathNotFound(path.to_string()),
        _ => ControlError::Zygote(e),
    }
}

async fn stat_entry(
    st: &AppState,
    g: &VolumeGuest,
    rel: &str,
    guest: &str,
) -> Result<EntryStat, ControlError> {
    let m = st
        .manager
        .stat_path(&g.sandbox, guest, false)
        .await
        .map_err(|e| about_path(rel, e))?;
    Ok(entry(rel, &m))
}

/// Sets owner and mode of `guest` as the query or patch asks.
async fn apply_metadata(
    st: &AppState,
    g: &VolumeGuest,
    guest: &str,
    uid: Option<u32>,
    gid: Option<u32>,
    mode: Option<u32>,
) -> Result<(), ControlError> {
    let mut ops = Vec::new();
    if uid.is_some() || gid.is_some() {
        let m = st.manager.stat_path(&g.sandbox, guest, false).await?;
        ops.push(TreeOp::Chown {
            path: guest.to_string(),
            uid: uid.unwrap_or(m.uid),
            gid: gid.unwrap_or(m.gid),
        });
    }
    if let Some(mode) = mode {
        ops.push(TreeOp::Chmod {
            path: guest.to_string(),
            mode: mode & 0o7777,
        });
    }
    if !ops.is_empty() {
        st.manager.apply_ops(&g.sandbox, ops).await?;
    }
    Ok(())
}

async fn read_file(
    State(st): State<AppState>,
    Path(id): Path<String>,
    Query(q): Query<PathQuery>,
    headers: HeaderMap,
) -> Result<Response, ControlError> {
    let g = authorized(&st, &id, &headers).await?;
    let (rel, guest) = paths(&g, &q.path)?;
    let body = st
        .manager
        .read_file(&g.sandbox, guest, false)
        .await
        .map_err(|e| about_path(&rel, e))?;
    let octets = [(header::CONTENT_TYPE, "application/octet-stream")];
    Ok(match body {
        FileBody::Whole(data) => (octets, data).into_response(),
        FileBody::Stream { chunks, .. } => (
            octets,
            axum::body::Body::from_stream(ReceiverStream::new(chunks)),
        )
            .into_response(),
    })
}

async fn write_file(
    State(st): State<AppState>,
    Path(id): Path<String>,
    Query(q): Query<PathQuery>,
    req: Request,
) -> Result<Response, ControlError> {
    let g = authorized(&st, &id, req.headers()).await?;
    let (rel, guest) = paths(&g, &q.path)?;
    let (_, data) = crate::api::read_body(req, MAX_FILE_BYTES, "a file")
        .await
        .map_err(ControlError::Zygote)?;
    let owner = match (q.uid, q.gid) {
        (None, None) => None,
        (uid, gid) => Some(Owner {
            uid: uid.unwrap_or(0),
            gid: gid.unwrap_or(0),
        }),
    };
    let mode = q.mode.map(|m| format!("{:o}", m & 0o7777));
    st.manager
        .write_file(&g.sandbox, guest.clone(), mode, owner, data.to_vec())
        .await
        .map_err(|e| about_path(&rel, e))?;
    let stat = stat_entry(&st, &g, &rel, &guest).await?;
    Ok((StatusCode::CREATED, Json(stat)).into_response())
}

async fn list_dir(
    State(st): State<AppState>,
    Path(id): Path<String>,
    Query(q): Query<PathQuery>,
    headers: HeaderMap,
) -> Result<Response, ControlError> {
    let g = authorized(&st, &id, &headers).await?;
    let (rel, guest) = paths(&g, &q.path)?;
    let depth = q.depth.unwrap_or(1).clamp(1, MAX_DEPTH);
    let mut out = Vec::new();
    let mut level = vec![(rel.trim_end_matches('/').to_string(), guest)];
    for d in 0..depth {
        let mut next = Vec::new();
        for (rel_dir, guest_dir) in level {
            let entries = match st.manager.dir_entries(&g.sandbox, &guest_dir).await {
                Ok(e) => e,
                // Below the first level, a directory that went away is skipped.
                Err(e) if d > 0 => {
                    tracing::debug!("listing {guest_dir}: {e}");
                    continue;
                }
                Err(e) => return Err(about_path(&rel, e)),
            };
            for e in entries {
                let (r, gp) = (
                    format!("{rel_dir}/{}", e.name),
                    format!("{guest_dir}/{}", e.name),
                );
                if e.meta.kind == FileKind::Dir {
                    next.push((r.clone(), gp));
                }
                out.push(entry(&r, &e.meta));
                if out.len() > MAX_ENTRIES {
                    return Err(ControlError::BadRequest(format!(
                        "more than {MAX_ENTRIES} entries: list a smaller depth or a subdirectory"
                    )));
                }
            }
        }
        level = next;
    }
    Ok(Json(out).into_response())
}

async fn make_dir(
    State(st): State<AppState>,
    Path(id): Path<String>,
    Query(q): Query<PathQuery>,
    headers: HeaderMap,
) -> Result<Response, ControlError> {
    let g = authorized(&st, &id, &headers).await?;
    let (rel, guest) = paths(&g, &q.path)?;
    if !q.force.unwrap_or(false) {
        // Without `force` the parent must exist (mkdir, not mkdir -p).
        let parent = guest.rsplit_once('/').map(|(p, _)| p).unwrap_or("/");
        let parent = if parent.is_empty() { "/" } else { parent };
        st.manager
            .stat_path(&g.sandbox, parent, true)
            .await
            .map_err(|e| about_path(&rel, e))?;
    }
    let owner = (q.uid.is_some() || q.gid.is_some()).then(|| Owner {
        uid: q.uid.unwrap_or(0),
        gid: q.gid.unwrap_or(0),
    });
    let made = st
        .manager
        .make_dir(&g.sandbox, &guest, owner)
        .await
        .map_err(|e| about_path(&rel, e))?;
    if !made && !q.force.unwrap_or(false) {
        return Err(ControlError::Conflict(format!("path {rel} already exists")));
    }
    apply_metadata(&st, &g, &guest, None, None, q.mode).await?;
    let stat = stat_entry(&st, &g, &rel, &guest).await?;
    Ok((StatusCode::CREATED, Json(stat)).into_response())
}

async fn stat(
    State(st): State<AppState>,
    Path(id): Path<String>,
    Query(q): Query<PathQuery>,
    headers: HeaderMap,
) -> Result<Response, ControlError> {
    let g = authorized(&st, &id, &headers).await?;
    let (rel, guest) = paths(&g, &q.path)?;
    Ok(Json(stat_entry(&st, &g, &rel, &guest).await?).into_response())
}

async fn set_metadata(
    State(st): State<AppState>,
    Path(id): Path<String>,
    Query(q): Query<PathQuery>,
    req: Request,
) -> Result<Response, ControlError> {
    let g = authorized(&st, &id, req.headers()).await?;
    let (rel, guest) = paths(&g, &q.path)?;
    let patch: MetadataPatch = json_body(req).await?;
    stat_entry(&st, &g, &rel, &guest).await?;
    apply_metadata(&st, &g, &guest, patch.uid, patch.gid, patch.mode).await?;
    Ok(Json(stat_entry(&st, &g, &rel, &guest).await?).into_response())
}

async fn remove(
    State(st): State<AppState>,
    Path(id): Path<String>,
    Query(q): Query<PathQuery>,
    headers: HeaderMap,
) -> Result<Response, ControlError> {
    let g = authorized(&st, &id, &headers).await?;
    let (rel, guest) = paths(&g, &q.path)?;
    if rel == "/" {
        return Err(ControlError::BadRequest(
            "the volume's root cannot be removed".into(),
        ));
    }
    stat_entry(&st, &g, &rel, &guest).await?;
    st.manager
        .remove_path(&g.sandbox, &guest, true)
        .await
        .map_err(|e| about_path(&rel, e))?;
    Ok(StatusCode::NO_CONTENT.into_response())
}
