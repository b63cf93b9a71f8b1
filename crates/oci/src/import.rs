//! Importing images without a registry: an OCI image layout (a directory, or a tar of
//! one: `skopeo copy ... oci-archive:`, newer `docker save`) or a classic `docker save`
//! archive (`manifest.json` with `Config`, `RepoTags`, `Layers`). Archives are
//! untrusted like registries: the tar is unpacked into scratch space with every name
//! checked (no `..`, no absolute paths, links only to files inside it, bounded size),
//! and every blob is checked against its digest on its way into the blob store.
use std::io::Read;
use std::path::{Path, PathBuf};

use serde::Deserialize;
use zygote_images::pack::{scratch_dir, ScratchPath};
use zygote_images::{ImageInfo, OciOrigin};

use crate::blobs::BlobStore;
use crate::budget::{limit_hit, Budget};
use crate::convert::{self, ConvertOptions, LocalImage};
use crate::entry_path::guest_path;
use crate::error::{IoContext, OciError, Result};
use crate::layer_stream::decompress;
use crate::manifest::{self, Descriptor, Digest, Document, ImageConfig, MAX_DOCUMENT_BYTES};
use crate::sparse::copy_sparse;
use crate::{Event, ImageRef, Limits, Progress};

/// How to import.
#[derive(Debug, Clone, Default)]
pub struct ImportOptions {
    /// The name to store it under; None: the archive's own (`RepoTags`, the
    /// containerd name annotation), else `localhost/<file name>:<tag>`.
    pub name: Option<String>,
    /// Which image of an archive holding several (a tag of `RepoTags`, or an OCI
    /// layout's `org.opencontainers.image.ref.name`).
    pub tag: Option<String>,
    pub limits: Limits,
    pub convert: ConvertOptions,
}

/// Imports the image at `path` (see the module doc) and converts it.
pub fn import(path: &Path, opts: &ImportOptions, progress: Progress) -> Result<ImageInfo> {
    let meta = std::fs::metadata(path).ctx(|| format!("reading {}", path.display()))?;
    let _unpacked;
    let dir = if meta.is_dir() {
        path.to_path_buf()
    } else {
        progress(Event::Step {
            message: format!("unpacking {}", path.display()),
        });
        let scratch = scratch_dir()?;
        let at = ScratchPath(scratch.join(format!(
            "import-{}-{}-{}.root",
            &Digest::of(path.as_os_str().as_encoded_bytes()).hex()[..12],
            zygote_images::pack::scratch_nonce(),
            std::process::id()
        )));
        at.clear()?;
        unpack_archive(path, &at.0, &opts.limits)?;
        let d = at.0.clone();
        _unpacked = at;
        d
    };
    let store = BlobStore::open()?.with_reserve(opts.limits.unpack.reserve_bytes);
    let local = if dir.join("oci-layout").is_file() {
        from_layout(path, &dir, opts, &store, progress)?
    } else if dir.join("manifest.json").is_file() {
        from_docker_archive(path, &dir, opts, &store, progress)?
    } else {
        return Err(bad(path, "neither an OCI image layout (no oci-layout file) nor a docker save archive (no manifest.json)"));
    };
    let digest = Digest::parse(&local.origin.manifest_digest)?;
    let prepared = convert::prepare(&digest, &opts.convert, progress)?;
    if let Some(info) = convert::lookup(&local.name, &prepared, &opts.convert)? {
        return Ok(info);
    }
    convert::convert(local, &prepared, &opts.convert, &opts.limits, progress)
}

fn bad(path: &Path, message: impl Into<String>) -> OciError {
    OciError::BadArchive {
        path: path.to_path_buf(),
        message: message.into(),
    }
}

