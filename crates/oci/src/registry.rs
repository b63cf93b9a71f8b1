//! Pulling an image from a registry (the distribution spec, through `oci-client`):
//! resolve a reference to the linux/amd64 image manifest, fetch its config and its
//! layers into the blob store (three at a time, resuming partial downloads), checking
//! every digest and size against what the manifest declared.
use futures_util::StreamExt;
use oci_client::errors::{DigestError, OciDistributionError, OciErrorCode};
use oci_client::manifest::OciDescriptor;
use oci_client::secrets::RegistryAuth;

use crate::blobs::BlobStore;
use crate::error::{OciError, Result};
use crate::manifest::{self, Descriptor, Digest, Document, ImageConfig, ImageManifest};
use crate::reference::ImageRef;
use crate::{Event, LayerState, Limits, Progress};

/// A registry session for one reference.
pub(crate) struct Registry {
    client: oci_client::Client,
    image: ImageRef,
    auth: RegistryAuth,
    /// Said in an authorization error: whether credentials were sent.
    had_credentials: bool,
}

/// The image a reference names, resolved to one platform.
pub(crate) struct Resolved {
    pub manifest_digest: Digest,
    pub manifest: ImageManifest,
}

impl Registry {
    pub fn new(client: oci_client::Client, image: ImageRef, auth: RegistryAuth) -> Registry {
        let had_credentials = !matches!(auth, RegistryAuth::Anonymous);
        Registry {
            client,
            image,
            auth,
            had_credentials,
        }
    }

