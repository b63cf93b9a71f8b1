//! E2B's sandbox logs, read from the sandbox's event log ([`crate::event_log`]; what the
//! daemon did to it and in it: started, branched, paused, commands, network changes):
//!
//! - `GET /v2/sandboxes/{id}/logs?cursor=&limit=&direction=&level=&search=` →
//!   `{"logs": [SandboxLogEntry]}`: newest first by default (`direction=backward`);
//!   `cursor` (unix ms) is where to start, inclusive, in that direction.
//! - `GET /sandboxes/{id}/logs?start=&limit=` (the older call) → `{"logs": [{timestamp,
//!   line}], "logEntries": [SandboxLogEntry]}`, oldest first from `start`.
//!
//! Neither SDK calls these (E2B's CLI does). Logs outlive a sandbox's VM (a dead one
//! still has them) but not the sandbox: a deleted sandbox is E2B's 404.
use std::collections::BTreeMap;

use axum::extract::rejection::QueryRejection;
use axum::extract::{Path, Query, State};
use axum::Json;
use serde::{Deserialize, Serialize};

use super::page::bad_param;
use super::ControlError;
use crate::api::AppState;
use crate::model::{EventLevel, EventOrder, EventsQuery, SandboxEvent, MAX_EVENTS_PER_QUERY};

/// E2B's `SandboxLogEntry`.
#[derive(Debug, Serialize)]
pub(super) struct LogEntry {
    timestamp: String,
    level: &'static str,
    message: String,
    fields: BTreeMap<String, String>,
}

/// E2B's `SandboxLog`: one line of text.
#[derive(Debug, Serialize)]
pub(super) struct LogLine {
    timestamp: String,
    line: String,
}

