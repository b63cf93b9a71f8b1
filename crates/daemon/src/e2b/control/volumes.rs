//! E2B's volumes (`Volume.create/list/get_info/destroy`): `POST`/`GET /volumes`,
//! `GET`/`DELETE /volumes/{id}`, on zygote's named volumes (`crate::manager::volumes`).
//! E2B's create names no size: the volume gets zygote's default. The answer's `token`
//! is the volume's own bearer token for the volume content API (never the daemon's).
use axum::extract::{Path, Request, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;

use super::{json_body, ControlError};
use crate::api::AppState;
use crate::db::VolumeRow;
use crate::e2b::model::{ListedVolume, NewVolume, VolumeAndToken};
use crate::error::Error;
use crate::model::CreateVolumeRequest;

fn with_token(v: &VolumeRow) -> VolumeAndToken {
    VolumeAndToken {
        volume_id: v.id.clone(),
        name: v.name.clone(),
        token: v.token.clone(),
    }
}

/// A daemon error about volume `id`, E2B's 404 when there is none.
fn about_volume(id: &str, e: Error) -> ControlError {
    match e {
        Error::NotFound { .. } => ControlError::VolumeNotFound(id.to_string()),
        Error::Request(r) => ControlError::BadRequest(r.to_string()),
        e => ControlError::Zygote(e),
    }
}

/// `POST /volumes {"name"}` → 201 VolumeAndToken.
pub(super) async fn create(
    State(st): State<AppState>,
    req: Request,
) -> Result<Response, ControlError> {
    let body: NewVolume = json_body(req).await?;
    let request = CreateVolumeRequest {
        name: body.name.clone(),
        size_mib: None,
    };
    let manager = st.manager.clone();
    // In a task of its own: a client that goes away does not cut the create short.
    let made = tokio::spawn(async move { manager.create_volume(request).await })
        .await
        .map_err(|e| Error::Internal(format!("volume create task failed: {e}")))?
        .map_err(|e| about_volume(&body.name, e))?;
    let row = st
        .manager
        .volume_with_token(&made.id)
        .map_err(|e| about_volume(&made.id, e))?;
    Ok((StatusCode::CREATED, Json(with_token(&row))).into_response())
}

/// `GET /volumes` → `[{"volumeID", "name"}]`.
pub(super) async fn list(State(st): State<AppState>) -> Result<Response, ControlError> {
    let all: Vec<ListedVolume> = st
        .manager
        .volumes()?
        .into_iter()
        .map(|v| ListedVolume {
            volume_id: v.id,
            name: v.name,
        })
        .collect();
    Ok(Json(all).into_response())
}

/// `GET /volumes/{id}` → VolumeAndToken.
pub(super) async fn get_info(
    State(st): State<AppState>,
    Path(id): Path<String>,
) -> Result<Response, ControlError> {
    let row = st
        .manager
        .volume_with_token(&id)
        .map_err(|e| about_volume(&id, e))?;
    Ok(Json(with_token(&row)).into_response())
}

/// `DELETE /volumes/{id}` → 204 (409 while a sandbox has it mounted).
pub(super) async fn destroy(
    State(st): State<AppState>,
    Path(id): Path<String>,
) -> Result<Response, ControlError> {
    match st.manager.delete_volume(&id).await {
        Ok(()) => Ok(StatusCode::NO_CONTENT.into_response()),
        Err(Error::Conflict(m)) => Err(ControlError::Conflict(m)),
        Err(e) => Err(about_volume(&id, e)),
    }
}
