//! Exec and file routes (work inside a sandbox through its agent).
use axum::extract::{Path, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use tokio_stream::wrappers::ReceiverStream;

use super::ndjson::ndjson;
use super::{ApiBytes, ApiJson, ApiQuery, AppState};
use crate::error::{Error, ErrorBody, Result};
use crate::manager::FileBody;
use crate::model::{
    DirListing, ExecEvent, ExecRequest, ExecResponse, PathQuery, Process, WriteResult,
};

// Only the OpenAPI document uses it: a plain `Vec<u8>` would be documented as an
// array of integers rather than as binary.
/// A file's contents, as raw bytes.
#[derive(utoipa::ToSchema)]
#[schema(value_type = String, format = Binary)]
pub struct FileBytes(#[allow(dead_code)] Vec<u8>);

#[utoipa::path(post, path = "/v1/sandboxes/{id}/exec", tag = "exec",
    params(("id" = String, Path, description = "Sandbox id")),
    request_body = ExecRequest,
    responses((status = 200, description = "The program ran to completion", body = ExecResponse),
              (status = 202, description = "background: the program runs; follow it with the \
                process routes", body = Process),
              (status = 400, description = "Invalid request", body = ErrorBody),
              (status = 404, description = "No such sandbox", body = ErrorBody),
              (status = 409, description = "Sandbox not running, or paused (sandbox_paused; one created with auto_resume is resumed instead)", body = ErrorBody),
              (status = 413, description = "Body over 32 MiB, or the request does not fit the \
                guest agent's 16 MiB frame (payload_too_large; the message states the limit)", body = ErrorBody),
              (status = 422, description = "The program could not start (guest_spawn_failed)", body = ErrorBody),
              (status = 429, description = "background: the guest runs as many background \
                processes as it may (256, or its agent's file descriptors would run short); \
                guest_limit_reached, the message names the limit. End some first", body = ErrorBody),
              (status = 502, description = "The sandbox's agent cannot be reached \
                (agent_unreachable) or sent a malformed reply (agent_malformed_reply)", body = ErrorBody)))]
pub async fn exec(
    State(st): State<AppState>,
    Path(id): Path<String>,
    ApiJson(req): ApiJson<ExecRequest>,
) -> Result<Response> {
    if req.background {
        let process = st.manager.spawn_process(&id, req).await?;
        return Ok((StatusCode::ACCEPTED, Json(process)).into_response());
    }
    Ok(Json(st.manager.exec(&id, req).await?).into_response())
}

#[utoipa::path(post, path = "/v1/sandboxes/{id}/exec/stream", tag = "exec",
    params(("id" = String, Path, description = "Sandbox id")),
    request_body = ExecRequest,
    responses((status = 200, description = "NDJSON: a started line, output lines as they happen (base64 data), then exit or error",
               content_type = "application/x-ndjson", body = ExecEvent),
              (status = 400, description = "Invalid request", body = ErrorBody),
              (status = 404, description = "No such sandbox", body = ErrorBody),
              (status = 409, description = "Sandbox not running, or paused (sandbox_paused; one created with auto_resume is resumed instead)", body = ErrorBody),
              (status = 413, description = "Body over 32 MiB, or the request does not fit the \
                guest agent's 16 MiB frame (payload_too_large; the message states the limit)", body = ErrorBody),
              (status = 422, description = "The program could not start", body = ErrorBody),
              (status = 502, description = "The sandbox's agent cannot be reached \
                (agent_unreachable) or sent a malformed reply (agent_malformed_reply)", body = ErrorBody)))]
pub async fn exec_stream(
    State(st): State<AppState>,
    Path(id): Path<String>,
    ApiJson(req): ApiJson<ExecRequest>,
) -> Result<Response> {
    if req.background {
        return Err(Error::invalid(
            "background processes are not streamed from here: POST .../exec with \
             background, then GET .../processes/{pid}/output?follow=true",
        ));
    }
    Ok(ndjson(st.manager.exec_stream(&id, req).await?))
}

