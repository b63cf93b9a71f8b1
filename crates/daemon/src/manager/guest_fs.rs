//! Single-path file operations inside a sandbox through its agent: stat, rename,
//! remove, make a directory (with its parents, owned by a user) and read a small file
//! whole. They serve E2B's filesystem service (crates/daemon/src/e2b/envd) and are
//! the native layer a REST route can take later.
//!
//! Paths are guest paths, checked like every other ([`validate_guest_path`]); what the
//! agent answers (metadata, contents) is the guest's and trusted for nothing.
use std::sync::Arc;

use zygote_proto::{DirEntry, Metadata, Owner, TreeOp};

use super::Manager;
use crate::error::{Error, Result};
use crate::model::validate_guest_path;

/// Permission bits of directories `make_dir` creates (envd's 0o755).
const NEW_DIR_MODE: u32 = 0o755;

impl Manager {
    /// Metadata of `path`; of a symlink itself unless `follow`.
    pub async fn stat_path(
        self: &Arc<Self>,
        id: &str,
        path: &str,
        follow: bool,
    ) -> Result<Metadata> {
        validate_guest_path(path)?;
        let p = path.to_string();
        self.agent_call(id, move |c| c.stat_with(&p, follow)).await
    }

    /// The entries of directory `path` with their full metadata (symlinks not followed).
    pub async fn dir_entries(self: &Arc<Self>, id: &str, path: &str) -> Result<Vec<DirEntry>> {
        validate_guest_path(path)?;
        let p = path.to_string();
        self.agent_call(id, move |c| c.list_dir(&p)).await
    }

    pub async fn rename_path(self: &Arc<Self>, id: &str, from: &str, to: &str) -> Result<()> {
        validate_guest_path(from)?;
        validate_guest_path(to)?;
        let (f, t) = (from.to_string(), to.to_string());
        self.agent_call(id, move |c| c.rename(&f, &t)).await
    }

    pub async fn remove_path(
        self: &Arc<Self>,
        id: &str,
        path: &str,
        recursive: bool,
    ) -> Result<()> {
        validate_guest_path(path)?;
        let p = path.to_string();
        self.agent_call(id, move |c| c.remove(&p, recursive)).await
    }

    /// Applies tree operations in the guest, in order (each path checked first).
    pub async fn apply_tree_ops(self: &Arc<Self>, id: &str, ops: Vec<TreeOp>) -> Result<()> {
        for op in &ops {
            match op {
                TreeOp::Mkdir { path, .. }
                | TreeOp::Symlink { path, .. }
                | TreeOp::Remove { path, .. }
                | TreeOp::Chmod { path, .. }
                | TreeOp::Chown { path, .. } => validate_guest_path(path)?,
                TreeOp::Install { from, to, .. } => {
                    validate_guest_path(from)?;
                    validate_guest_path(to)?;
                }
            }
        }
        self.agent_call(id, move |c| c.apply(ops.clone())).await?;
        Ok(())
    }

    /// Creates directory `path` and its missing parents, each given to `owner`. `Ok(false)`
    /// when `path` already is a directory; an error when it is anything else.
    pub async fn make_dir(
        self: &Arc<Self>,
        id: &str,
        path: &str,
        owner: Option<Owner>,
    ) -> Result<bool> {
        validate_guest_path(path)?;
        // The missing ancestors, deepest first (a path has at most 2048 components).
        let mut missing = Vec::new();
        let mut at = Some(path);
        while let Some(p) = at.filter(|p| *p != "/" && !p.is_empty()) {
            match self.stat_path(id, p, true).await {
                Ok(m) if m.kind == zygote_proto::FileKind::Dir => break,
                Ok(_) => {
                    return Err(Error::invalid(format!(
                        "path '{p}' already exists and is not a directory"
                    )))
                }
                Err(e) if e.status_code().1 == "guest_not_found" => missing.push(p.to_string()),
                Err(e) => return Err(e),
            }
            at = p.rsplit_once('/').map(|(parent, _)| parent);
        }
        if missing.is_empty() {
            return Ok(false);
        }
        let mut ops = Vec::with_capacity(missing.len() * 2);
        for dir in missing.into_iter().rev() {
            ops.push(TreeOp::Mkdir {
                path: dir.clone(),
                mode: NEW_DIR_MODE,
            });
            if let Some(o) = owner {
                ops.push(TreeOp::Chown {
                    path: dir,
                    uid: o.uid,
                    gid: o.gid,
                });
            }
        }
        self.agent_call(id, move |c| c.apply(ops.clone())).await?;
        Ok(true)
    }

    /// A regular file read whole, `None` when it does not exist; one over `limit` bytes
    /// (or not a regular file) is an error, so a guest cannot make the daemon buffer more.
    pub async fn read_small_file(
        self: &Arc<Self>,
        id: &str,
        path: &str,
        limit: u64,
    ) -> Result<Option<Vec<u8>>> {
        validate_guest_path(path)?;
        let meta = match self.stat_path(id, path, true).await {
            Ok(m) => m,
            Err(e) if e.status_code().1 == "guest_not_found" => return Ok(None),
            Err(e) => return Err(e),
        };
        if meta.kind != zygote_proto::FileKind::File {
            return Err(Error::invalid(format!("{path} is not a regular file")));
        }
        let p = path.to_string();
        match self
            .agent_call(id, move |c| c.read_file_up_to(&p, limit))
            .await?
        {
            Some(data) => Ok(Some(data)),
            None => Err(Error::invalid(format!(
                "{path} is larger than {limit} bytes"
            ))),
        }
    }
}
