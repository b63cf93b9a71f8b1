//! Helpers of the whole-tree tests: scratch filesystems, a rich sample tree, a
//! deep comparison of trees and the checks every clone goes through.
use super::*;

/// (entry, name) of the user.* xattrs of the rich tree; the value is the entry.
pub(crate) const XATTRS: [(&str, &str); 3] = [
    ("top.txt", "user.o"),
    ("a", "user.dir"),
    ("ro_dir/ro.txt", "user.k"),
];
pub(crate) const MARK: &str = "trusted.zygote.treeclone";
pub(crate) const NONE: [&str; 0] = [];

/// Run `f` on a fresh loop-mounted filesystem of each kind (its canonical
/// root), printing why a kind is skipped.
pub(crate) fn on_each(kinds: &[LoopFsKind], f: impl Fn(LoopFsKind, &Path)) {
    for &kind in kinds {
        let ready = match kind {
            Xfs => xfs_availability(),
            Btrfs => btrfs_availability(),
        };
        let made = ready.and_then(|()| LoopFs::create_kind(&std::env::temp_dir(), 512 << 20, kind));
        match made {
            Ok(lfs) => f(kind, &fs::canonicalize(lfs.path()).unwrap()),
            Err(e) => eprintln!("skipping: no loop-mounted {kind:?}: {e}"),
        }
    }
}

pub(crate) fn have_overlay() -> bool {
    let r = overlay_availability();
    if let Err(why) = &r {
        eprintln!("skipping the overlay cases: {why}");
    }
    r.is_ok()
}

pub(crate) fn with(method: Method) -> Options {
    Options {
        method,
        ..Options::default()
    }
}

pub(crate) fn keeping_xattrs() -> Options {
    Options {
        preserve_xattrs: true,
        ..Options::default()
    }
}

/// How a tree was made: (strategy, validation).
pub(crate) fn how(r: &Report) -> (S, Validation) {
    (r.strategy, r.validation)
}

pub(crate) fn cstr(s: &str) -> CString {
    CString::new(s).unwrap()
}

pub(crate) fn set_xattr(p: &Path, name: &str, v: &[u8]) -> io::Result<()> {
    let (p, n) = (cstr(p.to_str().unwrap()), cstr(name));
    // SAFETY: NUL-terminated strings and a readable value buffer.
    match unsafe { libc::lsetxattr(p.as_ptr(), n.as_ptr(), v.as_ptr().cast(), v.len(), 0) } {
        0 => Ok(()),
        _ => Err(io::Error::last_os_error()),
    }
}

pub(crate) fn get_xattr(p: &Path, name: &str) -> Option<Vec<u8>> {
    let (p, n) = (cstr(p.to_str().unwrap()), cstr(name));
    let mut buf = vec![0u8; 256];
    // SAFETY: buf is writable for its length.
    let len = unsafe { libc::lgetxattr(p.as_ptr(), n.as_ptr(), buf.as_mut_ptr().cast(), 256) };
    (len >= 0).then(|| buf[..len as usize].to_vec())
}

pub(crate) fn chmod(p: &Path, mode: u32) {
    fs::set_permissions(p, fs::Permissions::from_mode(mode)).unwrap();
}

pub(crate) fn set_mtime(p: &Path, secs: u64) {
    let t = SystemTime::UNIX_EPOCH + Duration::new(secs, 123_456_789);
    let times = FileTimes::new().set_modified(t).set_accessed(t);
    File::open(p).unwrap().set_times(times).unwrap();
}

/// Post-order, so every directory keeps the mtime it is given.
pub(crate) fn stamp_dirs(p: &Path, secs: u64) {
    for e in fs::read_dir(p).unwrap().map(Result::unwrap) {
        if e.file_type().unwrap().is_dir() {
            stamp_dirs(&e.path(), secs + 1);
        }
    }
    set_mtime(p, secs);
}

/// 200 nested directories.
pub(crate) fn deep() -> PathBuf {
    (0..200).map(|_| "d").collect()
}

