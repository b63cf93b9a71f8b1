//! Snapshot packs: a snapshot leaves this daemon as one self-describing artifact (the
//! runtime's self-contained files, the base image, and a [`PackConfig`]) and comes back
//! into another as a snapshot of its own (`pack_import`: every check before anything
//! is recorded, nothing left by a refused pack). Export, push, pull, and what a pack
//! must be for this daemon to run it.
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use zygote_oci::pack::{self, Packed};
use zygote_oci::{Event, PullOptions};

use super::pack_import::{host_side, refusal, MAX_PACK_BYTES};
use super::space::room;
use super::Manager;
use crate::db::SnapshotRow;
use crate::error::{Error, Result};
use crate::model::Snapshot;
use crate::pack_format::{PackConfig, PackImage, PackSnapshot, PACK_FORMAT};

/// Progress of a pack operation.
pub type PackProgress = Arc<dyn Fn(Event) + Send + Sync>;

impl Manager {
    /// A new scratch file path in the state directory (removed at start-up if left).
    pub fn scratch_file(&self, what: &str, ext: &str) -> Result<PathBuf> {
        let dir = self.dirs.state.join("tmp");
        std::fs::create_dir_all(&dir).map_err(Error::io(format!("creating {}", dir.display())))?;
        Ok(dir.join(format!("{what}-{}.{ext}", super::random_hex(6))))
    }

    /// Packs snapshot `id` into the blob store (files already packed are reused).
    pub async fn pack_snapshot(&self, id: &str, progress: PackProgress) -> Result<Packed> {
        let snap = self.snapshot_row(id)?;
        if !snap.data.volumes.is_empty() {
            // A volume's data stays on its host: a pack carries the sandbox, not its volumes.
            return Err(Error::Unsupported(
                "a snapshot of a sandbox with volumes cannot be packed (volumes stay on their \
                 host)"
                    .into(),
            ));
        }
        let work = self.scratch_file(&format!("pack-{}", snap.id), "d")?;
        std::fs::create_dir_all(&work)
            .map_err(Error::io(format!("creating {}", work.display())))?;
        let rt = self.runtime.clone();
        let token = self.boot_token(&snap);
        let w = work.clone();
        let result = self
            .blocking(move || -> Result<Packed> {
                let exported = rt.export_files(&snap.data, &w).map_err(refusal)?;
                let image = base_image(&exported.base)?;
                let config = PackConfig {
                    format: PACK_FORMAT,
                    runtime: snap.runtime.clone(),
                    accel: snap.data.accel.clone(),
                    cpu: zygote_vmm::persist::CpuIdentity::host(),
                    mem_mib: snap.mem_mib,
                    vcpus: snap.vcpus,
                    image: PackImage {
                        name: image.name.clone(),
                        sha256: image.sha256.clone(),
                    },
                    snapshot: PackSnapshot {
                        id: snap.id.clone(),
                        name: snap.name.clone(),
                        kind: snap.kind,
                        source_sandbox: snap.source_sandbox.clone(),
                        created_at: snap.created_at,
                    },
                    agent_token: token,
                    run: snap.run.clone(),
                    state_file: exported.state_file.clone(),
                    isolated_nic: snap.data.isolated_nic,
                };
                let mut files = vec![("image".to_string(), image.path.clone())];
                if let Some(disk) = &exported.disk {
                    files.push(("disk".to_string(), disk.clone()));
                }
                for (name, path) in &exported.state {
                    files.push((format!("state/{name}"), path.clone()));
                }
                // The base image never changes (it is named by its hash): packed once.
                let cache =
                    BTreeMap::from([("image".to_string(), format!("image-{}", image.sha256))]);
                let json = serde_json::to_vec(&config).expect("a pack config serializes");
                Ok(pack::pack(&json, &files, &cache, &*progress)?)
            })
            .await;
        let _ = std::fs::remove_dir_all(&work);
        result?
    }

