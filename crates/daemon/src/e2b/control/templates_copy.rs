//! A COPY step (`[src, dest, user?, mode?]`): the uploaded archive's entries written
//! into the build sandbox through the agent, as Docker's COPY places them: a directory
//! source's contents go into `dest`, a file goes to `dest` (or into it when `dest` ends
//! with `/`), a glob's matches go into `dest` by their path below the glob's directory.
//! Every entry is checked (`templates_tar`), symlinks may not leave the tree they are
//! copied into, and the archive must match the step's `filesHash`.
use std::sync::Arc;

use bytes::Bytes;
use tokio::sync::mpsc;
use zygote_proto::{Owner, TreeOp};

use super::templates_tar::{read_entries, ArchiveError, Entry, EntryKind};
use super::templates_upload::{forget_upload, upload_path};
use crate::manager::Manager;

/// Bytes per chunk of a file on its way to the agent.
const CHUNK: usize = 1 << 20;

/// How the archive's names map to guest paths.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Placement {
    /// The source as an archive name (`""`: the whole context).
    src: String,
    glob_base: Option<String>,
    dest: String,
    dest_is_dir: bool,
}

impl Placement {
    /// `dest` is absolute already (relative ones are resolved by the caller).
    pub fn new(src: &str, dest: &str) -> Result<Placement, ArchiveError> {
        let is_glob = src.contains(['*', '?', '[']);
        let norm = super::templates_tar::normalize(src)?.unwrap_or_default();
        let glob_base = is_glob.then(|| norm.rsplit_once('/').map_or("", |(d, _)| d).to_string());
        Ok(Placement {
            src: norm,
            glob_base,
            dest: dest.trim_end_matches('/').to_string(),
            dest_is_dir: dest.ends_with('/'),
        })
    }

    fn under(base: &str, path: &str) -> Option<String> {
        if base.is_empty() {
            return Some(path.to_string());
        }
        if path == base {
            return Some(String::new());
        }
        path.strip_prefix(&format!("{base}/")).map(str::to_string)
    }

    fn join(&self, rel: &str) -> String {
        match (self.dest.as_str(), rel) {
            ("", "") => "/".into(),
            (d, "") => d.to_string(),
            (d, r) => format!("{d}/{r}"),
        }
    }

    /// The guest path of archive entry `e`.
    pub fn target(&self, path: &str, is_dir: bool) -> Result<String, ArchiveError> {
        let outside = || ArchiveError::OutsideSource(path.chars().take(200).collect());
        if let Some(base) = &self.glob_base {
            let rel = Self::under(base, path).ok_or_else(outside)?;
            return Ok(self.join(&rel));
        }
        if path == self.src && !is_dir && !self.src.is_empty() {
            let name = path.rsplit('/').next().unwrap_or(path);
            return Ok(if self.dest_is_dir {
                self.join(name)
            } else {
                self.join("")
            });
        }
        let rel = Self::under(&self.src, path).ok_or_else(outside)?;
        Ok(self.join(&rel))
    }

    /// The archive subtree a symlink at `path` must point into.
    pub fn link_root(&self, path: &str) -> String {
        match &self.glob_base {
            Some(base) => base.clone(),
            None if path == self.src => path.rsplit_once('/').map_or("", |(d, _)| d).into(),
            None => self.src.clone(),
        }
    }
}

/// What the copy did, for the build log.
pub(super) struct Copied {
    pub files: usize,
    pub dirs: usize,
    pub links: usize,
}

