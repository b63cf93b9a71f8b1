use std::path::PathBuf;

/// Everything that can go wrong while building or locating kernels and images.
#[derive(Debug, thiserror::Error)]
pub enum ImageError {
    #[error("{path}:{line}: {msg}")]
    RecipeSyntax {
        path: PathBuf,
        line: usize,
        msg: String,
    },
    #[error("recipe {path}: {msg}")]
    RecipeInvalid { path: PathBuf, msg: String },
    #[error("no recipe named {name:?} (looked in: {searched})")]
    UnknownRecipe { name: String, searched: String },
    #[error("image {0:?} has not been built yet (run `zygote image build {0}`)")]
    ImageNotFound(String),
    #[error(
        "{what} is not in {dir} and ZYGOTE_PREBUILT is set, which forbids building it; \
         copy a built cache there or unset ZYGOTE_PREBUILT"
    )]
    NotPrebuilt { what: String, dir: PathBuf },
    #[error(
        "cannot find the zygote source tree (needed for {what}); set ZYGOTE_REPO to its root \
         (tried {tried})"
    )]
    RepoNotFound { what: String, tried: PathBuf },
    #[error("cannot run {program}: {source}")]
    Spawn {
        program: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{what} failed ({status}); last output:\n{tail}")]
    CommandFailed {
        what: String,
        status: String,
        tail: String,
    },
    #[error("{what} produced no usable output: {detail}")]
    BadOutput { what: String, detail: String },
    #[error("{context}: {source}")]
    Io {
        context: String,
        #[source]
        source: std::io::Error,
    },
    #[error("image metadata {path}: {source}")]
    Metadata {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },
    #[error(
        "building a debootstrap base needs root (debootstrap creates device nodes and \
         chowns files); rerun as root or with sudo"
    )]
    NeedsRoot,
    #[error(
        "no apt source for Debian suite {0:?} in /etc/apt/sources.list(.d); \
         set MIRROR= in the recipe"
    )]
    NoMirror(String),
    #[error("guest path {path:?}: {msg}")]
    GuestPath { path: String, msg: String },
}

pub type Result<T, E = ImageError> = std::result::Result<T, E>;

/// Attaches a human context to an io::Error.
pub(crate) trait IoContext<T> {
    fn ctx(self, context: impl FnOnce() -> String) -> Result<T>;
}

impl<T> IoContext<T> for std::io::Result<T> {
    fn ctx(self, context: impl FnOnce() -> String) -> Result<T> {
        self.map_err(|source| ImageError::Io {
            context: context(),
            source,
        })
    }
}