/// The tree the tests clone: 200 nested directories, relative in-tree
/// symlinks, two names for one inode, a 0555 directory holding a 0444 file,
/// a setgid directory, user.* xattrs and distinctive mtimes. `root` may
/// already exist (an empty subvolume).
pub(crate) fn rich_tree(root: &Path) -> PathBuf {
    fs::create_dir_all(root.join(deep())).unwrap();
    for d in ["a", "b", "ro_dir", "sgid", "empty"] {
        fs::create_dir(root.join(d)).unwrap();
    }
    let bottom = deep().join("bottom.txt");
    let files = [
        ("top.txt", 3000, 0o644),
        ("a/file.txt", 5000, 0o640),
        ("a/hard1", 4096, 0o644),
        ("b/victim", 100, 0o600),
        ("ro_dir/ro.txt", 2048, 0o444),
        ("sgid/x.sh", 64, 0o755),
        (bottom.to_str().unwrap(), 1000, 0o644),
    ];
    for (i, (rel, len, mode)) in files.into_iter().enumerate() {
        let p = root.join(rel);
        fs::write(&p, common::bytes(i as u64 + 1, len)).unwrap();
        chmod(&p, mode);
        set_mtime(&p, 1_600_000_000 + i as u64);
    }
    fs::hard_link(root.join("a/hard1"), root.join("b/hard2")).unwrap();
    symlink("file.txt", root.join("a/link_to_file")).unwrap();
    symlink("../top.txt", root.join("a/up_and_back")).unwrap();
    symlink("a", root.join("link_to_dir")).unwrap();
    symlink(&bottom, root.join("to_bottom")).unwrap();
    for (rel, name) in XATTRS {
        set_xattr(&root.join(rel), name, rel.as_bytes()).unwrap();
    }
    chmod(&root.join("ro_dir"), 0o555);
    chmod(&root.join("sgid"), 0o2775);
    stamp_dirs(root, 1_500_000_000);
    root.to_path_buf()
}

pub(crate) fn subvolume_at(p: &Path) -> PathBuf {
    let out = Command::new("btrfs")
        .args(["subvolume", "create"])
        .arg(p)
        .output()
        .unwrap();
    assert!(out.status.success(), "btrfs subvolume create: {out:?}");
    p.to_path_buf()
}

/// A sealed copy of the rich tree (xattrs kept) at `root/sealed`.
pub(crate) fn sealed_tree(root: &Path) -> PathBuf {
    let raw = rich_tree(&root.join("raw"));
    let dst = root.join("sealed");
    seal(&raw, &dst, &keeping_xattrs()).unwrap();
    dst
}

/// What a clone must keep and isolate: the tree, its xattrs, the hard link.
pub(crate) struct State {
    pub(crate) tree: BTreeMap<PathBuf, Node>,
    pub(crate) xattrs: Vec<Option<Vec<u8>>>,
    pub(crate) linked: bool,
}

impl State {
    pub(crate) fn of(root: &Path) -> State {
        let meta = |rel: &str| fs::metadata(root.join(rel)).unwrap();
        let (one, two) = (meta("a/hard1"), meta("b/hard2"));
        State {
            tree: snapshot(root),
            xattrs: XATTRS
                .iter()
                .map(|(rel, n)| get_xattr(&root.join(rel), n))
                .collect(),
            linked: one.ino() == two.ino() && one.nlink() == 2,
        }
    }

    /// (files, dirs, symlinks, bytes) as a report counts them.
    pub(crate) fn counts(&self) -> (u64, u64, u64, u64) {
        let mut c = (0, 0, 0, 0);
        for n in self.tree.values() {
            match n {
                Node::File { data, .. } => (c.0, c.3) = (c.0 + 1, c.3 + data.len() as u64),
                Node::Dir { .. } => c.1 += 1,
                Node::Link { .. } => c.2 += 1,
            }
        }
        c
    }

    /// Assert `other` has the same entries, modes, mtimes, contents and
    /// symlink targets (the root's own entry included), naming the first
    /// difference.
    pub(crate) fn assert_same_tree(&self, other: &State, what: &str) {
        let keys = |s: &State| s.tree.keys().cloned().collect::<Vec<_>>();
        assert_eq!(keys(self), keys(other), "{what}: different entries");
        for k in keys(self) {
            assert!(self.tree[&k] == other.tree[&k], "{what}: {k:?} differs");
        }
    }
}

