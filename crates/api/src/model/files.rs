//! The guest file routes (`GET`/`PUT /v1/sandboxes/{id}/files`, directory listings):
//! their query string and answers.
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// The query string of the file routes (`?path=/etc/hostname&mode=644`).
#[derive(Debug, Clone, Deserialize, Serialize, ToSchema, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct PathQuery {
    /// Absolute path in the guest (at most 4096 bytes, no NUL).
    #[param(pattern = "^/[^\\u0000]*$")]
    pub path: String,
    /// Permission bits for written files, octal digits up to `7777` (e.g. `644`).
    #[serde(default)]
    #[param(pattern = "^0*[0-7]{1,4}$")]
    pub mode: Option<String>,
    /// Reading: also read a file that is not a regular file (a device or FIFO), up to
    /// the size limit. Without it such a read is refused.
    #[serde(default)]
    pub special: Option<bool>,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct FileEntry {
    pub name: String,
    /// `file`, `dir`, `symlink`, `other`.
    pub kind: String,
    pub size: u64,
    pub mode: u32,
    pub mtime: i64,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct DirListing {
    pub path: String,
    pub entries: Vec<FileEntry>,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct WriteResult {
    pub path: String,
    pub size: u64,
}
