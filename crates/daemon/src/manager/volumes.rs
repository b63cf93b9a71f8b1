//! Named volumes: ext4 images in `<state>/volumes/<id>.ext4` that outlive sandboxes.
//!
//! A volume is made by `mkfs.ext4` on an empty sparse file of the requested size
//! (never from guest data), synced and renamed into place, then recorded: a daemon
//! killed in between leaves an image no record names, which start-up removes
//! ([`Manager::remove_volume_orphans`]). Deletion removes the record first (only if
//! no sandbox holds the volume, in one statement), then the image.
//!
//! The host never mounts a volume: a guest wrote it, and a hostile ext4 image is a
//! kernel attack surface. It is a disk of the one sandbox it is mounted into at create
//! (the runtime's [`VolumeDisk`]), which mounts it in the guest ([`mount_in_guest`]);
//! branch children and sandboxes started from its snapshots see a copy-on-write view
//! (`crate::runtime::qemu_volumes`). The claim (`volumes.attached_to`) is taken right
//! before the sandbox's record is written and released when the sandbox is deleted;
//! claims whose sandbox has no record are released at every start (`db_volumes`).
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use zygote_proto::client::AgentClient;

use super::{new_id, now, random_hex, Manager};
use crate::db::{DeleteVolume, SandboxRow, VolumeRow};
use crate::error::{Error, Result};
use crate::fault;
use crate::model::{
    CreateVolumeRequest, MountedVolume, Volume, VolumeMountSpec, DEFAULT_VOLUME_MIB,
};
use crate::runtime::{VmRecord, VolumeDisk};

/// How long the guest gets to mount a volume, or to flush its writes.
const GUEST_STEP: Duration = Duration::from_secs(30);

impl Manager {
    fn volume_dir(&self) -> PathBuf {
        self.dirs.state.join("volumes")
    }

    fn volume_file(&self, id: &str) -> PathBuf {
        self.volume_dir().join(format!("{id}.ext4"))
    }

    fn volume_view(v: &VolumeRow) -> Volume {
        Volume {
            id: v.id.clone(),
            name: v.name.clone(),
            size_mib: v.size_mib,
            created_at: v.created_at,
            attached_to: v.attached_to.clone(),
        }
    }

    pub(crate) fn volume_row(&self, id_or_name: &str) -> Result<VolumeRow> {
        self.db.volume(id_or_name)?.ok_or_else(|| Error::NotFound {
            what: "volume",
            id: id_or_name.to_string(),
        })
    }

    pub fn volumes(&self) -> Result<Vec<Volume>> {
        Ok(self.db.volumes()?.iter().map(Self::volume_view).collect())
    }

    pub fn volume_get(&self, id_or_name: &str) -> Result<Volume> {
        Ok(Self::volume_view(&self.volume_row(id_or_name)?))
    }

    /// The volume's record with its content-API token (E2B's `VolumeAndToken`).
    pub(crate) fn volume_with_token(&self, id_or_name: &str) -> Result<VolumeRow> {
        self.volume_row(id_or_name)
    }

    /// Makes and records a volume (see the module doc for the order).
    pub async fn create_volume(self: &Arc<Self>, req: CreateVolumeRequest) -> Result<Volume> {
        req.validate()?;
        if self.db.volume(&req.name)?.is_some() {
            return Err(name_taken(&req.name));
        }
        let row = VolumeRow {
            id: new_id("vol"),
            name: req.name.clone(),
            size_mib: req.size_mib.unwrap_or(DEFAULT_VOLUME_MIB),
            created_at: now(),
            token: random_hex(24),
            attached_to: None,
        };
        let dir = self.volume_dir();
        std::fs::create_dir_all(&dir).map_err(Error::io(format!("creating {}", dir.display())))?;
        let file = self.volume_file(&row.id);
        let (f, size) = (file.clone(), row.size_mib << 20);
        self.blocking(move || make_image(&f, size)).await??;
        fault::point("volume.image-made");
        if !self.db.insert_volume(&row)? {
            // Another create took the name meanwhile.
            let _ = std::fs::remove_file(&file);
            return Err(name_taken(&req.name));
        }
        tracing::info!(
            "volume {} ({}) created, {} MiB",
            row.id,
            row.name,
            row.size_mib
        );
        Ok(Self::volume_view(&row))
    }

