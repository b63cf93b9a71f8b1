//! Entry points for fuzzing the layer applier (fuzz/, and the seeded
//! randomized test in `tests.rs`): random layers ([`generate`]) are applied to a staging
//! root that has a sentinel directory next to it, as the store's scratch directory
//! holds other builds' and pulls' work next to each staging tree. What must hold
//! whatever the layers say ([`FuzzReport::check`]):
//! - nothing outside the root is created, removed or modified (the root's parent,
//!   sentinel included, is listed with types, sizes, modes, times and contents before
//!   and after; the root itself must still be the same directory);
//! - what the root holds stays within the limits ([`LIMITS`]): bytes allocated by its
//!   files within the disk budget, their logical sizes within the apparent limit;
//! - no panic (the applier may refuse a layer: most random ones are refused).
//!
//! Not part of the crate's API.
#![doc(hidden)]

pub mod generate;
pub mod tar_stream;

use std::collections::HashSet;
use std::io::Read;
use std::os::unix::fs::MetadataExt;
use std::path::Path;

use sha2::{Digest, Sha256};

use crate::apply::{Applier, Limits, Ownership};
use generate::{Entropy, FuzzBytes, Seeded};

/// Small limits, so that every bound is reached often and each run is quick.
pub const LIMITS: Limits = Limits {
    max_stream_bytes: 8 << 20,
    max_expansion_ratio: 1000,
    expansion_floor_bytes: 1 << 20,
    max_apparent_bytes: 32 << 20,
    max_disk_bytes: Some(1 << 20),
    reserve_bytes: 0,
    max_entries: 256,
};

/// What one run did, for [`FuzzReport::check`].
#[derive(Debug)]
pub struct FuzzReport {
    pub layers: usize,
    /// The applier's verdict: refusals are expected.
    pub outcome: Result<(), String>,
    /// The root's parent (root excluded), one line per entry, before and after.
    pub outside_before: Vec<String>,
    pub outside_after: Vec<String>,
    /// Bytes allocated by the root's files (each inode once), their logical sizes,
    /// and how many there are.
    pub allocated_bytes: u64,
    pub apparent_bytes: u64,
    pub files: u64,
}

impl FuzzReport {
    /// The first property broken, if any.
    pub fn check(&self) -> Result<(), String> {
        if self.outside_before != self.outside_after {
            let gone: Vec<_> = self
                .outside_before
                .iter()
                .filter(|l| !self.outside_after.contains(l))
                .collect();
            let new: Vec<_> = self
                .outside_after
                .iter()
                .filter(|l| !self.outside_before.contains(l))
                .collect();
            return Err(format!(
                "outside the staging root: gone or changed {gone:?}, new or changed {new:?} \
                 (applier: {:?})",
                self.outcome
            ));
        }
        // Written runs are charged in whole blocks; a file's extent tree may take
        // blocks of its own.
        let disk = LIMITS.max_disk_bytes.unwrap_or(0) + 8192 * self.files;
        if self.allocated_bytes > disk {
            return Err(format!(
                "{} bytes allocated under the root, over the disk budget ({disk} with slack)",
                self.allocated_bytes
            ));
        }
        if self.apparent_bytes > LIMITS.max_apparent_bytes {
            return Err(format!(
                "files of {} logical bytes under the root, over the apparent-size limit",
                self.apparent_bytes
            ));
        }
        Ok(())
    }
}

/// For cargo-fuzz: a leading 0xff means "the rest is one raw layer", anything else
/// drives the generator.
pub fn fuzz_apply(data: &[u8]) -> FuzzReport {
    let ownership = if data.get(1).is_some_and(|b| b & 1 == 1) {
        Ownership::Record
    } else {
        Ownership::for_this_process()
    };
    run(ownership, |outside| match data.split_first() {
        Some((0xff, raw)) => vec![raw.to_vec()],
        _ => generate::layers(&mut FuzzBytes::new(data), outside),
    })
}

/// For the randomized test: layers generated from `seed`.
pub fn fuzz_seed(seed: u64) -> FuzzReport {
    let mut e = Seeded::new(seed);
    let ownership = if e.below(2) == 0 {
        Ownership::Record
    } else {
        Ownership::for_this_process()
    };
    run(ownership, |outside| generate::layers(&mut e, outside))
}

