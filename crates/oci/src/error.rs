use std::path::PathBuf;

/// Everything that can go wrong turning an OCI image into a zygote image.
#[derive(Debug, thiserror::Error)]
pub enum OciError {
    #[error(
        "pulling {0:?} is off here: ZYGOTE_PREBUILT is set (only what is already in the cache \
         is used)"
    )]
    PullsDisabled(String),
    #[error("{0:?} is not an image reference (expected e.g. alpine:3.20, registry.example:5000/app:1.4 or app@sha256:...)")]
    BadReference(String),
    #[error("registry {registry}: {message}")]
    Registry { registry: String, message: String },
    #[error("registry {registry} refused the credentials or needs some{hint}: {message}")]
    Unauthorized {
        registry: String,
        hint: String,
        message: String,
    },
    #[error("{reference}: not found in the registry ({message})")]
    NotFound { reference: String, message: String },
    #[error("{reference}: no linux/amd64 image (the image is for {available})")]
    NoPlatform {
        reference: String,
        available: String,
    },
    #[error("{what}: digest mismatch: expected {expected}, got {actual}")]
    DigestMismatch {
        what: String,
        expected: String,
        actual: String,
    },
    #[error("{what} is {size} bytes, over the limit of {limit} bytes")]
    TooLarge { what: String, size: u64, limit: u64 },
    /// Bigger than the free disk space set aside for it (checked before the disk fills).
    #[error("{what} needs more than the {limit} bytes of disk space free for it")]
    NoSpace { what: String, limit: u64 },
    #[error("layer {layer} ({digest}): {message}")]
    BadLayer {
        layer: usize,
        digest: String,
        message: String,
    },
    #[error("{what}: {message}")]
    BadImage { what: String, message: String },
    #[error("{path}: {message}")]
    BadArchive { path: PathBuf, message: String },
    #[error("{context}: {source}")]
    Io {
        context: String,
        #[source]
        source: std::io::Error,
    },
    #[error(transparent)]
    Image(#[from] zygote_images::ImageError),
}

pub type Result<T, E = OciError> = std::result::Result<T, E>;

/// Adds what was being done to an I/O error.
pub(crate) trait IoContext<T> {
    fn ctx(self, context: impl FnOnce() -> String) -> Result<T>;
}

impl<T> IoContext<T> for std::io::Result<T> {
    fn ctx(self, context: impl FnOnce() -> String) -> Result<T> {
        self.map_err(|source| OciError::Io {
            context: context(),
            source,
        })
    }
}
