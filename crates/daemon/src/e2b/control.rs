//! E2B's control plane, mounted under `/e2b` on the API listener: the calls of
//! `Sandbox.create`, `get_info`, `connect` and `kill`, each mapped onto the
//! [`Manager`](crate::manager::Manager) calls the REST API makes.
//!
//! Auth is E2B's `X-API-Key` header, compared in constant time with the daemon token
//! (`Authorization: Bearer` is not taken here: E2B's SDKs never send it). Errors have
//! E2B's shape, `{"code": <HTTP status>, "message": ...}`, which the SDKs require
//! (their generated `Error.from_dict` raises on a body without both fields).
use axum::extract::{Path, Request, State};
use axum::http::{Method, StatusCode, Uri};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::de::DeserializeOwned;

use super::model::{ConnectSandbox, ErrorBody, NewSandbox, SandboxAnswer, SandboxDetail};
use super::{time::rfc3339, EnvdKeys, ENVD_VERSION};
use crate::api::AppState;
use crate::error::Error;
use crate::model::{
    CreateSandboxRequest, Origin, Sandbox, SetTtlRequest, TtlAction, MAX_JSON_BODY_BYTES,
};
use crate::token::token_matches;

/// Sandbox lifetime when create names none. E2B's API uses 15 s; its Python SDK's own
/// default is 300 s, which is what users of the SDK expect.
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
    #[error("Timeout must be greater than 0")]
    TimeoutNotPositive,
    #[error("{0}")]
    BadRequest(String),
    #[error("no E2B API route {method} /e2b{path}")]
    NoRoute { method: String, path: String },
    /// Any other failure of the daemon, with its status and message.
    #[error("{}", .0)]
    Zygote(#[from] Error),
}

