//! Pulling an image from a registry (the distribution spec, `registry_http.rs`):
//! resolve a reference to the linux/amd64 image manifest, fetch its config and its
//! layers into the blob store (three at a time, resuming partial downloads), checking
//! every digest and size against what the manifest declared.
//!
//! Downloads are bounded by the disk as well as by the manifest: before the first
//! byte, the layers' declared sizes (less what partial downloads already hold) must
//! fit in the free space beyond the reserve (`Limits::unpack.reserve_bytes`), and the
//! blob store checks the reserve again as it writes (`blobs.rs`); a registry sending
//! more than a layer's declared size is cut off at that size, and one announcing more
//! (`Content-Length`) is refused before a byte is read.
use std::collections::HashSet;

use futures_util::StreamExt;
use reqwest::header::RANGE;
use reqwest::{Method, StatusCode};

use crate::blobs::BlobStore;
use crate::error::{OciError, Result};
use crate::manifest::{self, Descriptor, Digest, Document, ImageConfig, ImageManifest};
use crate::reference::{ImageRef, Transport};
use crate::registry_auth::Credentials;
use crate::registry_http::{describe, Session};
use crate::{Event, LayerState, Limits, Progress};

/// A registry session for one reference.
pub(crate) struct Registry {
    session: Session,
}

/// The image a reference names, resolved to one platform.
pub(crate) struct Resolved {
    pub manifest_digest: Digest,
    pub manifest: ImageManifest,
}

impl Registry {
    pub fn new(
        transport: &Transport,
        image: ImageRef,
        credentials: Credentials,
    ) -> Result<Registry> {
        Ok(Registry {
            session: Session::new(transport, image, credentials, false)?,
        })
    }

    fn image(&self) -> &ImageRef {
        &self.session.image
    }

    /// The reference's image manifest for linux/amd64 (through an index if it is one).
    pub async fn resolve(&self) -> Result<Resolved> {
        let name = self.image().name();
        let (bytes, digest) = self.manifest(&self.image().inner).await?;
        match Document::parse(&name, &bytes)? {
            Document::Manifest(manifest) => Ok(Resolved {
                manifest_digest: digest,
                manifest,
            }),
            Document::Index(entries) => {
                let entry = manifest::pick_amd64(&name, &entries)?;
                let want = Digest::parse(&entry.digest)?;
                let by_digest = self.image().inner.clone_with_digest(want.to_string());
                let (bytes, digest) = self.manifest(&by_digest).await?;
                if digest != want {
                    return Err(OciError::DigestMismatch {
                        what: format!("{name}'s linux/amd64 manifest"),
                        expected: want.to_string(),
                        actual: digest.to_string(),
                    });
                }
                match Document::parse(&name, &bytes)? {
                    Document::Manifest(manifest) => Ok(Resolved {
                        manifest_digest: digest,
                        manifest,
                    }),
                    Document::Index(_) => Err(OciError::BadImage {
                        what: name,
                        message: "its index points at another index".into(),
                    }),
                }
            }
        }
    }

    /// The reference's manifest as it is (no index resolution): bytes and digest.
    pub async fn manifest_bytes(&self) -> Result<(Vec<u8>, Digest)> {
        self.manifest(&self.image().inner).await
    }

    /// A small blob (a config) into memory: at most its declared size (and `max`),
    /// checked against its digest.
    pub async fn small_blob(&self, d: &Descriptor, max: u64) -> Result<Vec<u8>> {
        let digest = Digest::parse(&d.digest)?;
        let what = format!("blob {digest} of {}", self.image().name());
        let size = u64::try_from(d.size).unwrap_or(u64::MAX);
        if size > max {
            return Err(OciError::TooLarge {
                what,
                size: d.size.max(0) as u64,
                limit: max,
            });
        }
        let url = self.session.url(&format!("blobs/{digest}"))?;
        let bytes = self
            .session
            .get_document(url, &["*/*"], size, &format!("{what} (its declared size)"))
            .await?;
        digest.verify(&what, &bytes)?;
        Ok(bytes)
    }

    /// One manifest's bytes (at most [`manifest::MAX_DOCUMENT_BYTES`]) and digest,
    /// checked against the reference's digest when it has one.
    async fn manifest(
        &self,
        reference: &oci_spec::distribution::Reference,
    ) -> Result<(Vec<u8>, Digest)> {
        let url = self.session.manifest_url(reference)?;
        let bytes = self
            .session
            .get_document(
                url,
                manifest::ACCEPT,
                manifest::MAX_DOCUMENT_BYTES,
                &format!("the manifest of {}", reference.whole()),
            )
            .await?;
        let digest = Digest::of(&bytes);
        if let Some(want) = reference.digest() {
            Digest::parse(want)?.verify(&format!("manifest {}", reference.whole()), &bytes)?;
        }
        Ok((bytes, digest))
    }

    /// The image config (small: fetched into memory and checked).
    pub async fn config(&self, resolved: &Resolved) -> Result<(Digest, Vec<u8>, ImageConfig)> {
        let d = &resolved.manifest.config;
        let bytes = self.small_blob(d, manifest::MAX_DOCUMENT_BYTES).await?;
        let config = ImageConfig::parse(&self.image().name(), &bytes)?;
        Ok((Digest::parse(&d.digest)?, bytes, config))
    }