/// Unpacks a (possibly gzip- or zstd-compressed) tar into `dest`: regular files and
/// directories only; symlinks become hard links to the file they name inside `dest`
/// (old `docker save` links repeated layers), anything else is refused. Bounded like
/// a layer (`budget.rs`), and written with all-zero blocks as holes.
fn unpack_archive(archive: &Path, dest: &Path, limits: &Limits) -> Result<()> {
    let file = std::fs::File::open(archive).ctx(|| format!("opening {}", archive.display()))?;
    let (reader, compressed) = decompress(file).ctx(|| format!("reading {}", archive.display()))?;
    std::fs::create_dir_all(dest).ctx(|| format!("creating {}", dest.display()))?;
    let mut budget = Budget::new(dest, limits.unpack)?;
    let mut tar = tar::Archive::new(budget.meter(reader, Some(compressed)));
    let read_error = |e: std::io::Error| {
        limit_hit(&e, "the archive").unwrap_or_else(|| bad(archive, format!("reading it: {e}")))
    };
    let mut links = Vec::new();
    let entries = tar
        .entries()
        .map_err(|e| bad(archive, format!("not a tar archive: {e}")))?;
    for entry in entries {
        let mut entry = entry.map_err(read_error)?;
        budget.entry()?;
        let raw = entry.path_bytes().into_owned();
        let Some(guest) = guest_path(&raw).map_err(|m| bad(archive, format!("entry {m}")))? else {
            continue;
        };
        let host = dest.join(guest.trim_start_matches('/'));
        let kind = entry.header().entry_type();
        if kind.is_dir() {
            std::fs::create_dir_all(&host).ctx(|| format!("creating {}", host.display()))?;
            continue;
        }
        if let Some(parent) = host.parent() {
            std::fs::create_dir_all(parent).ctx(|| format!("creating {}", parent.display()))?;
        }
        if kind.is_symlink() {
            let target = entry
                .link_name_bytes()
                .ok_or_else(|| bad(archive, format!("{guest}: a link without a target")))?
                .into_owned();
            links.push((guest, target));
            continue;
        }
        if !kind.is_file() {
            if kind.is_pax_global_extensions() || kind.is_pax_local_extensions() {
                continue;
            }
            return Err(bad(
                archive,
                format!("{guest}: unexpected entry type {kind:?}"),
            ));
        }
        let size = entry.size();
        budget.apparent(size, &guest)?;
        let out = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&host)
            .ctx(|| format!("creating {}", host.display()))?;
        let written = copy_sparse(&mut entry, &out, &host, size, &mut budget, &read_error)?;
        if written != size {
            return Err(bad(
                archive,
                format!("{guest}: {written} of {size} bytes in the archive"),
            ));
        }
    }
    for (guest, target) in links {
        let dir = guest.rsplit_once('/').map_or("", |(d, _)| d);
        let t = String::from_utf8_lossy(&target);
        let joined = if t.starts_with('/') {
            t.to_string()
        } else {
            format!("{dir}/{t}")
        };
        // `..` inside the archive is fine for a link (`../other/layer.tar`), as long
        // as it stays inside: normalize, then check.
        let mut parts: Vec<&str> = Vec::new();
        for c in joined.split('/') {
            match c {
                "" | "." => {}
                ".." => {
                    parts.pop().ok_or_else(|| {
                        bad(archive, format!("{guest}: link to {t} leaves the archive"))
                    })?;
                }
                c => parts.push(c),
            }
        }
        let source = dest.join(parts.join("/"));
        if !std::fs::symlink_metadata(&source).is_ok_and(|m| m.is_file()) {
            return Err(bad(
                archive,
                format!("{guest}: link to {t}, not a file of the archive"),
            ));
        }
        let host = dest.join(guest.trim_start_matches('/'));
        std::fs::hard_link(&source, &host).ctx(|| format!("linking {}", host.display()))?;
    }
    Ok(())
}

/// A small JSON document of the archive, bounded in size.
fn read_document(archive: &Path, file: &Path) -> Result<Vec<u8>> {
    let f = std::fs::File::open(file).ctx(|| format!("opening {}", file.display()))?;
    let mut bytes = Vec::new();
    f.take(MAX_DOCUMENT_BYTES + 1)
        .read_to_end(&mut bytes)
        .ctx(|| format!("reading {}", file.display()))?;
    if bytes.len() as u64 > MAX_DOCUMENT_BYTES {
        return Err(bad(archive, format!("{} is too large", file.display())));
    }
    Ok(bytes)
}

