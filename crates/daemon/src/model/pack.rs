//! Snapshot packs: what a pack says about its snapshot, and the API's requests and
//! events for export, import, push and pull.
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::image::registry_request;
use super::validate::{in_range, validate_name};
use super::{ImageRun, Snapshot, SnapshotKind, Validate, MAX_MEM_MIB, MAX_VCPUS, MIN_MEM_MIB};
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

/// The pack's base image. `name` is what the exporting host called it, kept for
/// people to read: the importing host stores the image under its content only (a pack
/// never names an image here).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct PackImage {
    pub name: String,
    pub sha256: String,
}

/// Longest id, token or informational name a pack may carry.
const MAX_PACK_STRING: usize = 256;

/// A pack's config comes from whoever made the pack: every value the importing daemon
/// keeps or acts on is checked like an API request's.
impl Validate for PackConfig {
    fn validate(&self) -> Result<()> {
        in_range("the pack's mem_mib", self.mem_mib, MIN_MEM_MIB, MAX_MEM_MIB)?;
        in_range("the pack's vcpus", self.vcpus, 1, MAX_VCPUS)?;
        let sha = &self.image.sha256;
        if sha.len() != 64 || !sha.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')) {
            return Err(Error::invalid(
                "the pack's base image hash is not 64 lowercase hex digits",
            ));
        }
        let empty = String::new();
        for (what, value) in [
            (
                "snapshot name",
                self.snapshot.name.as_ref().unwrap_or(&empty),
            ),
            ("base image name", &self.image.name),
            ("snapshot id", &self.snapshot.id),
            ("source sandbox", &self.snapshot.source_sandbox),
            ("agent token", &self.agent_token),
            ("state file", &self.state_file),
            ("accelerator", &self.accel),
        ] {
            if value.len() > MAX_PACK_STRING || value.chars().any(char::is_control) {
                return Err(Error::invalid(format!(
                    "the pack's {what} is over {MAX_PACK_STRING} bytes or has control characters"
                )));
            }
        }
        if let Some(name) = &self.snapshot.name {
            validate_name("the pack's snapshot name", name)?;
        }
        if !["kvm", "tcg"].contains(&self.accel.as_str()) {
            return Err(Error::invalid(format!(
                "the pack's state was captured with accelerator {:?}, not kvm or tcg",
                self.accel
            )));
        }
        Ok(())
    }
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
    /// The event that ends a stream with `e`.
    pub fn error(e: &Error) -> PackEvent {
        let body = e.body();
        PackEvent::Error {
            code: body.error.code,
            message: body.error.message,
        }
    }
}