/// Copies the archive of `files_hash` into sandbox `id` as `placement` says, owned by
/// `owner`, files and directories given `mode` when set; fails (and forgets the
/// upload) when the archive does not match `files_hash` for `COPY <src> <dest>`.
#[allow(clippy::too_many_arguments)]
pub(super) async fn copy(
    m: &Arc<Manager>,
    id: &str,
    files_hash: &str,
    src_arg: &str,
    dest_arg: &str,
    placement: Placement,
    owner: Owner,
    mode: Option<u32>,
) -> Result<Copied, String> {
    let path = upload_path(m, files_hash);
    let bytes = tokio::fs::read(&path)
        .await
        .map_err(|_| format!("the files of {src_arg} were not uploaded"))?;
    let (tx, mut rx) = mpsc::channel::<Entry>(2);
    let (src, dest) = (src_arg.to_string(), dest_arg.to_string());
    let place = placement.clone();
    let reader = tokio::task::spawn_blocking(move || {
        read_entries(&bytes, &src, &dest, &|p| place.link_root(p), &mut |e| {
            // The writer stopped (it failed): so does the reader.
            tx.blocking_send(e)
                .map_err(|_| ArchiveError::Malformed("the copy stopped".into()))
        })
    });
    let mut done = Copied {
        files: 0,
        dirs: 0,
        links: 0,
    };
    if !placement.dest.is_empty() {
        let root = match (placement.glob_base.is_some(), placement.dest_is_dir) {
            (false, false) => placement.dest.rsplit_once('/').map_or("", |(d, _)| d),
            _ => placement.dest.as_str(),
        };
        if !root.is_empty() {
            m.make_dir(id, root, Some(owner))
                .await
                .map_err(|e| format!("creating {root}: {e}"))?;
        }
    }
    let mut failed = None;
    while let Some(e) = rx.recv().await {
        if let Err(why) = write_entry(m, id, &placement, e, owner, mode, &mut done).await {
            failed = Some(why);
            break;
        }
    }
    drop(rx);
    let read = reader
        .await
        .map_err(|e| format!("the copy task failed: {e}"))?;
    if let Some(why) = failed {
        return Err(why);
    }
    let hash = read.map_err(|e| e.to_string())?;
    if hash != files_hash {
        forget_upload(m, files_hash);
        return Err(ArchiveError::HashMismatch.to_string());
    }
    Ok(done)
}

async fn write_entry(
    m: &Arc<Manager>,
    id: &str,
    placement: &Placement,
    e: Entry,
    owner: Owner,
    mode: Option<u32>,
    done: &mut Copied,
) -> Result<(), String> {
    let target = placement
        .target(&e.path, e.kind == EntryKind::Dir)
        .map_err(|e| e.to_string())?;
    let chown = TreeOp::Chown {
        path: target.clone(),
        uid: owner.uid,
        gid: owner.gid,
    };
    let mode = mode.unwrap_or(e.mode);
    let fail = |what: &str, err: crate::error::Error| format!("{what} {target}: {err}");
    match e.kind {
        EntryKind::Dir => {
            let ops = vec![
                TreeOp::Mkdir {
                    path: target.clone(),
                    mode,
                },
                TreeOp::Chmod {
                    path: target.clone(),
                    mode,
                },
                chown,
            ];
            m.apply_tree_ops(id, ops)
                .await
                .map_err(|e| fail("creating", e))?;
            done.dirs += 1;
        }
        EntryKind::File(data) => {
            let chunks: Vec<Bytes> = data.chunks(CHUNK).map(Bytes::copy_from_slice).collect();
            let (tx, rx) = mpsc::channel(chunks.len().max(1));
            for c in chunks {
                let _ = tx.try_send(Ok(c));
            }
            drop(tx);
            m.write_file_stream(id, &target, Some(owner), rx, false)
                .await
                .map_err(|e| fail("writing", e))?;
            let ops = vec![TreeOp::Chmod {
                path: target.clone(),
                mode,
            }];
            m.apply_tree_ops(id, ops)
                .await
                .map_err(|e| fail("setting the mode of", e))?;
            done.files += 1;
        }
        EntryKind::Symlink(to) => {
            let ops = vec![
                TreeOp::Symlink {
                    path: target.clone(),
                    target: to,
                },
                chown,
            ];
            m.apply_tree_ops(id, ops)
                .await
                .map_err(|e| fail("linking", e))?;
            done.links += 1;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_land_where_dockers_copy_puts_them() {
        let p = Placement::new("data", "/home/user/data").unwrap();
        assert_eq!(p.target("data", true).unwrap(), "/home/user/data");
        assert_eq!(p.target("data/a/b", false).unwrap(), "/home/user/data/a/b");
        assert!(p.target("other/x", false).is_err());
        let f = Placement::new("f.txt", "/app/").unwrap();
        assert_eq!(f.target("f.txt", false).unwrap(), "/app/f.txt");
        let f = Placement::new("./f.txt", "/app/g.txt").unwrap();
        assert_eq!(f.target("f.txt", false).unwrap(), "/app/g.txt");
        let g = Placement::new("src/*.py", "/app/").unwrap();
        assert_eq!(g.target("src/a.py", false).unwrap(), "/app/a.py");
        let all = Placement::new(".", "/app").unwrap();
        assert_eq!(all.target("x/y", false).unwrap(), "/app/x/y");
        assert_eq!(p.link_root("data/l"), "data");
    }
}
