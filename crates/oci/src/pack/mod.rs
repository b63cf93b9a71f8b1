//! Snapshot packs: a sandbox snapshot (its files and a JSON description the daemon
//! writes) as one self-describing OCI artifact, moved as a file (an OCI image layout in
//! a tar) or through any OCI registry.
//!
//! The artifact is an OCI image manifest with `artifactType`
//! `application/vnd.zygote.snapshot.v1`: its config blob is the daemon's description
//! (`application/vnd.zygote.snapshot.config.v1+json`), and each file of the snapshot is
//! a layer of its own (`application/vnd.zygote.snapshot.file.v1.sparse+zstd`, the file
//! encoded by [`sparse`], its role in the `org.opencontainers.image.title`
//! annotation). One blob per file, content-addressed: unchanged files (the base image
//! above all) are stored and uploaded once, and a second push of the same snapshot
//! uploads nothing. Every blob is checked against its digest before anything uses it.
//!
//! A pack coming in (a file upload, a pull) is staged ([`staging`]): its blobs reach the
//! shared store only with the snapshot it holds, so a refused pack leaves nothing.
mod archive;
pub mod fuzzing;
pub mod sparse;
pub mod staging;
mod transfer;

use std::collections::{BTreeMap, HashSet};
use std::path::PathBuf;

use serde_json::json;

use crate::blobs::BlobStore;
use crate::error::{IoContext, OciError, Result};
use crate::manifest::{Descriptor, Digest, Document, ImageManifest, OCI_MANIFEST};
use crate::Event;

pub use archive::{read_archive, write_archive, MAX_ENTRIES};
pub use staging::Staging;
pub use transfer::{pull, push};

pub const ARTIFACT_TYPE: &str = "application/vnd.zygote.snapshot.v1";
pub const CONFIG_TYPE: &str = "application/vnd.zygote.snapshot.config.v1+json";
pub const FILE_TYPE: &str = "application/vnd.zygote.snapshot.file.v1.sparse+zstd";
const TITLE: &str = "org.opencontainers.image.title";

/// The disk space an incoming pack may take where it is written: what is free there
/// beyond `reserve`, the space kept for everything else. Measured by the caller (who
/// knows which filesystem it writes to); over it is [`OciError::NoSpace`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Room {
    pub spare: u64,
    pub reserve: u64,
}

impl Room {
    /// No bound (tests, tools on a host that cannot be measured).
    pub const UNBOUNDED: Room = Room {
        spare: u64::MAX,
        reserve: 0,
    };

    /// Refuses `needed` bytes beyond [`Room::spare`]; `during` says for what.
    pub fn check(&self, needed: u64, during: impl FnOnce() -> String) -> Result<()> {
        if needed <= self.spare {
            return Ok(());
        }
        Err(OciError::NoSpace {
            during: during(),
            free_mib: self.spare.saturating_add(self.reserve) >> 20,
            needed_mib: needed.saturating_add(self.reserve).div_ceil(1 << 20),
            reserve_mib: self.reserve >> 20,
        })
    }
}

/// A pack whose blobs are all in the blob store.
#[derive(Debug, Clone)]
pub struct Packed {
    pub manifest: Vec<u8>,
    pub manifest_digest: Digest,
    /// The daemon's description of the snapshot (JSON).
    pub config: Vec<u8>,
    pub files: Vec<PackedFile>,
}

#[derive(Debug, Clone)]
pub struct PackedFile {
    /// What the file is to the daemon (e.g. `image`, `disk`, `state/memory`).
    pub role: String,
    pub digest: Digest,
    /// Bytes of the encoded blob.
    pub size: u64,
    pub blob: PathBuf,
}

impl Packed {
    pub fn file(&self, role: &str) -> Option<&PackedFile> {
        self.files.iter().find(|f| f.role == role)
    }

    /// The digests of its files' blobs (what [`Staging::commit`] keeps).
    pub fn digests(&self) -> Vec<Digest> {
        self.files.iter().map(|f| f.digest.clone()).collect()
    }

    /// Bytes of every blob (config, files, manifest): the pack's size.
    pub fn size(&self) -> u64 {
        self.files.iter().map(|f| f.size).sum::<u64>()
            + (self.config.len() + self.manifest.len()) as u64
    }
}

