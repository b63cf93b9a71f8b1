//! E2B's template API (the SDK's `Template.build`, `Template.exists`, tags): a template
//! is a **snapshot** of a sandbox the build ran its steps in, like E2B's own templates
//! and like `create_snapshot` (`snapshots`), so `Sandbox.create("<name>[:<tag>]")` starts
//! from it with its memory, processes and files (`sandboxes::create`).
//!
//! A build is requested (`POST /v3/templates`: a `waiting` build row), its COPY files
//! uploaded (`templates_upload`), started (`POST /v2/templates/{id}/builds/{buildID}`:
//! the steps are checked here, run by `templates_build`) and polled (`GET
//! .../status?logsOffset=`). The template's id is its name; a tag names one ready build
//! (`default` when the name has none). Rows live in the state database
//! (`db_templates`).
use axum::extract::rejection::QueryRejection;
use axum::extract::{Path, Query, Request, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Deserialize;

use super::templates_build::{self, Plan};
use super::templates_wire::{
    AliasAnswer, AssignTags, AssignedTags, BuildRequest, BuildRequested, BuildStart, BuildStatus,
    DeleteTags, LogEntry, Reason, ReasonAnswer, TagInfo,
};
use super::{json_body, ControlError};
use crate::api::AppState;
use crate::db::{BuildLogRow, BuildRow};
use crate::e2b::time::rfc3339;
use crate::error::Error;

/// The tag a name without one means.
pub const DEFAULT_TAG: &str = "default";
/// Bytes of a template name or tag.
const MAX_NAME_BYTES: usize = 128;
/// Tags one request may name.
const MAX_TAGS: usize = 32;
/// Log lines one status answer carries (E2B's page size).
const LOG_PAGE: u64 = 100;

/// A name or tag: 1..=128 of `[A-Za-z0-9._-]`, not starting with `.` or `-`.
fn valid_word(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= MAX_NAME_BYTES
        && !s.starts_with(['.', '-'])
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b))
}

/// `name[:tag]` split and checked (a 400 naming the bad part otherwise).
pub(super) fn split_name(s: &str) -> Result<(String, Option<String>), ControlError> {
    let (name, tag) = match s.split_once(':') {
        Some((n, t)) => (n, Some(t)),
        None => (s, None),
    };
    if !valid_word(name) {
        return Err(ControlError::BadRequest(format!(
            "invalid template name {:?}: 1 to {MAX_NAME_BYTES} letters, digits, '.', '_' or '-'",
            printable(name)
        )));
    }
    if let Some(t) = tag.filter(|t| !valid_word(t)) {
        return Err(ControlError::BadRequest(format!(
            "invalid tag {:?}: 1 to {MAX_NAME_BYTES} letters, digits, '.', '_' or '-'",
            printable(t)
        )));
    }
    Ok((name.to_string(), tag.map(str::to_string)))
}

fn printable(s: &str) -> String {
    s.chars()
        .take(MAX_NAME_BYTES)
        .filter(|c| !c.is_control())
        .collect()
}

/// The ready build `reference` (`name[:tag]`) names, if any.
pub(super) fn resolve(st: &AppState, reference: &str) -> Result<Option<BuildRow>, ControlError> {
    let Ok((name, tag)) = split_name(reference) else {
        return Ok(None);
    };
    let tag = tag.unwrap_or_else(|| DEFAULT_TAG.to_string());
    let db = &st.manager.db;
    let Some(t) = db.template_tags(&name)?.into_iter().find(|t| t.tag == tag) else {
        return Ok(None);
    };
    Ok(db
        .build(&t.build)?
        .filter(|b| b.status == "ready" && b.snapshot.is_some()))
}

/// A build of template `template`, or E2B's 404.
fn build_of(st: &AppState, template: &str, build: &str) -> Result<BuildRow, ControlError> {
    st.manager
        .db
        .build(build)?
        .filter(|b| b.template == template)
        .ok_or_else(|| {
            ControlError::NotFound(format!(
                "build '{}' of template '{}' not found",
                printable(build),
                printable(template)
            ))
        })
}

fn template_known(st: &AppState, template: &str) -> Result<(), ControlError> {
    if st.manager.db.builds_of(template)?.is_empty() {
        return Err(ControlError::TemplateNotFound(printable(template)));
    }
    Ok(())
}

/// A build id as E2B's (a UUID, which the SDK parses), from the CSPRNG.
fn new_build_id() -> String {
    let h = crate::ids::random_hex(16);
    format!(
        "{}-{}-4{}-a{}-{}",
        &h[0..8],
        &h[8..12],
        &h[13..16],
        &h[17..20],
        &h[20..32]
    )
}

