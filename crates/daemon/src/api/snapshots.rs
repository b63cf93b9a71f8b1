//! Snapshot routes.
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::Json;

use super::{ApiJson, AppState};
use crate::error::{ErrorBody, Result};
use crate::model::{Snapshot, SnapshotList, SnapshotRequest};

#[utoipa::path(get, path = "/v1/snapshots", tag = "snapshots",
    responses((status = 200, description = "All snapshots with lineage", body = SnapshotList)))]
pub async fn list(State(st): State<AppState>) -> Result<Json<SnapshotList>> {
    Ok(Json(SnapshotList {
        snapshots: st.manager.snapshots()?,
    }))
}

#[utoipa::path(post, path = "/v1/snapshots", tag = "snapshots", request_body = SnapshotRequest,
    responses((status = 201, description = "Snapshot taken; the sandbox keeps running", body = Snapshot),
              (status = 400, description = "Invalid request", body = ErrorBody),
              (status = 404, description = "No such sandbox", body = ErrorBody),
              (status = 409, description = "Sandbox not running", body = ErrorBody),
              (status = 422, description = "The runtime cannot take this kind", body = ErrorBody)))]
pub async fn create(
    State(st): State<AppState>,
    ApiJson(req): ApiJson<SnapshotRequest>,
) -> Result<(StatusCode, Json<Snapshot>)> {
    Ok((StatusCode::CREATED, Json(st.manager.snapshot(req).await?)))
}

#[utoipa::path(get, path = "/v1/snapshots/{id}", tag = "snapshots",
    params(("id" = String, Path, description = "Snapshot id")),
    responses((status = 200, description = "The snapshot", body = Snapshot),
              (status = 404, description = "No such snapshot", body = ErrorBody)))]
pub async fn get(State(st): State<AppState>, Path(id): Path<String>) -> Result<Json<Snapshot>> {
    Ok(Json(st.manager.snapshot_get(&id)?))
}

#[utoipa::path(delete, path = "/v1/snapshots/{id}", tag = "snapshots",
    params(("id" = String, Path, description = "Snapshot id")),
    responses((status = 204, description = "Deleted"),
              (status = 404, description = "No such snapshot", body = ErrorBody),
              (status = 409, description = "Sandboxes or snapshots depend on it (snapshot_in_use)", body = ErrorBody)))]
pub async fn delete(State(st): State<AppState>, Path(id): Path<String>) -> Result<StatusCode> {
    st.manager.delete_snapshot(&id)?;
    Ok(StatusCode::NO_CONTENT)
}