#[utoipa::path(get, path = "/v1/sandboxes/{id}/files", tag = "files",
    params(("id" = String, Path, description = "Sandbox id"), PathQuery),
    responses((status = 200, description = "File contents", content_type = "application/octet-stream", body = FileBytes),
              (status = 400, description = "Relative or bad path, or not a regular file without special=true", body = ErrorBody),
              (status = 403, description = "The guest refused (guest_permission_denied)", body = ErrorBody),
              (status = 404, description = "No such sandbox or file (guest_not_found)", body = ErrorBody),
              (status = 409, description = "Sandbox not running, or paused (sandbox_paused; one created with auto_resume is resumed instead)", body = ErrorBody),
              (status = 413, description = "A device or FIFO (special=true) gave more than 64 MiB; regular files are streamed whatever their size", body = ErrorBody),
              (status = 502, description = "The sandbox's agent cannot be reached \
                (agent_unreachable) or sent a malformed reply (agent_malformed_reply)", body = ErrorBody)))]
pub async fn read_file(
    State(st): State<AppState>,
    Path(id): Path<String>,
    ApiQuery(q): ApiQuery<PathQuery>,
) -> Result<Response> {
    let special = q.special.unwrap_or(false);
    let octets = [(header::CONTENT_TYPE, "application/octet-stream")];
    Ok(match st.manager.read_file(&id, q.path, special).await? {
        FileBody::Whole(data) => (octets, data).into_response(),
        // Chunked: the file may change size while it is read.
        FileBody::Stream { chunks, .. } => {
            let body = axum::body::Body::from_stream(ReceiverStream::new(chunks));
            (octets, body).into_response()
        }
    })
}

#[utoipa::path(put, path = "/v1/sandboxes/{id}/files", tag = "files",
    params(("id" = String, Path, description = "Sandbox id"), PathQuery),
    request_body(content = FileBytes, content_type = "application/octet-stream",
                 description = "New contents (atomic replace; parent directories are created)"),
    responses((status = 200, description = "Written", body = WriteResult),
              (status = 400, description = "Relative path or bad mode", body = ErrorBody),
              (status = 403, description = "The guest refused (guest_permission_denied)", body = ErrorBody),
              (status = 404, description = "No such sandbox", body = ErrorBody),
              (status = 409, description = "Sandbox not running, or paused (sandbox_paused; one created with auto_resume is resumed instead)", body = ErrorBody),
              (status = 413, description = "Body larger than 64 MiB", body = ErrorBody),
              (status = 502, description = "The sandbox's agent cannot be reached \
                (agent_unreachable) or sent a malformed reply (agent_malformed_reply)", body = ErrorBody)))]
pub async fn write_file(
    State(st): State<AppState>,
    Path(id): Path<String>,
    ApiQuery(q): ApiQuery<PathQuery>,
    ApiBytes(body): ApiBytes,
) -> Result<Json<WriteResult>> {
    Ok(Json(
        st.manager
            .write_file(&id, q.path, q.mode, None, body.to_vec())
            .await?,
    ))
}

#[utoipa::path(get, path = "/v1/sandboxes/{id}/files/list", tag = "files",
    params(("id" = String, Path, description = "Sandbox id"), PathQuery),
    responses((status = 200, description = "Directory entries", body = DirListing),
              (status = 400, description = "Relative or bad path", body = ErrorBody),
              (status = 403, description = "The guest refused (guest_permission_denied)", body = ErrorBody),
              (status = 404, description = "No such sandbox or directory", body = ErrorBody),
              (status = 409, description = "Sandbox not running, or paused (sandbox_paused; one created with auto_resume is resumed instead)", body = ErrorBody),
              (status = 502, description = "The sandbox's agent cannot be reached \
                (agent_unreachable) or sent a malformed reply (agent_malformed_reply)", body = ErrorBody)))]
pub async fn list_dir(
    State(st): State<AppState>,
    Path(id): Path<String>,
    ApiQuery(q): ApiQuery<PathQuery>,
) -> Result<Json<DirListing>> {
    Ok(Json(st.manager.list_dir(&id, q.path).await?))
}
