//! Images: built from recipes, or pulled from OCI registries.
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct Image {
    /// A recipe's name (`minimal`) or, for an OCI image, its normalized reference
    /// (`docker.io/library/python:3.12-slim`).
    pub name: String,
    pub sha256: String,
    pub size_bytes: u64,
    pub disk_bytes: u64,
    pub description: String,
    pub built_at: u64,
    /// For an OCI image: where it came from (the reference, or the archive imported).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source: Option<String>,
    /// For an OCI image: its manifest digest.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub digest: Option<String>,
}

impl From<&zygote_images::ImageInfo> for Image {
    fn from(i: &zygote_images::ImageInfo) -> Self {
        Image {
            name: i.name.clone(),
            sha256: i.sha256.clone(),
            size_bytes: i.size_bytes,
            disk_bytes: i.disk_bytes,
            description: i.description.clone(),
            built_at: i.built_at,
            source: i.oci.as_ref().map(|o| o.reference.clone()),
            digest: i.oci.as_ref().map(|o| o.manifest_digest.clone()),
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct ImageList {
    pub images: Vec<Image>,
    /// Recipes that `POST /v1/images/build` accepts.
    pub recipes: Vec<String>,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct BuildImageRequest {
    /// Recipe name (e.g. `minimal`): a lower-case letter or digit, then up to 63 of
    /// those and `.`, `_`, `-`.
    #[schema(pattern = "^[a-z0-9][a-z0-9._-]{0,63}$")]
    pub name: String,
}

/// `POST /v1/images`: pull an OCI image from a registry and convert it.
#[derive(Clone, Default, Deserialize, Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct PullImageRequest {
    /// An image reference: `alpine:3.20`, `registry.example:5000/team/app:1.4`,
    /// `app@sha256:...`.
    #[schema(min_length = 1, max_length = 512)]
    pub reference: String,
    /// Registry credentials (used for this pull only, never stored); without them the
    /// daemon's user's docker config is used, else none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub username: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub password: Option<String>,
}

/// Debug without the password, validation of the reference and of the credentials'
/// pairing, and the credentials as a pull takes them: for every request that names a
/// registry reference.
macro_rules! registry_request {
    ($t:ty) => {
        impl std::fmt::Debug for $t {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.debug_struct(stringify!($t))
                    .field("reference", &self.reference)
                    .field("username", &self.username)
                    .finish_non_exhaustive()
            }
        }

        impl $crate::model::Validate for $t {
            fn validate(&self) -> $crate::error::Result<()> {
                zygote_oci::ImageRef::parse(&self.reference)
                    .map_err(|e| $crate::error::RequestError::invalid(e.to_string()))?;
                match (&self.username, &self.password) {
                    (Some(_), None) | (None, Some(_)) => Err($crate::error::RequestError::invalid(
                        "username and password go together: give both or neither",
                    )),
                    _ => Ok(()),
                }
            }
        }

        impl $t {
            pub fn credentials(&self) -> Option<(String, String)> {
                self.username.clone().zip(self.password.clone())
            }
        }
    };
}
pub(crate) use registry_request;

registry_request!(PullImageRequest);

/// One line of the NDJSON stream of `POST /v1/images/build` and `POST /v1/images`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum BuildEvent {
    Progress {
        line: String,
    },
    /// A pull: the reference resolved to this manifest.
    Resolved {
        reference: String,
        digest: String,
        layers: usize,
        /// Compressed bytes of all layers.
        bytes: u64,
    },
    /// A pull: a layer's download (`state`: cached, resuming, downloading, done).
    Layer {
        index: usize,
        digest: String,
        done: u64,
        total: u64,
        state: String,
    },
    Done {
        image: Image,
    },
    Error {
        code: String,
        message: String,
    },
}

impl From<zygote_oci::Event> for BuildEvent {
    fn from(e: zygote_oci::Event) -> Self {
        use zygote_oci::Event as E;
        match e {
            E::Resolved {
                reference,
                digest,
                layers,
                bytes,
            } => BuildEvent::Resolved {
                reference,
                digest,
                layers,
                bytes,
            },
            E::Layer {
                index,
                digest,
                done,
                total,
                state,
            } => BuildEvent::Layer {
                index,
                digest,
                done,
                total,
                state: state.as_str().to_string(),
            },
            E::Step { message } => BuildEvent::Progress { line: message },
        }
    }
}
