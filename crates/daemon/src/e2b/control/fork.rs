//! `POST /sandboxes/{id}/fork` (`sandbox.fork(count=N)`): a zygote branch. The
//! running sandbox is captured once and `count` copy-on-write children start from
//! that point, each with its processes running and its memory as the parent's was
//! (`Manager::begin_branch`/`finish_branch`, the path of `POST /v1/sandboxes/{id}/branch`);
//! the parent runs on with its id and deadline.
//!
//! E2B's answer is 201 with one entry per requested fork, in order: `{"sandbox":
//! Sandbox}` or `{"error": Error}` (each fork succeeds or fails on its own). Checks
//! answer before anything is made: count 1..=100 (E2B's bounds; the SDK allows 1..=20,
//! zygote's own branch limit is larger), the timeout, the sandbox (404; 409 when
//! paused), and the host's memory for `count` children (E2B's 400 for a count over
//! the sandbox limit, saying how many fit).
use axum::extract::{Path, Request, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;

use super::{answer, json_body, timeout_secs, visible, ControlError};
use crate::api::AppState;
use crate::e2b::model::{ErrorBody, ForkResult, ForkSandbox};
use crate::error::Error;
use crate::model::BranchRequest;

/// E2B's API bound on `count`.
pub const MAX_FORK_COUNT: i64 = 100;

/// What a fork that did not start says: the runtime's own words may name host paths.
const FORK_FAILED: &str = "Failed to start the forked sandbox";

pub(super) async fn fork(
    State(st): State<AppState>,
    Path(id): Path<String>,
    req: Request,
) -> Result<Response, ControlError> {
    let body: ForkSandbox = json_body(req).await?;
    let ttl = timeout_secs(body.timeout)?;
    let count = body.count.unwrap_or(1);
    if count < 1 {
        return Err(ControlError::BadRequest("Count must be at least 1".into()));
    }
    if count > MAX_FORK_COUNT {
        return Err(ControlError::BadRequest(format!(
            "Count cannot be greater than {MAX_FORK_COUNT}"
        )));
    }
    if visible(&st, &id)?.1 == "paused" {
        return Err(refused(&id, Error::Paused(id.clone())));
    }
    let request = BranchRequest {
        count: Some(count as u32),
        ttl_secs: Some(ttl),
        ..Default::default()
    };
    let job = st
        .manager
        .begin_branch(&id, request)
        .await
        .map_err(|e| refused(&id, e))?;
    // In a task of its own, as the REST branch: a client that goes away does not cut
    // the branch short between its records.
    let manager = st.manager.clone();
    let done = tokio::spawn(manager.finish_branch(job, None))
        .await
        .map_err(|e| Error::Internal(format!("branch task failed: {e}")))?;
    let done = match done {
        Ok(d) => d,
        Err(e) => {
            tracing::warn!(sandbox = %id, "E2B fork failed: {e}");
            return Err(ControlError::Failed("Error forking sandbox"));
        }
    };
    let mut children = done.children.iter();
    let mut results = Vec::with_capacity(count as usize);
    for index in 0..count as u32 {
        let failed = done.failed.iter().any(|f| f.index == index);
        let child = (!failed).then(|| children.next()).flatten();
        let entry = match child.map(|c| st.manager.get(c)) {
            Some(Ok(c)) => ForkResult::Sandbox(answer(&st, &c)),
            _ => ForkResult::Error(ErrorBody {
                code: 500,
                message: FORK_FAILED.into(),
            }),
        };
        results.push(entry);
    }
    Ok((StatusCode::CREATED, Json(results)).into_response())
}

/// A branch refused before anything was made, in E2B's words.
fn refused(id: &str, e: Error) -> ControlError {
    match e {
        Error::InsufficientMemory { fit, .. } => ControlError::BadRequest(format!(
            "Count must be lower than the maximum number of concurrent sandboxes ({}): \
             this host's memory holds {fit} more",
            fit + 1
        )),
        Error::Paused(_) => ControlError::Conflict(format!(
            "Sandbox '{id}' is paused and cannot be forked; resume it first"
        )),
        Error::NotRunning { state, .. } | Error::WrongState { state, .. } => {
            ControlError::Conflict(format!(
                "Sandbox '{id}' cannot be forked while in '{state}' state"
            ))
        }
        e => ControlError::about_sandbox(id, e),
    }
}