/// Applies what `layers` makes (given the sentinel's absolute path) in a fresh
/// scratch directory, and reports.
pub fn run(ownership: Ownership, layers: impl FnOnce(&str) -> Vec<Vec<u8>>) -> FuzzReport {
    // On a tmpfs when there is one: creating and removing thousands of small trees is
    // some 20 times faster there than on a virtual disk, and a tmpfs keeps holes and
    // counts blocks as a disk filesystem does.
    let mut builder = tempfile::Builder::new();
    builder.prefix("zygote-fuzz-");
    let dir = builder
        .tempdir_in("/dev/shm")
        .or_else(|_| builder.tempdir())
        .expect("a temporary directory");
    let root = dir.path().join("root");
    let sentinel = dir.path().join("sentinel");
    std::fs::create_dir(&root).expect("mkdir root");
    std::fs::create_dir_all(sentinel.join("sub")).expect("mkdir sentinel");
    std::fs::write(sentinel.join("keep"), b"another build's file").expect("write");
    std::fs::write(sentinel.join("sub/keep2"), b"and another").expect("write");
    std::os::unix::fs::symlink("keep", sentinel.join("link")).expect("symlink");
    std::fs::write(dir.path().join("next-to-root"), b"x").expect("write");
    let layers = layers(&sentinel.to_string_lossy());
    let outside_before = listing(dir.path(), &root);
    let outcome = apply(&root, ownership, &layers).map_err(|e| e.to_string());
    let outside_after = listing(dir.path(), &root);
    let (allocated_bytes, apparent_bytes, files) = usage(&root);
    make_removable(&root);
    FuzzReport {
        layers: layers.len(),
        outcome,
        outside_before,
        outside_after,
        allocated_bytes,
        apparent_bytes,
        files,
    }
}

fn apply(root: &Path, ownership: Ownership, layers: &[Vec<u8>]) -> crate::Result<()> {
    let mut applier = Applier::new(root, ownership, LIMITS)?;
    for (i, layer) in layers.iter().enumerate() {
        applier.apply(i, "sha256:fuzz", &layer[..])?;
    }
    applier.finish().map(|_| ())
}

/// Every entry under `dir` except what is inside `root` (root itself: its inode), one
/// line each, sorted.
fn listing(dir: &Path, root: &Path) -> Vec<String> {
    let mut lines = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&d) else {
            lines.push(format!("{}: unreadable", d.display()));
            continue;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            let Ok(m) = std::fs::symlink_metadata(&path) else {
                continue;
            };
            let rel = path
                .strip_prefix(dir)
                .unwrap_or(&path)
                .display()
                .to_string();
            if path == root {
                lines.push(format!("{rel} dir={} ino={}", m.is_dir(), m.ino()));
                continue;
            }
            let what = if m.is_symlink() {
                format!("-> {:?}", std::fs::read_link(&path).ok())
            } else if m.is_file() {
                format!("sha256 {}", file_hash(&path))
            } else {
                String::new()
            };
            lines.push(format!(
                "{rel} mode={:o} size={} mtime={}.{} ino={} {what}",
                m.mode(),
                m.len(),
                m.mtime(),
                m.mtime_nsec(),
                m.ino()
            ));
            if m.is_dir() {
                stack.push(path);
            }
        }
    }
    lines.sort();
    lines
}

fn file_hash(path: &Path) -> String {
    let mut h = Sha256::new();
    let mut buf = Vec::new();
    if let Ok(mut f) = std::fs::File::open(path) {
        let _ = f.read_to_end(&mut buf);
    }
    h.update(&buf);
    hex::encode(h.finalize())
}

/// Bytes allocated by the regular files under `root` (each inode once), their logical
/// sizes, and their count.
fn usage(root: &Path) -> (u64, u64, u64) {
    let (mut allocated, mut apparent, mut files) = (0, 0, 0);
    let mut seen = HashSet::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&d) else {
            continue;
        };
        for entry in entries.flatten() {
            let Ok(m) = std::fs::symlink_metadata(entry.path()) else {
                continue;
            };
            if m.is_dir() {
                stack.push(entry.path());
            } else if m.is_file() && seen.insert(m.ino()) {
                allocated += m.blocks() * 512;
                apparent += m.len();
                files += 1;
            }
        }
    }
    (allocated, apparent, files)
}

/// Directories the layers made unwritable (0o500, 0o000) get their owner's bits back,
/// so that the temporary directory can go (as an unprivileged user).
fn make_removable(root: &Path) {
    use std::os::unix::fs::PermissionsExt;
    let mut stack = vec![root.to_path_buf()];
    while let Some(d) = stack.pop() {
        let _ = std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o700));
        let Ok(entries) = std::fs::read_dir(&d) else {
            continue;
        };
        for entry in entries.flatten() {
            if entry.file_type().is_ok_and(|t| t.is_dir()) {
                stack.push(entry.path());
            }
        }
    }
}

#[cfg(test)]
mod tests;
