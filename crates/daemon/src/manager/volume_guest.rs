//! Which guest serves a volume's files to the host. The host never mounts a volume (a
//! guest wrote it: a hostile ext4 image is a kernel attack surface), so reading or
//! writing a volume's files from outside goes through a sandbox that has it mounted:
//! the one that writes it (at its mount path), or, for a volume no sandbox has, a
//! short-lived helper sandbox on the `minimal` image with the volume mounted at
//! [`HELPER_ROOT`] and no network.
//!
//! A helper is booted on first need, kept while used and deleted once idle for
//! [`HELPER_IDLE`]. Every use holds the volume's lock (`volume:<id>` in the manager's
//! lock map): two requests never boot two helpers, and the idle reaper never deletes
//! one in use. A helper is labelled `zygote.volume-helper` (a key users cannot set):
//! a create or delete naming its volume deletes it first, and a restarted daemon
//! deletes the helpers the previous one left.
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::OwnedMutexGuard;

use super::Manager;
use crate::error::{Error, Result};
use crate::model::{CreateSandboxRequest, NetworkMode, VolumeMountSpec};

/// Where a helper sandbox has its volume.
pub const HELPER_ROOT: &str = "/volume";
/// The label that marks a helper sandbox (its value: the volume's id).
pub const HELPER_LABEL: &str = "zygote.volume-helper";
/// How long an unused helper lives on.
const HELPER_IDLE: Duration = Duration::from_secs(60);

/// A sandbox serving a volume's files, and the volume's lock (held for the operation).
pub struct VolumeGuest {
    pub sandbox: String,
    /// The volume's mount path in that sandbox.
    pub root: String,
    _lock: OwnedMutexGuard<()>,
}

impl VolumeGuest {
    /// The guest path of `path` (relative to the volume's root, `/` for the root). `..`
    /// is refused: the path stays under the mount whatever the caller sent.
    pub fn guest_path(&self, path: &str) -> Result<String> {
        let mut out = self.root.trim_end_matches('/').to_string();
        for part in path.split('/').filter(|p| !p.is_empty() && *p != ".") {
            if part == ".." || part.contains('\0') {
                return Err(Error::invalid(format!(
                    "volume path {path:?} must not contain '..' or NUL"
                )));
            }
            out.push('/');
            out.push_str(part);
        }
        if out.is_empty() {
            out.push('/');
        }
        Ok(out)
    }
}

impl Manager {
    /// The guest serving volume `id_or_name` now, booting a helper if no sandbox has it.
    pub async fn volume_guest(self: &Arc<Self>, id_or_name: &str) -> Result<VolumeGuest> {
        let id = self.volume_row(id_or_name)?.id;
        let lock = self.lock(&format!("volume:{id}")).await;
        let vol = self.volume_row(&id)?;
        if let Some(holder) = &vol.attached_to {
            let row = self.sandbox_row(holder)?;
            let disks = row.vm.as_ref().map(|vm| &vm.volumes).or(row
                .lifecycle
                .park
                .as_ref()
                .map(|p| &p.data.volumes));
            let root = disks
                .into_iter()
                .flatten()
                .find(|d| d.volume == vol.id && d.writes_volume)
                .map(|d| d.path.clone())
                .ok_or_else(|| {
                    Error::Conflict(format!(
                        "volume {} is held by sandbox {holder}, which has not mounted it (yet)",
                        vol.name
                    ))
                })?;
            if row.metadata.contains_key(HELPER_LABEL) {
                self.touch_helper(&vol.id);
            }
            return Ok(VolumeGuest {
                sandbox: holder.clone(),
                root,
                _lock: lock,
            });
        }
        let sandbox = self.boot_helper(&vol.id).await?;
        Ok(VolumeGuest {
            sandbox,
            root: HELPER_ROOT.into(),
            _lock: lock,
        })
    }

