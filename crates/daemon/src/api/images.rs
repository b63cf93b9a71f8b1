//! `POST /v1/images`: pulling OCI images through the daemon.
use std::sync::Arc;

use axum::extract::State;
use axum::response::Response;

use super::system::ndjson;
use super::{ApiJson, AppState};
use crate::error::{ErrorBody, Result};
use crate::model::{BuildEvent, Image, PullImageRequest, Validate};

#[utoipa::path(post, path = "/v1/images", tag = "images", request_body = PullImageRequest,
    responses((status = 200, description = "NDJSON stream of BuildEvent lines: `resolved`, `layer` \
                 progress and `progress` lines, then `done` with the image or `error` (codes: \
                 image_not_found, registry_unauthorized, unsupported_platform, bad_image, \
                 image_too_large, registry_error)",
               content_type = "application/x-ndjson", body = BuildEvent),
              (status = 400, description = "Not an image reference, or a username without a password", body = ErrorBody)))]
pub async fn pull(
    State(st): State<AppState>,
    ApiJson(req): ApiJson<PullImageRequest>,
) -> Result<Response> {
    req.validate()?;
    let (tx, rx) = tokio::sync::mpsc::channel(256);
    let manager = st.manager.clone();
    // The pull goes on if the client leaves: it registers the image whole or not at all,
    // and a finished one serves the next create.
    tokio::spawn(async move {
        let progress_tx = tx.clone();
        let progress = Arc::new(move |e: zygote_oci::Event| {
            // Progress may be dropped for a slow reader; the outcome never is.
            let _ = progress_tx.try_send(BuildEvent::from(e));
        });
        let last = match manager.pull_image(&req, progress).await {
            Ok(info) => BuildEvent::Done {
                image: Image::from(&info),
            },
            Err(e) => {
                tracing::warn!(reference = %req.reference, "pull failed: {e}");
                let body = e.body();
                BuildEvent::Error {
                    code: body.error.code,
                    message: body.error.message,
                }
            }
        };
        let _ = tx.send(last).await;
    });
    Ok(ndjson(rx))
}