/// `POST /v3/templates` → 202: a `waiting` build of `name[:tag]` (+ `tags`).
pub(super) async fn request_build(
    State(st): State<AppState>,
    req: Request,
) -> Result<Response, ControlError> {
    let body: BuildRequest = json_body(req).await?;
    let full = body
        .name
        .or(body.alias)
        .ok_or_else(|| ControlError::BadRequest("name is required".into()))?;
    let (name, tag) = split_name(&full)?;
    let mut tags: Vec<String> = tag.into_iter().collect();
    for t in body.tags.unwrap_or_default() {
        split_name(&format!("{name}:{t}"))?;
        if !tags.contains(&t) {
            tags.push(t);
        }
    }
    if tags.len() > MAX_TAGS {
        return Err(ControlError::BadRequest(format!(
            "at most {MAX_TAGS} tags per build"
        )));
    }
    if tags.is_empty() {
        tags.push(DEFAULT_TAG.to_string());
    }
    use zygote_api::model::{MAX_MEM_MIB, MAX_VCPUS, MIN_MEM_MIB};
    let vcpus = body.cpu_count.map(|c| u32::try_from(c).unwrap_or(0));
    let mem_mib = body.memory_mb.map(|m| u32::try_from(m).unwrap_or(0));
    if vcpus.is_some_and(|c| !(1..=MAX_VCPUS).contains(&c))
        || mem_mib.is_some_and(|m| !(MIN_MEM_MIB..=MAX_MEM_MIB).contains(&m))
    {
        return Err(ControlError::BadRequest(format!(
            "cpuCount must be 1 to {MAX_VCPUS} and memoryMB {MIN_MEM_MIB} to {MAX_MEM_MIB}"
        )));
    }
    let row = BuildRow {
        id: new_build_id(),
        template: name.clone(),
        tags: serde_json::to_string(&tags).map_err(|e| Error::Internal(e.to_string()))?,
        status: "waiting".into(),
        reason: None,
        snapshot: None,
        defaults: None,
        created_at: crate::manager::now(),
        vcpus,
        mem_mib,
    };
    st.manager.db.put_build(&row)?;
    let answer = BuildRequested {
        template_id: name.clone(),
        build_id: row.id,
        public: false,
        names: vec![name.clone()],
        tags,
        aliases: vec![name],
    };
    Ok((StatusCode::ACCEPTED, Json(answer)).into_response())
}

/// `POST /v2/templates/{id}/builds/{buildID}` → 202: the steps are checked, then run
/// in a task of their own (the SDK polls the status).
pub(super) async fn start_build(
    State(st): State<AppState>,
    Path((template, build)): Path<(String, String)>,
    req: Request,
) -> Result<StatusCode, ControlError> {
    let body: BuildStart = json_body(req).await?;
    let mut row = build_of(&st, &template, &build)?;
    if row.status != "waiting" {
        return Err(ControlError::BadRequest(format!(
            "build '{build}' was started already"
        )));
    }
    let plan = Plan::check(&st, body)?;
    row.status = "building".into();
    st.manager.db.put_build(&row)?;
    tokio::spawn(templates_build::run(st.manager.clone(), row, plan));
    Ok(StatusCode::ACCEPTED)
}

#[derive(Debug, Deserialize)]
pub(super) struct StatusQuery {
    #[serde(rename = "logsOffset")]
    logs_offset: Option<u64>,
}

fn log_entry(l: BuildLogRow) -> LogEntry {
    let secs = l.at_ms / 1000;
    let ts = rfc3339(secs);
    // rfc3339 gives whole seconds ("...:05Z"): the milliseconds go before the Z.
    let timestamp = match ts.strip_suffix('Z') {
        Some(base) => format!("{base}.{:03}Z", l.at_ms % 1000),
        None => ts,
    };
    LogEntry {
        timestamp,
        message: l.message,
        level: l.level,
        step: l.step,
    }
}

/// `GET /templates/{id}/builds/{buildID}/status?logsOffset=` → 200: the status, at
/// most [`LOG_PAGE`] log lines from `logsOffset` on, and why a failed build failed.
pub(super) async fn status(
    State(st): State<AppState>,
    Path((template, build)): Path<(String, String)>,
    query: Result<Query<StatusQuery>, QueryRejection>,
) -> Result<Json<BuildStatus>, ControlError> {
    let Query(q) = query.map_err(|e| ControlError::BadRequest(e.body_text()))?;
    let row = build_of(&st, &template, &build)?;
    let db = &st.manager.db;
    let entries: Vec<LogEntry> = db
        .build_logs(&build, q.logs_offset.unwrap_or(0), LOG_PAGE)?
        .into_iter()
        .map(log_entry)
        .collect();
    let reason = match (&row.status[..], &row.reason) {
        ("error", Some(r)) => {
            let reason: Reason = serde_json::from_str(r).unwrap_or(Reason {
                message: r.clone(),
                step: None,
            });
            let step_lines = db
                .build_logs(&build, 0, u64::MAX)?
                .into_iter()
                .filter(|l| l.step.is_some() && l.step == reason.step)
                .map(log_entry)
                .collect();
            Some(ReasonAnswer {
                reason,
                log_entries: step_lines,
            })
        }
        _ => None,
    };
    Ok(Json(BuildStatus {
        logs: entries.iter().map(|e| e.message.clone()).collect(),
        log_entries: entries,
        template_id: template,
        build_id: build,
        status: row.status,
        reason,
    }))
}

