//! E2B's snapshots: `create_snapshot` (`POST /sandboxes/{id}/snapshots`),
//! `list_snapshots` (`GET /snapshots`) and `delete_snapshot` (`DELETE
//! /templates/{id}`: to E2B a snapshot is a template, which is also why
//! `Sandbox.create(<snapshot id>)` starts from one, see `sandboxes::create`). Each is a
//! zygote full snapshot (memory, processes and files); the sandbox runs on.
//! Branch points (zygote's implicit snapshots, made by a fork) are not listed: E2B
//! shows only the snapshots a user asked for.
use axum::extract::rejection::QueryRejection;
use axum::extract::{Path, Query, Request, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Deserialize;

use super::page::{self, Page};
use super::{json_body, visible, ControlError};
use crate::api::AppState;
use crate::e2b::model::{NewSnapshot, SnapshotInfo};
use crate::error::Error;
use crate::model::{Snapshot, SnapshotRequest};

fn info(s: &Snapshot) -> SnapshotInfo {
    SnapshotInfo {
        snapshot_id: s.id.clone(),
        names: s.name.iter().cloned().collect(),
    }
}

/// `POST /sandboxes/{id}/snapshots` → 201 `{snapshotID, names}`.
pub(super) async fn create(
    State(st): State<AppState>,
    Path(id): Path<String>,
    req: Request,
) -> Result<Response, ControlError> {
    let body: NewSnapshot = json_body(req).await?;
    let (_, state) = visible(&st, &id)?;
    let cannot = |state: &str| {
        ControlError::Conflict(format!(
            "Sandbox '{id}' cannot be snapshotted while in '{state}' state"
        ))
    };
    if state != "running" {
        return Err(cannot(state));
    }
    let request = SnapshotRequest {
        sandbox: id.clone(),
        kind: None,
        name: body.name.filter(|n| !n.is_empty()),
    };
    // In a task of its own: a client that goes away does not cut the capture short.
    let manager = st.manager.clone();
    let snap = tokio::spawn(async move { manager.snapshot(request).await })
        .await
        .map_err(|e| Error::Internal(format!("snapshot task failed: {e}")))?
        .map_err(|e| match e {
            Error::Request(r) => ControlError::BadRequest(format!("Invalid name: {r}")),
            Error::Paused(_) => cannot("paused"),
            Error::NotRunning { state, .. } | Error::WrongState { state, .. } => cannot(&state),
            e => ControlError::about_sandbox(&id, e),
        })?;
    Ok((StatusCode::CREATED, Json(info(&snap))).into_response())
}

#[derive(Debug, Deserialize)]
pub(super) struct SnapshotQuery {
    #[serde(rename = "sandboxID")]
    sandbox_id: Option<String>,
    name: Option<String>,
    limit: Option<String>,
    #[serde(rename = "nextToken")]
    next_token: Option<String>,
}

/// `GET /snapshots?sandboxID=&name=&limit=&nextToken=`, newest first, paged; `name`
/// matches a snapshot's name or id (as E2B's).
pub(super) async fn list(
    State(st): State<AppState>,
    query: Result<Query<SnapshotQuery>, QueryRejection>,
) -> Result<Response, ControlError> {
    let Query(q) = query.map_err(|e| ControlError::BadRequest(e.body_text()))?;
    let page = Page::new(
        q.limit.as_deref(),
        q.next_token.as_deref(),
        page::Order::Desc,
    )?;
    let shown: Vec<Snapshot> = st
        .manager
        .snapshots()?
        .into_iter()
        .filter(|s| !s.implicit)
        // The snapshots of template builds are the templates', not the user's.
        .filter(|s| !st.manager.db.template_owns_snapshot(&s.id).unwrap_or(false))
        .filter(|s| {
            q.sandbox_id
                .as_ref()
                .is_none_or(|id| *id == s.source_sandbox)
        })
        .filter(|s| {
            q.name
                .as_ref()
                .is_none_or(|n| s.name.as_ref() == Some(n) || s.id == *n)
        })
        .collect();
    let (items, next) = page.take(shown, |s| (s.created_at, s.id.as_str()));
    Ok(page::answer(items.iter().map(info).collect(), next))
}

/// `DELETE /templates/{id}` (`delete_snapshot`): 204, 404 (the SDK returns False), or
/// E2B's 400 while a sandbox still uses it (in zygote: its disk reads the snapshot's
/// layer, which includes the sandbox it was taken of).
pub(super) async fn delete(
    State(st): State<AppState>,
    Path(id): Path<String>,
) -> Result<StatusCode, ControlError> {
    if super::templates::delete_template(&st, &id)?.is_some() {
        return Ok(StatusCode::NO_CONTENT);
    }
    match st.manager.delete_snapshot(&id) {
        Ok(()) => Ok(StatusCode::NO_CONTENT),
        Err(Error::NotFound { .. }) => Err(ControlError::TemplateNotFound(id)),
        Err(Error::SnapshotInUse { .. }) => Err(ControlError::BadRequest(format!(
            "cannot delete template '{id}' because there are running sandboxes using it"
        ))),
        Err(e) => Err(ControlError::Zygote(e)),
    }
}
