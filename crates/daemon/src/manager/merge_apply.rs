//! The copying half of `merge`: theirs' files are streamed into hidden staging
//! directories inside the merged directories here (a few at a time, each checked against
//! the hash the walk reported), then one `apply` request moves everything into place and
//! removes the staging. Until that request this sandbox is unchanged; once sent, the guest
//! agent completes it even if the daemon dies.
use sha2::{Digest, Sha256};
use zygote_proto::client::{AgentClient, ClientError};
use zygote_proto::{TreeOp, WriteFileRequest};

use super::merge::join;
use super::merge_plan::{Plan, Step};

/// Bytes read from `from` per request while copying a file.
const COPY_CHUNK: u64 = 4 << 20;
/// Staging directories are named this, plus a nonce.
pub(super) const STAGING_PREFIX: &str = ".zygote-merge-";

pub(super) fn staging_dir(dir: &str, nonce: &str) -> String {
    format!("{dir}/{STAGING_PREFIX}{nonce}")
}

/// Where [`apply_plans`] stages: per merged directory, whether it exists here.
pub(super) struct Staged<'a> {
    pub from: &'a str,
    pub dirs: &'a [String],
    pub roots: &'a [bool],
    pub nonce: &'a str,
}

/// Stages every file, then sends one `apply`. Returns the bytes copied.
pub(super) fn apply_plans(
    ours: &AgentClient,
    theirs: &AgentClient,
    s: Staged<'_>,
    plans: &[Plan],
) -> std::result::Result<u64, ClientError> {
    let Staged {
        from,
        dirs,
        roots,
        nonce,
    } = s;
    let mut ops = Vec::new();
    let mut staging_dirs = Vec::new();
    let mut copies: Vec<Copy> = Vec::new();
    let staged = (|| {
        for ((dir, plan), root_exists) in dirs.iter().zip(plans).zip(roots) {
            if plan.steps.is_empty() {
                continue;
            }
            if !root_exists {
                // Made first, on its own: the staging directory lives in it.
                ours.apply(vec![TreeOp::Mkdir {
                    path: dir.clone(),
                    mode: 0o755,
                }])?;
            }
            let staging = staging_dir(dir, nonce);
            staging_dirs.push(staging.clone());
            ours.apply(vec![TreeOp::Mkdir {
                path: staging.clone(),
                mode: 0o700,
            }])?;
            for (n, step) in plan.steps.iter().enumerate() {
                let abs = |rel: &str| join(dir, rel);
                ops.push(match step {
                    Step::Remove { rel, recursive } => TreeOp::Remove {
                        path: abs(rel),
                        recursive: *recursive,
                    },
                    Step::Mkdir { rel, mode } => TreeOp::Mkdir {
                        path: abs(rel),
                        mode: *mode,
                    },
                    Step::Symlink { rel, target } => TreeOp::Symlink {
                        path: abs(rel),
                        target: target.clone(),
                    },
                    Step::Chmod { rel, mode } => TreeOp::Chmod {
                        path: abs(rel),
                        mode: *mode,
                    },
                    Step::Write {
                        rel,
                        mode,
                        size,
                        sha256,
                    } => {
                        let to = format!("{staging}/{n}");
                        copies.push(Copy {
                            src: abs(rel),
                            dst: to.clone(),
                            size: *size,
                            sha256: sha256.clone(),
                        });
                        TreeOp::Install {
                            from: to,
                            to: abs(rel),
                            mode: *mode,
                        }
                    }
                });
            }
        }
        copy_all(theirs, from, ours, &copies)
    })();
    let cleanup: Vec<TreeOp> = staging_dirs
        .iter()
        .map(|s| TreeOp::Remove {
            path: s.clone(),
            recursive: true,
        })
        .collect();
    if let Err(e) = staged {
        let _ = ours.apply(cleanup);
        return Err(e);
    }
    ops.extend(cleanup);
    crate::fault::point("merge.staged");
    ours.apply(ops)?;
    Ok(copies.iter().map(|c| c.size).sum())
}

/// One file to stage: `src` in the sandbox merged from, `dst` in the one merged into.
struct Copy {
    src: String,
    dst: String,
    size: u64,
    sha256: String,
}

/// Copies in flight at once: each is a chain of agent round trips, so a few overlap
/// the guests' latency; more only queue on the guests' few vCPUs.
const COPY_WORKERS: usize = 4;

/// Runs every copy, [`COPY_WORKERS`] at a time; the first error stops the rest.
fn copy_all(
    theirs: &AgentClient,
    from: &str,
    ours: &AgentClient,
    copies: &[Copy],
) -> std::result::Result<(), ClientError> {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Mutex;
    let next = AtomicUsize::new(0);
    let failed: Mutex<Option<ClientError>> = Mutex::new(None);
    std::thread::scope(|scope| {
        for _ in 0..COPY_WORKERS.min(copies.len()) {
            scope.spawn(|| {
                while let Some(c) = copies.get(next.fetch_add(1, Ordering::Relaxed)) {
                    if failed.lock().map_or(true, |f| f.is_some()) {
                        return;
                    }
                    let r = copy_file(theirs, from, &c.src, ours, &c.dst, c.size, &c.sha256);
                    if let Err(e) = r {
                        if let Ok(mut f) = failed.lock() {
                            f.get_or_insert(e);
                        }
                        return;
                    }
                }
            });
        }
    });
    match failed.into_inner() {
        Ok(Some(e)) => Err(e),
        _ => Ok(()),
    }
}

/// Streams `src` in `theirs` into the new file `dst` in `ours`, checking that it is
/// still what the walk hashed.
fn copy_file(
    theirs: &AgentClient,
    from: &str,
    src: &str,
    ours: &AgentClient,
    dst: &str,
    size: u64,
    sha256: &str,
) -> std::result::Result<u64, ClientError> {
    let mut hasher = Sha256::new();
    let mut offset = 0u64;
    loop {
        let chunk = theirs.read_file_range(src, offset, Some(COPY_CHUNK))?;
        hasher.update(&chunk.data);
        offset += chunk.data.len() as u64;
        if offset > size {
            break;
        }
        ours.write_file_with(WriteFileRequest {
            path: dst.to_string(),
            data: chunk.data,
            mode: Some(0o600),
            append: true,
            create_parents: false,
            owner: None,
        })?;
        if chunk.eof {
            break;
        }
    }
    let digest = hex::encode(hasher.finalize());
    if offset != size || digest != sha256 {
        return Err(ClientError::Protocol(format!(
            "{src} changed in {from} during the merge (walked {size} bytes, read {offset}); \
             nothing was merged: try again"
        )));
    }
    Ok(size)
}
