//! A snapshot pack as a file: an OCI image layout in a tar (what `docker save` and
//! `skopeo copy oci-archive:` make), written from the blob store and read back from a
//! stream (an upload) into a [`Staging`], never into the shared store.
//!
//! Reading trusts nothing in the stream: entries are counted and their bytes bounded,
//! every blob is checked against its digest as it is written, each blob name is read
//! once, and what is kept in memory (index, manifest, config) is at most
//! [`MAX_DOCUMENT_BYTES`] each. Errors name the pack's parts (`blob sha256:...`,
//! `index.json`), never a host path: they reach API clients.
use std::collections::HashSet;
use std::io::{Read, Write};

use serde_json::json;

use super::staging::Staging;
use super::{from_manifest, Packed, ARTIFACT_TYPE};
use crate::error::{IoContext, OciError, Result};
use crate::manifest::{Digest, Document, MAX_DOCUMENT_BYTES, OCI_MANIFEST};

/// Entries a pack's tar may hold: a pack has a handful of files (a kvm snapshot's
/// directory some more), never thousands.
pub const MAX_ENTRIES: u64 = 1024;

/// The pack as errors name it.
const WHAT: &str = "the pack";

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
    let mut seen = HashSet::new();
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

/// Reads a pack made by [`write_archive`] from `input`: its blobs, each checked against
/// its digest, go into `staging`; more than `max_bytes` in all, or more than
/// [`MAX_ENTRIES`] entries, is refused.
pub fn read_archive(input: &mut dyn Read, max_bytes: u64, staging: &Staging) -> Result<Packed> {
    let bad = |m: String| OciError::BadImage {
        what: WHAT.into(),
        message: m,
    };
    let store = staging.blobs();
    let mut tar = tar::Archive::new(input);
    let mut index: Option<Vec<u8>> = None;
    let mut seen = HashSet::new();
    let (mut total, mut count) = (0u64, 0u64);
    for entry in tar.entries().map_err(|e| bad(format!("not a tar: {e}")))? {
        let mut entry = entry.map_err(|e| bad(format!("reading it: {e}")))?;
        count += 1;
        if count > MAX_ENTRIES {
            return Err(bad(format!("more than {MAX_ENTRIES} entries")));
        }
        if !entry.header().entry_type().is_file() {
            continue;
        }
        let name = String::from_utf8_lossy(&entry.path_bytes())
            .trim_start_matches("./")
            .to_string();
        let size = entry.size();
        total = total.saturating_add(size);
        if total > max_bytes {
            return Err(OciError::TooLarge {
                what: WHAT.into(),
                size: total,
                limit: max_bytes,
            });
        }
        if !seen.insert(name.clone()) {
            return Err(bad(format!("{name:?} appears twice")));
        }
        if let Some(hex) = name.strip_prefix("blobs/sha256/") {
            let digest = Digest::parse(&format!("sha256:{hex}"))?;
            stage_blob(&mut entry, &digest, size, staging)?;
        } else if name == "index.json" {
            index = Some(read_document(&mut entry, size, "index.json")?);
        }
    }
    let index = index.ok_or_else(|| bad("no index.json: not a snapshot pack".into()))?;
    let Document::Index(entries) = Document::parse("index.json", &index)? else {
        return Err(bad("index.json is not an index".into()));
    };
    let [entry] = entries.as_slice() else {
        return Err(bad(format!("{} manifests in it, not one", entries.len())));
    };
    let digest = Digest::parse(&entry.digest)?;
    let staged_document = |d: &Digest| -> Result<Vec<u8>> {
        if !store.has(d) {
            return Err(bad(format!("blob {d} is missing")));
        }
        let path = store.path(d);
        let mut f = std::fs::File::open(&path).ctx(|| format!("opening {}", path.display()))?;
        let size = f
            .metadata()
            .ctx(|| format!("stat {}", path.display()))?
            .len();
        read_document(&mut f, size, d.as_str())
    };
    let manifest = staged_document(&digest)?;
    from_manifest(WHAT, manifest, staged_document, store)
}

/// Writes one blob of the stream into the staging store, checking its digest.
fn stage_blob(entry: &mut dyn Read, digest: &Digest, size: u64, staging: &Staging) -> Result<()> {
    let mut w = staging.blobs().writer(digest)?;
    w.restart()?;
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = entry.read(&mut buf).map_err(|e| OciError::BadImage {
            what: WHAT.into(),
            message: format!("reading blob {digest}: {e}"),
        })?;
        if n == 0 {
            break;
        }
        w.write(&buf[..n], size)?;
    }
    w.finish()?;
    Ok(())
}

/// A small document (index, manifest, config): at most [`MAX_DOCUMENT_BYTES`].
fn read_document(r: &mut dyn Read, size: u64, what: &str) -> Result<Vec<u8>> {
    if size > MAX_DOCUMENT_BYTES {
        return Err(OciError::BadImage {
            what: WHAT.into(),
            message: format!("{what} is {size} bytes: not a document"),
        });
    }
    let mut bytes = Vec::new();
    r.take(MAX_DOCUMENT_BYTES)
        .read_to_end(&mut bytes)
        .map_err(|e| OciError::BadImage {
            what: WHAT.into(),
            message: format!("reading {what}: {e}"),
        })?;
    Ok(bytes)
}

#[cfg(test)]
#[path = "archive_tests.rs"]
mod tests;
