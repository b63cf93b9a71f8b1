//! The trees the bench materializes, the naive copy it compares against,
//! and the inode-creation floor that bounds any per-file method.
use std::fs::{self, OpenOptions};
use std::io;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};

use crate::plan;

/// One generated tree: `files` files of `file_size` random bytes each.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Shape {
    pub name: &'static str,
    pub files: usize,
    pub file_size: u64,
    /// Spread files over a multi-level directory tree instead of one dir.
    pub nested: bool,
}

impl Shape {
    pub fn bytes(&self) -> u64 {
        self.files as u64 * self.file_size
    }
}

const KIB: u64 = 1024;

/// The shapes from issue 8: a handful of tiny files, a deep tree of medium
/// files, and two flat trees sized like real repositories / input sets.
pub const SHAPES: [Shape; 4] = [
    Shape {
        name: "small_flat",
        files: 64,
        file_size: KIB,
        nested: false,
    },
    Shape {
        name: "deep_nested",
        files: 200,
        file_size: 256 * KIB,
        nested: true,
    },
    Shape {
        name: "medium_flat",
        files: 635,
        file_size: 290 * KIB,
        nested: false,
    },
    Shape {
        name: "large_flat",
        files: 1978,
        file_size: 245 * KIB,
        nested: false,
    },
];

/// Relative path of file `i`. Nested shapes put file `i` at depth 2..=6
/// under three-way branching directories, giving a tree with many small
/// directories at several depths.
pub fn file_path(shape: &Shape, i: usize) -> PathBuf {
    let mut p = PathBuf::new();
    if shape.nested {
        let depth = 2 + i % 5;
        let mut k = i;
        for level in 0..depth {
            p.push(format!("l{level}_{}", k % 3));
            k /= 3;
        }
    }
    p.push(format!("f{i:05}.bin"));
    p
}

/// splitmix64: a tiny, fast generator. Its output is incompressible and
/// different per file, which is what matters here: no filesystem or device
/// can shortcut the copy by compressing or deduplicating the data.
struct SplitMix(u64);

impl SplitMix {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
}

/// Write `shape` under `root` (which must not exist). Files get mode 0644.
pub fn generate(shape: &Shape, root: &Path, seed: u64) -> io::Result<()> {
    fs::create_dir(root)?;
    let mut buf = vec![0u8; shape.file_size as usize];
    for i in 0..shape.files {
        let path = root.join(file_path(shape, i));
        if let Some(parent) = path.parent() {
            fs::create_dir_all(parent)?;
        }
        let mut rng = SplitMix(seed ^ (i as u64).wrapping_mul(0xD6E8_FEB8_6659_FD93));
        for chunk in buf.chunks_mut(8) {
            let v = rng.next().to_le_bytes();
            chunk.copy_from_slice(&v[..chunk.len()]);
        }
        fs::write(&path, &buf)?;
        fs::set_permissions(&path, fs::Permissions::from_mode(0o644))?;
    }
    Ok(())
}

/// The baseline: what `cp -r` does without reflink. Sequential, one file at
/// a time, each read whole into memory and written back out with write(2)
/// (deliberately not `io::copy`, which would use copy_file_range). Modes
/// are kept like `cp -r` keeps them; times are not (`cp -r` does not).
pub fn naive_copy(src: &Path, dst: &Path) -> io::Result<u64> {
    fs::create_dir(dst)?;
    let mut bytes = 0;
    let mut entries: Vec<_> = fs::read_dir(src)?.collect::<io::Result<_>>()?;
    entries.sort_by_key(|e| e.file_name());
    for e in entries {
        let ft = e.file_type()?;
        let to = dst.join(e.file_name());
        if ft.is_dir() {
            bytes += naive_copy(&e.path(), &to)?;
        } else if ft.is_file() {
            let data = fs::read(e.path())?;
            fs::write(&to, &data)?;
            fs::set_permissions(&to, e.metadata()?.permissions())?;
            bytes += data.len() as u64;
        }
    }
    Ok(bytes)
}

/// Whether `cp` is GNU cp, which [`cp_reference`] needs.
pub fn gnu_cp_available() -> bool {
    Command::new("cp")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success() && o.stdout.starts_with(b"cp (GNU"))
}

/// A reference from outside this code base: GNU `cp -r --reflink=never`, the
/// per-file copy people actually run (timed with its process start, a few
/// ms). Check [`gnu_cp_available`] first.
pub fn cp_reference(src: &Path, dst: &Path) -> io::Result<()> {
    cp_r(src, dst, "--reflink=never")
}