fn from_layout(
    path: &Path,
    dir: &Path,
    opts: &ImportOptions,
    store: &BlobStore,
    progress: Progress,
) -> Result<LocalImage> {
    #[derive(Deserialize)]
    #[serde(rename_all = "camelCase")]
    struct Layout {
        image_layout_version: String,
    }
    let layout: Layout = serde_json::from_slice(&read_document(path, &dir.join("oci-layout"))?)
        .map_err(|e| bad(path, format!("oci-layout: {e}")))?;
    if !layout.image_layout_version.starts_with("1.") {
        return Err(bad(
            path,
            format!(
                "image layout version {} (1.x is supported)",
                layout.image_layout_version
            ),
        ));
    }
    let index = read_document(path, &dir.join("index.json"))?;
    let Document::Index(entries) = Document::parse("index.json", &index)? else {
        return Err(bad(path, "index.json is not an image index"));
    };
    const REF_NAME: &str = "org.opencontainers.image.ref.name";
    const CONTAINERD_NAME: &str = "io.containerd.image.name";
    let annotation =
        |d: &Descriptor, key: &str| d.annotations.as_ref().and_then(|a| a.get(key)).cloned();
    let chosen = match &opts.tag {
        Some(tag) => entries
            .iter()
            .find(|d| annotation(d, REF_NAME).as_deref() == Some(tag.as_str()))
            .ok_or_else(|| {
                let tags: Vec<String> = entries
                    .iter()
                    .filter_map(|d| annotation(d, REF_NAME))
                    .collect();
                bad(
                    path,
                    format!("no image tagged {tag:?} (it has: {})", tags.join(", ")),
                )
            })?,
        None if entries.len() == 1 => &entries[0],
        None => {
            let tags: Vec<String> = entries
                .iter()
                .filter_map(|d| annotation(d, REF_NAME))
                .collect();
            return Err(bad(
                path,
                format!(
                    "it holds {} images: choose one by tag ({})",
                    entries.len(),
                    tags.join(", ")
                ),
            ));
        }
    };
    let blob = |d: &Descriptor| -> Result<(Digest, PathBuf)> {
        let digest = Digest::parse(&d.digest)?;
        Ok((digest.clone(), dir.join("blobs/sha256").join(digest.hex())))
    };
    let document = |d: &Descriptor, what: &str| -> Result<(Digest, Vec<u8>)> {
        let (digest, file) = blob(d)?;
        let bytes = read_document(path, &file)?;
        digest.verify(what, &bytes)?;
        Ok((digest, bytes))
    };
    let label = path.display().to_string();
    let (mut manifest_digest, mut bytes) = document(chosen, "the image manifest")?;
    if let Document::Index(platforms) = Document::parse(&label, &bytes)? {
        let entry = manifest::pick_amd64(&label, &platforms)?;
        (manifest_digest, bytes) = document(entry, "the linux/amd64 image manifest")?;
    }
    let Document::Manifest(m) = Document::parse(&label, &bytes)? else {
        return Err(bad(path, "an index points at another index"));
    };
    let (config_digest, config_bytes) = document(&m.config, "the image config")?;
    let config = ImageConfig::parse(&label, &config_bytes)?;
    let platform = config.check_platform(&label)?;
    let mut files = Vec::new();
    for (i, d) in m.layers.iter().enumerate() {
        manifest::check_layer_type(i, d)?;
        let (digest, file) = blob(d)?;
        layer_file_size(path, i, &file, &opts.limits)?;
        files.push((digest, file));
    }
    let layers = store_layers(store, files, &opts.limits, progress)?;
    let tag = annotation(chosen, REF_NAME);
    let name = match (&opts.name, annotation(chosen, CONTAINERD_NAME)) {
        (Some(n), _) => n.clone(),
        (None, Some(n)) => normalize(path, &n)?,
        (None, None) => default_name(path, tag.as_deref())?,
    };
    Ok(LocalImage {
        name,
        origin: OciOrigin {
            reference: format!("oci-archive:{}", path.display()),
            manifest_digest: manifest_digest.to_string(),
            config_digest: config_digest.to_string(),
            platform,
            layers: m.layers.iter().map(|d| d.digest.clone()).collect(),
            config: Default::default(),
        },
        config,
        layers,
    })
}

