//! Sandbox lifecycle routes.
use axum::extract::{Path, RawQuery, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use tokio_stream::wrappers::UnboundedReceiverStream;

use super::ndjson::ndjson_stream;
use super::{ApiJson, ApiQuery, AppState};
use crate::error::{Error, ErrorBody, Result};
use crate::model::metadata;
use crate::model::{
    BranchEvent, BranchRequest, BranchResponse, CreateEvent, CreateSandboxRequest, DiffQuery,
    KeepRequest, KeepResponse, LogsQuery, MergeReport, MergeRequest, RestoreRequest, Sandbox,
    SandboxDiff, SandboxList, SandboxTree, SetNetworkRequest, SetTtlRequest, Validate,
};

#[utoipa::path(get, path = "/v1/sandboxes", tag = "sandboxes",
    params(("metadata" = Option<Vec<String>>, Query, explode = true,
        description = "`key=value`: only sandboxes whose metadata has it (repeat to AND several)")),
    responses((status = 200, description = "All sandboxes (matching every metadata filter)", body = SandboxList),
              (status = 400, description = "A filter that is not key=value, or an unknown parameter", body = ErrorBody)))]
pub async fn list(
    State(st): State<AppState>,
    RawQuery(query): RawQuery,
) -> Result<Json<SandboxList>> {
    let filters = metadata::parse_filters(query.as_deref())?;
    Ok(Json(SandboxList {
        sandboxes: st.manager.list(&filters)?,
    }))
}

#[utoipa::path(post, path = "/v1/sandboxes", tag = "sandboxes", request_body = CreateSandboxRequest,
    responses((status = 201, description = "Created (n sandboxes, all running; each is listed \
                as `creating` until it runs)", body = SandboxList),
              (status = 200, description = "With `\"stream\": true`, at once: an NDJSON stream of \
                CreateEvent lines: `accepted` (every sandbox recorded, listed as `creating`), \
                one `sandbox` or `sandbox_failed` per sandbox as it comes up or fails, then \
                `done` (the sandboxes) or `error` (all or none: nothing is left). The checks \
                below answer before the stream starts",
               content_type = "application/x-ndjson", body = CreateEvent),
              (status = 400, description = "Invalid request (e.g. an image name that is no reference)", body = ErrorBody),
              (status = 403, description = "The registry of an image (or snapshot pack) pulled on first use refused the daemon's credentials (registry_unauthorized)", body = ErrorBody),
              (status = 404, description = "No such image or snapshot (image_not_found: not in the registry)", body = ErrorBody),
              (status = 409, description = "Name taken", body = ErrorBody),
              (status = 422, description = "The snapshot is from another runtime (unsupported); \
                an image for another platform, malformed, too large, or pulling is off; or more \
                sandboxes than the host's memory holds on the qemu runtime (insufficient_memory: \
                `fit` says how many fit)", body = ErrorBody),
              (status = 502, description = "The registry of an image pulled on first use failed or is unreachable", body = ErrorBody)))]
pub async fn create(
    State(st): State<AppState>,
    ApiJson(req): ApiJson<CreateSandboxRequest>,
) -> Result<Response> {
    let stream = req.stream.unwrap_or(false);
    // In tasks of their own: a client that goes away neither cuts a pull short nor a
    // fan-out between its sandboxes' records (all of them run, or none is left).
    let manager = st.manager.clone();
    let job = tokio::spawn(async move { manager.begin_create(req).await })
        .await
        .map_err(|e| Error::Internal(format!("create task failed: {e}")))??;
    let manager = st.manager.clone();
    if stream {
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        tokio::spawn(manager.finish_create(job, Some(tx)));
        return Ok(ndjson_stream(UnboundedReceiverStream::new(rx)));
    }
    let sandboxes = tokio::spawn(manager.finish_create(job, None))
        .await
        .map_err(|e| Error::Internal(format!("create task failed: {e}")))??;
    Ok((StatusCode::CREATED, Json(SandboxList { sandboxes })).into_response())
}

#[utoipa::path(get, path = "/v1/sandboxes/{id}", tag = "sandboxes",
    params(("id" = String, Path, description = "Sandbox id")),
    responses((status = 200, description = "The sandbox", body = Sandbox),
              (status = 404, description = "No such sandbox", body = ErrorBody)))]
pub async fn get(State(st): State<AppState>, Path(id): Path<String>) -> Result<Json<Sandbox>> {
    Ok(Json(st.manager.get(&id)?))
}

#[utoipa::path(delete, path = "/v1/sandboxes/{id}", tag = "sandboxes",
    params(("id" = String, Path, description = "Sandbox id")),
    responses((status = 204, description = "Killed and removed"),
              (status = 404, description = "No such sandbox", body = ErrorBody)))]