    async fn boot_helper(self: &Arc<Self>, volume: &str) -> Result<String> {
        let req = CreateSandboxRequest {
            image: Some("minimal".into()),
            network: Some(NetworkMode::None),
            volumes: Some(vec![VolumeMountSpec {
                name: volume.to_string(),
                path: HELPER_ROOT.into(),
                shared: None,
            }]),
            ..Default::default()
        };
        let mut job = self.begin_create(req).await?;
        job.label(HELPER_LABEL, volume);
        let this = self.clone();
        let made = tokio::spawn(this.finish_create(job, None))
            .await
            .map_err(|e| Error::Internal(format!("helper create task failed: {e}")))??;
        let sandbox = made
            .first()
            .map(|s| s.id.clone())
            .ok_or_else(|| Error::Internal("the helper create made no sandbox".into()))?;
        tracing::info!(volume, sandbox, "volume helper sandbox running");
        self.touch_helper(volume);
        let this = self.clone();
        let volume = volume.to_string();
        tokio::spawn(async move { this.reap_helper_when_idle(volume, sandbox).await });
        Ok(made[0].id.clone())
    }

    fn touch_helper(&self, volume: &str) {
        self.helpers_used
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(volume.to_string(), Instant::now());
    }

    async fn reap_helper_when_idle(self: Arc<Self>, volume: String, sandbox: String) {
        loop {
            tokio::time::sleep(HELPER_IDLE / 4).await;
            let _lock = self.lock(&format!("volume:{volume}")).await;
            let idle = self
                .helpers_used
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .get(&volume)
                .is_none_or(|t| t.elapsed() >= HELPER_IDLE);
            if !idle {
                continue;
            }
            self.helpers_used
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .remove(&volume);
            if let Err(e) = self.delete(&sandbox).await {
                if !matches!(e, Error::NotFound { .. }) {
                    tracing::warn!(volume, sandbox, "deleting the idle volume helper: {e}");
                }
            }
            return;
        }
    }

    /// Deletes the helper holding any of `volumes` (names or ids), so that a create or
    /// a delete naming the volume finds it free.
    pub(super) async fn release_helpers(self: &Arc<Self>, volumes: Vec<String>) -> Result<()> {
        for name in volumes {
            let Ok(vol) = self.volume_row(&name) else {
                continue;
            };
            let Some(holder) = vol.attached_to else {
                continue;
            };
            let is_helper = self
                .sandbox_row(&holder)
                .is_ok_and(|r| r.metadata.contains_key(HELPER_LABEL));
            if is_helper {
                let _lock = self.lock(&format!("volume:{}", vol.id)).await;
                self.delete(&holder).await?;
            }
        }
        Ok(())
    }

    /// Applies tree operations (chmod, chown) in sandbox `id` through its agent.
    pub async fn apply_ops(
        self: &Arc<Self>,
        id: &str,
        ops: Vec<zygote_proto::TreeOp>,
    ) -> Result<()> {
        for op in &ops {
            let (zygote_proto::TreeOp::Chmod { path, .. }
            | zygote_proto::TreeOp::Chown { path, .. }) = op
            else {
                return Err(Error::Internal(
                    "apply_ops takes chmod and chown only".into(),
                ));
            };
            crate::model::validate_guest_path(path)?;
        }
        self.agent_call(id, move |c| c.apply(ops.clone()))
            .await
            .map(drop)
    }

    /// Helpers a previous daemon left (start-up).
    pub(crate) async fn remove_stale_helpers(self: &Arc<Self>) -> Result<()> {
        for row in self.db.sandboxes()? {
            if row.metadata.contains_key(HELPER_LABEL) {
                tracing::info!("deleting volume helper {} a previous daemon left", row.id);
                self.delete(&row.id).await?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn volume_paths_stay_under_the_mount() {
        let g = |root: &str, p: &str| {
            let lock = Arc::new(tokio::sync::Mutex::new(()))
                .try_lock_owned()
                .unwrap();
            VolumeGuest {
                sandbox: "sb".into(),
                root: root.into(),
                _lock: lock,
            }
            .guest_path(p)
        };
        assert_eq!(g("/data", "/").unwrap(), "/data");
        assert_eq!(g("/data", "").unwrap(), "/data");
        assert_eq!(g("/data", "/a/./b//c").unwrap(), "/data/a/b/c");
        assert_eq!(g("/data", "x").unwrap(), "/data/x");
        assert!(g("/data", "/../etc").is_err());
        assert!(g("/data", "/a/../../etc").is_err());
    }
}
