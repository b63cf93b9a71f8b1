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
pub mod sparse;
mod transfer;

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};

use serde_json::json;

use crate::blobs::BlobStore;
use crate::error::{IoContext, OciError, Result};
use crate::manifest::{
    Descriptor, Digest, Document, ImageManifest, MAX_DOCUMENT_BYTES, OCI_MANIFEST,
};
use crate::Event;

pub use transfer::{pull, push};

pub const ARTIFACT_TYPE: &str = "application/vnd.zygote.snapshot.v1";
pub const CONFIG_TYPE: &str = "application/vnd.zygote.snapshot.config.v1+json";
pub const FILE_TYPE: &str = "application/vnd.zygote.snapshot.file.v1.sparse+zstd";
const TITLE: &str = "org.opencontainers.image.title";

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
    let config_digest = Digest::of(config);
    let manifest = json!({
        "schemaVersion": 2,
        "mediaType": OCI_MANIFEST,
        "artifactType": ARTIFACT_TYPE,
        "config": {"mediaType": CONFIG_TYPE, "digest": config_digest.as_str(), "size": config.len()},
        "layers": out.iter().map(|f| json!({
            "mediaType": FILE_TYPE,
            "digest": f.digest.as_str(),
            "size": f.size,
            "annotations": {TITLE: f.role},
        })).collect::<Vec<_>>(),
    });
    let manifest = serde_json::to_vec(&manifest).expect("a manifest serializes");
    Ok(Packed {
        manifest_digest: Digest::of(&manifest),
        manifest,
        config: config.to_vec(),
        files: out,
    })
}

/// Writes `p` as an OCI image layout in a tar (what `docker save` / `skopeo copy
/// oci-archive:` make), the manifest tagged `tag`.
pub fn write_archive(p: &Packed, tag: &str, out: impl Write) -> Result<()> {
    let mut tar = tar::Builder::new(out);
    let mut add = |name: &str, data: &mut dyn Read, size: u64| -> Result<()> {
        let mut h = tar::Header::new_ustar();
        h.set_size(size);
        h.set_mode(0o644);
        h.set_entry_type(tar::EntryType::Regular);
        tar.append_data(&mut h, name, data)
            .ctx(|| format!("writing {name} to the pack"))
    };
    let layout = br#"{"imageLayoutVersion":"1.0.0"}"#;
    add("oci-layout", &mut &layout[..], layout.len() as u64)?;
    let index = serde_json::to_vec(&json!({
        "schemaVersion": 2,
        "mediaType": crate::manifest::OCI_INDEX,
        "manifests": [{
            "mediaType": OCI_MANIFEST,
            "artifactType": ARTIFACT_TYPE,
            "digest": p.manifest_digest.as_str(),
            "size": p.manifest.len(),
            "annotations": {"org.opencontainers.image.ref.name": tag},
        }],
    }))
    .expect("an index serializes");
    add("index.json", &mut &index[..], index.len() as u64)?;
    let blob_name = |d: &Digest| format!("blobs/sha256/{}", d.hex());
    add(
        &blob_name(&p.manifest_digest),
        &mut &p.manifest[..],
        p.manifest.len() as u64,
    )?;
    add(
        &blob_name(&Digest::of(&p.config)),
        &mut &p.config[..],
        p.config.len() as u64,
    )?;
    let mut seen = std::collections::HashSet::new();
    for f in &p.files {
        if !seen.insert(f.digest.clone()) {
            continue;
        }
        let mut file =
            std::fs::File::open(&f.blob).ctx(|| format!("opening {}", f.blob.display()))?;
        add(&blob_name(&f.digest), &mut file, f.size)?;
    }
    tar.into_inner()
        .and_then(|mut w| w.flush())
        .ctx(|| "finishing the pack".into())
}