    /// Every layer in the blob store (downloaded unless it is there already), once
    /// all their declared sizes are within the limits and fit on the disk.
    pub async fn fetch_layers(
        &self,
        layers: &[Descriptor],
        store: &BlobStore,
        limits: &Limits,
        progress: Progress<'_>,
    ) -> Result<()> {
        let mut sizes = Vec::with_capacity(layers.len());
        let mut missing = 0u64;
        let mut counted = HashSet::new();
        for (index, d) in layers.iter().enumerate() {
            let digest = Digest::parse(&d.digest)?;
            let size = declared_size(index, &digest, d, limits)?;
            if !store.has(&digest) && counted.insert(digest.clone()) {
                missing = missing.saturating_add(size.saturating_sub(store.partial_len(&digest)));
            }
            sizes.push((digest, size));
        }
        store.make_room(
            missing,
            &format!(
                "to download {}'s layers ({} MiB not in the blob store yet)",
                self.image().name(),
                missing.div_ceil(1 << 20)
            ),
        )?;
        // Made in a loop, not a closure over the stream's items: the compiler cannot
        // prove such a closure's futures `Send` for every lifetime, which a caller that
        // must be `Send` (an axum handler) needs.
        let mut jobs: Vec<futures_util::future::BoxFuture<'_, Result<()>>> = Vec::new();
        for (index, (digest, size)) in sizes.into_iter().enumerate() {
            jobs.push(Box::pin(
                self.fetch_layer(index, digest, size, store, progress),
            ));
        }
        let downloads = futures_util::stream::iter(jobs).buffer_unordered(3);
        let mut downloads = std::pin::pin!(downloads);
        while let Some(done) = downloads.next().await {
            done?;
        }
        Ok(())
    }

    /// One layer of `total` declared bytes into the store.
    async fn fetch_layer(
        &self,
        index: usize,
        digest: Digest,
        total: u64,
        store: &BlobStore,
        progress: Progress<'_>,
    ) -> Result<()> {
        let event = |done: u64, state: LayerState| Event::Layer {
            index,
            digest: digest.to_string(),
            done,
            total,
            state,
        };
        if store.has(&digest) {
            progress(event(total, LayerState::Cached));
            return Ok(());
        }
        let lock_name = format!("blob-{}", digest.hex());
        let _lock = tokio::task::spawn_blocking(move || {
            zygote_images::pack::build_lock(&lock_name, &mut |_| {})
        })
        .await
        .map_err(|e| OciError::Io {
            context: "waiting for another download of the layer".into(),
            source: std::io::Error::other(e.to_string()),
        })??;
        if store.has(&digest) {
            progress(event(total, LayerState::Cached));
            return Ok(());
        }
        let mut writer = store.writer(&digest)?;
        if writer.len() > total {
            writer.restart()?;
        }
        let what = format!("layer {index} ({digest})");
        if writer.len() < total {
            let offset = writer.len();
            if offset > 0 {
                progress(event(offset, LayerState::Resuming));
            }
            let url = self.session.url(&format!("blobs/{digest}"))?;
            let response = self
                .session
                .send(Method::GET, url, |r| match offset {
                    0 => r,
                    _ => r.header(RANGE, format!("bytes={offset}-")),
                })
                .await?;
            let response = self
                .session
                .expect(response, &[StatusCode::OK, StatusCode::PARTIAL_CONTENT])
                .await?;
            if response.status() == StatusCode::OK && offset > 0 {
                // The whole blob came instead of the rest of it.
                writer.restart()?;
            }
            let too_many = |size: u64, how: &str| OciError::TooLarge {
                what: format!(
                    "{what} as the registry {how}, against the size its manifest declared"
                ),
                size,
                limit: total,
            };
            if let Some(len) = response.content_length() {
                let announced = writer.len().saturating_add(len);
                if announced > total {
                    // Not this blob as declared: nothing of it is kept.
                    writer.discard();
                    return Err(too_many(announced, "announced it (Content-Length)"));
                }
            }
            let mut reported = writer.len();
            let mut stream = response.bytes_stream();
            while let Some(chunk) = stream.next().await {
                // Kept on a dropped connection: the next pull continues from here.
                let chunk = chunk.map_err(|e| {
                    self.session
                        .registry_error(format!("downloading {what}: {}", describe(&e)))
                })?;
                writer.write(&chunk, total).map_err(|e| match e {
                    OciError::TooLarge { size, .. } => too_many(size, "sent it"),
                    e => e,
                })?;
                if writer.len() - reported >= 1 << 20 {
                    reported = writer.len();
                    progress(event(reported, LayerState::Downloading));
                }
            }
        }
        let size = writer.len();
        if size != total {
            // Short: keep what came, a retry resumes; the registry said otherwise.
            return Err(self
                .session
                .registry_error(format!("{what} ended after {size} of its {total} bytes")));
        }
        writer.finish()?;
        progress(event(total, LayerState::Done));
        Ok(())
    }
}

/// A layer's size as its manifest declares it, within the layer limit.
fn declared_size(index: usize, digest: &Digest, d: &Descriptor, limits: &Limits) -> Result<u64> {
    let size = u64::try_from(d.size).map_err(|_| OciError::BadImage {
        what: format!("layer {index} ({digest})"),
        message: format!("its manifest declares a size of {}", d.size),
    })?;
    if size > limits.max_layer_bytes {
        return Err(OciError::TooLarge {
            what: format!("layer {index} ({digest})"),
            size,
            limit: limits.max_layer_bytes,
        });
    }
    Ok(size)
}
