//! Snapshot packs: what a pack says about its snapshot, and the API's requests and
//! events for export, import, push and pull.
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::{ImageRun, Snapshot, SnapshotKind, Validate};
use crate::error::{Error, Result};

/// The pack format this daemon writes and reads.
pub const PACK_FORMAT: u32 = 1;

/// The config blob of a pack: everything a daemon needs to register the snapshot.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct PackConfig {
    pub format: u32,
    pub runtime: String,
    /// The accelerator the state was captured with (`kvm` state restores only on a host
    /// with the same CPU).
    pub accel: String,
    /// The exporting host's CPU (vendor, family, model).
    pub cpu: zygote_vmm::persist::CpuIdentity,
    pub mem_mib: u32,
    pub vcpus: u32,
    pub image: PackImage,
    pub snapshot: PackSnapshot,
    /// The token the guest's agent holds in this state: the importing daemon says it to
    /// the first VM started from the pack, then gives that VM its own.
    pub agent_token: String,
    #[serde(default)]
    pub run: ImageRun,
    /// The name of the state file among the `state/*` files.
    pub state_file: String,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct PackImage {
    pub name: String,
    pub sha256: String,
}

/// The snapshot as its own daemon knew it (lineage).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct PackSnapshot {
    pub id: String,
    pub name: Option<String>,
    pub kind: SnapshotKind,
    pub source_sandbox: String,
    pub created_at: u64,
}

/// Where an imported snapshot came from (kept with it).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct PackOrigin {
    /// `oci://REFERENCE` for a pull, `file` for an uploaded pack.
    pub source: String,
    /// The pack's manifest digest.
    pub digest: String,
    /// The snapshot's id on the daemon that exported it.
    pub snapshot: String,
    /// Never shown: see [`PackConfig::agent_token`].
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
    #[serde(default)]
    pub username: Option<String>,
    #[serde(default)]
    pub password: Option<String>,
}

/// `POST /v1/snapshots/pull`.
#[derive(Clone, Default, Deserialize, Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct PullSnapshotRequest {
    #[schema(min_length = 1, max_length = 512)]
    pub reference: String,
    #[serde(default)]
    pub username: Option<String>,
    #[serde(default)]
    pub password: Option<String>,
    /// Name for the imported snapshot (default: the exported one's).
    #[serde(default)]
    pub name: Option<String>,
}

macro_rules! registry_request {
    ($t:ty) => {
        impl std::fmt::Debug for $t {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.debug_struct(stringify!($t))
                    .field("reference", &self.reference)
                    .field("username", &self.username)
                    .finish_non_exhaustive()
            }
        }

        impl Validate for $t {
            fn validate(&self) -> Result<()> {
                zygote_oci::ImageRef::parse(&self.reference)
                    .map_err(|e| Error::invalid(e.to_string()))?;
                match (&self.username, &self.password) {
                    (Some(_), None) | (None, Some(_)) => Err(Error::invalid(
                        "username and password go together: give both or neither",
                    )),
                    _ => Ok(()),
                }
            }
        }

        impl $t {
            pub fn credentials(&self) -> Option<(String, String)> {
                self.username.clone().zip(self.password.clone())
            }
        }
    };
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
                state: serde_json::to_value(state)
                    .ok()
                    .and_then(|v| v.as_str().map(str::to_string))
                    .unwrap_or_default(),
            },
            E::Step { message } => PackEvent::Progress { line: message },
        }
    }
}

impl PackEvent {
    /// The event that ends a stream with `e`.
    pub fn error(e: &Error) -> PackEvent {
        let body = e.body();
        PackEvent::Error {
            code: body.error.code,
            message: body.error.message,
        }
    }
}