/// Reads a pack made by [`write_archive`] (the tar, or the layout unpacked into a
/// directory): every blob is checked against its digest and kept in the blob store.
pub fn read_archive(path: &Path, max_bytes: u64) -> Result<Packed> {
    let bad = |m: String| OciError::BadArchive {
        path: path.to_path_buf(),
        message: m,
    };
    let store = BlobStore::open()?;
    let mut file = std::fs::File::open(path).ctx(|| format!("opening {}", path.display()))?;
    let mut tar = tar::Archive::new(&mut file);
    let mut documents: BTreeMap<String, Vec<u8>> = BTreeMap::new();
    let mut total = 0u64;
    for entry in tar.entries().map_err(|e| bad(format!("not a tar: {e}")))? {
        let mut entry = entry.map_err(|e| bad(format!("reading it: {e}")))?;
        if !entry.header().entry_type().is_file() {
            continue;
        }
        let name = String::from_utf8_lossy(&entry.path_bytes())
            .trim_start_matches("./")
            .to_string();
        total += entry.size();
        if total > max_bytes {
            return Err(OciError::TooLarge {
                what: format!("pack {}", path.display()),
                size: total,
                limit: max_bytes,
            });
        }
        match name.strip_prefix("blobs/sha256/") {
            Some(hex) => {
                let digest = Digest::parse(&format!("sha256:{hex}"))?;
                if entry.size() <= MAX_DOCUMENT_BYTES {
                    let mut bytes = Vec::new();
                    entry
                        .read_to_end(&mut bytes)
                        .map_err(|e| bad(e.to_string()))?;
                    digest.verify(&format!("blob {name} of the pack"), &bytes)?;
                    documents.insert(digest.to_string(), bytes.clone());
                    if !store.has(&digest) {
                        store.put_with_digest(&digest, &mut &bytes[..], max_bytes)?;
                    }
                } else if !store.has(&digest) {
                    store.put_with_digest(&digest, &mut entry, max_bytes)?;
                } else {
                    // Already kept (checked then): this copy is checked all the same, so a
                    // damaged pack is refused whatever this host holds.
                    let mut hasher = HashingSink(sha2::Sha256::default());
                    std::io::copy(&mut entry, &mut hasher).map_err(|e| bad(e.to_string()))?;
                    let actual =
                        format!("sha256:{}", hex::encode(sha2::Digest::finalize(hasher.0)));
                    if actual != digest.as_str() {
                        return Err(OciError::DigestMismatch {
                            what: format!("blob {name} of the pack"),
                            expected: digest.to_string(),
                            actual,
                        });
                    }
                }
            }
            None if name == "index.json" => {
                let mut bytes = Vec::new();
                (&mut entry)
                    .take(MAX_DOCUMENT_BYTES)
                    .read_to_end(&mut bytes)
                    .map_err(|e| bad(e.to_string()))?;
                documents.insert("index.json".into(), bytes);
            }
            None => {}
        }
    }
    let index = documents
        .get("index.json")
        .ok_or_else(|| bad("no index.json: not a snapshot pack".into()))?;
    let Document::Index(entries) = Document::parse("index.json", index)? else {
        return Err(bad("index.json is not an index".into()));
    };
    let [entry] = entries.as_slice() else {
        return Err(bad(format!("{} manifests in it, not one", entries.len())));
    };
    let digest = Digest::parse(&entry.digest)?;
    let manifest = documents
        .get(digest.as_str())
        .cloned()
        .ok_or_else(|| bad(format!("its manifest {digest} is missing")))?;
    from_manifest(&path.display().to_string(), manifest, |d| {
        documents
            .get(d.as_str())
            .cloned()
            .ok_or_else(|| bad(format!("blob {d} is missing")))
    })
}

/// Hashes what is written to it.
struct HashingSink(sha2::Sha256);

impl Write for HashingSink {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        sha2::Digest::update(&mut self.0, buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// A pack from its manifest, its config read by `document`, its files from the store.
pub(crate) fn from_manifest(
    what: &str,
    manifest: Vec<u8>,
    document: impl Fn(&Digest) -> Result<Vec<u8>>,
) -> Result<Packed> {
    let bad = |m: String| OciError::BadImage {
        what: what.to_string(),
        message: m,
    };
    let m = snapshot_manifest(what, &manifest)?;
    let config_digest = Digest::parse(&m.config.digest)?;
    let config = document(&config_digest)?;
    config_digest.verify("the pack's config", &config)?;
    let store = BlobStore::open()?;
    let mut files = Vec::new();
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
        let digest = Digest::parse(&l.digest)?;
        if !store.has(&digest) {
            return Err(bad(format!("{role} ({digest}) is missing")));
        }
        files.push(PackedFile {
            role,
            size: u64::try_from(l.size).unwrap_or(0),
            blob: store.path(&digest),
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