/// Assert `root` still looks exactly like `before`.
pub(crate) fn assert_unchanged(before: &State, root: &Path, what: &str) {
    let now = State::of(root);
    before.assert_same_tree(&now, what);
    assert_eq!(now.xattrs, before.xattrs, "{what}: xattrs changed");
    assert_eq!(now.linked, before.linked, "{what}: hard link changed");
}

/// Writes, creates, deletes, chmods and xattr changes all over a tree.
pub(crate) fn mutate(root: &Path, tag: &[u8]) {
    let bottom = root.join(deep()).join("bottom.txt");
    for f in [
        "a/file.txt",
        "ro_dir/ro.txt",
        "a/hard1",
        "new_file",
        "ro_dir/new",
    ] {
        fs::write(root.join(f), tag).unwrap();
    }
    fs::write(&bottom, tag).unwrap();
    fs::remove_file(root.join("b/victim")).unwrap();
    fs::remove_dir(root.join("empty")).unwrap();
    chmod(&root.join("top.txt"), 0o600);
    chmod(&root.join("sgid"), 0o700);
    set_xattr(&root.join("top.txt"), "user.o", tag).unwrap();
    fs::remove_file(root.join("a/link_to_file")).unwrap();
    symlink("hard1", root.join("a/link_to_file")).unwrap();
    assert_eq!(fs::read(&bottom).unwrap(), tag);
}

pub(crate) fn mounted(p: &Path) -> bool {
    let mountinfo = fs::read_to_string("/proc/self/mountinfo").unwrap();
    mountinfo.lines().any(|l| l.split(' ').nth(4) == p.to_str())
}

pub(crate) fn overlay_state(dst: &Path) -> PathBuf {
    let name = dst.file_name().unwrap().to_str().unwrap();
    dst.with_file_name(format!(".{name}.treeclone-overlay"))
}

/// No tree, no mount and no overlay state directory at `p`.
pub(crate) fn gone(p: &Path) -> bool {
    !p.exists() && !mounted(p) && !overlay_state(p).exists()
}

/// Clone `src` into `root/name` with `method`, expecting `strategy`; check
/// fidelity, isolation both ways (the source is written only if it is not
/// sealed) and removal.
pub(crate) fn check_clone(root: &Path, name: &str, src: &Path, method: Method, strategy: S) {
    let dst = root.join(name);
    let is_sealed = sealed(src).is_some();
    let whole = strategy != S::PerFile;
    let validation = if is_sealed && whole { Sealed } else { Scanned };
    let before = State::of(src);
    let tree =
        materialize_owned(src, &dst, &with(method)).unwrap_or_else(|e| panic!("{name}: {e}"));
    let r = tree.report();
    assert_eq!(how(r), (strategy, validation), "{name}");
    let counts = (r.files, r.dirs, r.symlinks, r.bytes);
    assert_eq!(counts, before.counts(), "{name}");
    match method {
        Reflink => assert_eq!(r.by_method.reflink, r.files, "{name}"),
        Copy => assert_eq!(r.by_method.copy, r.files, "{name}"),
        _ => {}
    }
    let clone = State::of(&dst);
    before.assert_same_tree(&clone, name);
    if !whole {
        // Default options: no xattrs, and hard links become independent files.
        assert_eq!(clone.xattrs, vec![None; 3], "{name}");
        assert!(!clone.linked, "{name}: per-file clone kept a hard link");
    } else {
        // Whole-tree clones are the tree as it is, xattrs and links included.
        assert_eq!(clone.xattrs, before.xattrs, "{name}");
        assert!(clone.xattrs.iter().all(Option::is_some), "{name}");
        assert_eq!(clone.linked, before.linked, "{name}");
    }
    mutate(&dst, b"clone");
    assert_unchanged(&before, src, &format!("{name}: clone -> source"));
    // A write through one name shows through the other only if still linked.
    let other = fs::read(dst.join("b/hard2")).unwrap();
    assert_eq!(other == b"clone", clone.linked, "{name}");
    if !is_sealed {
        let clone_now = State::of(&dst);
        mutate(src, b"source");
        assert_unchanged(&clone_now, &dst, &format!("{name}: source -> clone"));
    }
    tree.remove().unwrap();
    assert!(gone(&dst), "{name}");
}