pub async fn delete(State(st): State<AppState>, Path(id): Path<String>) -> Result<StatusCode> {
    st.manager.delete(&id).await?;
    Ok(StatusCode::NO_CONTENT)
}

#[utoipa::path(put, path = "/v1/sandboxes/{id}/ttl", tag = "sandboxes",
    params(("id" = String, Path, description = "Sandbox id")),
    request_body = SetTtlRequest,
    responses((status = 200, description = "The sandbox with its new deadline (now + ttl_secs) or none", body = Sandbox),
              (status = 400, description = "Invalid ttl_secs", body = ErrorBody),
              (status = 404, description = "No such sandbox", body = ErrorBody)))]
pub async fn set_ttl(
    State(st): State<AppState>,
    Path(id): Path<String>,
    ApiJson(req): ApiJson<SetTtlRequest>,
) -> Result<Json<Sandbox>> {
    Ok(Json(st.manager.set_ttl(&id, req).await?))
}

#[utoipa::path(put, path = "/v1/sandboxes/{id}/network", tag = "sandboxes",
    params(("id" = String, Path, description = "Sandbox id")),
    request_body = SetNetworkRequest,
    responses((status = 200, description = "The sandbox under its new network policy, which \
                replaces the old one whole (a field left out is the create default) and is \
                in force for new connections when this answers; branch children made later \
                inherit it", body = Sandbox),
              (status = 400, description = "Invalid CIDRs or lists with network none", body = ErrorBody),
              (status = 404, description = "No such sandbox", body = ErrorBody),
              (status = 409, description = "Not running or paused", body = ErrorBody),
              (status = 422, description = "The daemon's network backend cannot enforce it", body = ErrorBody)))]
pub async fn set_network(
    State(st): State<AppState>,
    Path(id): Path<String>,
    ApiJson(req): ApiJson<SetNetworkRequest>,
) -> Result<Json<Sandbox>> {
    Ok(Json(st.manager.set_network(&id, req).await?))
}

#[utoipa::path(post, path = "/v1/sandboxes/{id}/branch", tag = "sandboxes",
    params(("id" = String, Path, description = "Parent sandbox id")),
    request_body = BranchRequest,
    responses((status = 201, description = "At least one child running; `failed` lists the \
                children that did not come up, with the cause", body = BranchResponse),
              (status = 200, description = "With `\"stream\": true`, at once: an NDJSON stream of \
                BranchEvent lines: `point` (the branch point is taken, the parent runs on; \
                every child's id, each listed as `creating`), one `child` or `child_failed` \
                per child as it comes up or fails, then `done` (the BranchResponse) or \
                `error`. The checks below answer before the stream starts",
               content_type = "application/x-ndjson", body = BranchEvent),
              (status = 500, description = "No child came up (the causes)", body = ErrorBody),
              (status = 400, description = "Invalid count", body = ErrorBody),
              (status = 422, description = "More children than the host's memory holds, on a \
                runtime whose children each copy the parent's memory (insufficient_memory: \
                `fit` says how many fit)", body = ErrorBody),
              (status = 404, description = "No such sandbox", body = ErrorBody),
              (status = 409, description = "Sandbox not running", body = ErrorBody),
              (status = 507, description = "No room on the snapshot directory's filesystem for \
                a kept branch point (no_space)", body = ErrorBody)))]
pub async fn branch(
    State(st): State<AppState>,
    Path(id): Path<String>,
    ApiJson(req): ApiJson<BranchRequest>,
) -> Result<Response> {
    let stream = req.stream.unwrap_or(false);
    let job = st.manager.begin_branch(&id, req).await?;
    // The branch runs in a task of its own: a client that goes away (or stops reading
    // the stream) neither cancels it nor holds it up.
    let manager = st.manager.clone();
    if stream {
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        tokio::spawn(manager.finish_branch(job, Some(tx)));
        return Ok(ndjson_stream(UnboundedReceiverStream::new(rx)));
    }
    let resp = tokio::spawn(manager.finish_branch(job, None))
        .await
        .map_err(|e| Error::Internal(format!("branch task failed: {e}")))??;
    Ok((StatusCode::CREATED, Json(resp)).into_response())
}

#[utoipa::path(post, path = "/v1/sandboxes/{id}/restore", tag = "sandboxes",
    params(("id" = String, Path, description = "Sandbox id")),
    request_body = RestoreRequest,
    responses((status = 200, description = "The sandbox now runs from the snapshot", body = Sandbox),
              (status = 400, description = "Invalid request", body = ErrorBody),
              (status = 404, description = "No such sandbox or snapshot", body = ErrorBody),
              (status = 422, description = "The snapshot is from another runtime", body = ErrorBody)))]
