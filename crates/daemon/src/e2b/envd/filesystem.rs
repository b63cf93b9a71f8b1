//! envd's unary `filesystem.Filesystem` procedures: `Stat`, `ListDir`, `MakeDir`,
//! `Move` and `Remove`, each one or a few agent file calls on the routed sandbox.
//!
//! The caller acts as a guest user ([`users`]: `Authorization: Basic`, else the
//! default user): relative paths resolve under its home, and the directories `MakeDir`
//! and `Move` create are its own. Entries come back as envd's `EntryInfo` (proto3
//! JSON: `size` as a string, `type` as the enum's name, `modifiedTime` RFC 3339), with
//! owner and group names from the guest's account files.
//!
//! `ListDir` recurses host-side, one agent `list_dir` per directory, down to `depth`
//! (0 counts as 1, as envd) and never through symlinks; a listing past
//! [`MAX_LIST_ENTRIES`] is refused (`resource_exhausted`) instead of growing the
//! daemon's memory with whatever tree the guest holds.
use std::sync::Arc;

use axum::http::HeaderMap;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use zygote_proto::{FileKind, Metadata};

use super::connect::{Code, ConnectError};
use super::users::{self, Accounts, User};
use crate::error::Error;
use crate::manager::Manager;

/// Entries one `ListDir` answers at most, whatever its depth.
pub const MAX_LIST_ENTRIES: usize = 10_000;

/// A unary procedure of the filesystem service.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unary {
    Stat,
    ListDir,
    MakeDir,
    Move,
    Remove,
}

#[derive(Debug, Deserialize)]
struct PathRequest {
    #[serde(default)]
    path: String,
}

#[derive(Debug, Deserialize)]
struct ListDirRequest {
    #[serde(default)]
    path: String,
    #[serde(default)]
    depth: Value,
}

#[derive(Debug, Deserialize)]
struct MoveRequest {
    #[serde(default)]
    source: String,
    #[serde(default)]
    destination: String,
}

/// `EntryInfo` (filesystem.proto) as proto3 JSON.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct EntryInfo {
    name: String,
    #[serde(rename = "type")]
    kind: &'static str,
    path: String,
    size: String,
    mode: u32,
    permissions: String,
    owner: String,
    group: String,
    modified_time: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    symlink_target: Option<String>,
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    is_symlink: bool,
}

/// What a call needs besides its body: the guest's accounts and the acting user.
struct Caller {
    accounts: Accounts,
    user: User,
}

/// Serves one unary procedure for sandbox `id`; the answer is the response message.
pub async fn serve(
    manager: &Arc<Manager>,
    id: &str,
    unary: Unary,
    headers: &HeaderMap,
    body: &[u8],
) -> Result<Value, ConnectError> {
    let name = users::basic_auth_user(headers)?;
    let accounts = Accounts::load(manager, id, true).await?;
    let user = accounts.resolve(name.as_deref())?;
    let caller = Caller { accounts, user };
    let answer = match unary {
        Unary::Stat => {
            let req: PathRequest = decode("StatRequest", body)?;
            let path = caller.path(&req.path)?;
            serde_json::json!({ "entry": caller.entry(manager, id, &path).await? })
        }
        Unary::ListDir => {
            let req: ListDirRequest = decode("ListDirRequest", body)?;
            let depth = depth(&req.depth)?;
            let path = caller.path(&req.path)?;
            serde_json::json!({ "entries": caller.list(manager, id, &path, depth).await? })
        }
        Unary::MakeDir => {
            let req: PathRequest = decode("MakeDirRequest", body)?;
            let path = caller.path(&req.path)?;
            let created = manager
                .make_dir(id, &path, Some(caller.user.owner()))
                .await
                .map_err(|e| path_error(&path, &e))?;
            if !created {
                return Err(ConnectError::new(
                    Code::AlreadyExists,
                    format!("directory already exists: {path}"),
                ));
            }
            serde_json::json!({ "entry": caller.entry(manager, id, &path).await? })
        }
        Unary::Move => {
            let req: MoveRequest = decode("MoveRequest", body)?;
            let from = caller.path(&req.source)?;
            let to = caller.path(&req.destination)?;
            if let Some((parent, _)) = to.rsplit_once('/').filter(|(p, _)| !p.is_empty()) {
                manager
                    .make_dir(id, parent, Some(caller.user.owner()))
                    .await
                    .map_err(|e| path_error(parent, &e))?;
            }
            manager
                .rename_path(id, &from, &to)
                .await
                .map_err(|e| path_error(&from, &e))?;
            serde_json::json!({ "entry": caller.entry(manager, id, &to).await? })
        }
        Unary::Remove => {
            let req: PathRequest = decode("RemoveRequest", body)?;
            let path = caller.path(&req.path)?;
            if path == "/" {
                return Err(ConnectError::new(
                    Code::InvalidArgument,
                    "refusing to remove /",
                ));
            }
            manager
                .remove_path(id, &path, true)
                .await
                .map_err(|e| path_error(&path, &e))?;
            serde_json::json!({})
        }
    };
    Ok(answer)
}

