//! The streamed answer of `POST /v1/sandboxes` with `"stream": true`: a fan-out's
//! sandboxes reported one by one as they come up, instead of one answer at the end.
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::Sandbox;

/// One line of the NDJSON stream of `POST /v1/sandboxes` with `"stream": true`. `ms` is
/// the time since the daemon took the request.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum CreateEvent {
    /// Every requested sandbox is recorded: `ids` in order, each listed as `creating`
    /// until it runs (`GET /v1/sandboxes/{id}` answers for each from now on).
    Accepted { ids: Vec<String>, ms: u64 },
    /// A sandbox runs and its agent answers (it is `running` from now on).
    Sandbox { index: u32, id: String, ms: u64 },
    /// A sandbox did not come up; nothing of it is left. A create is all or none: the
    /// others are deleted once all are done, and the stream ends with `error`.
    SandboxFailed {
        index: u32,
        id: String,
        error: String,
        ms: u64,
    },
    /// The last line when every sandbox runs: what the non-streaming request answers.
    Done { sandboxes: Vec<Sandbox> },
    /// The last line when the create failed (nothing of it is left).
    Error { code: String, message: String },
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_are_lines_tagged_by_type() {
        let ev = CreateEvent::SandboxFailed {
            index: 2,
            id: "sb-x".into(),
            error: "no".into(),
            ms: 7,
        };
        let line = serde_json::to_value(&ev).unwrap();
        assert_eq!(line["type"], "sandbox_failed");
        assert_eq!(
            (line["index"].as_u64(), line["ms"].as_u64()),
            (Some(2), Some(7))
        );
        let back: CreateEvent =
            serde_json::from_str(r#"{"type":"accepted","ids":["a","b"],"ms":3}"#).unwrap();
        assert!(matches!(back, CreateEvent::Accepted { ids, ms: 3 } if ids == ["a", "b"]));
        let done = serde_json::to_value(CreateEvent::Done { sandboxes: vec![] }).unwrap();
        assert_eq!(done, serde_json::json!({"type": "done", "sandboxes": []}));
    }
}