pub async fn restore(
    State(st): State<AppState>,
    Path(id): Path<String>,
    ApiJson(req): ApiJson<RestoreRequest>,
) -> Result<Json<Sandbox>> {
    Ok(Json(st.manager.restore(&id, &req.snapshot).await?))
}

#[utoipa::path(get, path = "/v1/sandboxes/{id}/logs", tag = "sandboxes",
    params(("id" = String, Path, description = "Sandbox id"), LogsQuery),
    responses((status = 200, description = "The end of the serial console log, streamed as it \
                is read (raw bytes, mostly UTF-8). The log keeps at most 2 MiB: the first 64 \
                KiB (the boot), a line `[zygote: N bytes of console output dropped here; ...]` \
                where output was dropped, and the latest output. Empty when the sandbox has no \
                VM (dead, or still being created)", content_type = "text/plain", body = String),
              (status = 400, description = "tail_bytes out of range, or an unknown parameter", body = ErrorBody),
              (status = 404, description = "No such sandbox", body = ErrorBody)))]
pub async fn logs(
    State(st): State<AppState>,
    Path(id): Path<String>,
    ApiQuery(q): ApiQuery<LogsQuery>,
) -> Result<Response> {
    q.validate()?;
    let path = st.manager.console_log(&id)?;
    Ok(super::console::tail_body(path, q.bytes()).await)
}

#[utoipa::path(get, path = "/v1/sandboxes/{id}/tree", tag = "sandboxes",
    params(("id" = String, Path, description = "Any sandbox of the tree")),
    responses((status = 200, description = "Its lineage: the topmost existing ancestor and every \
                descendant, with each one's unique memory and disk layer, and the snapshots \
                and branch points taken of them", body = SandboxTree),
              (status = 404, description = "No such sandbox", body = ErrorBody)))]
pub async fn tree(State(st): State<AppState>, Path(id): Path<String>) -> Result<Json<SandboxTree>> {
    Ok(Json(st.manager.tree(&id)?))
}

#[utoipa::path(post, path = "/v1/sandboxes/{id}/keep", tag = "sandboxes",
    params(("id" = String, Path, description = "The branch child to keep")),
    request_body = KeepRequest,
    responses((status = 200, description = "Its siblings (the other children of its branch \
                point) and their descendants are deleted; with `promote`, its parent too, \
                whose name it takes", body = KeepResponse),
              (status = 404, description = "No such sandbox", body = ErrorBody),
              (status = 409, description = "Not a branch child, no siblings left, or no parent \
                to promote over", body = ErrorBody)))]
pub async fn keep(
    State(st): State<AppState>,
    Path(id): Path<String>,
    ApiJson(req): ApiJson<KeepRequest>,
) -> Result<Json<KeepResponse>> {
    Ok(Json(st.manager.keep(&id, req).await?))
}

#[utoipa::path(get, path = "/v1/sandboxes/{id}/diff", tag = "sandboxes",
    params(("id" = String, Path, description = "Sandbox id"), DiffQuery),
    responses((status = 200, description = "How this sandbox's files under `path` differ from \
                `against`'s: added, removed and modified entries (both guests walk the \
                directory and hash every file)", body = SandboxDiff),
              (status = 400, description = "Invalid path, or a tree over 50000 entries", body = ErrorBody),
              (status = 404, description = "No such sandbox, or no such directory in a guest", body = ErrorBody),
              (status = 409, description = "A sandbox is not running", body = ErrorBody)))]
pub async fn diff(
    State(st): State<AppState>,
    Path(id): Path<String>,
    ApiQuery(q): ApiQuery<DiffQuery>,
) -> Result<Json<SandboxDiff>> {
    Ok(Json(st.manager.diff(&id, q).await?))
}

#[utoipa::path(post, path = "/v1/sandboxes/{id}/merge", tag = "sandboxes",
    params(("id" = String, Path, description = "The sandbox merged into")),
    request_body = MergeRequest,
    responses((status = 200, description = "What `from` changed under `paths` since the common \
                branch point, made here: `applied` is true. When a path changed on both sides \
                differently and `on_conflict` is `fail`, nothing is changed, `applied` is false \
                and `conflicts` lists them (as it does with `dry_run`)", body = MergeReport),
              (status = 400, description = "Invalid paths or from", body = ErrorBody),
              (status = 404, description = "No such sandbox", body = ErrorBody),
              (status = 409, description = "A sandbox is not running, the two are not of one \
                tree, or their common state was not kept", body = ErrorBody)))]
pub async fn merge(
    State(st): State<AppState>,
    Path(id): Path<String>,
    ApiJson(req): ApiJson<MergeRequest>,
) -> Result<Json<MergeReport>> {
    Ok(Json(st.manager.merge(&id, req).await?))
}
