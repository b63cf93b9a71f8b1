//! The daemon-wide event stream (`GET /v1/events`): every sandbox's events as they
//! happen, as Server-Sent Events. The same entries as each sandbox's event log
//! (`GET /v1/sandboxes/{id}/events`), each tagged with its sandbox and a stream id, plus
//! the ones a log cannot hold (`sandbox deleted`: the log goes with its sandbox).
//!
//! The wire (`text/event-stream`):
//! - `event: ready`, data [`StreamReady`]: sent first; anything after it is delivered.
//! - `event: sandbox`, `id: EPOCH-SEQ`, data [`LiveEvent`]: one event.
//! - `event: lagged`, data [`StreamLagged`]: this client fell behind and lost events;
//!   what it shows must be read again.
//! - `: keep-alive` comments on silence.
//!
//! A client reconnecting with `Last-Event-ID` gets the events it missed if the daemon
//! still holds them (the last [`REPLAY_EVENTS`]), else `lagged` first.
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::{EventLevel, SandboxEvent, Validate};
use crate::error::{RequestError, Result};

/// Events a daemon keeps in memory for clients that reconnect.
pub const REPLAY_EVENTS: usize = 4096;

/// The SSE `event:` names.
pub const SSE_READY: &str = "ready";
pub const SSE_SANDBOX: &str = "sandbox";
pub const SSE_LAGGED: &str = "lagged";

/// One event of the stream.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct LiveEvent {
    /// `EPOCH-SEQ`: this daemon run's epoch and the event's number in it, also the SSE
    /// `id` (what `Last-Event-ID` names on a reconnect).
    pub id: String,
    /// The sandbox it is about (it may be gone by the time it is read).
    pub sandbox: String,
    #[serde(flatten)]
    pub event: SandboxEvent,
}

/// `event: ready`: the subscription is live.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct StreamReady {
    /// This daemon run's epoch (unix milliseconds when it started): ids of another
    /// epoch are not replayed.
    pub epoch: u64,
}

/// `event: lagged`: events this client did not get.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct StreamLagged {
    /// How many were lost (0 when unknown: a `Last-Event-ID` of another daemon run).
    pub missed: u64,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize, ToSchema, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct LiveEventsQuery {
    /// Only this sandbox's events.
    #[serde(default)]
    #[param(max_length = 128)]
    pub sandbox: Option<String>,
    /// Only events at this level or above (default `info`: the `debug` ones, such as
    /// each DNS query, are many).
    #[serde(default)]
    pub level: Option<EventLevel>,
}

impl LiveEventsQuery {
    pub fn matches(&self, e: &LiveEvent) -> bool {
        self.sandbox.as_deref().is_none_or(|s| e.sandbox == s)
            && e.event.level >= self.level.unwrap_or(EventLevel::Info)
    }
}

impl Validate for LiveEventsQuery {
    fn validate(&self) -> Result<()> {
        match &self.sandbox {
            Some(s) if s.is_empty() || s.len() > 128 => Err(RequestError::invalid(
                "sandbox must be a sandbox id (1..=128 bytes)",
            )),
            _ => Ok(()),
        }
    }
}

/// A `Last-Event-ID` split into its epoch and sequence number (None: not one of ours).
pub fn parse_stream_id(id: &str) -> Option<(u64, u64)> {
    let (epoch, seq) = id.trim().split_once('-')?;
    Some((epoch.parse().ok()?, seq.parse().ok()?))
}

pub fn stream_id(epoch: u64, seq: u64) -> String {
    format!("{epoch}-{seq}")
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    fn live(sandbox: &str, level: EventLevel) -> LiveEvent {
        LiveEvent {
            id: stream_id(1, 2),
            sandbox: sandbox.into(),
            event: SandboxEvent {
                ts_ms: 3,
                level,
                message: "branched".into(),
                fields: BTreeMap::new(),
            },
        }
    }

    #[test]
    fn a_live_event_is_a_log_entry_with_its_sandbox_and_id() {
        let json = serde_json::to_value(live("sb-1", EventLevel::Info)).unwrap();
        assert_eq!(
            json,
            serde_json::json!({"id": "1-2", "sandbox": "sb-1", "ts_ms": 3, "level": "info",
                               "message": "branched", "fields": {}})
        );
        let back: LiveEvent = serde_json::from_value(json).unwrap();
        assert_eq!(back, live("sb-1", EventLevel::Info));
    }

    #[test]
    fn the_query_keeps_its_sandbox_and_level_info_by_default() {
        let all = LiveEventsQuery::default();
        assert!(all.matches(&live("a", EventLevel::Info)));
        assert!(!all.matches(&live("a", EventLevel::Debug)));
        let one = LiveEventsQuery {
            sandbox: Some("a".into()),
            level: Some(EventLevel::Warn),
        };
        assert!(one.matches(&live("a", EventLevel::Error)));
        assert!(!one.matches(&live("a", EventLevel::Info)));
        assert!(!one.matches(&live("b", EventLevel::Error)));
        let empty = LiveEventsQuery {
            sandbox: Some(String::new()),
            level: None,
        };
        assert!(empty.validate().is_err());
    }

    #[test]
    fn stream_ids_round_trip_and_strangers_are_refused() {
        assert_eq!(parse_stream_id(&stream_id(17, 4)), Some((17, 4)));
        for bad in ["", "17", "a-4", "17-", "-4", "17-4-5", "17-x"] {
            assert_eq!(parse_stream_id(bad), None, "{bad:?}");
        }
    }
}