    /// Deletes a volume no sandbox has mounted (a helper serving its files goes first).
    pub async fn delete_volume(self: &Arc<Self>, id_or_name: &str) -> Result<()> {
        self.release_helpers(vec![id_or_name.to_string()]).await?;
        let row = self.volume_row(id_or_name)?;
        match self.db.delete_volume(&row.id)? {
            DeleteVolume::Deleted => {}
            DeleteVolume::Missing => {
                return Err(Error::NotFound {
                    what: "volume",
                    id: id_or_name.to_string(),
                })
            }
            DeleteVolume::Attached(sandbox) => {
                return Err(Error::Conflict(format!(
                    "volume {} is mounted in sandbox {sandbox}: delete that sandbox first",
                    row.name
                )))
            }
        }
        fault::point("volume.delete-recorded");
        let file = self.volume_file(&row.id);
        if let Err(e) = std::fs::remove_file(&file) {
            tracing::warn!("removing {}: {e}", file.display());
        }
        tracing::info!("volume {} ({}) deleted", row.id, row.name);
        Ok(())
    }

    /// The disks a create's `volumes` give its one sandbox, checked: each volume exists
    /// and nobody has it now (the claim itself is [`Manager::claim_volumes`]).
    pub(super) fn volume_disks(&self, mounts: &[VolumeMountSpec]) -> Result<Vec<VolumeDisk>> {
        if !mounts.is_empty() && !self.runtime.volumes_supported() {
            return Err(Error::Unsupported(format!(
                "the {} runtime cannot mount volumes yet (the qemu runtime can)",
                self.runtime.name()
            )));
        }
        mounts
            .iter()
            .map(|m| {
                let v = self.volume_row(&m.name)?;
                if let Some(holder) = &v.attached_to {
                    return Err(attached(&v.name, holder));
                }
                Ok(VolumeDisk {
                    file: self.volume_file(&v.id),
                    volume: v.id,
                    name: v.name,
                    path: m.path.trim_end_matches('/').to_string(),
                    format: "raw".into(),
                    writes_volume: true,
                })
            })
            .collect()
    }

    /// Gives `disks`' volumes to `sandbox`, all or none.
    pub(super) fn claim_volumes(&self, sandbox: &str, disks: &[VolumeDisk]) -> Result<()> {
        for (i, d) in disks.iter().enumerate() {
            if let Err(holder) = self.db.claim_volume(&d.volume, sandbox)? {
                for done in &disks[..i] {
                    let _ = self.db.release_volume(&done.volume, sandbox);
                }
                return Err(match holder {
                    Some(h) => attached(&d.name, &h),
                    None => Error::NotFound {
                        what: "volume",
                        id: d.name.clone(),
                    },
                });
            }
        }
        Ok(())
    }

    /// Mounts `disks` in the guest of `vm` (just booted for sandbox `id`); on failure
    /// the VM is destroyed (the caller discards the rest of the sandbox).
    pub(super) async fn mount_volumes(
        &self,
        id: &str,
        vm: VmRecord,
        disks: Vec<VolumeDisk>,
    ) -> Result<VmRecord> {
        let (rt, token) = (self.runtime.clone(), self.dirs.agent_key.token(id));
        let v = vm.clone();
        let mounted = self
            .blocking(move || {
                let client = rt.connect(&v, &token).map_err(Error::runtime)?;
                match mount_in_guest(&client, &disks) {
                    Ok(()) => Ok(client),
                    Err(e) => {
                        rt.destroy(&v);
                        Err(Error::Unsupported(e))
                    }
                }
            })
            .await??;
        self.agents
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(id.to_string(), mounted);
        Ok(vm)
    }

    /// Lets the guest flush what it wrote to its volumes (before its VM is stopped for
    /// good or paused to disk). Best effort: a guest that does not is only losing its
    /// own unwritten data.
    pub(super) async fn flush_volumes(&self, row: &SandboxRow) {
        let writes = row
            .vm
            .as_ref()
            .is_some_and(|vm| vm.volumes.iter().any(|v| v.writes_volume));
        if !writes || self.running_vm(row).is_err() {
            return;
        }
        let Ok(client) = self.agent(&row.id).await else {
            return;
        };
        let done = self.blocking(move || guest_exec(&client, &["sync"])).await;
        if let Ok(Err(e)) = done {
            tracing::warn!(sandbox = %row.id, "flushing its volumes: {e}");
        }
    }

    /// Image files of volumes with no record (a create or delete a crash interrupted).
    pub(crate) fn remove_volume_orphans(&self) -> Result<()> {
        let known: std::collections::HashSet<PathBuf> = self
            .db
            .volumes()?
            .iter()
            .map(|v| self.volume_file(&v.id))
            .collect();
        let Ok(entries) = std::fs::read_dir(self.volume_dir()) else {
            return Ok(());
        };
        for e in entries.flatten() {
            let path = e.path();
            if !known.contains(&path) {
                tracing::info!("removing orphan volume image {}", path.display());
                let removed = if path.is_dir() {
                    std::fs::remove_dir_all(&path)
                } else {
                    std::fs::remove_file(&path)
                };
                if let Err(e) = removed {
                    tracing::warn!("removing {}: {e}", path.display());
                }
            }
        }
        Ok(())
    }
}