impl Caller {
    fn path(&self, path: &str) -> Result<String, ConnectError> {
        let resolved = users::resolve_path(path, &self.user)
            .filter(|p| p.len() <= 4096)
            .ok_or_else(|| {
                ConnectError::new(
                    Code::InvalidArgument,
                    "path: empty, over 4096 bytes or with a NUL byte",
                )
            })?;
        Ok(resolved)
    }

    async fn entry(
        &self,
        manager: &Arc<Manager>,
        id: &str,
        path: &str,
    ) -> Result<EntryInfo, ConnectError> {
        let meta = manager
            .stat_path(id, path, false)
            .await
            .map_err(|e| path_error(path, &e))?;
        Ok(self.entry_info(path, &meta))
    }

    /// Entries under `dir` down to `depth` levels, breadth first.
    async fn list(
        &self,
        manager: &Arc<Manager>,
        id: &str,
        dir: &str,
        depth: u32,
    ) -> Result<Vec<EntryInfo>, ConnectError> {
        let top = manager
            .stat_path(id, dir, true)
            .await
            .map_err(|e| path_error(dir, &e))?;
        if top.kind != FileKind::Dir {
            return Err(ConnectError::new(
                Code::InvalidArgument,
                format!("path is not a directory: {dir}"),
            ));
        }
        let mut entries = Vec::new();
        let mut level = vec![dir.to_string()];
        for _ in 0..depth {
            let mut next = Vec::new();
            for d in level {
                let listing = manager
                    .dir_entries(id, &d)
                    .await
                    .map_err(|e| path_error(&d, &e))?;
                for e in listing {
                    if entries.len() == MAX_LIST_ENTRIES {
                        return Err(ConnectError::new(
                            Code::ResourceExhausted,
                            format!(
                                "more than {MAX_LIST_ENTRIES} entries: list a narrower \
                                 directory or a smaller depth"
                            ),
                        ));
                    }
                    let path = format!("{}/{}", d.trim_end_matches('/'), e.name);
                    if e.meta.kind == FileKind::Dir {
                        next.push(path.clone());
                    }
                    entries.push(self.entry_info(&path, &e.meta));
                }
            }
            if next.is_empty() {
                break;
            }
            level = next;
        }
        Ok(entries)
    }

