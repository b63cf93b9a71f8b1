//! A sandbox's event log (`GET /v1/sandboxes/{id}/events`): what the daemon did to it
//! and in it, one structured entry per event (created, branched, paused, a command run
//! and how it ended, its network policy changed, its VM died, ...). E2B's sandbox logs
//! are read from it.
use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::{in_range, Validate};
use crate::error::{RequestError, Result};

/// How many entries one query answers at most (E2B's bound too).
pub const MAX_EVENTS_PER_QUERY: u32 = 1000;
/// Bytes of `search` at most (E2B's bound too).
pub const MAX_EVENT_SEARCH: usize = 256;

/// How much an event matters. Ordered: a query's `level` keeps that level and above.
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize, ToSchema,
)]
#[serde(rename_all = "lowercase")]
pub enum EventLevel {
    Debug,
    #[default]
    Info,
    Warn,
    Error,
}

impl EventLevel {
    pub fn as_str(self) -> &'static str {
        match self {
            EventLevel::Debug => "debug",
            EventLevel::Info => "info",
            EventLevel::Warn => "warn",
            EventLevel::Error => "error",
        }
    }
}

/// One entry of a sandbox's event log.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct SandboxEvent {
    /// When it happened, unix milliseconds.
    pub ts_ms: u64,
    pub level: EventLevel,
    pub message: String,
    /// Details (ids, commands, exit codes), all as strings.
    #[serde(default)]
    pub fields: BTreeMap<String, String>,
}

/// Oldest first (`asc`, the default) or newest first (`desc`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum EventOrder {
    #[default]
    Asc,
    Desc,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize, ToSchema, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct EventsQuery {
    /// Only events at or after this time (unix milliseconds).
    #[serde(default)]
    pub since_ms: Option<u64>,
    /// Only events at or before this time (unix milliseconds).
    #[serde(default)]
    pub until_ms: Option<u64>,
    /// At most this many (1..=1000, default 100): the first ones in `order`.
    #[serde(default)]
    #[param(minimum = 1, maximum = 1000)]
    pub limit: Option<u32>,
    #[serde(default)]
    pub order: Option<EventOrder>,
    /// Only events at this level or above.
    #[serde(default)]
    pub level: Option<EventLevel>,
    /// Only events whose message contains this (case-sensitive, at most 256 bytes).
    #[serde(default)]
    #[param(max_length = 256)]
    pub search: Option<String>,
}

impl EventsQuery {
    pub fn limit(&self) -> usize {
        self.limit.unwrap_or(100) as usize
    }

    /// Whether `e` is one this query asks for (its time window, level and search).
    pub fn matches(&self, e: &SandboxEvent) -> bool {
        self.since_ms.is_none_or(|s| e.ts_ms >= s)
            && self.until_ms.is_none_or(|u| e.ts_ms <= u)
            && self.level.is_none_or(|l| e.level >= l)
            && self.search.as_deref().is_none_or(|s| e.message.contains(s))
    }
}

impl Validate for EventsQuery {
    fn validate(&self) -> Result<()> {
        if let Some(n) = self.limit {
            in_range("limit", n as u64, 1, MAX_EVENTS_PER_QUERY as u64)?;
        }
        if let (Some(s), Some(u)) = (self.since_ms, self.until_ms) {
            if s > u {
                return Err(RequestError::invalid(format!(
                    "since_ms ({s}) is after until_ms ({u})"
                )));
            }
        }
        if self
            .search
            .as_ref()
            .is_some_and(|s| s.len() > MAX_EVENT_SEARCH)
        {
            return Err(RequestError::invalid(format!(
                "search is longer than {MAX_EVENT_SEARCH} bytes"
            )));
        }
        Ok(())
    }
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct EventList {
    pub events: Vec<SandboxEvent>,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(ts_ms: u64, level: EventLevel, message: &str) -> SandboxEvent {
        SandboxEvent {
            ts_ms,
            level,
            message: message.into(),
            fields: BTreeMap::new(),
        }
    }

    #[test]
    fn a_query_keeps_its_window_level_and_search() {
        let q = EventsQuery {
            since_ms: Some(10),
            until_ms: Some(20),
            level: Some(EventLevel::Warn),
            search: Some("died".into()),
            ..Default::default()
        };
        assert!(q.matches(&event(15, EventLevel::Error, "the VM died")));
        assert!(!q.matches(&event(9, EventLevel::Error, "the VM died")));
        assert!(!q.matches(&event(21, EventLevel::Error, "the VM died")));
        assert!(!q.matches(&event(15, EventLevel::Info, "the VM died")));
        assert!(!q.matches(&event(15, EventLevel::Error, "the VM Died")));
        assert!(EventsQuery::default().matches(&event(0, EventLevel::Debug, "")));
    }

    #[test]
    fn bad_queries_say_which_bound() {
        let bad = |q: EventsQuery| q.validate().unwrap_err().to_string();
        let limit = |n| EventsQuery {
            limit: Some(n),
            ..Default::default()
        };
        assert!(bad(limit(0)).contains("limit"));
        assert!(bad(limit(1001)).contains("limit"));
        assert!(limit(1000).validate().is_ok());
        let window = EventsQuery {
            since_ms: Some(2),
            until_ms: Some(1),
            ..Default::default()
        };
        assert!(bad(window).contains("after until_ms"));
        let search = EventsQuery {
            search: Some("x".repeat(257)),
            ..Default::default()
        };
        assert!(bad(search).contains("256"));
    }
}
