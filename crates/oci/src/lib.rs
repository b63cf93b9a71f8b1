//! OCI images for zygote: sandboxes boot what users build as container images.
//!
//! - [`pull`]: a reference (`python:3.12-slim`, `registry.example:5000/app:1.4`,
//!   `app@sha256:...`) from any registry that speaks the distribution spec
//!   (`registry_http.rs`, every answer read with a cap): anonymous, basic or
//!   bearer-token auth (credentials given, or from `~/.docker/config.json`), plain
//!   HTTP only for loopback and registries named insecure, an index resolved to
//!   linux/amd64, every manifest, config and layer checked against its digest and
//!   declared size, downloads only when the declared sizes fit on the disk.
//! - [`import`]: an OCI image layout (a directory, or a tar of one) or a `docker save`
//!   archive.
//! - Either way the layers land in a content-addressed blob store ([`blobs`]) shared by
//!   all images, and are converted once per image into an ext4 root filesystem
//!   ([`apply`], `convert.rs`): whiteouts and opaque directories, hard links, symlinks
//!   never followed out of the tree, devices skipped, owners and xattrs kept; the agent
//!   is added as PID 1 (the image's entrypoint is not init), and the config's Env,
//!   WorkingDir and User are kept as the image's run configuration. The result is an
//!   ordinary image of the store (`zygote_images`), named by its reference, which both
//!   runtimes boot, branch and snapshot like a recipe image.
//!
//! A pull interrupted at any point registers nothing: blobs publish only once their
//! digest checks, partial downloads resume, and the image is recorded last.
pub mod apply;
pub mod blobs;
mod budget;
mod convert;
mod entry_path;
mod error;
mod ext4;
pub mod fuzzing;
mod import;
mod layer_stream;
pub mod manifest;
pub mod pack;
mod reference;
mod registry;
mod registry_auth;
mod registry_http;
mod registry_push;
mod sparse;
mod staged_attrs;

use std::sync::Arc;

use serde::{Deserialize, Serialize};
use zygote_images::{ImageError, ImageInfo, OciOrigin};

pub use convert::ConvertOptions;
pub use error::{OciError, Result};
pub use import::{import, ImportOptions};
pub use reference::{credentials, ImageRef, Transport};
pub use registry_auth::Credentials;

use crate::blobs::BlobStore;
use crate::convert::LocalImage;
use crate::manifest::Digest;
use crate::registry::Registry;

/// What a pull or import reports as it goes.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "event", rename_all = "snake_case")]
pub enum Event {
    /// The reference resolved to an image manifest.
    Resolved {
        reference: String,
        digest: String,
        layers: usize,
        /// Compressed bytes of all layers.
        bytes: u64,
    },
    /// A layer's download (throttled: about one per MiB).
    Layer {
        index: usize,
        digest: String,
        done: u64,
        total: u64,
        state: LayerState,
    },
    /// Any other step, as a line for people.
    Step { message: String },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LayerState {
    Cached,
    Resuming,
    Downloading,
    Done,
}

impl LayerState {
    /// The name the API streams (as serde names it).
    pub fn as_str(self) -> &'static str {
        match self {
            LayerState::Cached => "cached",
            LayerState::Resuming => "resuming",
            LayerState::Downloading => "downloading",
            LayerState::Done => "done",
        }
    }
}

/// Where events go (the CLI draws bars, the daemon streams NDJSON).
pub type Progress<'a> = &'a (dyn Fn(Event) + Send + Sync);

/// Bounds on what one image may bring.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Compressed size of any one layer.
    pub max_layer_bytes: u64,
    pub unpack: apply::Limits,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_layer_bytes: 16 << 30,
            unpack: apply::Limits::default(),
        }
    }
}

/// How to pull.
#[derive(Clone, Default)]
pub struct PullOptions {
    /// Username and password for the registry; None: the docker config's, else none.
    pub credentials: Option<(String, String)>,
    pub transport: Transport,
    pub limits: Limits,
    pub convert: ConvertOptions,
}

impl std::fmt::Debug for PullOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PullOptions")
            .field("credentials", &self.credentials.as_ref().map(|(u, _)| u))
            .field("transport", &self.transport)
            .field("limits", &self.limits)
            .field("convert", &self.convert)
            .finish()
    }
}