#[derive(Debug, Serialize)]
pub(super) struct LogsV2 {
    logs: Vec<LogEntry>,
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct LogsV1 {
    logs: Vec<LogLine>,
    log_entries: Vec<LogEntry>,
}

/// The v2 query, read as text so that each bad value gets E2B's message.
#[derive(Debug, Deserialize)]
pub(super) struct V2Query {
    cursor: Option<String>,
    limit: Option<String>,
    direction: Option<String>,
    level: Option<String>,
    search: Option<String>,
}

#[derive(Debug, Deserialize)]
pub(super) struct V1Query {
    start: Option<String>,
    limit: Option<String>,
}

pub(super) async fn logs_v2(
    State(st): State<AppState>,
    Path(id): Path<String>,
    query: Result<Query<V2Query>, QueryRejection>,
) -> Result<Json<LogsV2>, ControlError> {
    let Query(q) = query.map_err(|e| ControlError::BadRequest(e.body_text()))?;
    let cursor = q
        .cursor
        .as_deref()
        .map(|c| number("cursor", c))
        .transpose()?;
    let backward = match q.direction.as_deref() {
        None | Some("backward") => true,
        Some("forward") => false,
        Some(other) => {
            return Err(bad_param(
                "direction",
                &format!(
                    "value is not one of the allowed values [\"forward\",\"backward\"]: {other:?}"
                ),
            ))
        }
    };
    let level = q.level.as_deref().map(level).transpose()?;
    if q.search.as_ref().is_some_and(|s| s.chars().count() > 256) {
        return Err(bad_param("search", "maximum string length is 256"));
    }
    let (since_ms, until_ms) = match backward {
        true => (None, cursor),
        false => (cursor, None),
    };
    let events = read(
        &st,
        &id,
        EventsQuery {
            since_ms,
            until_ms,
            limit: Some(limit(q.limit.as_deref())?),
            order: Some(if backward {
                EventOrder::Desc
            } else {
                EventOrder::Asc
            }),
            level,
            search: q.search,
        },
    )?;
    Ok(Json(LogsV2 {
        logs: events.iter().map(entry).collect(),
    }))
}

pub(super) async fn logs_v1(
    State(st): State<AppState>,
    Path(id): Path<String>,
    query: Result<Query<V1Query>, QueryRejection>,
) -> Result<Json<LogsV1>, ControlError> {
    let Query(q) = query.map_err(|e| ControlError::BadRequest(e.body_text()))?;
    let start = q.start.as_deref().map(|s| number("start", s)).transpose()?;
    let events = read(
        &st,
        &id,
        EventsQuery {
            since_ms: start,
            limit: Some(limit(q.limit.as_deref())?),
            ..Default::default()
        },
    )?;
    Ok(Json(LogsV1 {
        logs: events
            .iter()
            .map(|e| LogLine {
                timestamp: timestamp(e.ts_ms),
                line: line(e),
            })
            .collect(),
        log_entries: events.iter().map(entry).collect(),
    }))
}

/// The events `q` asks for; a `limit` of 0 (which E2B allows) answers none.
fn read(st: &AppState, id: &str, q: EventsQuery) -> Result<Vec<SandboxEvent>, ControlError> {
    let want = q.limit;
    let q = EventsQuery {
        limit: want.map(|n| n.max(1)),
        ..q
    };
    let mut events = st
        .manager
        .events(id, &q)
        .map_err(|e| ControlError::about_sandbox(id, e))?
        .events;
    if want == Some(0) {
        events.clear();
    }
    Ok(events)
}

fn entry(e: &SandboxEvent) -> LogEntry {
    LogEntry {
        timestamp: timestamp(e.ts_ms),
        level: e.level.as_str(),
        message: e.message.clone(),
        fields: e.fields.clone(),
    }
}

/// An event as one line: its message, then its fields as `key=value`.
fn line(e: &SandboxEvent) -> String {
    let mut line = e.message.clone();
    for (k, v) in &e.fields {
        line.push_str(&format!(" {k}={v}"));
    }
    line
}

/// Unix milliseconds as RFC 3339 with milliseconds (`2026-11-27T21:40:00.123Z`).
fn timestamp(ms: u64) -> String {
    use time::format_description::well_known::Rfc3339;
    let nanos = i128::from(ms) * 1_000_000;
    time::OffsetDateTime::from_unix_timestamp_nanos(nanos)
        .ok()
        .and_then(|t| t.format(&Rfc3339).ok())
        .unwrap_or_else(|| "9999-12-31T23:59:59Z".into())
}

/// A non-negative integer query value.
fn number(name: &str, raw: &str) -> Result<u64, ControlError> {
    raw.parse::<u64>().map_err(|_| {
        bad_param(
            name,
            &format!("value {raw:?} is not a non-negative integer"),
        )
    })
}

/// `limit`: 0..=1000, default 1000 (E2B's bounds).
fn limit(raw: Option<&str>) -> Result<u32, ControlError> {
    let Some(raw) = raw else {
        return Ok(MAX_EVENTS_PER_QUERY);
    };
    match raw.parse::<u32>() {
        Ok(n) if n <= MAX_EVENTS_PER_QUERY => Ok(n),
        _ => Err(bad_param(
            "limit",
            &format!("number must be at most {MAX_EVENTS_PER_QUERY} and not negative: {raw:?}"),
        )),
    }
}

fn level(raw: &str) -> Result<EventLevel, ControlError> {
    match raw {
        "debug" => Ok(EventLevel::Debug),
        "info" => Ok(EventLevel::Info),
        "warn" => Ok(EventLevel::Warn),
        "error" => Ok(EventLevel::Error),
        other => Err(bad_param(
            "level",
            &format!(
                "value is not one of the allowed values [\"debug\",\"info\",\"warn\",\"error\"]: {other:?}"
            ),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timestamps_keep_milliseconds() {
        assert_eq!(timestamp(0), "1970-01-01T00:00:00Z");
        assert_eq!(timestamp(1_000_123), "1970-01-01T00:16:40.123Z");
        assert_eq!(timestamp(u64::MAX), "9999-12-31T23:59:59Z");
    }

    #[test]
    fn bad_values_get_e2bs_400s() {
        assert!(limit(Some("1001")).is_err());
        assert!(limit(Some("-1")).is_err());
        assert_eq!(limit(Some("0")).unwrap(), 0);
        assert_eq!(limit(None).unwrap(), 1000);
        assert!(number("cursor", "x").is_err());
        assert!(level("fatal").is_err());
        assert_eq!(level("warn").unwrap(), EventLevel::Warn);
    }
}
