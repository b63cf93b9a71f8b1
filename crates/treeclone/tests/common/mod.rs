//! Shared helpers for the integration tests: sample trees, a deep tree
//! comparison, and leftover checks.
#![allow(dead_code)] // each test binary uses a different subset

use std::collections::BTreeMap;
use std::fs::{self, File, FileTimes};
use std::os::unix::fs::{symlink, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use zygote_treeclone::loopfs::{xfs_availability, LoopXfs};

/// A scratch XFS, or None after printing why the test is being skipped.
pub fn xfs_or_skip() -> Option<LoopXfs> {
    if let Err(e) = xfs_availability() {
        eprintln!("skipping: {e}");
        return None;
    }
    match LoopXfs::create(&std::env::temp_dir(), 768 << 20) {
        Ok(x) => Some(x),
        Err(e) => {
            eprintln!("skipping: cannot make a loop-mounted XFS here: {e}");
            None
        }
    }
}

/// Run `f` without root's file-access privileges: as root, on a thread
/// whose filesystem uid/gid are `nobody` (setfsuid/setfsgid are per thread
/// on Linux, drop CAP_DAC_OVERRIDE and friends for that thread, and are
/// inherited by threads it spawns); as anyone else, directly.
pub fn unprivileged<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
    // SAFETY: geteuid has no preconditions.
    let as_root = unsafe { libc::geteuid() } == 0;
    std::thread::spawn(move || {
        if as_root {
            // SAFETY: these change only the calling thread's credentials.
            unsafe {
                libc::setfsgid(65534);
                libc::setfsuid(65534);
                assert_eq!(
                    libc::setfsuid(u32::MAX),
                    65534,
                    "setfsuid did not take effect"
                );
            }
        }
        f()
    })
    .join()
    .unwrap()
}

/// Deterministic, incompressible-looking bytes.
pub fn bytes(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x2545_F491_4F6C_DD1D) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 24) as u8
        })
        .collect()
}

fn set_mtime(p: &Path, secs: u64, nanos: u32) {
    let t = SystemTime::UNIX_EPOCH + Duration::new(secs, nanos);
    File::open(p)
        .unwrap()
        .set_times(FileTimes::new().set_modified(t).set_accessed(t))
        .unwrap();
}

fn chmod(p: &Path, mode: u32) {
    fs::set_permissions(p, fs::Permissions::from_mode(mode)).unwrap();
}

/// A tree exercising every feature: nested and empty directories, odd
/// modes (read-only files, setgid dir), in-tree symlinks (file, directory,
/// dangling), an empty file, and distinctive mtimes. Returns `root`.
pub fn sample_tree(root: &Path) -> PathBuf {
    fs::create_dir(root).unwrap();
    for d in ["a/b/c", "empty", "a/also_empty", "modes"] {
        fs::create_dir_all(root.join(d)).unwrap();
    }
    let files: [(&str, usize, u32); 7] = [
        ("top.bin", 200_000, 0o644),
        ("a/b/c/deep.bin", 70_000, 0o640),
        ("a/b/exec.sh", 50, 0o755),
        ("modes/readonly.txt", 4096, 0o444),
        ("modes/private", 10, 0o600),
        ("modes/empty_file", 0, 0o644),
        ("a/one_mib.bin", 1 << 20, 0o644),
    ];
    for (i, (rel, len, mode)) in files.iter().enumerate() {
        let p = root.join(rel);
        fs::write(&p, bytes(i as u64 + 1, *len)).unwrap();
        chmod(&p, *mode);
        set_mtime(&p, 1_600_000_000 + i as u64, 123_456_789);
    }
    symlink("b/c/deep.bin", root.join("a/link_to_file")).unwrap();
    symlink("a/b", root.join("link_to_dir")).unwrap();
    symlink("does/not/exist", root.join("dangling")).unwrap();
    symlink("../top.bin", root.join("a/up_and_back")).unwrap();
    chmod(&root.join("modes"), 0o2750);
    chmod(&root.join("a/also_empty"), 0o711);
    // Directory times last: creating entries above updated them.
    for (i, d) in ["a/b/c", "empty", "a/also_empty", "modes", "a/b", "a", ""]
        .iter()
        .enumerate()
    {
        set_mtime(&root.join(d), 1_500_000_000 + i as u64, 987_654_321);
    }
    root.to_path_buf()
}

#[derive(Debug, PartialEq, Eq)]
pub enum Node {
    Dir {
        mode: u32,
        mtime: (i64, i64),
    },
    File {
        mode: u32,
        mtime: (i64, i64),
        data: Vec<u8>,
    },
    Link {
        target: PathBuf,
        mtime: (i64, i64),
    },
}

/// Everything we promise to preserve, keyed by relative path (the root is "").
pub fn snapshot(root: &Path) -> BTreeMap<PathBuf, Node> {
    let mut out = BTreeMap::new();
    fn walk(root: &Path, rel: &Path, out: &mut BTreeMap<PathBuf, Node>) {
        let p = root.join(rel);
        let m = fs::symlink_metadata(&p).unwrap();
        let mtime = (m.mtime(), m.mtime_nsec());
        let mode = m.mode() & 0o7777;
        let ft = m.file_type();
        if ft.is_symlink() {
            let target = fs::read_link(&p).unwrap();
            out.insert(rel.into(), Node::Link { target, mtime });
        } else if ft.is_file() {
            let data = fs::read(&p).unwrap();
            out.insert(rel.into(), Node::File { mode, mtime, data });
        } else {
            assert!(ft.is_dir(), "unexpected file type at {p:?}");
            out.insert(rel.into(), Node::Dir { mode, mtime });
            let mut names: Vec<_> = fs::read_dir(&p)
                .unwrap()
                .map(|e| e.unwrap().file_name())
                .collect();
            names.sort();
            for n in names {
                walk(root, &rel.join(n), out);
            }
        }
    }
    walk(root, Path::new(""), &mut out);
    out
}

/// Assert two trees are identical in content, structure, modes and mtimes.
pub fn assert_same_tree(src: &Path, dst: &Path) {
    let (a, b) = (snapshot(src), snapshot(dst));
    let ka: Vec<_> = a.keys().collect();
    let kb: Vec<_> = b.keys().collect();
    assert_eq!(ka, kb, "different entries");
    for (k, va) in &a {
        assert_eq!(va, &b[k], "entry {k:?} differs");
    }
}

/// Names in `dir` other than `except`: used to prove no staging directory
/// or partial destination was left behind.
pub fn leftovers(dir: &Path, except: &[&str]) -> Vec<String> {
    fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| !except.contains(&n.as_str()))
        .collect()
}
