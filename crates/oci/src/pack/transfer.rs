//! Snapshot packs to and from registries: blobs the registry has are not sent again
//! (the check is a HEAD per blob), the manifest goes last so a pull never sees a pack
//! whose blobs are not all there, and pulls reuse the image pull's checked downloads,
//! into a [`Staging`] (blobs the shared store has are linked, not fetched again).
use std::sync::Arc;

use futures_util::StreamExt;
use tokio::io::AsyncReadExt;

use super::{from_manifest, snapshot_manifest, Packed, Room, Staging, CONFIG_TYPE, FILE_TYPE};
use crate::blobs::BlobStore;
use crate::error::{OciError, Result};
use crate::manifest::{MAX_DOCUMENT_BYTES, OCI_MANIFEST};
use crate::reference::{credentials, ImageRef};
use crate::registry::Registry;
use crate::registry_http::Session;
use crate::{Event, LayerState, PullOptions};

/// Pushes `p` as `reference`; returns the manifest digest. `progress` gets a
/// [`Event::Layer`] per blob (state `cached` when the registry already had it).
pub async fn push(
    p: &Packed,
    reference: &str,
    opts: &PullOptions,
    progress: Arc<dyn Fn(Event) + Send + Sync>,
) -> Result<String> {
    let image = ImageRef::parse(reference)?;
    let auth = credentials(image.registry(), opts.credentials.clone())?;
    let session = Session::new(&opts.transport, image, auth, true)?;
    for (index, f) in p.files.iter().enumerate() {
        let event = |done: u64, state: LayerState| Event::Layer {
            index,
            digest: f.digest.to_string(),
            done,
            total: f.size,
            state,
        };
        if session.blob_exists(&f.digest).await? {
            progress(event(f.size, LayerState::Cached));
            continue;
        }
        let file = tokio::fs::File::open(&f.blob)
            .await
            .map_err(|source| OciError::Io {
                context: format!("opening {}", f.blob.display()),
                source,
            })?;
        let sent = Arc::new(std::sync::atomic::AtomicU64::new(0));
        let (s, pr, total, idx, digest) = (
            sent.clone(),
            progress.clone(),
            f.size,
            index,
            f.digest.to_string(),
        );
        let chunks = futures_util::stream::unfold(file, |mut file| async move {
            let mut buf = vec![0u8; 8 << 20];
            match file.read(&mut buf).await {
                Ok(0) => None,
                Ok(n) => {
                    buf.truncate(n);
                    Some((Ok(bytes::Bytes::from(buf)), file))
                }
                Err(e) => Some((Err(e), file)),
            }
        })
        .inspect(move |c| {
            if let Ok(c) = c {
                let done = s.fetch_add(c.len() as u64, std::sync::atomic::Ordering::SeqCst)
                    + c.len() as u64;
                pr(Event::Layer {
                    index: idx,
                    digest: digest.clone(),
                    done,
                    total,
                    state: LayerState::Downloading,
                });
            }
        });
        session.upload_blob(&f.digest, f.size, chunks).await?;
        progress(event(f.size, LayerState::Done));
    }
    let config_digest = crate::manifest::Digest::of(&p.config);
    if !session.blob_exists(&config_digest).await? {
        let config = bytes::Bytes::from(p.config.clone());
        let size = config.len() as u64;
        let once = futures_util::stream::iter([Ok(config)]);
        session.upload_blob(&config_digest, size, once).await?;
    }
    session
        .put_manifest(p.manifest.clone(), OCI_MANIFEST)
        .await?;
    Ok(p.manifest_digest.to_string())
}

/// Pulls the pack `reference` names into `staging` (checked); a pack whose blobs
/// together claim more than the staging's `room` is refused before any is fetched.
pub async fn pull(
    reference: &str,
    opts: &PullOptions,
    staging: &Staging,
    room: Room,
    progress: Arc<dyn Fn(Event) + Send + Sync>,
) -> Result<Packed> {
    let image = ImageRef::parse(reference)?;
    // Same rule as image pulls: a prebuilt-only host (CI, the nested lane) never reaches
    // out to a registry, so a stray reference cannot send traffic off the machine.
    if zygote_images::paths::prebuilt_only() {
        return Err(OciError::PullsDisabled(reference.to_string()));
    }
    let auth = credentials(image.registry(), opts.credentials.clone())?;
    let registry = Registry::new(&opts.transport, image.clone(), auth)?;
    let (manifest, digest) = registry.manifest_bytes().await?;
    let m = snapshot_manifest(&image.name(), &manifest)?;
    progress(Event::Resolved {
        reference: image.name(),
        digest: digest.to_string(),
        layers: m.layers.len(),
        bytes: m.layers.iter().map(|d| d.size.max(0) as u64).sum(),
    });
    if m.config.media_type != CONFIG_TYPE || m.layers.iter().any(|l| l.media_type != FILE_TYPE) {
        return Err(OciError::BadImage {
            what: image.name(),
            message: "not a zygote snapshot pack".into(),
        });
    }
    let claimed = m
        .layers
        .iter()
        .fold(0u64, |n, l| n.saturating_add(l.size.max(0) as u64));
    room.check(claimed, || format!("pulling the pack {}", image.name()))?;
    let shared = BlobStore::open()?;
    for l in &m.layers {
        staging.link_existing(&shared, &crate::manifest::Digest::parse(&l.digest)?);
    }
    registry
        .fetch_layers(&m.layers, staging.blobs(), &opts.limits, &*progress)
        .await?;
    let config = registry.small_blob(&m.config, MAX_DOCUMENT_BYTES).await?;
    from_manifest(
        &image.name(),
        manifest,
        |d| {
            if d.as_str() == m.config.digest {
                Ok(config.clone())
            } else {
                Err(OciError::BadImage {
                    what: image.name(),
                    message: format!("unexpected document {d}"),
                })
            }
        },
        staging.blobs(),
    )
}
