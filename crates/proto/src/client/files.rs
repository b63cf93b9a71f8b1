//! File requests of [`AgentClient`], including chunking for files larger
//! than one frame.

use std::sync::atomic::Ordering;

use super::{expect_ok, unexpected, AgentClient, ClientError};
use crate::{
    ApplyRequest, DirEntry, FileChunk, Metadata, PathRequest, ReadFileRequest, RemoveRequest,
    RenameRequest, Request, Response, StatRequest, TreeOp, WalkEntry, WalkRequest,
    WriteFileRequest, MAX_DATA_CHUNK,
};

impl AgentClient {
    /// One chunk of a file (at most [`MAX_DATA_CHUNK`] bytes).
    pub fn read_file_range(
        &self,
        path: &str,
        offset: u64,
        len: Option<u64>,
    ) -> Result<FileChunk, ClientError> {
        let req = Request::ReadFile(ReadFileRequest {
            path: path.into(),
            offset,
            len,
        });
        match self.call(req, "read_file")? {
            Response::FileData(chunk) => Ok(chunk),
            other => Err(unexpected("read_file", &other)),
        }
    }

    /// A whole file, fetched chunk by chunk. A file that changes meanwhile
    /// may be read inconsistently.
    pub fn read_file(&self, path: &str) -> Result<Vec<u8>, ClientError> {
        self.read_file_up_to(path, u64::MAX)?
            .ok_or_else(|| ClientError::Protocol("file larger than memory".into()))
    }

    /// A whole file of at most `limit` bytes, or `None` once more than `limit` bytes
    /// arrived. The bound is on bytes actually read, not on the size the guest reports
    /// (0 for /proc files, nothing for a device that never ends).
    pub fn read_file_up_to(&self, path: &str, limit: u64) -> Result<Option<Vec<u8>>, ClientError> {
        let mut data = Vec::new();
        loop {
            // One byte past the limit tells "exactly limit" from "more".
            let left = limit.saturating_add(1).saturating_sub(data.len() as u64);
            let want = (crate::MAX_DATA_CHUNK as u64).min(left);
            let chunk = self.read_file_range(path, data.len() as u64, Some(want))?;
            if chunk.offset != data.len() as u64 {
                return Err(ClientError::Malformed(format!(
                    "asked for offset {}, got {}",
                    data.len(),
                    chunk.offset
                )));
            }
            if chunk.data.is_empty() && !chunk.eof {
                return Err(ClientError::Malformed(
                    "empty chunk before end of file".into(),
                ));
            }
            data.extend_from_slice(&chunk.data);
            if data.len() as u64 > limit {
                return Ok(None);
            }
            if chunk.eof {
                return Ok(Some(data));
            }
        }
    }

    /// Atomically replace `path` with `data` (see [`Self::write_file_with`]).
    pub fn write_file(
        &self,
        path: &str,
        data: &[u8],
        mode: Option<u32>,
    ) -> Result<(), ClientError> {
        self.write_file_with(WriteFileRequest {
            path: path.into(),
            data: data.to_vec(),
            mode,
            append: false,
            create_parents: false,
            owner: None,
        })
    }

    /// Write a file with every option. Data larger than one frame can carry
    /// is sent in chunks; for a non-append write the chunks are appended to a
    /// hidden temp file next to `path`, which is then renamed over it, so the
    /// replacement stays atomic.
    pub fn write_file_with(&self, req: WriteFileRequest) -> Result<(), ClientError> {
        if req.data.len() <= MAX_DATA_CHUNK {
            return self.write_one(req);
        }
        let target = req.path.clone();
        let staging = if req.append {
            target.clone()
        } else {
            staging_path(&target, self.conn.next_id.load(Ordering::Relaxed))
        };
        let upload = || -> Result<(), ClientError> {
            for (i, piece) in req.data.chunks(MAX_DATA_CHUNK).enumerate() {
                self.write_one(WriteFileRequest {
                    path: staging.clone(),
                    data: piece.to_vec(),
                    mode: req.mode,
                    append: true,
                    create_parents: req.create_parents && i == 0,
                    owner: req.owner,
                })?;
            }
            Ok(())
        };
        if req.append {
            return upload();
        }
        // A leftover from an interrupted upload with the same name must not be appended to.
        let _ = self.remove(&staging, false);
        let result = upload().and_then(|()| self.rename(&staging, &target));
        if result.is_err() {
            let _ = self.remove(&staging, false);
        }
        result
    }

    fn write_one(&self, req: WriteFileRequest) -> Result<(), ClientError> {
        match self.call(Request::WriteFile(req), "write_file")? {
            Response::Written { .. } => Ok(()),
            other => Err(unexpected("write_file", &other)),
        }
    }

    /// Every entry under `path` (not following symlinks, not crossing into other
    /// filesystems), with regular files' sha256 when `hash`.
    pub fn walk(&self, path: &str, hash: bool) -> Result<Vec<WalkEntry>, ClientError> {
        let req = Request::Walk(WalkRequest {
            path: path.into(),
            hash,
        });
        match self.call(req, "walk")? {
            Response::Walked { entries } => Ok(entries),
            other => Err(unexpected("walk", &other)),
        }
    }

    /// Makes `ops` in order in the guest (see [`ApplyRequest`]); returns how many.
    pub fn apply(&self, ops: Vec<TreeOp>) -> Result<u32, ClientError> {
        match self.call(Request::Apply(ApplyRequest { ops }), "apply")? {
            Response::Applied { done } => Ok(done),
            other => Err(unexpected("apply", &other)),
        }
    }

    pub fn list_dir(&self, path: &str) -> Result<Vec<DirEntry>, ClientError> {
        let req = Request::ListDir(PathRequest { path: path.into() });
        match self.call(req, "list_dir")? {
            Response::DirListing { entries } => Ok(entries),
            other => Err(unexpected("list_dir", &other)),
        }
    }

    /// Metadata of `path`, following symlinks.
    pub fn stat(&self, path: &str) -> Result<Metadata, ClientError> {
        self.stat_with(path, true)
    }

    pub fn stat_with(&self, path: &str, follow_symlinks: bool) -> Result<Metadata, ClientError> {
        let req = Request::Stat(StatRequest {
            path: path.into(),
            follow_symlinks,
        });
        match self.call(req, "stat")? {
            Response::Stat(m) => Ok(m),
            other => Err(unexpected("stat", &other)),
        }
    }

    pub fn rename(&self, from: &str, to: &str) -> Result<(), ClientError> {
        let req = Request::Rename(RenameRequest {
            from: from.into(),
            to: to.into(),
        });
        expect_ok("rename", self.call(req, "rename")?)
    }

    pub fn remove(&self, path: &str, recursive: bool) -> Result<(), ClientError> {
        let req = Request::Remove(RemoveRequest {
            path: path.into(),
            recursive,
        });
        expect_ok("remove", self.call(req, "remove")?)
    }
}

fn staging_path(target: &str, nonce: u64) -> String {
    let (dir, name) = match target.rfind('/') {
        Some(i) => (&target[..=i], &target[i + 1..]),
        None => ("", target),
    };
    format!("{dir}.{name}.zygote-upload-{}-{nonce}", std::process::id())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn staging_path_is_a_hidden_sibling() {
        let p = staging_path("/a/b/file.bin", 7);
        assert!(p.starts_with("/a/b/.file.bin.zygote-upload-"), "{p}");
        assert!(p.ends_with("-7"));
    }
}
