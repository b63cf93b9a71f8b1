//! Daemon-level routes: health, metrics, the API document, info, images.

use axum::extract::State;
use axum::http::header;
use axum::response::{IntoResponse, Response};
use axum::Json;
use utoipa::OpenApi;

use super::ndjson::ndjson;
use super::{ApiDoc, ApiJson, AppState};
use crate::error::{Error, ErrorBody, Result};
use crate::model::{BuildEvent, BuildImageRequest, Health, Image, ImageList, Info, ProxyInfo};

#[utoipa::path(get, path = "/healthz", tag = "system", security(()),
    responses((status = 200, description = "The daemon is up", body = Health)))]
pub async fn healthz() -> Json<Health> {
    Json(Health {
        status: "ok".into(),
    })
}

#[utoipa::path(get, path = "/metrics", tag = "system",
    responses((status = 200, description = "Prometheus text format", content_type = "text/plain", body = String)))]
pub async fn metrics(State(st): State<AppState>) -> Result<Response> {
    let m = st.manager.clone();
    let text = tokio::task::spawn_blocking(move || -> Result<String> {
        let sandboxes = m.db.sandboxes()?;
        let snapshots = m.db.snapshots()?.len();
        let spawners = sandboxes
            .iter()
            .filter_map(|s| {
                let list = m.runtime.warm_spawners(s.vm.as_ref()?);
                (!list.is_empty()).then(|| (s.id.clone(), list))
            })
            .collect();
        Ok(m.metrics.render(&sandboxes, snapshots, &spawners))
    })
    .await
    .map_err(|e| Error::Internal(e.to_string()))??;
    Ok(([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], text).into_response())
}

#[utoipa::path(get, path = "/v1/openapi.json", tag = "system", security(()),
    responses((status = 200, description = "This API's OpenAPI 3 document", body = Object)))]
pub async fn openapi() -> Json<utoipa::openapi::OpenApi> {
    Json(ApiDoc::openapi())
}

#[utoipa::path(get, path = "/v1/info", tag = "system",
    responses((status = 200, description = "Runtime in use, cgroup support, networking, the port proxy", body = Info)))]
pub async fn info(State(st): State<AppState>) -> Json<Info> {
    let m = &st.manager;
    Json(Info {
        version: env!("CARGO_PKG_VERSION").into(),
        runtime: m.runtime_info.clone(),
        cgroups: m.cgroups.info(),
        state_dir: m.dirs.state.display().to_string(),
        network: m.network.info(),
        proxy: st.proxy.map(|addr| ProxyInfo {
            url: crate::proxy::base_url(addr),
        }),
    })
}

#[utoipa::path(get, path = "/v1/images", tag = "images",
    responses((status = 200, description = "Built images and known recipes", body = ImageList)))]
pub async fn list_images() -> Result<Json<ImageList>> {
    let (images, recipes) = tokio::task::spawn_blocking(|| {
        let images = zygote_images::list_images()?;
        let recipes = zygote_images::list_recipes()
            .into_iter()
            .map(|(name, _)| name)
            .collect::<Vec<_>>();
        Ok::<_, Error>((images, recipes))
    })
    .await
    .map_err(|e| Error::Internal(e.to_string()))??;
    Ok(Json(ImageList {
        images: images.iter().map(Image::from).collect(),
        recipes,
    }))
}

#[utoipa::path(post, path = "/v1/images/build", tag = "images", request_body = BuildImageRequest,
    responses((status = 200, description = "NDJSON stream of BuildEvent lines (progress, then done or error)",
               content_type = "application/x-ndjson", body = BuildEvent),
              (status = 400, description = "Invalid name", body = ErrorBody),
              (status = 404, description = "No such recipe", body = ErrorBody)))]
pub async fn build_image(ApiJson(req): ApiJson<BuildImageRequest>) -> Result<Response> {
    if !zygote_images::recipe::valid_name(&req.name) {
        return Err(Error::invalid(format!(
            "{:?} is not a recipe name",
            req.name
        )));
    }
    let name = req.name.clone();
    tokio::task::spawn_blocking(move || zygote_images::find_recipe(&name))
        .await
        .map_err(|e| Error::Internal(e.to_string()))??;
    let (tx, rx) = tokio::sync::mpsc::channel(256);
    tokio::task::spawn_blocking(move || {
        let progress_tx = tx.clone();
        let mut progress = |line: &str| {
            let _ = progress_tx.blocking_send(BuildEvent::Progress {
                line: line.to_string(),
            });
        };
        // The kernel too: a fresh host needs both before a sandbox can boot.
        let result = zygote_images::build_kernel(&mut progress)
            .and_then(|_| zygote_images::build_image(&req.name, &mut progress));
        let last = match result {
            Ok(info) => BuildEvent::Done {
                image: Image::from(&info),
            },
            Err(e) => {
                let body = Error::from(e).body();
                BuildEvent::Error {
                    code: body.error.code,
                    message: body.error.message,
                }
            }
        };
        let _ = tx.blocking_send(last);
    });
    Ok(ndjson(rx))
}
