//! Code interpreter routes (image `code-interpreter`): run Python in a context's kernel
//! with results streamed as NDJSON, and manage contexts. The work is in
//! `manager/code.rs`.
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;

use super::ndjson::ndjson;
use super::{ApiJson, AppState};
use crate::error::{ErrorBody, Result};
use crate::manager::ContextOp;
use crate::model::{CodeContext, CodeContextList, CodeEvent, CodeRequest, CreateContextRequest};

const NO_INTERPRETER: &str = "The sandbox's image has no code interpreter \
    (no_code_interpreter: use image code-interpreter)";
const NO_INTERPRETER_OR_ENVS: &str = "The sandbox's image has no code interpreter \
    (no_code_interpreter: use image code-interpreter), or one older than per-execution \
    envs, given here (code_envs_unsupported)";
const SERVER_502: &str = "The sandbox's code server failed or sent a malformed answer \
    (code_server_error, code_server_malformed), or its agent cannot be reached \
    (agent_unreachable)";

#[utoipa::path(post, path = "/v1/sandboxes/{id}/code", tag = "code",
    params(("id" = String, Path, description = "Sandbox id")),
    request_body = CodeRequest,
    responses((status = 200, description = "NDJSON: stdout/stderr chunks as they happen, \
                results (mime bundles: the last expression's value and every displayed \
                figure), then an error (the code raised, TimeoutError, KernelDied) and \
                done with the execution count; failure if the stream broke. The client \
                going away interrupts the execution",
               content_type = "application/x-ndjson", body = CodeEvent),
              (status = 400, description = "Empty code, code over 1 MiB, a language other \
                than python, a malformed context id, envs out of bounds (more than 64, a \
                name not [A-Za-z_][A-Za-z0-9_]* of 1..=128 bytes, a value over 32 KiB or \
                with NUL, 256 KiB in all) (invalid_argument)", body = ErrorBody),
              (status = 404, description = "No such sandbox, or no such context in it \
                (code_context_not_found)", body = ErrorBody),
              (status = 409, description = "Sandbox not running, or paused", body = ErrorBody),
              (status = 422, description = NO_INTERPRETER_OR_ENVS, body = ErrorBody),
              (status = 502, description = SERVER_502, body = ErrorBody)))]
pub async fn run(
    State(st): State<AppState>,
    Path(id): Path<String>,
    ApiJson(req): ApiJson<CodeRequest>,
) -> Result<Response> {
    Ok(ndjson(st.manager.run_code(&id, req).await?))
}

#[utoipa::path(get, path = "/v1/sandboxes/{id}/code/contexts", tag = "code",
    params(("id" = String, Path, description = "Sandbox id")),
    responses((status = 200, description = "The sandbox's contexts (always including \
                `default`)", body = CodeContextList),
              (status = 404, description = "No such sandbox", body = ErrorBody),
              (status = 409, description = "Sandbox not running, or paused", body = ErrorBody),
              (status = 422, description = NO_INTERPRETER, body = ErrorBody),
              (status = 502, description = SERVER_502, body = ErrorBody)))]
pub async fn list(State(st): State<AppState>, Path(id): Path<String>) -> Result<Response> {
    let contexts = st.manager.code_contexts(&id).await?;
    Ok(Json(CodeContextList { contexts }).into_response())
}

#[utoipa::path(post, path = "/v1/sandboxes/{id}/code/contexts", tag = "code",
    params(("id" = String, Path, description = "Sandbox id")),
    request_body = CreateContextRequest,
    responses((status = 201, description = "A new context with its own kernel (started \
                before the answer)", body = CodeContext),
              (status = 400, description = "A language other than python, a cwd that is \
                not an absolute guest path (invalid_argument)", body = ErrorBody),
              (status = 404, description = "No such sandbox", body = ErrorBody),
              (status = 409, description = "Sandbox not running, or paused", body = ErrorBody),
              (status = 422, description = NO_INTERPRETER, body = ErrorBody),
              (status = 429, description = "The sandbox has 16 contexts already \
                (code_context_limit)", body = ErrorBody),
              (status = 502, description = SERVER_502, body = ErrorBody)))]
pub async fn create(
    State(st): State<AppState>,
    Path(id): Path<String>,
    ApiJson(req): ApiJson<CreateContextRequest>,
) -> Result<Response> {
    let ctx = st.manager.create_code_context(&id, req).await?;
    Ok((StatusCode::CREATED, Json(ctx)).into_response())
}

#[utoipa::path(post, path = "/v1/sandboxes/{id}/code/contexts/{context}/restart", tag = "code",
    params(("id" = String, Path, description = "Sandbox id"),
           ("context" = String, Path, description = "Context id")),
    responses((status = 204, description = "The context has a fresh kernel (its state is \
                gone); also how a context whose kernel died is brought back"),
              (status = 400, description = "A malformed context id (invalid_argument)", body = ErrorBody),
              (status = 404, description = "No such sandbox or context", body = ErrorBody),
              (status = 409, description = "Sandbox not running, or paused", body = ErrorBody),
              (status = 422, description = NO_INTERPRETER, body = ErrorBody),
              (status = 502, description = SERVER_502, body = ErrorBody)))]
pub async fn restart(
    State(st): State<AppState>,
    Path((id, context)): Path<(String, String)>,
) -> Result<StatusCode> {
    st.manager
        .code_context_op(&id, &context, ContextOp::Restart)
        .await?;
    Ok(StatusCode::NO_CONTENT)
}

#[utoipa::path(delete, path = "/v1/sandboxes/{id}/code/contexts/{context}", tag = "code",
    params(("id" = String, Path, description = "Sandbox id"),
           ("context" = String, Path, description = "Context id")),
    responses((status = 204, description = "The context and its kernel are gone \
                (`default` comes back, empty, on its next use)"),
              (status = 400, description = "A malformed context id (invalid_argument)", body = ErrorBody),
              (status = 404, description = "No such sandbox or context", body = ErrorBody),
              (status = 409, description = "Sandbox not running, or paused", body = ErrorBody),
              (status = 422, description = NO_INTERPRETER, body = ErrorBody),
              (status = 502, description = SERVER_502, body = ErrorBody)))]
pub async fn delete(
    State(st): State<AppState>,
    Path((id, context)): Path<(String, String)>,
) -> Result<StatusCode> {
    st.manager
        .code_context_op(&id, &context, ContextOp::Delete)
        .await?;
    Ok(StatusCode::NO_CONTENT)
}
