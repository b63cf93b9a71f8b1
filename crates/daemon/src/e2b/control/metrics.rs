//! `Sandbox.get_metrics(start, end)` (`GET /sandboxes/{id}/metrics`) and the batch form
//! `GET /sandboxes/metrics?sandbox_ids=a,b`, on the daemon's own time series
//! (`manager::metrics_sampler`): the samples it took of a running sandbox, mapped onto
//! E2B's `SandboxMetric` field names. Bad values get E2B's OpenAPI validator's 400s.
use std::collections::BTreeMap;

use axum::extract::rejection::QueryRejection;
use axum::extract::{Path, Query, State};
use axum::Json;
use serde::Deserialize;

use super::page::bad_param;
use super::{visible, ControlError};
use crate::api::AppState;
use crate::e2b::model::{SandboxMetric, SandboxesWithMetrics};
use crate::model::MetricsQuery;

/// Most sandboxes one batch call names (E2B's `maxSandboxMetricsCount`).
pub const MAX_BATCH: usize = 100;

/// The time range, read as text: each value is checked here, with E2B's messages.
#[derive(Debug, Deserialize)]
pub(super) struct RangeQuery {
    start: Option<String>,
    end: Option<String>,
}

/// A unix-seconds bound (int64 in E2B's schema; before 1970 is 0).
fn seconds(name: &str, raw: Option<&str>) -> Result<Option<u64>, ControlError> {
    raw.map(|r| {
        r.parse::<i64>().map(|s| s.max(0) as u64).map_err(|_| {
            bad_param(
                name,
                &format!("value {r}: an invalid integer: invalid syntax"),
            )
        })
    })
    .transpose()
}

pub(super) async fn get_metrics(
    State(st): State<AppState>,
    Path(id): Path<String>,
    query: Result<Query<RangeQuery>, QueryRejection>,
) -> Result<Json<Vec<SandboxMetric>>, ControlError> {
    let Query(q) = query.map_err(|e| ControlError::BadRequest(e.body_text()))?;
    let range = MetricsQuery {
        start: seconds("start", q.start.as_deref())?,
        end: seconds("end", q.end.as_deref())?,
    };
    if q.end.as_deref().is_some_and(|e| e.starts_with('-')) {
        // An end before 1970: nothing was sampled then.
        visible(&st, &id)?;
        return Ok(Json(Vec::new()));
    }
    if let (Some(s), Some(e)) = (range.start, range.end) {
        if s > e {
            return Err(ControlError::BadRequest(format!(
                "start ({s}) must not be after end ({e})"
            )));
        }
    }
    visible(&st, &id)?;
    let list = st
        .manager
        .metrics(&id, &range)
        .map_err(|e| ControlError::about_sandbox(&id, e))?;
    Ok(Json(list.metrics.iter().map(SandboxMetric::from).collect()))
}

/// The ids of `sandbox_ids`, comma-separated (the Python SDK) or repeated (form
/// style with explode), in order, each once.
fn sandbox_ids(pairs: &[(String, String)]) -> Result<Vec<String>, ControlError> {
    let mut ids: Vec<String> = Vec::new();
    for (key, value) in pairs {
        if key != "sandbox_ids" {
            continue;
        }
        for id in value.split(',').filter(|s| !s.is_empty()) {
            if !ids.iter().any(|i| i == id) {
                ids.push(id.to_string());
            }
        }
    }
    if ids.is_empty() {
        return Err(bad_param("sandbox_ids", "value is required but missing"));
    }
    if ids.len() > MAX_BATCH {
        return Err(ControlError::BadRequest(format!(
            "Too many sandboxes requested, maximum is {MAX_BATCH}"
        )));
    }
    Ok(ids)
}

/// `GET /sandboxes/metrics?sandbox_ids=...`: the newest sample of each named sandbox
/// that has one (others, unknown ones included, are left out, as E2B does).
pub(super) async fn list_metrics(
    State(st): State<AppState>,
    query: Result<Query<Vec<(String, String)>>, QueryRejection>,
) -> Result<Json<SandboxesWithMetrics>, ControlError> {
    let Query(pairs) = query.map_err(|e| ControlError::BadRequest(e.body_text()))?;
    let ids = sandbox_ids(&pairs)?;
    let visible_ids: Vec<&str> = ids
        .iter()
        .map(String::as_str)
        .filter(|id| visible(&st, id).is_ok())
        .collect();
    let sandboxes: BTreeMap<String, SandboxMetric> = st
        .manager
        .latest_metrics(visible_ids)
        .iter()
        .map(|(id, s)| (id.clone(), SandboxMetric::from(s)))
        .collect();
    Ok(Json(SandboxesWithMetrics { sandboxes }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pairs(v: &[(&str, &str)]) -> Vec<(String, String)> {
        v.iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn sandbox_ids_are_comma_separated_or_repeated() {
        let q = pairs(&[
            ("sandbox_ids", "a,b"),
            ("sandbox_ids", "c"),
            ("x", "1"),
            ("sandbox_ids", "a"),
        ]);
        assert_eq!(sandbox_ids(&q).unwrap(), ["a", "b", "c"]);
        assert!(sandbox_ids(&[]).is_err());
        assert!(sandbox_ids(&pairs(&[("sandbox_ids", "")])).is_err());
        let many = (0..=MAX_BATCH)
            .map(|i| format!("s{i}"))
            .collect::<Vec<_>>()
            .join(",");
        let e = sandbox_ids(&pairs(&[("sandbox_ids", &many)])).unwrap_err();
        assert_eq!(
            e.to_string(),
            "Too many sandboxes requested, maximum is 100"
        );
    }

    #[test]
    fn bounds_are_int64_seconds() {
        assert_eq!(seconds("start", Some("17")).unwrap(), Some(17));
        assert_eq!(seconds("start", Some("-5")).unwrap(), Some(0));
        assert_eq!(seconds("start", None).unwrap(), None);
        let e = seconds("start", Some("soon")).unwrap_err().to_string();
        assert!(
            e.contains("parameter \"start\" in query") && e.contains("soon"),
            "{e}"
        );
    }
}
