//! `/v1/volumes`: named volumes that outlive sandboxes, and the `volumes` a create
//! mounts. A volume is a block device (an ext4 image the daemon made): it is written by
//! one sandbox at a time, the one it was mounted into at create; a branch child or a
//! sandbox started from a snapshot of it sees a copy-on-write view of the volume as it
//! was at that instant, discarded with it. A `shared` mount (several writers) is not
//! possible with a block device and is refused.
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::in_range;
use crate::error::{RequestError, Result};

/// A new volume's size when the request gives none.
pub const DEFAULT_VOLUME_MIB: u64 = 1024;
/// The smallest volume: ext4 with a journal needs a few MiB to be useful.
pub const MIN_VOLUME_MIB: u64 = 16;
/// The largest volume, 64 GiB (the image is sparse: this bounds what a guest may fill
/// on the host's disk, and what a branch or snapshot may copy).
pub const MAX_VOLUME_MIB: u64 = 64 * 1024;
/// Volumes one sandbox may mount.
pub const MAX_VOLUME_MOUNTS: usize = 8;
/// Guest directories a volume may not be mounted on or under: the root, and the
/// kernel's own filesystems (the agent needs them as they are).
pub const FORBIDDEN_MOUNT_ROOTS: &[&str] = &["/proc", "/sys", "/dev"];

#[derive(Debug, Clone, Default, Deserialize, Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateVolumeRequest {
    /// Unique name (docker's rule): 1-63 characters of A-Z, a-z, 0-9, '_', '.' and '-',
    /// starting with a letter or digit.
    #[schema(pattern = "^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$")]
    pub name: String,
    /// Size in MiB (16..=65536, default 1024). The image is sparse: the host disk holds
    /// only what was written.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(minimum = 16, maximum = 65536)]
    pub size_mib: Option<u64>,
}

