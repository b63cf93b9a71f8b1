//! Pause to disk and resume (`crate::manager::pause`).
use axum::extract::{Path, State};
use axum::Json;

use super::AppState;
use crate::error::{ErrorBody, Result};
use crate::model::Sandbox;

#[utoipa::path(post, path = "/v1/sandboxes/{id}/pause", tag = "sandboxes",
    params(("id" = String, Path, description = "Sandbox id")),
    responses((status = 200, description = "Paused: its memory and device state are on disk, \
                its VM process is gone (`pid` null, `paused_at` set); it keeps its id, files, \
                network and lineage, and its TTL stops running", body = Sandbox),
              (status = 404, description = "No such sandbox", body = ErrorBody),
              (status = 409, description = "Not running (wrong_state: e.g. already paused; \
                sandbox_not_running: dead or busy)", body = ErrorBody),
              (status = 500, description = "The runtime could not save the VM (it runs on \
                unchanged)", body = ErrorBody),
              (status = 507, description = "No room for the saved memory (no_space)", body = ErrorBody)))]
pub async fn pause(State(st): State<AppState>, Path(id): Path<String>) -> Result<Json<Sandbox>> {
    Ok(Json(st.manager.pause(&id).await?))
}

#[utoipa::path(post, path = "/v1/sandboxes/{id}/resume", tag = "sandboxes",
    params(("id" = String, Path, description = "Sandbox id")),
    responses((status = 200, description = "Running again where it was paused: same processes, \
                files and network, its clock stepped to now, its TTL running again with what \
                it had left", body = Sandbox),
              (status = 404, description = "No such sandbox", body = ErrorBody),
              (status = 409, description = "Not paused (wrong_state)", body = ErrorBody),
              (status = 500, description = "The VM did not come back (the sandbox stays paused, \
                its state kept)", body = ErrorBody)))]
pub async fn resume(State(st): State<AppState>, Path(id): Path<String>) -> Result<Json<Sandbox>> {
    Ok(Json(st.manager.resume(&id).await?))
}
