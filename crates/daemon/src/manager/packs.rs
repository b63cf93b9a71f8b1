//! Snapshot packs: a snapshot leaves this daemon as one self-describing artifact (the
//! runtime's self-contained files, the base image, and a [`PackConfig`]) and comes back
//! into another as a snapshot of its own. Import checks everything before it records
//! anything: every blob's digest, the format version, the runtime, the CPU a
//! hardware-accelerated state needs, the base image's hash; the snapshot's record is
//! written last, so a daemon killed half-way leaves only files that no record names
//! (start-up removes them) and no half-registered snapshot.
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use zygote_oci::pack::{self, Packed};
use zygote_oci::{Event, PullOptions};

use super::{new_id, now, Manager};
use crate::db::SnapshotRow;
use crate::error::{Error, Result};
use crate::model::pack::{PackConfig, PackImage, PackSnapshot, PACK_FORMAT};
use crate::model::{PackOrigin, Snapshot, SnapshotKind};
use crate::runtime::RuntimeError;

/// Largest file a pack may unpack to (a memory state or disk layer).
const MAX_FILE_BYTES: u64 = 1 << 40;

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
        let work = self.scratch_file(&format!("pack-{}", snap.id), "d")?;
        std::fs::create_dir_all(&work)
            .map_err(Error::io(format!("creating {}", work.display())))?;
        let rt = self.runtime.clone();
        let token = self.boot_token(&snap);
        let w = work.clone();
        let result = self
            .blocking(move || -> Result<Packed> {
                let exported = rt.export_files(&snap.data, &w).map_err(unsupported)?;
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
                };
                let mut files = vec![
                    ("image".to_string(), image.path.clone()),
                    ("disk".to_string(), exported.disk.clone()),
                ];
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

    /// Registers the snapshot `p` holds (its blobs in the blob store) as a new one here.
    pub async fn import_pack(
        &self,
        p: Packed,
        name: Option<String>,
        source: String,
    ) -> Result<Snapshot> {
        let config: PackConfig = serde_json::from_slice(&p.config)
            .map_err(|e| Error::invalid(format!("not a zygote snapshot pack: its config: {e}")))?;
        self.check_pack(&config)?;
        let state_role = format!("state/{}", config.state_file);
        for role in ["image", "disk", state_role.as_str()] {
            if p.file(role).is_none() {
                return Err(Error::invalid(format!("the pack has no {role} file")));
            }
        }
        let digest = p.manifest_digest.to_string();
        let id = new_id("snap");
        let dir = self.dirs.snapshots.join(&id);
        let disk = self.dirs.new_layer(&id);
        let rt = self.runtime.clone();
        let (d, k) = (dir.clone(), disk.clone());
        let cfg = config.clone();
        let unpacked = self
            .blocking(move || -> Result<crate::runtime::SnapshotData> {
                let base = adopt_base(&p, &cfg)?;
                std::fs::create_dir_all(&d)
                    .map_err(Error::io(format!("creating {}", d.display())))?;
                for f in p.files.iter().filter(|f| f.role.starts_with("state/")) {
                    let name = &f.role["state/".len()..];
                    if name.is_empty() || name.contains('/') || name.starts_with('.') {
                        return Err(Error::invalid(format!("a state file named {name:?}")));
                    }
                    pack::sparse::decode(&f.blob, &d.join(name), MAX_FILE_BYTES)?;
                }
                let disk_blob = p.file("disk").expect("checked above");
                pack::sparse::decode(&disk_blob.blob, &k, MAX_FILE_BYTES)?;
                let state_file = d.join(&cfg.state_file);
                rt.import_files(&d, &state_file, &k, &base, &cfg.accel)
                    .map_err(unsupported)
            })
            .await
            .and_then(|r| r);
        let data = match unpacked {
            Ok(data) => data,
            Err(e) => {
                let _ = std::fs::remove_dir_all(&dir);
                let _ = std::fs::remove_file(&disk);
                return Err(e);
            }
        };
        let row = SnapshotRow {
            id: id.clone(),
            name: name.or(config.snapshot.name.clone()),
            kind: SnapshotKind::Full,
            runtime: config.runtime.clone(),
            source_sandbox: config.snapshot.source_sandbox.clone(),
            depends_on: Vec::new(),
            mem_mib: config.mem_mib,
            vcpus: config.vcpus,
            created_at: now(),
            size_bytes: data.size_bytes(),
            implicit: false,
            data,
            run: config.run.clone(),
            pack: Some(PackOrigin {
                source,
                digest,
                snapshot: config.snapshot.id.clone(),
                agent_token: config.agent_token.clone(),
            }),
        };
        self.db.put_snapshot(&row)?;
        tracing::info!(snapshot = %id, from = %config.snapshot.id, "imported a snapshot pack");
        self.snapshot_view(&row)
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
        let p = pack::pull(reference, &opts, progress).await?;
        let image = zygote_oci::ImageRef::parse(reference)?;
        self.import_pack(p, name, format!("oci://{}", image.name()))
            .await
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
    fn check_pack(&self, c: &PackConfig) -> Result<()> {
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

/// The pack's base image in this host's image store (decoded and checked unless an
/// image with its hash is there already); returns its path.
fn adopt_base(p: &Packed, c: &PackConfig) -> Result<PathBuf> {
    if let Ok(found) = zygote_images::locate_image(&c.image.sha256) {
        if found.sha256 == c.image.sha256 {
            return Ok(found.path);
        }
    }
    let blob = p.file("image").expect("checked by the caller");
    let tmp = zygote_images::pack::scratch_dir()?.join(format!(
        "pack-{}-{}.ext4",
        &c.image.sha256[..12.min(c.image.sha256.len())],
        std::process::id()
    ));
    let _ = std::fs::remove_file(&tmp);
    let scratch = zygote_images::pack::ScratchPath(tmp.clone());
    pack::sparse::decode(&blob.blob, &tmp, MAX_FILE_BYTES)?;
    let info = zygote_images::ImageInfo {
        name: c.image.name.clone(),
        sha256: String::new(),
        path: PathBuf::new(),
        size_bytes: 0,
        disk_bytes: 0,
        recipe_key: format!("pack-{}", c.image.sha256),
        recipe_path: PathBuf::new(),
        description: format!("base image of snapshot {} (from a pack)", c.snapshot.id),
        base: "snapshot pack".into(),
        agent_sha256: String::new(),
        built_at: now(),
        build_secs: 0.0,
        oci: None,
    };
    let stored = zygote_images::pack::adopt_image(&tmp, info, &c.image.sha256)?;
    drop(scratch);
    Ok(stored.path)
}

/// A runtime's "not here" as the API's 422; anything else as it is.
fn unsupported(e: RuntimeError) -> Error {
    match e {
        RuntimeError::Unsupported(m) => Error::Unsupported(m),
        e => e.into(),
    }
}