impl ControlError {
    fn status(&self) -> StatusCode {
        match self {
            ControlError::InvalidApiKey => StatusCode::UNAUTHORIZED,
            ControlError::SandboxNotFound(_)
            | ControlError::TemplateNotFound(_)
            | ControlError::NoRoute { .. } => StatusCode::NOT_FOUND,
            ControlError::TimeoutNotPositive | ControlError::BadRequest(_) => {
                StatusCode::BAD_REQUEST
            }
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
    Router::new()
        .route("/v2/sandboxes", post(create))
        .route("/sandboxes/{id}", get(get_info).delete(kill))
        .route("/v2/sandboxes/{id}/connect", post(connect))
        .fallback(no_route)
        .method_not_allowed_fallback(no_route)
        .layer(axum::middleware::from_fn_with_state(state.clone(), api_key))
        .with_state(state)
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

/// A JSON body of at most [`MAX_JSON_BODY_BYTES`]; an empty body is `{}`.
async fn json_body<T: DeserializeOwned>(req: Request) -> Result<T, ControlError> {
    let (_, bytes) = crate::api::read_body(req, MAX_JSON_BODY_BYTES, "a JSON request body")
        .await
        .map_err(ControlError::Zygote)?;
    let bytes: &[u8] = if bytes.is_empty() { b"{}" } else { &bytes };
    serde_json::from_slice(bytes).map_err(|e| ControlError::BadRequest(format!("body: {e}")))
}

/// A timeout in seconds as E2B takes it: positive; absent: the default.
fn timeout_secs(timeout: Option<i64>) -> Result<u64, ControlError> {
    match timeout {
        None => Ok(DEFAULT_TIMEOUT_SECS),
        Some(t) if t <= 0 => Err(ControlError::TimeoutNotPositive),
        Some(t) => Ok(t as u64),
    }
}

/// `domain` of the answers: the proxy's host and port, so the SDK's `get_host(port)`
/// (`<port>-<id>.<domain>`) names a host the proxy routes.
fn domain(st: &AppState) -> Option<String> {
    st.proxy.map(|a| format!("localhost:{}", a.port()))
}

/// E2B's `templateID` of a sandbox: what it was started from.
fn template_of(s: &Sandbox) -> String {
    match &s.origin {
        Origin::Image { name, .. } => name.clone(),
        Origin::Snapshot { id } => id.clone(),
        Origin::Branch { branch_point, .. } => branch_point.clone(),
    }
}

fn answer(st: &AppState, s: &Sandbox) -> SandboxAnswer {
    SandboxAnswer {
        template_id: template_of(s),
        sandbox_id: s.id.clone(),
        client_id: "zygote",
        envd_version: ENVD_VERSION,
        envd_access_token: EnvdKeys::new(st.token.clone()).access_token(&s.id),
        traffic_access_token: None,
        domain: domain(st),
    }
}

/// `POST /v2/sandboxes`: a sandbox from the image (or snapshot) `templateID` names.
async fn create(State(st): State<AppState>, req: Request) -> Result<Response, ControlError> {
    let body: NewSandbox = json_body(req).await?;
    let template = body.template_id.clone();
    let ttl = timeout_secs(body.timeout)?;
    let is_snapshot = st.manager.snapshot_get(&template).is_ok();
    let request = CreateSandboxRequest {
        image: (!is_snapshot).then(|| template.clone()),
        snapshot: is_snapshot.then(|| template.clone()),
        ttl_secs: Some(ttl),
        ttl_action: body.auto_pause.unwrap_or(false).then_some(TtlAction::Pause),
        envs: body.env_vars.filter(|e| !e.is_empty()),
        metadata: body.metadata.filter(|m| !m.is_empty()),
        ..Default::default()
    };
    // In tasks of their own, as the REST API's create: a client that goes away does not
    // cut a create short between its records.
    let manager = st.manager.clone();
    let job = tokio::spawn(async move { manager.begin_create(request).await })
        .await
        .map_err(|e| Error::Internal(format!("create task failed: {e}")))?
        .map_err(|e| match e.status_code() {
            (StatusCode::NOT_FOUND, _) => ControlError::TemplateNotFound(template.clone()),
            _ => ControlError::Zygote(e),
        })?;
    let manager = st.manager.clone();
    let made = tokio::spawn(manager.finish_create(job, None))
        .await
        .map_err(|e| Error::Internal(format!("create task failed: {e}")))??;
    let sandbox = made
        .first()
        .ok_or_else(|| Error::Internal("create made no sandbox".into()))?;
    Ok((StatusCode::CREATED, Json(answer(&st, sandbox))).into_response())
}

/// `GET /sandboxes/{id}` (`Sandbox.get_info`).
async fn get_info(
    State(st): State<AppState>,
    Path(id): Path<String>,
) -> Result<Json<SandboxDetail>, ControlError> {
    let s = st
        .manager
        .get(&id)
        .map_err(|e| ControlError::about_sandbox(&id, e))?;
    let state = match s.state.as_str() {
        "paused" | "pausing" => "paused",
        "dead" | "deleting" => return Err(ControlError::SandboxNotFound(id)),
        _ => "running",
    };
    let end = s
        .expires_at
        .or_else(|| s.ttl_left_secs.map(|left| crate::manager::now() + left))
        .unwrap_or(NO_DEADLINE);
    Ok(Json(SandboxDetail {
        template_id: template_of(&s),
        sandbox_id: s.id.clone(),
        client_id: "zygote",
        started_at: rfc3339(s.created_at),
        end_at: rfc3339(end),
        envd_version: ENVD_VERSION,
        envd_access_token: EnvdKeys::new(st.token.clone()).access_token(&s.id),
        cpu_count: s.vcpus,
        memory_mb: s.mem_mib,
        disk_size_mb: 0,
        state,
        metadata: s.metadata.clone(),
        domain: domain(&st),
    }))
}

/// `DELETE /sandboxes/{id}` (`Sandbox.kill`): 204, or 404 (the SDK returns False).
async fn kill(
    State(st): State<AppState>,
    Path(id): Path<String>,
) -> Result<StatusCode, ControlError> {
    st.manager
        .delete(&id)
        .await
        .map_err(|e| ControlError::about_sandbox(&id, e))?;
    Ok(StatusCode::NO_CONTENT)
}

/// `POST /v2/sandboxes/{id}/connect`: 200 for a running sandbox, 201 after resuming a
/// paused one; a `timeout` only ever extends its deadline (E2B: "TTL is only
/// extended").
async fn connect(
    State(st): State<AppState>,
    Path(id): Path<String>,
    req: Request,
) -> Result<Response, ControlError> {
    let body: ConnectSandbox = json_body(req).await?;
    let about = |e| ControlError::about_sandbox(&id, e);
    let mut s = st.manager.get(&id).map_err(about)?;
    let mut status = StatusCode::OK;
    if s.paused_at.is_some() {
        s = st.manager.resume(&id).await.map_err(about)?;
        status = StatusCode::CREATED;
    }
    if let Some(t) = body.timeout {
        let wanted = timeout_secs(Some(t))?;
        let left = s
            .expires_at
            .map(|e| e.saturating_sub(crate::manager::now()));
        if left.is_some_and(|l| l < wanted) {
            let ttl = SetTtlRequest {
                ttl_secs: Some(wanted),
                ttl_action: None,
            };
            s = st.manager.set_ttl(&id, ttl).await.map_err(about)?;
        }
    }
    Ok((status, Json(answer(&st, &s))).into_response())
}