/// `GET /templates/aliases/{alias}` (`Template.exists`): 200 when a ready build has the
/// name, E2B's 404 otherwise.
pub(super) async fn alias(
    State(st): State<AppState>,
    Path(alias): Path<String>,
) -> Result<Json<AliasAnswer>, ControlError> {
    let (name, _) = split_name(&alias)?;
    if st.manager.db.template_tags(&name)?.is_empty() {
        return Err(ControlError::NotFound(format!(
            "template alias '{}' not found",
            printable(&alias)
        )));
    }
    Ok(Json(AliasAnswer {
        template_id: name,
        public: false,
    }))
}

/// `POST /templates/tags` → 201: `tags` name the build `target` (`name:tag`) names.
pub(super) async fn assign_tags(
    State(st): State<AppState>,
    req: Request,
) -> Result<Response, ControlError> {
    let body: AssignTags = json_body(req).await?;
    let (name, _) = split_name(&body.target)?;
    for t in &body.tags {
        split_name(&format!("{name}:{t}"))?;
    }
    if body.tags.is_empty() || body.tags.len() > MAX_TAGS {
        return Err(ControlError::BadRequest(format!(
            "tags must name 1 to {MAX_TAGS} tags"
        )));
    }
    let build = resolve(&st, &body.target)?.ok_or_else(|| {
        ControlError::NotFound(format!("template '{}' not found", printable(&body.target)))
    })?;
    st.manager
        .db
        .set_tags(&name, &body.tags, &build.id, crate::manager::now())?;
    let answer = AssignedTags {
        tags: body.tags,
        build_id: build.id,
    };
    Ok((StatusCode::CREATED, Json(answer)).into_response())
}

/// `DELETE /templates/tags` → 204 (404 for an unknown name).
pub(super) async fn remove_tags(
    State(st): State<AppState>,
    req: Request,
) -> Result<StatusCode, ControlError> {
    let body: DeleteTags = json_body(req).await?;
    let (name, _) = split_name(&body.name)?;
    let have = st.manager.db.template_tags(&name)?;
    if have.is_empty() {
        return Err(ControlError::TemplateNotFound(printable(&name)));
    }
    if let Some(t) = body
        .tags
        .iter()
        .find(|t| !have.iter().any(|h| h.tag == **t))
    {
        return Err(ControlError::NotFound(format!(
            "tag '{}' of template '{name}' not found",
            printable(t)
        )));
    }
    st.manager.db.remove_tags(&name, &body.tags)?;
    Ok(StatusCode::NO_CONTENT)
}

/// `GET /templates/{id}/tags` → 200 `[{tag, buildID, createdAt}]`.
pub(super) async fn list_tags(
    State(st): State<AppState>,
    Path(template): Path<String>,
) -> Result<Json<Vec<TagInfo>>, ControlError> {
    let (name, _) = split_name(&template)?;
    let tags = st.manager.db.template_tags(&name)?;
    if tags.is_empty() {
        template_known(&st, &name)?;
    }
    Ok(Json(
        tags.into_iter()
            .map(|t| TagInfo {
                tag: t.tag,
                build_id: t.build,
                created_at: rfc3339(t.created_at),
            })
            .collect(),
    ))
}

/// `DELETE /templates/{name}` for a template (not a snapshot id): its builds, tags and
/// cache entries go, then every snapshot they named that nothing else uses. `None`
/// when no template has the name.
pub(super) fn delete_template(st: &AppState, name: &str) -> Result<Option<()>, ControlError> {
    let db = &st.manager.db;
    if db.builds_of(name)?.is_empty() {
        return Ok(None);
    }
    let ours: Vec<String> = db
        .builds_of(name)?
        .into_iter()
        .filter_map(|b| b.snapshot)
        .collect();
    let in_use = db
        .sandboxes()?
        .iter()
        .any(|s| s.depends_on.iter().any(|d| ours.contains(d)));
    if in_use {
        return Err(ControlError::BadRequest(format!(
            "cannot delete template '{name}' because there are running sandboxes using it"
        )));
    }
    let mut snaps = db.forget_template(name)?;
    // Descendants first: a later snapshot of a build depends on its earlier ones (and
    // has a longer chain); snapshots taken in the same second are ordered by it too.
    snaps.sort_by_key(|s| {
        std::cmp::Reverse(
            db.snapshot(s)
                .ok()
                .flatten()
                .map_or(0, |r| r.depends_on.len()),
        )
    });
    for s in snaps {
        if db.template_uses_snapshot(&s)? {
            continue;
        }
        match st.manager.delete_snapshot(&s) {
            Ok(()) | Err(Error::NotFound { .. }) => {}
            Err(e) => tracing::warn!("deleting template {name}: snapshot {s}: {e}"),
        }
    }
    Ok(Some(()))
}

/// Reads the caller's `Host` for URLs it is to call back (the upload URL).
pub(super) fn host_of(headers: &HeaderMap) -> Option<String> {
    headers
        .get(axum::http::header::HOST)
        .and_then(|h| h.to_str().ok())
        .filter(|h| {
            !h.is_empty()
                && h.len() <= 255
                && h.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b".-:[]".contains(&b))
        })
        .map(str::to_string)
}
