//! `GET /v1/sandboxes/{id}/files/watch`: the changes under a guest directory, as an
//! NDJSON stream of [`FileWatchEvent`]s, until the client goes away or the directory
//! does.
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// The query string of the watch route (`?path=/work&recursive=true`).
#[derive(Debug, Clone, Deserialize, Serialize, ToSchema, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct WatchQuery {
    /// Absolute path of a directory in the guest (at most 4096 bytes, no NUL).
    #[param(pattern = "^/[^\\u0000]*$")]
    pub path: String,
    /// Also every directory below it, including ones created while it is watched.
    #[serde(default)]
    pub recursive: Option<bool>,
}

/// One line of the watch stream.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum FileWatchEvent {
    /// The first line: the directory is watched; changes from now on are reported.
    Started,
    /// A change. `name` is relative to the watched directory ("" for itself);
    /// `kind` is `create`, `write`, `remove`, `rename`, `chmod`, or `overflow`: events
    /// were lost (the queue was full: `name` empty; or the directory `name` could not
    /// be watched, a limit was reached).
    Event { name: String, kind: String },
    /// Sent when nothing happened for a while (so a client that left is noticed).
    Keepalive,
    /// Terminal: the watched directory was removed; nothing more comes.
    End,
    /// Terminal: the watch broke (the sandbox stopped, its agent went away).
    Error { code: String, message: String },
}

impl FileWatchEvent {
    /// Whether the stream ends with this line.
    pub fn is_terminal(&self) -> bool {
        matches!(self, FileWatchEvent::End | FileWatchEvent::Error { .. })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn watch_lines_have_their_documented_shapes() {
        let ev = FileWatchEvent::Event {
            name: "a/b.txt".into(),
            kind: "create".into(),
        };
        assert_eq!(
            serde_json::to_string(&ev).unwrap(),
            r#"{"type":"event","name":"a/b.txt","kind":"create"}"#
        );
        assert_eq!(
            serde_json::to_string(&FileWatchEvent::Started).unwrap(),
            r#"{"type":"started"}"#
        );
        let q: WatchQuery = serde_json::from_str(r#"{"path":"/w","recursive":true}"#).unwrap();
        assert_eq!(q.recursive, Some(true));
        assert!(FileWatchEvent::End.is_terminal() && !ev.is_terminal());
    }
}
