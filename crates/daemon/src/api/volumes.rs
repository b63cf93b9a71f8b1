//! Named volume routes: ext4 volumes that outlive sandboxes, mounted at create
//! (`volumes` in `POST /v1/sandboxes`); see `crate::manager::volumes`.
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::Json;

use super::{ApiJson, AppState};
use crate::error::{ErrorBody, Result};
use crate::model::{CreateVolumeRequest, Volume, VolumeList};

#[utoipa::path(get, path = "/v1/volumes", tag = "volumes",
    responses((status = 200, description = "All volumes", body = VolumeList)))]
pub async fn list(State(st): State<AppState>) -> Result<Json<VolumeList>> {
    Ok(Json(VolumeList {
        volumes: st.manager.volumes()?,
    }))
}

#[utoipa::path(post, path = "/v1/volumes", tag = "volumes", request_body = CreateVolumeRequest,
    responses((status = 201, description = "Volume made (an empty ext4 filesystem)", body = Volume),
              (status = 400, description = "Invalid name or size", body = ErrorBody),
              (status = 409, description = "A volume with this name exists", body = ErrorBody)))]
pub async fn create(
    State(st): State<AppState>,
    ApiJson(req): ApiJson<CreateVolumeRequest>,
) -> Result<(StatusCode, Json<Volume>)> {
    Ok((
        StatusCode::CREATED,
        Json(st.manager.create_volume(req).await?),
    ))
}

#[utoipa::path(get, path = "/v1/volumes/{id}", tag = "volumes",
    params(("id" = String, Path, description = "Volume id or name")),
    responses((status = 200, description = "The volume", body = Volume),
              (status = 404, description = "No such volume", body = ErrorBody)))]
pub async fn get(State(st): State<AppState>, Path(id): Path<String>) -> Result<Json<Volume>> {
    Ok(Json(st.manager.volume_get(&id)?))
}

#[utoipa::path(delete, path = "/v1/volumes/{id}", tag = "volumes",
    params(("id" = String, Path, description = "Volume id or name")),
    responses((status = 204, description = "Deleted with its data"),
              (status = 404, description = "No such volume", body = ErrorBody),
              (status = 409, description = "Mounted in a sandbox (the message names it)", body = ErrorBody)))]
pub async fn delete(State(st): State<AppState>, Path(id): Path<String>) -> Result<StatusCode> {
    st.manager.delete_volume(&id).await?;
    Ok(StatusCode::NO_CONTENT)
}