    /// The snapshot a create names: one of this daemon's, else (for a reference) the one
    /// pulled from it before, else pulled now.
    pub(crate) async fn find_or_pull_snapshot(&self, id: &str) -> Result<SnapshotRow> {
        if let Some(s) = self.db.snapshot(id)? {
            return Ok(s);
        }
        if !zygote_oci::ImageRef::looks_like_reference(id) {
            return Err(Error::not_found("snapshot", id));
        }
        let source = format!("oci://{}", zygote_oci::ImageRef::parse(id)?.name());
        let pulled = self
            .db
            .snapshots()?
            .into_iter()
            .find(|s| s.pack.as_ref().is_some_and(|p| p.source == source));
        if let Some(s) = pulled {
            return Ok(s);
        }
        tracing::info!(reference = id, "not here yet: pulling the snapshot pack");
        let snap = self.pull_pack(id, None, None, Arc::new(|_| {})).await?;
        self.snapshot_row(&snap.id)
    }

    /// Pulls the pack `reference` names and imports it.
    pub async fn pull_pack(
        &self,
        reference: &str,
        credentials: Option<(String, String)>,
        name: Option<String>,
        progress: PackProgress,
    ) -> Result<Snapshot> {
        let opts = PullOptions {
            credentials,
            transport: self.registries.clone(),
            ..Default::default()
        };
        let pulled = async {
            let image = zygote_oci::ImageRef::parse(reference)?;
            let staging = self.blocking(super::space::pack_staging).await??;
            let mut room = room(staging.dir());
            room.spare = room.spare.min(MAX_PACK_BYTES);
            let p = pack::pull(reference, &opts, &staging, room, progress).await?;
            self.import_pack(p, staging, name, format!("oci://{}", image.name()))
                .await
        };
        pulled.await.map_err(host_side)
    }

    /// Pushes snapshot `id` as `reference`; returns the manifest digest and the size.
    pub async fn push_pack(
        &self,
        id: &str,
        reference: &str,
        credentials: Option<(String, String)>,
        progress: PackProgress,
    ) -> Result<(String, u64)> {
        let p = self.pack_snapshot(id, progress.clone()).await?;
        let opts = PullOptions {
            credentials,
            transport: self.registries.clone(),
            ..Default::default()
        };
        let digest = pack::push(&p, reference, &opts, progress).await?;
        tracing::info!(snapshot = %id, %reference, %digest, "pushed a snapshot pack");
        Ok((digest, p.size()))
    }

    /// Whether this daemon can run what the pack holds.
    pub(super) fn check_pack(&self, c: &PackConfig) -> Result<()> {
        if c.format != PACK_FORMAT {
            return Err(Error::Unsupported(format!(
                "pack format {} (this daemon reads format {PACK_FORMAT})",
                c.format
            )));
        }
        if c.runtime != self.runtime.name() {
            return Err(Error::Unsupported(format!(
                "the pack is a {} runtime snapshot and this daemon runs the {} runtime",
                c.runtime,
                self.runtime.name()
            )));
        }
        let host = zygote_vmm::persist::CpuIdentity::host();
        if c.accel == "kvm" && !c.cpu.compatible_with(&host) {
            return Err(Error::Unsupported(format!(
                "the pack's state was captured with hardware acceleration on a {} CPU; this \
                 host's is a {host}",
                c.cpu
            )));
        }
        Ok(())
    }
}

/// The stored image a disk chain ends in (any stored image: by path).
fn base_image(base: &Path) -> Result<zygote_images::ImageInfo> {
    let base = base.canonicalize().unwrap_or_else(|_| base.to_path_buf());
    zygote_images::list_images()?
        .into_iter()
        .find(|i| i.path.canonicalize().is_ok_and(|p| p == base))
        .ok_or_else(|| {
            Error::Unsupported(format!(
                "the snapshot's base image {} is no longer in the image store",
                base.display()
            ))
        })
}