/// The same with `--reflink=always`: GNU cp's own per-file reflink clone
/// (FICLONE per file), which fails where the filesystem cannot reflink.
pub fn cp_reflink_reference(src: &Path, dst: &Path) -> io::Result<()> {
    cp_r(src, dst, "--reflink=always")
}

fn cp_r(src: &Path, dst: &Path, reflink: &str) -> io::Result<()> {
    let out = Command::new("cp")
        .args(["-r", reflink, "--"])
        .arg(src)
        .arg(dst)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .output()?;
    if out.status.success() {
        Ok(())
    } else {
        let err = String::from_utf8_lossy(&out.stderr);
        let first = err.lines().next().unwrap_or("").trim();
        Err(io::Error::other(format!(
            "cp -r {reflink} exited with {}: {first}",
            out.status
        )))
    }
}

/// Whether GNU `cp --reflink=always` works in `dir` (tried on a scratch
/// file there), or why not.
pub fn cp_reflink_availability(dir: &Path) -> Result<(), String> {
    if !gnu_cp_available() {
        return Err("GNU cp not installed".into());
    }
    let t = tempfile::Builder::new()
        .prefix(".cp-reflink-probe-")
        .tempdir_in(dir)
        .map_err(|e| format!("scratch dir in {}: {e}", dir.display()))?;
    let a = t.path().join("a");
    fs::write(&a, [7u8; 4096]).map_err(|e| format!("write {}: {e}", a.display()))?;
    cp_r(&a, &t.path().join("b"), "--reflink=always").map_err(|e| {
        // cp names the probe's scratch paths; keep only its verdict.
        let e = e.to_string();
        let why = e.rsplit(": ").next().unwrap_or(&e).to_string();
        format!("cp --reflink=always cannot clone here: {why}")
    })
}

/// The floor: create the tree's directories and one *empty* file per source
/// file (same modes, no data, no times), with `threads` workers like the
/// treatment, after the same scan the treatment does. Any method that gives
/// every file its own inode (reflink, copy_file_range, copy) pays at least
/// this; only the bytes and the remaining metadata come on top. Returns the
/// number of files created.
pub fn create_empty_tree(src: &Path, dst: &Path, threads: usize) -> io::Result<usize> {
    let plan = plan::scan(src).map_err(io::Error::other)?;
    // The root comes first in plan order, parents before children.
    for d in &plan.dirs {
        fs::create_dir(dst.join(&d.rel))?;
    }
    let next = AtomicUsize::new(0);
    let worker = || -> io::Result<()> {
        while let Some(f) = plan.files.get(next.fetch_add(1, Ordering::Relaxed)) {
            OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(f.meta.mode)
                .open(dst.join(&f.rel))?;
        }
        Ok(())
    };
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads.max(1)).map(|_| s.spawn(worker)).collect();
        handles.into_iter().try_for_each(|h| {
            h.join()
                .unwrap_or_else(|_| Err(io::Error::other("worker panicked")))
        })
    })?;
    Ok(plan.files.len())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generated_tree_matches_shape_and_naive_copy_is_faithful() {
        let t = tempfile::tempdir().unwrap();
        let shape = Shape {
            name: "t",
            files: 23,
            file_size: 3000,
            nested: true,
        };
        let src = t.path().join("src");
        generate(&shape, &src, 7).unwrap();
        let mut files = 0;
        let mut max_depth = 0;
        let mut contents = std::collections::HashSet::new();
        for i in 0..shape.files {
            let rel = file_path(&shape, i);
            max_depth = max_depth.max(rel.components().count() - 1);
            let data = fs::read(src.join(&rel)).unwrap();
            assert_eq!(data.len() as u64, shape.file_size);
            contents.insert(data);
            files += 1;
        }
        assert_eq!(files, 23);
        assert_eq!(max_depth, 6);
        // Every file has distinct content (no accidental dedupe opportunity).
        assert_eq!(contents.len(), 23);

        let dst = t.path().join("dst");
        let copied = naive_copy(&src, &dst).unwrap();
        assert_eq!(copied, shape.bytes());
        for i in 0..shape.files {
            let rel = file_path(&shape, i);
            assert_eq!(
                fs::read(src.join(&rel)).unwrap(),
                fs::read(dst.join(&rel)).unwrap()
            );
        }

        let empty = t.path().join("empty");
        assert_eq!(create_empty_tree(&src, &empty, 2).unwrap(), shape.files);
        for i in 0..shape.files {
            let m = fs::metadata(empty.join(file_path(&shape, i))).unwrap();
            assert!(m.is_file());
            assert_eq!(m.len(), 0);
        }
    }
}
