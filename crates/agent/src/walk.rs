//! `walk`: every entry under a directory, for comparing two sandboxes' trees.
//!
//! Symlinks are reported, never followed; other filesystems mounted below the
//! directory (`/proc` under `/`) are not entered; more than [`MAX_WALK_ENTRIES`]
//! entries is refused rather than cut short, so a comparison never silently misses
//! files.
use std::fs::{self, File};
use std::io::Read;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};
use zygote_proto::{
    ErrorBody, ErrorCode, FileKind, Response, WalkEntry, WalkRequest, MAX_WALK_ENTRIES,
};

use crate::files::{abs_path, io_err, metadata_of};

pub(crate) fn walk(req: &WalkRequest) -> Result<Response, ErrorBody> {
    let root = abs_path(&req.path)?;
    let top = fs::metadata(root).map_err(io_err(root))?;
    if !top.is_dir() {
        return Err(ErrorBody::new(
            ErrorCode::BadRequest,
            format!("{} is not a directory", root.display()),
        ));
    }
    let mut entries = Vec::new();
    // One read buffer for every file: allocating (and zeroing) one per file costs more
    // than hashing small files.
    let mut buf = vec![0u8; 64 * 1024];
    let mut pending: Vec<PathBuf> = vec![PathBuf::new()];
    while let Some(rel) = pending.pop() {
        let dir = root.join(&rel);
        // A directory that vanished or cannot be read is reported as an error: a
        // comparison must not treat its files as removed.
        for entry in fs::read_dir(&dir).map_err(io_err(&dir))? {
            let entry = entry.map_err(io_err(&dir))?;
            let rel_child = rel.join(entry.file_name());
            let full = root.join(&rel_child);
            let Ok(m) = fs::symlink_metadata(&full) else {
                continue; // Deleted while we walk.
            };
            if entries.len() >= MAX_WALK_ENTRIES {
                return Err(ErrorBody::new(
                    ErrorCode::BadRequest,
                    format!(
                        "more than {MAX_WALK_ENTRIES} entries under {}: walk a narrower path",
                        root.display()
                    ),
                ));
            }
            let meta = metadata_of(&full, &m);
            if meta.kind == FileKind::Dir && m.dev() == top.dev() {
                pending.push(rel_child.clone());
            }
            let sha256 = (req.hash && meta.kind == FileKind::File)
                .then(|| hash_file(&full, &mut buf))
                .transpose()?;
            entries.push(WalkEntry {
                path: rel_child.to_string_lossy().into_owned(),
                meta,
                sha256,
            });
        }
    }
    entries.sort_by(|a, b| a.path.cmp(&b.path));
    Ok(Response::Walked { entries })
}

fn hash_file(path: &Path, buf: &mut [u8]) -> Result<String, ErrorBody> {
    let mut f = File::open(path).map_err(io_err(path))?;
    let mut h = Sha256::new();
    loop {
        let n = f.read(buf).map_err(io_err(path))?;
        if n == 0 {
            break;
        }
        h.update(&buf[..n]);
    }
    Ok(hex(&h.finalize()))
}

fn hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut s = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        s.push(DIGITS[usize::from(b >> 4)] as char);
        s.push(DIGITS[usize::from(b & 15)] as char);
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn walks_sorted_without_following_symlinks_and_hashes_files() {
        let t = tempfile::tempdir().unwrap();
        fs::create_dir_all(t.path().join("d/e")).unwrap();
        fs::write(t.path().join("d/e/f"), b"abc").unwrap();
        std::os::unix::fs::symlink("/", t.path().join("d/up")).unwrap();
        let req = WalkRequest {
            path: t.path().display().to_string(),
            hash: true,
        };
        let Response::Walked { entries } = walk(&req).unwrap() else {
            panic!("not a walk answer")
        };
        let paths: Vec<&str> = entries.iter().map(|e| e.path.as_str()).collect();
        assert_eq!(paths, ["d", "d/e", "d/e/f", "d/up"]);
        assert_eq!(
            entries[2].sha256.as_deref(),
            Some("ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad")
        );
        assert_eq!(entries[3].meta.kind, FileKind::Symlink);
        assert_eq!(entries[3].meta.symlink_target.as_deref(), Some("/"));
        let file = WalkRequest {
            path: t.path().join("d/e/f").display().to_string(),
            hash: false,
        };
        assert_eq!(walk(&file).unwrap_err().code, ErrorCode::BadRequest);
    }
}