/// A sandbox's volumes as its view shows them.
pub(super) fn mounted(row: &SandboxRow) -> Vec<MountedVolume> {
    let disks = match (&row.vm, &row.lifecycle.park) {
        (Some(vm), _) => &vm.volumes,
        (None, Some(park)) => &park.data.volumes,
        (None, None) => return Vec::new(),
    };
    disks
        .iter()
        .map(|d| MountedVolume {
            id: d.volume.clone(),
            name: d.name.clone(),
            path: d.path.clone(),
            writes_volume: d.writes_volume,
        })
        .collect()
}

fn name_taken(name: &str) -> Error {
    Error::Conflict(format!("a volume named {name:?} exists"))
}

fn attached(name: &str, sandbox: &str) -> Error {
    Error::Conflict(format!(
        "volume {name} is mounted in sandbox {sandbox} (a volume is written by one sandbox \
         at a time; delete that sandbox first, or branch it for a copy-on-write view)"
    ))
}

/// An empty ext4 filesystem of `size` bytes at `file`: made under a temporary name,
/// synced, then renamed into place (the name exists only for a whole image).
fn make_image(file: &Path, size: u64) -> Result<()> {
    let partial = file.with_extension("ext4.partial");
    let made = (|| -> Result<()> {
        let f = std::fs::File::create(&partial)
            .map_err(Error::io(format!("creating {}", partial.display())))?;
        f.set_len(size)
            .map_err(Error::io(format!("sizing {}", partial.display())))?;
        drop(f);
        // The root directory is a copy of an empty one with mode 1777 (`-d`): writable by
        // every guest user, sticky like /tmp (the image's user may not be root).
        let root = partial.with_extension("root");
        let _ = std::fs::remove_dir(&root);
        std::fs::create_dir(&root).map_err(Error::io(format!("creating {}", root.display())))?;
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&root, std::fs::Permissions::from_mode(0o1777))
            .map_err(Error::io(format!("setting the mode of {}", root.display())))?;
        let out = std::process::Command::new("mkfs.ext4")
            .args(["-q", "-F", "-m", "0", "-L", "zygote-volume", "-d"])
            .arg(&root)
            .arg(&partial)
            .output()
            .map_err(Error::io("running mkfs.ext4"));
        let _ = std::fs::remove_dir(&root);
        let out = out?;
        if !out.status.success() {
            return Err(Error::Internal(format!(
                "mkfs.ext4 failed: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            )));
        }
        crate::runtime::qemu::sync_into_place(&partial, file).map_err(Error::from)
    })();
    if made.is_err() {
        let _ = std::fs::remove_file(&partial);
    }
    made
}

/// Runs `argv` in the guest as root, failing on a non-zero exit.
fn guest_exec(client: &AgentClient, argv: &[&str]) -> std::result::Result<(), String> {
    let req = zygote_proto::ExecRequest {
        argv: argv.iter().map(|s| s.to_string()).collect(),
        timeout_ms: Some(GUEST_STEP.as_millis() as u64),
        uid: Some(0),
        gid: Some(0),
        ..Default::default()
    };
    let out = client.exec_output(req).map_err(|e| e.to_string())?;
    if out.result.exit_code == Some(0) {
        return Ok(());
    }
    let stderr = String::from_utf8_lossy(&out.stderr);
    let stderr: String = stderr.trim().chars().take(300).collect();
    Err(format!(
        "`{}` in the guest failed ({:?}): {stderr}",
        argv.join(" "),
        out.result
    ))
}

/// Mounts each writing disk of `disks` at its path in a guest just booted from an
/// image: the device is the one whose serial is the volume's id.
pub(super) fn mount_in_guest(
    client: &AgentClient,
    disks: &[VolumeDisk],
) -> std::result::Result<(), String> {
    if disks.is_empty() {
        return Ok(());
    }
    let mut by_serial = std::collections::HashMap::new();
    let blocks = client.list_dir("/sys/block").map_err(|e| e.to_string())?;
    for b in blocks.iter().filter(|b| b.name.starts_with("vd")) {
        let serial = client
            .read_file_up_to(&format!("/sys/block/{}/serial", b.name), 64)
            .ok()
            .flatten()
            .unwrap_or_default();
        by_serial.insert(
            String::from_utf8_lossy(&serial).trim().to_string(),
            b.name.clone(),
        );
    }
    for d in disks {
        let dev = by_serial
            .get(&d.volume)
            .ok_or_else(|| format!("volume {}: the guest has no disk with its serial", d.name))?;
        guest_exec(client, &["mkdir", "-p", &d.path])
            .and_then(|()| {
                guest_exec(
                    client,
                    &["mount", "-t", "ext4", &format!("/dev/{dev}"), &d.path],
                )
            })
            .map_err(|e| format!("volume {}: {e}", d.name))?;
    }
    Ok(())
}
