//! A snapshot pack's config blob: what a pack says about its snapshot, everything a
//! daemon needs to register it. Packs come from anyone (a registry, an upload): the
//! config is validated like an API request before anything acts on it.
use serde::{Deserialize, Serialize};

use zygote_api::error::{RequestError, Result};

use crate::model::{
    in_range, validate_name, ImageRun, SnapshotKind, Validate, MAX_MEM_MIB, MAX_VCPUS, MIN_MEM_MIB,
};

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
    /// The state holds an isolated network interface (it starts only under a daemon
    /// with isolated networking). Packs from before: false.
    #[serde(default)]
    pub isolated_nic: bool,
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
            return Err(RequestError::invalid(
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
                return Err(RequestError::invalid(format!(
                    "the pack's {what} is over {MAX_PACK_STRING} bytes or has control characters"
                )));
            }
        }
        if let Some(name) = &self.snapshot.name {
            validate_name("the pack's snapshot name", name)?;
        }
        if !["kvm", "tcg"].contains(&self.accel.as_str()) {
            return Err(RequestError::invalid(format!(
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
