//! `GET /v2/sandboxes` (`Sandbox.list`, the SDK's paginator): the sandboxes E2B would
//! know of (running or paused; never one being created, dead or being deleted),
//! filtered by `metadata`, `state`, `startedAfter` and `template`, newest first unless
//! `order=asc`, a page at a time ([`super::page`]). Bad values get E2B's 400s.
use axum::extract::rejection::QueryRejection;
use axum::extract::{Query, State};
use axum::response::Response;
use serde::Deserialize;

use super::page::{self, bad_param, Page};
use super::{listed, template_of, ControlError};
use crate::api::AppState;

/// The query, read as text: each value is checked here, with E2B's messages.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct ListQuery {
    metadata: Option<String>,
    state: Option<String>,
    order: Option<String>,
    started_after: Option<String>,
    template: Option<String>,
    next_token: Option<String>,
    limit: Option<String>,
}

pub(super) async fn list_sandboxes(
    State(st): State<AppState>,
    query: Result<Query<ListQuery>, QueryRejection>,
) -> Result<Response, ControlError> {
    let Query(q) = query.map_err(|e| ControlError::BadRequest(e.body_text()))?;
    let states = states(q.state.as_deref())?;
    let order = page::order(q.order.as_deref())?;
    let page = Page::new(q.limit.as_deref(), q.next_token.as_deref(), order)?;
    let filters = match q.metadata.as_deref() {
        Some(m) => metadata_filters(m)
            .ok_or_else(|| ControlError::BadRequest("Error parsing metadata".into()))?,
        None => Vec::new(),
    };
    let started_after = q.started_after.as_deref().map(started_after).transpose()?;
    if q.template.as_deref().is_some_and(|t| t.contains(':')) {
        return Err(ControlError::BadRequest(
            "Invalid template: tags are not supported here because sandboxes are not tag-scoped"
                .into(),
        ));
    }
    let shown: Vec<_> = st
        .manager
        .list(&filters)?
        .iter()
        .filter(|s| {
            q.template
                .as_ref()
                .is_none_or(|t| *t == template_of(&st, s))
        })
        .filter(|s| started_after.is_none_or(|at| s.created_at >= at))
        .filter_map(|s| Some((s.created_at, listed(&st, s)?)))
        .filter(|(_, l)| states.contains(&l.state))
        .collect();
    let (items, next) = page.take(shown, |(at, l)| (*at, l.sandbox_id.as_str()));
    let items: Vec<_> = items.into_iter().map(|(_, l)| l).collect();
    Ok(page::answer(items, next))
}

/// `state=running,paused` (default: both).
fn states(raw: Option<&str>) -> Result<Vec<&'static str>, ControlError> {
    let Some(raw) = raw else {
        return Ok(vec!["running", "paused"]);
    };
    raw.split(',')
        .map(|s| match s {
            "running" => Ok("running"),
            "paused" => Ok("paused"),
            _ => Err(bad_param(
                "state",
                "value is not one of the allowed values [\"running\",\"paused\"]",
            )),
        })
        .collect()
}

/// `startedAfter`, an RFC 3339 time, as a unix second (rounded up: "at or after").
fn started_after(raw: &str) -> Result<u64, ControlError> {
    use time::format_description::well_known::Rfc3339;
    let t = time::OffsetDateTime::parse(raw, &Rfc3339).map_err(|e| {
        bad_param(
            "startedAfter",
            &format!("value {raw}: not an RFC 3339 date-time: {e}"),
        )
    })?;
    let secs = t.unix_timestamp() + i64::from(t.nanosecond() > 0);
    Ok(secs.max(0) as u64)
}

/// E2B's metadata filter: `k1=v1&k2=v2`, the whole unescaped once and each key and
/// value once more (the SDKs quote them before joining). Anything else is `None`.
fn metadata_filters(raw: &str) -> Option<Vec<(String, String)>> {
    let whole = query_unescape(raw)?;
    whole
        .split('&')
        .map(
            |pair| match pair.split('=').collect::<Vec<_>>().as_slice() {
                [k, v] => Some((query_unescape(k)?, query_unescape(v)?)),
                _ => None,
            },
        )
        .collect()
}

/// Go's `url.QueryUnescape`: `+` is a space, `%XX` a byte; a bad escape or bytes that
/// are not UTF-8 are `None`.
fn query_unescape(s: &str) -> Option<String> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'+' => out.push(b' '),
            b'%' => {
                let hex = std::str::from_utf8(b.get(i + 1..i + 3)?).ok()?;
                out.push(u8::from_str_radix(hex, 16).ok()?);
                i += 2;
            }
            c => out.push(c),
        }
        i += 1;
    }
    String::from_utf8(out).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metadata_filters_are_read_as_e2b_reads_them() {
        assert_eq!(
            metadata_filters("a%3D1%26b%3Dx%2520y").unwrap(),
            vec![("a".into(), "1".into()), ("b".into(), "x y".into())]
        );
        assert_eq!(
            metadata_filters("k=v").unwrap(),
            vec![("k".into(), "v".into())]
        );
        for bad in ["", "k", "k=v=w", "k=%zz", "%ff=1", "k=%4"] {
            assert!(metadata_filters(bad).is_none(), "{bad}");
        }
    }

    #[test]
    fn states_and_times() {
        assert_eq!(states(None).unwrap(), ["running", "paused"]);
        assert_eq!(states(Some("paused")).unwrap(), ["paused"]);
        assert!(states(Some("running,dead")).is_err());
        assert_eq!(started_after("1970-01-01T00:00:10Z").unwrap(), 10);
        assert_eq!(started_after("1970-01-01T01:00:10.5+01:00").unwrap(), 11);
        assert!(started_after("yesterday").is_err());
    }
}