    /// The reference's image manifest for linux/amd64 (through an index if it is one).
    pub async fn resolve(&self) -> Result<Resolved> {
        let name = self.image.name();
        let (bytes, digest) = self.manifest(&self.image.inner).await?;
        match Document::parse(&name, &bytes)? {
            Document::Manifest(manifest) => Ok(Resolved {
                manifest_digest: digest,
                manifest,
            }),
            Document::Index(entries) => {
                let entry = manifest::pick_amd64(&name, &entries)?;
                let want = Digest::parse(&entry.digest)?;
                let by_digest = self.image.inner.clone_with_digest(want.to_string());
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
        self.manifest(&self.image.inner).await
    }

    /// A small blob (a config) into memory, checked against its digest and size.
    pub async fn small_blob(&self, d: &Descriptor, max: u64) -> Result<Vec<u8>> {
        let digest = Digest::parse(&d.digest)?;
        if d.size < 0 || d.size as u64 > max {
            return Err(OciError::TooLarge {
                what: format!("blob {digest} of {}", self.image.name()),
                size: d.size.max(0) as u64,
                limit: max,
            });
        }
        let mut bytes = Vec::new();
        self.client
            .pull_blob(&self.image.inner, &descriptor(d), &mut bytes)
            .await
            .map_err(|e| self.error(e))?;
        digest.verify(&format!("blob {digest} of {}", self.image.name()), &bytes)?;
        Ok(bytes)
    }

    /// One manifest's bytes and digest (checked against the bytes, and against the
    /// reference's digest when it has one).
    async fn manifest(&self, reference: &oci_client::Reference) -> Result<(Vec<u8>, Digest)> {
        let (bytes, _) = self
            .client
            .pull_manifest_raw(reference, &self.auth, manifest::ACCEPT)
            .await
            .map_err(|e| self.error(e))?;
        if bytes.len() as u64 > manifest::MAX_DOCUMENT_BYTES {
            return Err(OciError::TooLarge {
                what: format!("the manifest of {}", reference.whole()),
                size: bytes.len() as u64,
                limit: manifest::MAX_DOCUMENT_BYTES,
            });
        }
        let digest = Digest::of(&bytes);
        if let Some(want) = reference.digest() {
            Digest::parse(want)?.verify(&format!("manifest {}", reference.whole()), &bytes)?;
        }
        Ok((bytes.to_vec(), digest))
    }

    /// The image config (small: fetched into memory and checked).
    pub async fn config(&self, resolved: &Resolved) -> Result<(Digest, Vec<u8>, ImageConfig)> {
        let d = &resolved.manifest.config;
        let bytes = self.small_blob(d, manifest::MAX_DOCUMENT_BYTES).await?;
        let config = ImageConfig::parse(&self.image.name(), &bytes)?;
        Ok((Digest::parse(&d.digest)?, bytes, config))
    }

    /// Every layer in the blob store (downloaded unless it is there already).
    pub async fn fetch_layers(
        &self,
        layers: &[Descriptor],
        store: &BlobStore,
        limits: &Limits,
        progress: Progress<'_>,
    ) -> Result<()> {
        // Made in a loop, not a closure over the stream's items: the compiler cannot
        // prove such a closure's futures `Send` for every lifetime, which a caller that
        // must be `Send` (an axum handler) needs.
        let mut jobs: Vec<futures_util::future::BoxFuture<'_, Result<()>>> = Vec::new();
        for (index, d) in layers.iter().enumerate() {
            jobs.push(Box::pin(
                self.fetch_layer(index, d, store, limits, progress),
            ));
        }
        let downloads = futures_util::stream::iter(jobs).buffer_unordered(3);
        let mut downloads = std::pin::pin!(downloads);
        while let Some(done) = downloads.next().await {
            done?;
        }
        Ok(())
    }

    async fn fetch_layer(
        &self,
        index: usize,
        d: &Descriptor,
        store: &BlobStore,
        limits: &Limits,
        progress: Progress<'_>,
    ) -> Result<()> {
        let digest = Digest::parse(&d.digest)?;
        let total = u64::try_from(d.size).unwrap_or(0);
        if total > limits.max_layer_bytes {
            return Err(OciError::TooLarge {
                what: format!("layer {index} ({digest})"),
                size: total,
                limit: limits.max_layer_bytes,
            });
        }
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
        let desc = descriptor(d);
        let mut stream = if writer.is_empty() {
            self.client
                .pull_blob_stream(&self.image.inner, &desc)
                .await
                .map_err(|e| self.error(e))?
        } else {
            progress(event(writer.len(), LayerState::Resuming));
            match self
                .client
                .pull_blob_stream_partial(&self.image.inner, &desc, writer.len(), None)
                .await
                .map_err(|e| self.error(e))?
            {
                oci_client::client::BlobResponse::Partial(s) => s,
                oci_client::client::BlobResponse::Full(s) => {
                    writer.restart()?;
                    s
                }
            }
        };
        let max = total.min(limits.max_layer_bytes);
        let mut reported = 0u64;
        while let Some(chunk) = stream.next().await {
            let chunk = match chunk {
                Ok(c) => c,
                Err(e) => {
                    let wrong = e.get_ref().and_then(|i| i.downcast_ref::<DigestError>());
                    if let Some(DigestError::VerificationError { expected, actual }) = wrong {
                        // Bytes that are not the blob are not worth resuming.
                        let (expected, actual) = (expected.clone(), actual.clone());
                        writer.discard();
                        return Err(OciError::DigestMismatch {
                            what: format!("layer {index} of {}", self.image.name()),
                            expected,
                            actual,
                        });
                    }
                    // Kept: the next pull continues from here.
                    return Err(OciError::Registry {
                        registry: self.image.registry().to_string(),
                        message: format!("downloading layer {index} ({digest}): {}", describe(&e)),
                    });
                }
            };
            writer.write(&chunk, max)?;
            if writer.len() - reported >= 1 << 20 {
                reported = writer.len();
                progress(event(reported, LayerState::Downloading));
            }
        }
        let size = writer.len();
        if size != total {
            // Short: keep what came, a retry resumes; the registry said otherwise.
            return Err(OciError::Registry {
                registry: self.image.registry().to_string(),
                message: format!(
                    "layer {index} ({digest}) ended after {size} of its {total} bytes"
                ),
            });
        }
        writer.finish()?;
        progress(event(total, LayerState::Done));
        Ok(())
    }

    fn error(&self, e: OciDistributionError) -> OciError {
        Registry::describe_error(&self.image, self.had_credentials, e)
    }

    /// A registry error as one of ours, with what it means for the user.
    pub fn describe_error(
        image: &ImageRef,
        had_credentials: bool,
        e: OciDistributionError,
    ) -> OciError {
        let registry = image.registry().to_string();
        let reference = image.name();
        let unauthorized = |message: String| OciError::Unauthorized {
            registry: registry.clone(),
            hint: if had_credentials {
                String::new()
            } else {
                " (no credentials were found: pass them, or add them to ~/.docker/config.json)"
                    .into()
            },
            message,
        };
        match e {
            OciDistributionError::UnauthorizedError { url } => {
                unauthorized(format!("401 Unauthorized for {url}"))
            }
            OciDistributionError::AuthenticationFailure(m) => unauthorized(m),
            OciDistributionError::RegistryError { envelope, url } => {
                let codes: Vec<&OciErrorCode> = envelope.errors.iter().map(|e| &e.code).collect();
                let message = envelope
                    .errors
                    .iter()
                    .map(|e| e.message.clone())
                    .collect::<Vec<_>>()
                    .join("; ");
                if codes
                    .iter()
                    .any(|c| matches!(c, OciErrorCode::Unauthorized | OciErrorCode::Denied))
                {
                    unauthorized(message)
                } else if codes.iter().any(|c| {
                    matches!(
                        c,
                        OciErrorCode::ManifestUnknown
                            | OciErrorCode::NameUnknown
                            | OciErrorCode::BlobUnknown
                            | OciErrorCode::NotFound
                    )
                }) {
                    OciError::NotFound {
                        reference,
                        message: format!("{message} ({url})"),
                    }
                } else {
                    OciError::Registry {
                        registry,
                        message: format!("{message} ({url})"),
                    }
                }
            }
            OciDistributionError::ServerError { code: 404, url, .. } => OciError::NotFound {
                reference,
                message: format!("404 for {url}"),
            },
            OciDistributionError::DigestError(DigestError::VerificationError {
                expected,
                actual,
            }) => OciError::DigestMismatch {
                what: format!("a blob of {reference}"),
                expected,
                actual,
            },
            other => OciError::Registry {
                registry,
                message: describe(&other),
            },
        }
    }
}

/// The error with its causes (reqwest's own message hides e.g. "connection refused").
fn describe(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        let text = c.to_string();
        if !s.contains(&text) {
            s.push_str(": ");
            s.push_str(&text);
        }
        cause = c.source();
    }
    s
}

fn descriptor(d: &Descriptor) -> OciDescriptor {
    OciDescriptor {
        media_type: d.media_type.clone(),
        digest: d.digest.clone(),
        size: d.size,
        urls: None,
        annotations: None,
        artifact_type: None,
    }
}