fn from_docker_archive(
    path: &Path,
    dir: &Path,
    opts: &ImportOptions,
    store: &BlobStore,
    progress: Progress,
) -> Result<LocalImage> {
    #[derive(Deserialize)]
    struct Entry {
        #[serde(rename = "Config")]
        config: String,
        #[serde(rename = "RepoTags", default)]
        repo_tags: Option<Vec<String>>,
        #[serde(rename = "Layers")]
        layers: Vec<String>,
    }
    let entries: Vec<Entry> =
        serde_json::from_slice(&read_document(path, &dir.join("manifest.json"))?)
            .map_err(|e| bad(path, format!("manifest.json: {e}")))?;
    let tags = |e: &Entry| e.repo_tags.clone().unwrap_or_default();
    let chosen = match &opts.tag {
        Some(tag) => entries
            .iter()
            .find(|e| {
                tags(e)
                    .iter()
                    .any(|t| t == tag || t.ends_with(&format!(":{tag}")))
            })
            .ok_or_else(|| bad(path, format!("no image tagged {tag:?}")))?,
        None if entries.len() == 1 => &entries[0],
        None => {
            let all: Vec<String> = entries.iter().flat_map(tags).collect();
            return Err(bad(
                path,
                format!(
                    "it holds {} images: choose one by tag ({})",
                    entries.len(),
                    all.join(", ")
                ),
            ));
        }
    };
    let inside = |name: &str| -> Result<PathBuf> {
        let g = guest_path(name.as_bytes())
            .map_err(|m| bad(path, format!("manifest.json names {m}")))?
            .ok_or_else(|| bad(path, "manifest.json names the archive's root"))?;
        Ok(dir.join(g.trim_start_matches('/')))
    };
    let config_bytes = read_document(path, &inside(&chosen.config)?)?;
    let config_digest = Digest::of(&config_bytes);
    let label = path.display().to_string();
    let config = ImageConfig::parse(&label, &config_bytes)?;
    let platform = config.check_platform(&label)?;
    let mut files = Vec::new();
    for (i, l) in chosen.layers.iter().enumerate() {
        let file = inside(l)?;
        layer_file_size(path, i, &file, &opts.limits)?;
        progress(Event::Step {
            message: format!("hashing layer {}/{} ({l})", i + 1, chosen.layers.len()),
        });
        let digest =
            Digest::parse(&zygote_images::sha256_file(&file).map(|h| format!("sha256:{h}"))?)?;
        files.push((digest, file));
    }
    let layers = store_layers(store, files, &opts.limits, progress)?;
    let name = match (&opts.name, tags(chosen).first()) {
        (Some(n), _) => n.clone(),
        (None, Some(t)) => normalize(path, t)?,
        (None, None) => default_name(path, None)?,
    };
    Ok(LocalImage {
        name,
        origin: OciOrigin {
            reference: format!("docker-archive:{}", path.display()),
            // A docker archive has no manifest: its config digest is docker's image id.
            manifest_digest: config_digest.to_string(),
            config_digest: config_digest.to_string(),
            platform,
            layers: layers.iter().map(|(d, _)| d.to_string()).collect(),
            config: Default::default(),
        },
        config,
        layers,
    })
}

/// The size of an archive's layer file: a regular file (not a device or FIFO a
/// directory given to import could link to), within the layer limit.
fn layer_file_size(archive: &Path, index: usize, file: &Path, limits: &Limits) -> Result<u64> {
    let meta = std::fs::metadata(file).ctx(|| format!("reading {}", file.display()))?;
    if !meta.is_file() {
        return Err(bad(archive, format!("layer {index} is not a regular file")));
    }
    if meta.len() > limits.max_layer_bytes {
        return Err(OciError::TooLarge {
            what: format!("layer {index} of the archive"),
            size: meta.len(),
            limit: limits.max_layer_bytes,
        });
    }
    Ok(meta.len())
}