/// Pulls `reference` and converts it (or finds the conversion in the cache: the
/// registry is still asked what the reference means now).
pub async fn pull(
    reference: &str,
    opts: &PullOptions,
    progress: Arc<dyn Fn(Event) + Send + Sync>,
) -> Result<ImageInfo> {
    let image = ImageRef::parse(reference)?;
    if zygote_images::paths::prebuilt_only() {
        return Err(OciError::PullsDisabled(reference.to_string()));
    }
    let name = image.name();
    let auth = credentials(image.registry(), opts.credentials.clone())?;
    let registry = Registry::new(&opts.transport, image.clone(), auth)?;
    let resolved = registry.resolve().await?;
    let layers = &resolved.manifest.layers;
    for (i, d) in layers.iter().enumerate() {
        manifest::check_layer_type(i, d)?;
        Digest::parse(&d.digest)?;
    }
    progress(Event::Resolved {
        reference: name.clone(),
        digest: resolved.manifest_digest.to_string(),
        layers: layers.len(),
        bytes: layers.iter().map(|d| d.size.max(0) as u64).sum(),
    });
    let prepared = blocking({
        let (digest, convert, name, p) = (
            resolved.manifest_digest.clone(),
            opts.convert.clone(),
            name.clone(),
            progress.clone(),
        );
        move || {
            let prepared = convert::prepare(&digest, &convert, &*p)?;
            let hit = convert::lookup(&name, &prepared, &convert)?;
            Ok((prepared, hit))
        }
    })
    .await?;
    if let (_, Some(info)) = prepared {
        return Ok(info);
    }
    let (config_digest, _, config) = registry.config(&resolved).await?;
    let platform = config.check_platform(&name)?;
    let store = BlobStore::open()?.with_reserve(opts.limits.unpack.reserve_bytes);
    registry
        .fetch_layers(layers, &store, &opts.limits, &*progress)
        .await?;
    let local = LocalImage {
        name: name.clone(),
        origin: OciOrigin {
            reference: name,
            manifest_digest: resolved.manifest_digest.to_string(),
            config_digest: config_digest.to_string(),
            platform,
            layers: layers.iter().map(|d| d.digest.clone()).collect(),
            config: Default::default(),
        },
        config,
        layers: layers
            .iter()
            .map(|d| {
                let digest = Digest::parse(&d.digest)?;
                let path = store.path(&digest);
                Ok((digest, path))
            })
            .collect::<Result<_>>()?,
    };
    let (prepared, _) = prepared;
    let (convert, limits) = (opts.convert.clone(), opts.limits);
    blocking(move || convert::convert(local, &prepared, &convert, &limits, &*progress)).await
}

/// Runs blocking work (conversion, the agent build) off the async threads.
async fn blocking<T: Send + 'static>(f: impl FnOnce() -> Result<T> + Send + 'static) -> Result<T> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| OciError::Io {
            context: "a conversion task".into(),
            source: std::io::Error::other(e.to_string()),
        })?
}

/// A stored image by name (`minimal`, `name-sha256`, a sha256 prefix) or, for a
/// reference, by its normalized form (`alpine:3.20` finds
/// `docker.io/library/alpine:3.20`). None: not pulled or built yet.
pub fn find_local(query: &str) -> Result<Option<ImageInfo>> {
    match zygote_images::locate_image(query) {
        Ok(info) => return Ok(Some(info)),
        Err(ImageError::ImageNotFound(_)) => {}
        Err(e) => return Err(e.into()),
    }
    if ImageRef::looks_like_reference(query) {
        if let Ok(r) = ImageRef::parse(query) {
            match zygote_images::locate_image(&r.name()) {
                Ok(info) => return Ok(Some(info)),
                Err(ImageError::ImageNotFound(_)) => {}
                Err(e) => return Err(e.into()),
            }
        }
    }
    Ok(None)
}

/// Deletes blobs no stored image uses any more (after `image rm` or `prune`); returns
/// the bytes freed. Partial downloads younger than a day are kept for resuming.
pub fn prune_blobs() -> Result<u64> {
    let keep = zygote_images::list_images()?
        .into_iter()
        .filter_map(|i| i.oci)
        .flat_map(|o| o.layers)
        .filter_map(|d| Digest::parse(&d).ok())
        .map(|d| d.hex().to_string())
        .collect();
    BlobStore::open()?.retain(&keep)
}