/// Packs `files` (role, path) with `config`. A file whose role is in `cache` (an
/// immutable file, e.g. a content-named image: key -> cache key) is encoded once per key.
pub fn pack(
    config: &[u8],
    files: &[(String, PathBuf)],
    cache: &BTreeMap<String, String>,
    progress: &(dyn Fn(Event) + Send + Sync),
) -> Result<Packed> {
    let store = BlobStore::open()?;
    let index = store.dir().join("../../packed");
    std::fs::create_dir_all(&index).ctx(|| format!("creating {}", index.display()))?;
    let mut out = Vec::new();
    for (role, path) in files {
        let cached = cache
            .get(role)
            .and_then(|key| std::fs::read_to_string(index.join(key)).ok())
            .and_then(|d| Digest::parse(d.trim()).ok())
            .filter(|d| store.has(d));
        let digest = match cached {
            Some(d) => d,
            None => {
                let total = std::fs::metadata(path)
                    .ctx(|| format!("stat {}", path.display()))?
                    .len();
                progress(Event::Step {
                    message: format!("packing {role} ({} MiB)", total >> 20),
                });
                let d = store.put_with(|w| sparse::encode(path, w, &mut |_| {}))?;
                if let Some(key) = cache.get(role) {
                    let _ = std::fs::write(index.join(key), d.as_str());
                }
                d
            }
        };
        let blob = store.path(&digest);
        let size = std::fs::metadata(&blob)
            .ctx(|| format!("stat {}", blob.display()))?
            .len();
        out.push(PackedFile {
            role: role.clone(),
            digest,
            size,
            blob,
        });
    }
    Ok(assemble(config, out))
}

/// The pack of `config` and `files` (whose blobs are stored): its manifest made.
pub(crate) fn assemble(config: &[u8], files: Vec<PackedFile>) -> Packed {
    let config_digest = Digest::of(config);
    let manifest = json!({
        "schemaVersion": 2,
        "mediaType": OCI_MANIFEST,
        "artifactType": ARTIFACT_TYPE,
        "config": {"mediaType": CONFIG_TYPE, "digest": config_digest.as_str(), "size": config.len()},
        "layers": files.iter().map(|f| json!({
            "mediaType": FILE_TYPE,
            "digest": f.digest.as_str(),
            "size": f.size,
            "annotations": {TITLE: f.role},
        })).collect::<Vec<_>>(),
    });
    let manifest = serde_json::to_vec(&manifest).expect("a manifest serializes");
    Packed {
        manifest_digest: Digest::of(&manifest),
        manifest,
        config: config.to_vec(),
        files,
    }
}

/// A pack from its manifest, its config read by `document`, its files from `store`
/// (each role once).
pub(crate) fn from_manifest(
    what: &str,
    manifest: Vec<u8>,
    document: impl Fn(&Digest) -> Result<Vec<u8>>,
    store: &BlobStore,
) -> Result<Packed> {
    let bad = |m: String| OciError::BadImage {
        what: what.to_string(),
        message: m,
    };
    let m = snapshot_manifest(what, &manifest)?;
    let config_digest = Digest::parse(&m.config.digest)?;
    let config = document(&config_digest)?;
    config_digest.verify("the pack's config", &config)?;
    let mut files = Vec::new();
    let mut roles = HashSet::new();
    for l in &m.layers {
        if l.media_type != FILE_TYPE {
            return Err(bad(format!("a layer of type {}", l.media_type)));
        }
        let role = l
            .annotations
            .as_ref()
            .and_then(|a| a.get(TITLE))
            .cloned()
            .ok_or_else(|| bad("a layer without a role".into()))?;
        if !roles.insert(role.clone()) {
            return Err(bad(format!("two layers are {role:?}")));
        }
        let digest = Digest::parse(&l.digest)?;
        if !store.has(&digest) {
            return Err(bad(format!("{role} ({digest}) is missing")));
        }
        let blob = store.path(&digest);
        let size = std::fs::metadata(&blob)
            .ctx(|| format!("stat {}", blob.display()))?
            .len();
        files.push(PackedFile {
            role,
            size,
            blob,
            digest,
        });
    }
    Ok(Packed {
        manifest_digest: Digest::of(&manifest),
        manifest,
        config,
        files,
    })
}

/// The manifest, if it is a snapshot pack's.
pub(crate) fn snapshot_manifest(what: &str, bytes: &[u8]) -> Result<ImageManifest> {
    #[derive(serde::Deserialize)]
    #[serde(rename_all = "camelCase")]
    struct Artifact {
        #[serde(default)]
        artifact_type: Option<String>,
        config: Descriptor,
    }
    let a: Artifact = serde_json::from_slice(bytes).map_err(|e| OciError::BadImage {
        what: what.to_string(),
        message: format!("not a manifest: {e}"),
    })?;
    if a.artifact_type.as_deref() != Some(ARTIFACT_TYPE) && a.config.media_type != CONFIG_TYPE {
        return Err(OciError::BadImage {
            what: what.to_string(),
            message: format!(
                "not a zygote snapshot pack (artifact type {:?})",
                a.artifact_type.unwrap_or_default()
            ),
        });
    }
    match Document::parse(what, bytes)? {
        Document::Manifest(m) => Ok(m),
        Document::Index(_) => Err(OciError::BadImage {
            what: what.to_string(),
            message: "an index, not a snapshot pack".into(),
        }),
    }
}
