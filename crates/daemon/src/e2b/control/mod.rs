//! E2B's control plane, mounted under `/e2b` on the API listener: the calls of the
//! SDKs' `Sandbox` class (create, list, get_info, connect, kill, set_timeout, pause,
//! fork, snapshots, update_network, logs, get_metrics) and its `Volume` and `Template`
//! classes, each mapped onto the
//! [`Manager`](crate::manager::Manager) calls the REST API makes.
//!
//! Auth is E2B's `X-API-Key` header, compared in constant time with the daemon token
//! (`Authorization: Bearer` is not taken here: E2B's SDKs never send it). Errors have
//! E2B's shape, `{"code": <HTTP status>, "message": ...}`, which the SDKs require
//! (their generated `Error.from_dict` raises on a body without both fields), and
//! E2B's words (infra's `packages/api/internal/handlers`, see `../DESIGN.md`).
//!
//! One concern per module: [`sandboxes`] (one sandbox's lifecycle), [`list`] (the
//! sandbox list), [`fork`], [`snapshots`], [`logs`] (a sandbox's event log),
//! [`metrics`], [`volumes`] (and [`volume_content`]), the `templates*` modules (E2B's
//! Template SDK), and [`page`] (the keyset pagination both lists share).
mod fork;
mod list;
mod logs;
mod metrics;
mod page;
mod sandboxes;
mod snapshots;
mod templates;
mod templates_build;
mod templates_copy;
mod templates_tar;
mod templates_upload;
mod templates_wire;
mod volume_content;
mod volumes;

use axum::extract::{Request, State};
use axum::http::{Method, StatusCode, Uri};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, get, post, put};
use axum::{Json, Router};
use serde::de::DeserializeOwned;

use super::model::{ErrorBody, ListedSandbox, SandboxAnswer};
use super::{time::rfc3339, EnvdKeys, ENVD_VERSION};
use crate::api::AppState;
use crate::error::Error;
use crate::model::{Origin, Sandbox, MAX_JSON_BODY_BYTES, MAX_TTL_SECS};
use crate::token::token_matches;

/// Sandbox lifetime when create (or fork) names none. E2B's API uses 15 s; its Python
/// SDK's own default is 300 s, which is what users of the SDK expect.
pub const DEFAULT_TIMEOUT_SECS: u64 = 300;

/// "No deadline" as an RFC 3339 time (E2B's `endAt` is required).
const NO_DEADLINE: u64 = 253_402_300_799; // 9999-12-31T23:59:59Z

