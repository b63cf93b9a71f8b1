//! `POST /v1/images`: pulling OCI images through the daemon.
use axum::extract::State;
use axum::response::Response;

use super::ndjson::ndjson_job;
use super::{ApiJson, AppState};
use crate::error::{ErrorBody, Result};
use crate::model::{BuildEvent, Image, PullImageRequest, Validate};

#[utoipa::path(post, path = "/v1/images", tag = "images", request_body = PullImageRequest,
    responses((status = 200, description = "NDJSON stream of BuildEvent lines: `resolved`, `layer` \
                 progress and `progress` lines, then `done` with the image or `error` (codes: \
                 image_not_found, registry_unauthorized, unsupported_platform, bad_image, \
                 image_too_large (an unpack limit, named in the message), no_space (the \
                 host's disk), registry_error)",
               content_type = "application/x-ndjson", body = BuildEvent),
              (status = 400, description = "Not an image reference, or a username without a password", body = ErrorBody)))]
pub async fn pull(
    State(st): State<AppState>,
    ApiJson(req): ApiJson<PullImageRequest>,
) -> Result<Response> {
    req.validate()?;
    let manager = st.manager.clone();
    let reference = req.reference.clone();
    Ok(ndjson_job(
        move |progress| async move { manager.pull_image(&req, progress).await },
        move |outcome| match outcome {
            Ok(info) => BuildEvent::Done {
                image: Image::from(&info),
            },
            Err(e) => {
                tracing::warn!(%reference, "pull failed: {e}");
                let body = e.body();
                BuildEvent::Error {
                    code: body.error.code,
                    message: body.error.message,
                }
            }
        },
    ))
}
