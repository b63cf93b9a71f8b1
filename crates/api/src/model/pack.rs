//! Snapshot packs: the API's requests and events for export, import, push and pull
//! (the pack's own format is the daemon's: `zygote_daemon::pack_format`).
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::image::registry_request;
use super::Snapshot;
use crate::error::ErrorBody;

/// Where an imported snapshot came from (kept with it).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct PackOrigin {
    /// `oci://REFERENCE` for a pull, `file` for an uploaded pack.
    pub source: String,
    /// The pack's manifest digest.
    pub digest: String,
    /// The snapshot's id on the daemon that exported it.
    pub snapshot: String,
    /// Never shown: the token the guest's agent holds in the pack's state (the pack
    /// config's `agent_token`).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    #[schema(ignore)]
    pub agent_token: String,
}

impl PackOrigin {
    /// What the API shows (no token).
    pub fn public(&self) -> PackOrigin {
        PackOrigin {
            agent_token: String::new(),
            ..self.clone()
        }
    }
}

/// `POST /v1/snapshots/{id}/push`.
#[derive(Clone, Default, Deserialize, Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct PushSnapshotRequest {
    /// Where to push: `registry.example:5000/team/warm:v1`.
    #[schema(min_length = 1, max_length = 512)]
    pub reference: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub username: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub password: Option<String>,
}

/// `POST /v1/snapshots/pull`.
#[derive(Clone, Default, Deserialize, Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct PullSnapshotRequest {
    #[schema(min_length = 1, max_length = 512)]
    pub reference: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub username: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub password: Option<String>,
    /// Name for the imported snapshot (default: the exported one's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
}

registry_request!(PushSnapshotRequest);
registry_request!(PullSnapshotRequest);

/// `POST /v1/snapshots/import?name=`.
#[derive(Debug, Clone, Default, Deserialize, ToSchema, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct ImportQuery {
    /// Name for the imported snapshot (default: the exported one's).
    #[serde(default)]
    pub name: Option<String>,
}

/// One line of the NDJSON stream of a push or pull.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum PackEvent {
    Progress {
        line: String,
    },
    /// A blob: `done` of `total` bytes; `state`: cached (already there), downloading
    /// (also for uploads), resuming, done.
    Blob {
        index: usize,
        digest: String,
        done: u64,
        total: u64,
        state: String,
    },
    /// A push: the pack is in the registry under this manifest digest.
    Pushed {
        reference: String,
        digest: String,
        /// Bytes of all its blobs.
        size: u64,
    },
    /// A pull: the snapshot registered from it.
    Done {
        snapshot: Box<Snapshot>,
    },
    Error {
        code: String,
        message: String,
    },
}

impl From<zygote_oci::Event> for PackEvent {
    fn from(e: zygote_oci::Event) -> Self {
        use zygote_oci::Event as E;
        match e {
            E::Resolved { digest, .. } => PackEvent::Progress {
                line: format!("resolved to {digest}"),
            },
            E::Layer {
                index,
                digest,
                done,
                total,
                state,
            } => PackEvent::Blob {
                index,
                digest,
                done,
                total,
                state: state.as_str().to_string(),
            },
            E::Step { message } => PackEvent::Progress { line: message },
        }
    }
}

impl PackEvent {
    /// The event that ends a stream with the error `body`.
    pub fn error(body: ErrorBody) -> PackEvent {
        PackEvent::Error {
            code: body.error.code,
            message: body.error.message,
        }
    }
}