/// What E2B's API answers; each becomes `{"code", "message"}` with its status.
#[derive(Debug, thiserror::Error)]
pub enum ControlError {
    /// E2B's own words, which the SDKs show as they are.
    #[error("Invalid API key, please visit https://e2b.dev/docs/api-key for more information.")]
    InvalidApiKey,
    #[error("Sandbox \"{0}\" doesn't exist or you don't have access to it")]
    SandboxNotFound(String),
    #[error("template '{0}' not found")]
    TemplateNotFound(String),
    /// Any other "no such thing", in its own words.
    #[error("{0}")]
    NotFound(String),
    #[error("volume '{0}' not found")]
    VolumeNotFound(String),
    /// The volume content API's token is missing or wrong (or names no volume).
    #[error("invalid or missing volume token")]
    InvalidVolumeToken,
    #[error("path '{0}' not found")]
    PathNotFound(String),
    #[error("Timeout must be greater than 0")]
    TimeoutNotPositive,
    #[error("Timeout cannot be greater than {} hours", MAX_TTL_SECS / 3600)]
    TimeoutTooLong,
    #[error("{0}")]
    BadRequest(String),
    /// A credential that does not allow the call (an upload URL unknown, used or expired).
    #[error("{0}")]
    Forbidden(String),
    /// The sandbox is not in a state that allows the call (E2B's 409s).
    #[error("{0}")]
    Conflict(String),
    /// A call zygote cannot serve the way E2B does (said, never faked).
    #[error("{0}")]
    NotImplemented(String),
    /// A failure E2B reports without details (its own generic words).
    #[error("{0}")]
    Failed(&'static str),
    #[error("no E2B API route {method} /e2b{path}")]
    NoRoute { method: String, path: String },
    /// Any other failure of the daemon, with its status and message.
    #[error("{}", .0)]
    Zygote(#[from] Error),
}

impl ControlError {
    fn status(&self) -> StatusCode {
        match self {
            ControlError::InvalidApiKey | ControlError::InvalidVolumeToken => {
                StatusCode::UNAUTHORIZED
            }
            ControlError::SandboxNotFound(_)
            | ControlError::TemplateNotFound(_)
            | ControlError::NotFound(_)
            | ControlError::VolumeNotFound(_)
            | ControlError::PathNotFound(_)
            | ControlError::NoRoute { .. } => StatusCode::NOT_FOUND,
            ControlError::TimeoutNotPositive
            | ControlError::TimeoutTooLong
            | ControlError::BadRequest(_) => StatusCode::BAD_REQUEST,
            ControlError::Conflict(_) => StatusCode::CONFLICT,
            ControlError::Forbidden(_) => StatusCode::FORBIDDEN,
            ControlError::NotImplemented(_) => StatusCode::NOT_IMPLEMENTED,
            ControlError::Failed(_) => StatusCode::INTERNAL_SERVER_ERROR,
            ControlError::Zygote(e) => e.status_code().0,
        }
    }

    /// A daemon error about sandbox `id`, with E2B's message when it says "no such one".
    fn about_sandbox(id: &str, e: Error) -> ControlError {
        match e {
            Error::NotFound { .. } => ControlError::SandboxNotFound(id.to_string()),
            e => ControlError::Zygote(e),
        }
    }
}

impl IntoResponse for ControlError {
    fn into_response(self) -> Response {
        let status = self.status();
        let body = ErrorBody {
            code: status.as_u16(),
            message: self.to_string(),
        };
        let mut resp = (status, Json(body)).into_response();
        // E2B's SDKs retry 429/502/503/504 unless told not to; none of ours is a
        // passing condition that a retry would clear.
        resp.headers_mut().insert(
            "should-retry",
            axum::http::HeaderValue::from_static("false"),
        );
        resp
    }
}

/// The routes under `/e2b`, with their `X-API-Key` check.
pub fn router(state: AppState) -> Router {
    let control = Router::new()
        .route(
            "/v2/sandboxes",
            post(sandboxes::create).get(list::list_sandboxes),
        )
        .route(
            "/sandboxes/{id}",
            get(sandboxes::get_info).delete(sandboxes::kill),
        )
        .route("/v2/sandboxes/{id}/connect", post(sandboxes::connect))
        .route("/sandboxes/{id}/timeout", post(sandboxes::set_timeout))
        .route("/sandboxes/{id}/metrics", get(metrics::get_metrics))
        .route("/sandboxes/metrics", get(metrics::list_metrics))
        .route("/sandboxes/{id}/pause", post(sandboxes::pause))
        .route("/sandboxes/{id}/network", put(sandboxes::update_network))
        .route("/sandboxes/{id}/fork", post(fork::fork))
        .route("/sandboxes/{id}/logs", get(logs::logs_v1))
        .route("/v2/sandboxes/{id}/logs", get(logs::logs_v2))
        .route("/sandboxes/{id}/snapshots", post(snapshots::create))
        .route("/snapshots", get(snapshots::list))
        .route("/templates/{id}", delete(snapshots::delete))
        .route("/v3/templates", post(templates::request_build))
        .route(
            "/templates/{id}/files/{hash}",
            get(templates_upload::file_link),
        )
        .route(
            "/v2/templates/{id}/builds/{build}",
            post(templates::start_build),
        )
        .route(
            "/templates/{id}/builds/{build}/status",
            get(templates::status),
        )
        .route("/templates/aliases/{alias}", get(templates::alias))
        .route(
            "/templates/tags",
            post(templates::assign_tags).delete(templates::remove_tags),
        )
        .route("/templates/{id}/tags", get(templates::list_tags))
        .route("/volumes", post(volumes::create).get(volumes::list))
        .route(
            "/volumes/{id}",
            get(volumes::get_info).delete(volumes::destroy),
        )
        .fallback(no_route)
        .method_not_allowed_fallback(no_route)
        .layer(axum::middleware::from_fn_with_state(state.clone(), api_key))
        // The one route without the API key: an upload URL is its own credential
        // (`templates_upload`).
        .route("/_uploads/{token}", put(templates_upload::upload));
    // Merged after the API-key layer: the content API checks its volume token instead.
    volume_content::router().merge(control).with_state(state)
}

async fn api_key(State(st): State<AppState>, req: Request, next: Next) -> Response {
    let given = req.headers().get("x-api-key").map(|v| v.as_bytes());
    if !given.is_some_and(|g| token_matches(g, st.token.as_bytes())) {
        return ControlError::InvalidApiKey.into_response();
    }
    next.run(req).await
}

async fn no_route(method: Method, uri: Uri) -> ControlError {
    ControlError::NoRoute {
        method: method.to_string(),
        path: uri.path().to_string(),
    }
}

/// A JSON body of at most [`MAX_JSON_BODY_BYTES`]; an empty body is `{}`. A body that
/// does not parse is E2B's 400 `Error when parsing request: ...`.
async fn json_body<T: DeserializeOwned>(req: Request) -> Result<T, ControlError> {
    let (_, bytes) = crate::api::read_body(req, MAX_JSON_BODY_BYTES, "a JSON request body")
        .await
        .map_err(ControlError::Zygote)?;
    let bytes: &[u8] = if bytes.is_empty() { b"{}" } else { &bytes };
    serde_json::from_slice(bytes)
        .map_err(|e| ControlError::BadRequest(format!("Error when parsing request: {e}")))
}

/// A timeout in seconds as E2B takes it on create, connect and fork: positive, at most
/// zygote's longest TTL; absent: the default.
fn timeout_secs(timeout: Option<i64>) -> Result<u64, ControlError> {
    match timeout {
        None => Ok(DEFAULT_TIMEOUT_SECS),
        Some(t) if t <= 0 => Err(ControlError::TimeoutNotPositive),
        Some(t) if t as u64 > MAX_TTL_SECS => Err(ControlError::TimeoutTooLong),
        Some(t) => Ok(t as u64),
    }
}

/// `domain` of the answers: the proxy's host and port, so the SDK's `get_host(port)`
/// (`<port>-<id>.<domain>`) names a host the proxy routes.
fn domain(st: &AppState) -> Option<String> {
    st.proxy.map(|a| format!("localhost:{}", a.port()))
}

/// E2B's `templateID` of a sandbox: what it was started from. A fork's is its
/// parent's (as E2B answers), found up the branch tree while the ancestors exist;
/// below a deleted one (a kept child's parent is gone) it is the branch point the
/// sandbox started from, the snapshot that holds its start.
fn template_of(st: &AppState, s: &Sandbox) -> String {
    let mut origin = s.origin.clone();
    // Bounded: a record naming itself as an ancestor must not spin.
    for _ in 0..MAX_TREE_WALK {
        match origin {
            Origin::Image { name, .. } => return name,
            Origin::Snapshot { id } => return id,
            Origin::Branch {
                parent,
                branch_point,
            } => match st.manager.get(&parent) {
                Ok(p) => origin = p.origin,
                Err(_) => return branch_point,
            },
        }
    }
    match origin {
        Origin::Image { name: t, .. } | Origin::Snapshot { id: t } => t,
        Origin::Branch { branch_point, .. } => branch_point,
    }
}

/// How many ancestors [`template_of`] looks through.
const MAX_TREE_WALK: usize = 256;

/// The state E2B shows for a sandbox, or `None` for one E2B would not know of (being
/// created, dead, being deleted, or its VM gone): E2B lists only `running` and
/// `paused` sandboxes (and no volume helper), and a paused one is saved to disk (zygote's `pausing` is E2B's
/// too: "it can be resumed"). A sandbox stopped for a snapshot or branch (`paused`
/// with no saved state) runs on a moment later: `running`.
fn e2b_state(s: &Sandbox) -> Option<&'static str> {
    // A helper serving a volume's files is the daemon's, not the user's.
    if s.metadata.contains_key(crate::manager::VOLUME_HELPER_LABEL) {
        return None;
    }
    match s.state.as_str() {
        "pausing" => Some("paused"),
        "paused" if s.paused_at.is_some() => Some("paused"),
        "running" | "resuming" | "paused" => Some("running"),
        _ => None,
    }
}

/// Sandbox `id` and the state E2B shows for it; E2B's 404 when there is no such
/// sandbox or E2B would not know of it ([`e2b_state`]).
fn visible(st: &AppState, id: &str) -> Result<(Sandbox, &'static str), ControlError> {
    let s = st
        .manager
        .get(id)
        .map_err(|e| ControlError::about_sandbox(id, e))?;
    let state = e2b_state(&s).ok_or_else(|| ControlError::SandboxNotFound(id.to_string()))?;
    Ok((s, state))
}

/// A sandbox as E2B's list shows it (also the core of `get_info`'s answer).
fn listed(st: &AppState, s: &Sandbox) -> Option<ListedSandbox> {
    let state = e2b_state(s)?;
    let end = s
        .expires_at
        .or_else(|| s.ttl_left_secs.map(|left| crate::manager::now() + left))
        .unwrap_or(NO_DEADLINE);
    Some(ListedSandbox {
        template_id: template_of(st, s),
        sandbox_id: s.id.clone(),
        client_id: "zygote",
        started_at: rfc3339(s.created_at),
        end_at: rfc3339(end),
        envd_version: ENVD_VERSION,
        cpu_count: s.vcpus,
        memory_mb: s.mem_mib,
        disk_size_mb: 0,
        state,
        metadata: s.metadata.clone(),
    })
}

/// The answer of create, connect and fork (E2B's `Sandbox`).
fn answer(st: &AppState, s: &Sandbox) -> SandboxAnswer {
    SandboxAnswer {
        template_id: template_of(st, s),
        sandbox_id: s.id.clone(),
        client_id: "zygote",
        envd_version: ENVD_VERSION,
        envd_access_token: EnvdKeys::new(st.token.clone()).access_token(&s.id),
        traffic_access_token: None,
        domain: domain(st),
    }
}
