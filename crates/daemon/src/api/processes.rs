//! Background-process routes (started by `POST .../exec {"background": true}`).
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;

use super::ndjson::ndjson;
use super::{ApiJson, ApiQuery, AppState};
use crate::error::{Error, ErrorBody, Result};
use crate::model::{
    ExecEvent, OutputQuery, Process, ProcessList, ProcessOutput, SignalRequest, StdinRequest,
};

/// The `{pid}` path segment.
fn parse_pid(pid: &str) -> Result<u32> {
    pid.parse::<u32>()
        .ok()
        .filter(|&p| p != 0 && !pid.starts_with('+'))
        .ok_or_else(|| Error::invalid(format!("pid must be a positive integer, got {pid:?}")))
}

#[utoipa::path(get, path = "/v1/sandboxes/{id}/processes", tag = "processes",
    params(("id" = String, Path, description = "Sandbox id")),
    responses((status = 200, description = "Background processes, oldest first", body = ProcessList),
              (status = 404, description = "No such sandbox", body = ErrorBody),
              (status = 409, description = "Sandbox not running", body = ErrorBody),
              (status = 502, description = "The sandbox's agent cannot be reached \
                (agent_unreachable) or sent a malformed reply (agent_malformed_reply)", body = ErrorBody)))]
pub async fn list(State(st): State<AppState>, Path(id): Path<String>) -> Result<Json<ProcessList>> {
    Ok(Json(st.manager.processes(&id).await?))
}

#[utoipa::path(get, path = "/v1/sandboxes/{id}/processes/{pid}", tag = "processes",
    params(("id" = String, Path, description = "Sandbox id"),
           ("pid" = u32, Path, description = "The process's pid in the guest", minimum = 1)),
    responses((status = 200, description = "The process", body = Process),
              (status = 400, description = "Not a pid (invalid_argument)", body = ErrorBody),
              (status = 404, description = "No such sandbox or process", body = ErrorBody),
              (status = 409, description = "Sandbox not running", body = ErrorBody),
              (status = 502, description = "The sandbox's agent cannot be reached \
                (agent_unreachable) or sent a malformed reply (agent_malformed_reply)", body = ErrorBody)))]
pub async fn get(
    State(st): State<AppState>,
    Path((id, pid)): Path<(String, String)>,
) -> Result<Json<Process>> {
    Ok(Json(st.manager.process(&id, parse_pid(&pid)?).await?))
}

#[utoipa::path(get, path = "/v1/sandboxes/{id}/processes/{pid}/output", tag = "processes",
    params(("id" = String, Path, description = "Sandbox id"),
           ("pid" = u32, Path, description = "The process's pid in the guest", minimum = 1),
           OutputQuery),
    responses((status = 200, description = "What it printed from `offset` (JSON); with \
                follow=true, NDJSON: output lines as printed (base64 data), then exit",
               content((ProcessOutput = "application/json"), (ExecEvent = "application/x-ndjson"))),
              (status = 400, description = "Not a pid, or a bad query (invalid_argument)", body = ErrorBody),
              (status = 404, description = "No such sandbox, or no such process (guest_not_found)", body = ErrorBody),
              (status = 409, description = "Sandbox not running", body = ErrorBody),
              (status = 502, description = "The sandbox's agent cannot be reached \
                (agent_unreachable) or sent a malformed reply (agent_malformed_reply)", body = ErrorBody)))]
pub async fn output(
    State(st): State<AppState>,
    Path((id, pid)): Path<(String, String)>,
    ApiQuery(q): ApiQuery<OutputQuery>,
) -> Result<Response> {
    let pid = parse_pid(&pid)?;
    if q.follow == Some(true) {
        if q.wait_ms.is_some() {
            return Err(Error::invalid("wait_ms does not apply with follow=true"));
        }
        let events = st
            .manager
            .follow_process(&id, pid, q.offset.unwrap_or(0))
            .await?;
        return Ok(ndjson(events));
    }
    Ok(Json(st.manager.process_output(&id, pid, &q).await?).into_response())
}

#[utoipa::path(post, path = "/v1/sandboxes/{id}/processes/{pid}/stdin", tag = "processes",
    params(("id" = String, Path, description = "Sandbox id"),
           ("pid" = u32, Path, description = "The process's pid in the guest", minimum = 1)),
    request_body = StdinRequest,
    responses((status = 204, description = "Written (and closed with eof)"),
              (status = 400, description = "Not a pid, bad data, or the process closed its \
                stdin (invalid_argument, guest_bad_request)", body = ErrorBody),
              (status = 404, description = "No such sandbox, or no such process (guest_not_found)", body = ErrorBody),
              (status = 409, description = "The process has exited (process_exited), did not \
                read its stdin within 10 s (guest_busy), or the sandbox is not running", body = ErrorBody),
              (status = 502, description = "The sandbox's agent cannot be reached \
                (agent_unreachable) or sent a malformed reply (agent_malformed_reply)", body = ErrorBody)))]
pub async fn stdin(
    State(st): State<AppState>,
    Path((id, pid)): Path<(String, String)>,
    ApiJson(req): ApiJson<StdinRequest>,
) -> Result<StatusCode> {
    let pid = parse_pid(&pid)?;
    st.manager.process_stdin(&id, pid, req).await?;
    Ok(StatusCode::NO_CONTENT)
}

#[utoipa::path(post, path = "/v1/sandboxes/{id}/processes/{pid}/signal", tag = "processes",
    params(("id" = String, Path, description = "Sandbox id"),
           ("pid" = u32, Path, description = "The process's pid in the guest", minimum = 1)),
    request_body = SignalRequest,
    responses((status = 204, description = "Sent to the process's group"),
              (status = 400, description = "Not a pid, or an unknown signal (invalid_argument)", body = ErrorBody),
              (status = 404, description = "No such sandbox, or no such process (guest_not_found)", body = ErrorBody),
              (status = 409, description = "The process has exited (process_exited), or the \
                sandbox is not running", body = ErrorBody),
              (status = 502, description = "The sandbox's agent cannot be reached \
                (agent_unreachable) or sent a malformed reply (agent_malformed_reply)", body = ErrorBody)))]
pub async fn signal(
    State(st): State<AppState>,
    Path((id, pid)): Path<(String, String)>,
    ApiJson(req): ApiJson<SignalRequest>,
) -> Result<StatusCode> {
    let pid = parse_pid(&pid)?;
    st.manager.process_signal(&id, pid, &req).await?;
    Ok(StatusCode::NO_CONTENT)
}