/// Copies the layer files into the blob store, once all that it lacks fit on its disk
/// beyond the reserve (a copy writes every byte: a sparse file's holes too).
fn store_layers(
    store: &BlobStore,
    files: Vec<(Digest, PathBuf)>,
    limits: &Limits,
    progress: Progress,
) -> Result<Vec<(Digest, PathBuf)>> {
    let mut missing = 0u64;
    let mut counted = std::collections::HashSet::new();
    for (digest, file) in &files {
        if !store.has(digest) && counted.insert(digest.clone()) {
            let size = std::fs::metadata(file).map_or(0, |m| m.len());
            missing = missing.saturating_add(size);
        }
    }
    store.make_room(
        missing,
        &format!(
            "to copy the archive's layers into the blob store ({} MiB)",
            missing.div_ceil(1 << 20)
        ),
    )?;
    let count = files.len();
    let mut layers = Vec::with_capacity(count);
    for (i, (digest, file)) in files.into_iter().enumerate() {
        progress(Event::Step {
            message: format!("layer {}/{count} ({digest})", i + 1),
        });
        let stored = store.put_file(&digest, &file, limits.max_layer_bytes)?;
        layers.push((digest, stored));
    }
    Ok(layers)
}

fn normalize(path: &Path, name: &str) -> Result<String> {
    ImageRef::parse(name).map(|r| r.name()).map_err(|_| {
        bad(
            path,
            format!("it names itself {name:?}, not a reference: give a name"),
        )
    })
}

/// `localhost/<file name>:<tag>` (podman's convention for images of no registry).
fn default_name(path: &Path, tag: Option<&str>) -> Result<String> {
    let stem: String = path
        .file_stem()
        .map(|s| s.to_string_lossy().to_lowercase())
        .unwrap_or_default()
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '.' || c == '-' {
                c
            } else {
                '-'
            }
        })
        .collect();
    let stem = stem.trim_matches(['-', '.']);
    let tag = tag
        .filter(|t| !t.is_empty() && !t.contains(['/', ':']))
        .unwrap_or("latest");
    normalize(
        path,
        &format!(
            "localhost/{}:{tag}",
            if stem.is_empty() { "image" } else { stem }
        ),
    )
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::MetadataExt;

    use super::*;
    use crate::fuzzing::tar_stream::TarStream;

    fn gzip(data: &[u8]) -> Vec<u8> {
        let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
        std::io::Write::write_all(&mut e, data).unwrap();
        e.finish().unwrap()
    }

    #[test]
    fn archives_unpack_within_the_limits_of_a_layer() {
        let mut t = TarStream::default();
        t.file("blobs/sha256/aa", b"blob", 0o644)
            .file("zeros", &vec![0u8; 16 << 20], 0o644);
        let dir = tempfile::tempdir().unwrap();
        let archive = dir.path().join("image.tar.gz");
        std::fs::write(&archive, gzip(&t.bytes())).unwrap();
        let mut limits = Limits::default();
        limits.unpack.reserve_bytes = 0;
        limits.unpack.max_disk_bytes = Some(1 << 20);
        // Zeros are holes: 16 MiB of them fit a 1 MiB disk budget.
        let dest = dir.path().join("out");
        unpack_archive(&archive, &dest, &limits).unwrap();
        assert_eq!(
            std::fs::read(dest.join("blobs/sha256/aa")).unwrap(),
            b"blob"
        );
        let zeros = std::fs::metadata(dest.join("zeros")).unwrap();
        assert_eq!((zeros.len(), zeros.blocks()), (16 << 20, 0));
        // A bomb by the expansion ratio, said so.
        limits.unpack.max_expansion_ratio = 100;
        limits.unpack.expansion_floor_bytes = 1 << 20;
        let err = unpack_archive(&archive, &dir.path().join("again"), &limits).unwrap_err();
        let msg = err.to_string();
        assert!(
            msg.contains("expansion-ratio limit (100:1): the archive"),
            "{msg}"
        );
    }
}