    fn entry_info(&self, path: &str, m: &Metadata) -> EntryInfo {
        let name = path.rsplit('/').next().unwrap_or("").to_string();
        EntryInfo {
            name,
            kind: match m.kind {
                FileKind::Dir => "FILE_TYPE_DIRECTORY",
                FileKind::Symlink => "FILE_TYPE_SYMLINK",
                FileKind::File | FileKind::Other => "FILE_TYPE_FILE",
            },
            path: path.to_string(),
            size: m.size.to_string(),
            mode: m.mode & 0o777,
            permissions: permissions(m.kind, m.mode),
            owner: self.accounts.user_name(m.uid),
            group: self.accounts.group_name(m.gid),
            modified_time: timestamp(m.mtime, m.mtime_nanos),
            symlink_target: m.symlink_target.clone(),
            is_symlink: m.kind == FileKind::Symlink,
        }
    }
}

/// `depth` (uint32, a number or a decimal string); 0 or absent lists one level.
fn depth(v: &Value) -> Result<u32, ConnectError> {
    let n = match v {
        Value::Null => Some(0),
        Value::Number(n) => n.as_u64(),
        Value::String(s) if !s.is_empty() && s.len() <= 10 => s.parse().ok(),
        _ => None,
    };
    n.and_then(|n| u32::try_from(n).ok())
        .map(|n| n.max(1))
        .ok_or_else(|| {
            ConnectError::new(Code::InvalidArgument, format!("depth: {v} is not a uint32"))
        })
}

/// Go's `FileMode.String()` as envd sends it: type letter then `rwx` triplets.
fn permissions(kind: FileKind, mode: u32) -> String {
    let mut s = String::with_capacity(10);
    s.push(match kind {
        FileKind::Dir => 'd',
        FileKind::Symlink => 'L',
        _ => '-',
    });
    for shift in [6, 3, 0] {
        let bits = (mode >> shift) & 7;
        s.push(if bits & 4 != 0 { 'r' } else { '-' });
        s.push(if bits & 2 != 0 { 'w' } else { '-' });
        s.push(if bits & 1 != 0 { 'x' } else { '-' });
    }
    s
}

/// RFC 3339 with nanoseconds (a Timestamp in proto3 JSON); out of range → the epoch.
fn timestamp(secs: i64, nanos: u32) -> String {
    use time::format_description::well_known::Rfc3339;
    let at = i128::from(secs) * 1_000_000_000 + i128::from(nanos.min(999_999_999));
    time::OffsetDateTime::from_unix_timestamp_nanos(at)
        .ok()
        .and_then(|t| t.format(&Rfc3339).ok())
        .unwrap_or_else(|| "1970-01-01T00:00:00Z".into())
}

/// A daemon error about `path`, in envd's terms (a missing path is `not_found`).
fn path_error(path: &str, e: &Error) -> ConnectError {
    match e.status_code().1 {
        "guest_not_found" => ConnectError::new(
            Code::NotFound,
            format!("file not found: path '{path}' does not exist"),
        ),
        _ => ConnectError::from_zygote(e),
    }
}

fn decode<'a, T: Deserialize<'a>>(what: &str, body: &'a [u8]) -> Result<T, ConnectError> {
    serde_json::from_slice(body)
        .map_err(|e| ConnectError::new(Code::InvalidArgument, format!("{what}: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_are_written_as_envd_writes_them() {
        assert_eq!(permissions(FileKind::Dir, 0o755), "drwxr-xr-x");
        assert_eq!(permissions(FileKind::File, 0o4644), "-rw-r--r--");
        assert_eq!(permissions(FileKind::Symlink, 0o777), "Lrwxrwxrwx");
        assert_eq!(timestamp(0, 5), "1970-01-01T00:00:00.000000005Z");
        assert_eq!(timestamp(i64::MAX, 0), "1970-01-01T00:00:00Z");
        assert_eq!(depth(&Value::Null).unwrap(), 1);
        assert_eq!(depth(&serde_json::json!(0)).unwrap(), 1);
        assert_eq!(depth(&serde_json::json!("3")).unwrap(), 3);
        for bad in [
            serde_json::json!(-1),
            serde_json::json!(1u64 << 40),
            serde_json::json!("x"),
        ] {
            assert!(depth(&bad).is_err(), "{bad}");
        }
    }
}