impl CreateVolumeRequest {
    pub fn validate(&self) -> Result<()> {
        validate_volume_name(&self.name)?;
        in_range(
            "size_mib",
            self.size_mib.unwrap_or(DEFAULT_VOLUME_MIB),
            MIN_VOLUME_MIB,
            MAX_VOLUME_MIB,
        )
    }
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct Volume {
    /// `vol-` and 12 hex digits; also the disk's serial in the guest.
    pub id: String,
    pub name: String,
    pub size_mib: u64,
    pub created_at: u64,
    /// The sandbox it is mounted into (the only one that writes it), if any.
    pub attached_to: Option<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct VolumeList {
    pub volumes: Vec<Volume>,
}

/// One volume to mount at create (`volumes` in `POST /v1/sandboxes`).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct VolumeMountSpec {
    /// The volume's name or id.
    pub name: String,
    /// Absolute guest directory (made if missing); not `/`, not under /proc, /sys, /dev,
    /// no `..`.
    pub path: String,
    /// Refused (400): a volume is a block device, written by one sandbox at a time.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shared: Option<bool>,
}

/// A volume as a sandbox sees it (`volumes` in a sandbox's view).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize, ToSchema)]
pub struct MountedVolume {
    pub id: String,
    pub name: String,
    pub path: String,
    /// True: this sandbox writes the volume. False: a copy-on-write view of it (a branch
    /// child, or a sandbox started from a snapshot), discarded with the sandbox.
    pub writes_volume: bool,
}

/// Docker's rule for volume names, at most 63 characters (they are also E2B's).
pub fn validate_volume_name(name: &str) -> Result<()> {
    let b = name.as_bytes();
    let ok = !b.is_empty()
        && b.len() <= 63
        && b[0].is_ascii_alphanumeric()
        && b.iter()
            .all(|c| c.is_ascii_alphanumeric() || b"_.-".contains(c));
    if ok {
        return Ok(());
    }
    Err(RequestError::invalid(format!(
        "volume name {name:?} must be 1-63 characters of A-Z, a-z, 0-9, '_', '.' and '-', \
         starting with a letter or digit"
    )))
}

/// Checks a mount's guest directory: absolute, normal components only (no `.`, `..`,
/// empty or NUL), not `/`, not on or under [`FORBIDDEN_MOUNT_ROOTS`].
pub fn validate_mount_path(path: &str) -> Result<()> {
    let bad = |why: &str| {
        Err(RequestError::invalid(format!(
            "volume mount path {path:?} {why}"
        )))
    };
    if !path.starts_with('/') || path.len() > 1024 || path.contains('\0') {
        return bad("must be absolute, at most 1024 bytes, without NUL");
    }
    let parts: Vec<&str> = path[1..].split('/').collect();
    if parts.iter().all(|p| p.is_empty()) {
        return bad("must not be / (mount it on a directory under /)");
    }
    let trimmed = path.trim_end_matches('/');
    if parts[..parts.len() - usize::from(path.ends_with('/'))]
        .iter()
        .any(|p| p.is_empty() || *p == "." || *p == "..")
    {
        return bad("must be a plain path (no '.', '..' or '//')");
    }
    for root in FORBIDDEN_MOUNT_ROOTS {
        if trimmed == *root || trimmed.starts_with(&format!("{root}/")) {
            return bad(&format!("must not be on or under {root}"));
        }
    }
    Ok(())
}

/// Checks a create's `volumes`: each mount, and that no name or path repeats.
pub fn validate_mounts(mounts: &[VolumeMountSpec]) -> Result<()> {
    if mounts.len() > MAX_VOLUME_MOUNTS {
        return Err(RequestError::invalid(format!(
            "at most {MAX_VOLUME_MOUNTS} volumes per sandbox, got {}",
            mounts.len()
        )));
    }
    for (i, m) in mounts.iter().enumerate() {
        if m.shared == Some(true) {
            return Err(RequestError::invalid(format!(
                "volume {:?}: shared mounts are not possible: a volume is a block device \
                 written by one sandbox at a time (branch children get a copy-on-write view)",
                m.name
            )));
        }
        validate_volume_name(&m.name)?;
        validate_mount_path(&m.path)?;
        let path = m.path.trim_end_matches('/');
        for other in &mounts[..i] {
            if other.name == m.name {
                return Err(RequestError::invalid(format!(
                    "volume {:?} is mounted twice",
                    m.name
                )));
            }
            if other.path.trim_end_matches('/') == path {
                return Err(RequestError::invalid(format!(
                    "two volumes are mounted on {path:?}"
                )));
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mount_paths() {
        for ok in [
            "/data",
            "/mnt/vol/",
            "/home/user/work",
            "/devices",
            "/system",
        ] {
            assert!(validate_mount_path(ok).is_ok(), "{ok}");
        }
        for bad in [
            "", "data", "/", "//", "/proc", "/proc/x", "/sys/", "/dev/shm", "/a/../b", "/a/./b",
            "/a//b", "/a\0",
        ] {
            assert!(validate_mount_path(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn mounts_and_sizes() {
        let m = |name: &str, path: &str| VolumeMountSpec {
            name: name.into(),
            path: path.into(),
            shared: None,
        };
        assert!(validate_mounts(&[m("a", "/a"), m("b", "/b")]).is_ok());
        assert!(validate_mounts(&[m("a", "/a"), m("a", "/b")]).is_err());
        assert!(validate_mounts(&[m("a", "/a"), m("b", "/a/")]).is_err());
        let shared = VolumeMountSpec {
            shared: Some(true),
            ..m("a", "/a")
        };
        let e = validate_mounts(&[shared]).unwrap_err().to_string();
        assert!(e.contains("shared"), "{e}");
        let size = |s| CreateVolumeRequest {
            name: "v".into(),
            size_mib: Some(s),
        };
        assert!(size(64).validate().is_ok());
        assert!(size(1).validate().is_err());
        assert!(size(u64::MAX).validate().is_err());
        let name = CreateVolumeRequest {
            name: "-bad/name".into(),
            size_mib: None,
        };
        assert!(name.validate().is_err());
    }
}
