use std::ffi::CString;
use std::os::unix::fs::{MetadataExt, PermissionsExt};

use sha2::Sha256;

use super::*;

/// An uncompressed layer, written raw (hostile names included).
pub(super) use crate::fuzzing::tar_stream::TarStream as TarLayer;

/// Limits that do not depend on this machine's free space (the reserve and the
/// measured disk budget have tests of their own).
pub(super) fn test_limits() -> Limits {
    Limits {
        reserve_bytes: 0,
        max_disk_bytes: Some(1 << 30),
        ..Limits::default()
    }
}

pub(super) struct Tree {
    pub(super) _dir: tempfile::TempDir,
    pub(super) root: PathBuf,
}

pub(super) fn tree() -> Tree {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("root");
    std::fs::create_dir(&root).unwrap();
    Tree { _dir: dir, root }
}

pub(super) fn apply_all(
    root: &Path,
    ownership: Ownership,
    limits: Limits,
    layers: &[&TarLayer],
) -> Result<Applied> {
    let mut a = Applier::new(root, ownership, limits)?;
    for (i, l) in layers.iter().enumerate() {
        a.apply(i, "sha256:test", &l.bytes()[..])?;
    }
    a.finish()
}

pub(super) fn apply(root: &Path, layers: &[&TarLayer]) -> Applied {
    apply_all(root, Ownership::for_this_process(), test_limits(), layers).unwrap()
}

pub(super) fn names(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

fn is_root() -> bool {
    Ownership::for_this_process() == Ownership::Apply
}

#[test]
fn files_dirs_links_and_metadata() {
    let t = tree();
    let mut l = TarLayer::default();
    l.dir("./", 0o755)
        .dir("etc/", 0o755)
        .file("etc/passwd", b"root:x:0:0::/root:/bin/sh\n", 0o644)
        .file("/usr/bin/su", b"SU", 0o4755)
        .link("bin", "usr/bin", EntryType::Symlink)
        .link("usr/bin/su2", "usr/bin/su", EntryType::Link)
        .special("run/fifo", EntryType::Fifo)
        .special("dev/null", EntryType::Char)
        .pax(&[("SCHILY.xattr.user.zygote", b"yes")])
        .file("etc/xattr", b"x", 0o600)
        .dir("locked/", 0o500);
    let done = apply(&t.root, &[&l]);
    let r = &t.root;
    assert_eq!(
        std::fs::read(r.join("etc/passwd")).unwrap(),
        b"root:x:0:0::/root:/bin/sh\n"
    );
    assert_eq!(
        std::fs::read_link(r.join("bin")).unwrap(),
        Path::new("usr/bin")
    );
    let su = std::fs::metadata(r.join("usr/bin/su")).unwrap();
    let su2 = std::fs::metadata(r.join("usr/bin/su2")).unwrap();
    assert_eq!(su.ino(), su2.ino(), "a hard link is one inode");
    assert_eq!(su.mtime(), 1_600_000_000);
    assert!(std::fs::symlink_metadata(r.join("run/fifo"))
        .unwrap()
        .file_type()
        .is_fifo_like());
    assert!(!r.join("dev/null").exists(), "devices are skipped");
    assert_eq!(done.skipped_devices, 1);
    assert_eq!(done.entries, 10);
    if is_root() {
        assert_eq!(su.mode() & 0o7777, 0o4755, "setuid kept after the chown");
        assert_eq!((su.uid(), su.gid()), (1000, 100));
        assert!(done.fixups.is_empty());
        let locked = std::fs::metadata(r.join("locked")).unwrap();
        assert_eq!(locked.mode() & 0o7777, 0o500);
        let mut buf = [0u8; 8];
        let p = CString::new(r.join("etc/xattr").as_os_str().as_bytes()).unwrap();
        let n = CString::new("user.zygote").unwrap();
        // SAFETY: valid paths and buffer.
        let len = unsafe { libc::lgetxattr(p.as_ptr(), n.as_ptr(), buf.as_mut_ptr().cast(), 8) };
        assert_eq!(&buf[..len.max(0) as usize], b"yes");
    }
}

trait FifoLike {
    fn is_fifo_like(&self) -> bool;
}

impl FifoLike for std::fs::FileType {
    fn is_fifo_like(&self) -> bool {
        std::os::unix::fs::FileTypeExt::is_fifo(self)
    }
}

#[test]
fn whiteouts_hide_lower_layers_only() {
    let t = tree();
    let mut lower = TarLayer::default();
    lower
        .file("a/gone", b"1", 0o644)
        .file("a/kept", b"1", 0o644)
        .file("a/readded", b"old", 0o644)
        .file("d/x/y", b"1", 0o644)
        .file("same", b"1", 0o644);
    let mut upper = TarLayer::default();
    upper
        .file("a/.wh.gone", b"", 0o644)
        // Added, then whited out in the same layer: the whiteout is for lower layers.
        .file("a/new", b"2", 0o644)
        .file("a/.wh.new", b"", 0o644)
        // Whiteout first, then the re-add.
        .file("a/.wh.readded", b"", 0o644)
        .file("a/readded", b"new", 0o644)
        .file(".wh.d", b"", 0o644)
        .file(".wh.missing", b"", 0o644)
        .file("nodir/.wh.x", b"", 0o644);
    apply(&t.root, &[&lower, &upper]);
    let r = &t.root;
    assert_eq!(names(&r.join("a")), vec!["kept", "new", "readded"]);
    assert_eq!(std::fs::read(r.join("a/readded")).unwrap(), b"new");
    assert!(!r.join("d").exists());
    assert!(!r.join("nodir").exists(), "a whiteout creates no directory");
    assert!(names(r).iter().all(|n| !n.starts_with(".wh.")));
}

#[test]
fn opaque_directories_hide_what_lower_layers_had() {
    for marker_first in [true, false] {
        let t = tree();
        let mut lower = TarLayer::default();
        lower
            .file("o/old", b"1", 0o644)
            .file("o/sub/old", b"1", 0o644)
            .file("o/sub/also", b"1", 0o644)
            .file("other/keep", b"1", 0o644);
        let mut upper = TarLayer::default();
        if marker_first {
            upper.file("o/.wh..wh..opq", b"", 0o644);
        }
        upper
            .dir("o/sub/", 0o755)
            .file("o/sub/new", b"2", 0o644)
            .file("o/top", b"2", 0o644);
        if !marker_first {
            upper.file("o/.wh..wh..opq", b"", 0o644);
        }
        apply(&t.root, &[&lower, &upper]);
        let r = &t.root;
        assert_eq!(
            names(&r.join("o")),
            vec!["sub", "top"],
            "marker first: {marker_first}"
        );
        assert_eq!(
            names(&r.join("o/sub")),
            vec!["new"],
            "marker first: {marker_first}"
        );
        assert_eq!(names(&r.join("other")), vec!["keep"]);
    }
}

#[test]
fn entries_replace_what_was_there_without_following_it() {
    let t = tree();
    let outside = t.root.parent().unwrap().join("outside");
    std::fs::create_dir(&outside).unwrap();
    std::fs::write(outside.join("victim"), b"host").unwrap();
    let mut lower = TarLayer::default();
    let victim = outside.join("victim");
    lower
        .file("dir/inner", b"1", 0o644)
        .file("file", b"1", 0o644)
        .link("link", victim.to_str().unwrap(), EntryType::Symlink);
    let mut upper = TarLayer::default();
    upper
        .file("dir", b"now a file", 0o644)
        .dir("file/", 0o755)
        .file("link", b"written in the tree", 0o644);
    apply(&t.root, &[&lower, &upper]);
    let r = &t.root;
    assert_eq!(std::fs::read(r.join("dir")).unwrap(), b"now a file");
    assert!(r.join("file").is_dir());
    assert!(!std::fs::symlink_metadata(r.join("link"))
        .unwrap()
        .is_symlink());
    assert_eq!(
        std::fs::read(&victim).unwrap(),
        b"host",
        "the host file is untouched"
    );
}

#[test]
fn symlinks_are_resolved_inside_the_tree() {
    let t = tree();
    let mut l = TarLayer::default();
    l.link("evil", "/etc", EntryType::Symlink)
        .link("up", "../../../../..", EntryType::Symlink)
        .file("evil/zygote-owned", b"x", 0o644)
        .file("up/escaped", b"x", 0o644)
        .link("hl", "evil/zygote-owned", EntryType::Link);
    apply(&t.root, &[&l]);
    let r = &t.root;
    assert!(!Path::new("/etc/zygote-owned").exists());
    assert_eq!(std::fs::read(r.join("etc/zygote-owned")).unwrap(), b"x");
    assert_eq!(std::fs::read(r.join("escaped")).unwrap(), b"x");
    assert!(!t.root.parent().unwrap().join("escaped").exists());
    assert_eq!(std::fs::read(r.join("hl")).unwrap(), b"x");
}

#[test]
fn hostile_entries_are_refused_with_the_reason() {
    let cases: Vec<(&str, TarLayer)> = vec![
        ("`..` component", {
            let mut l = TarLayer::default();
            l.file("../escape", b"x", 0o644);
            l
        }),
        ("`..` component", {
            let mut l = TarLayer::default();
            l.file("a/../../escape", b"x", 0o644);
            l
        }),
        ("target", {
            let mut l = TarLayer::default();
            l.link("passwd", "../../etc/passwd", EntryType::Link);
            l
        }),
        ("not a file of this image", {
            let mut l = TarLayer::default();
            l.link("x", "missing", EntryType::Link);
            l
        }),
        ("not a file of this image", {
            let mut l = TarLayer::default();
            l.dir("d/", 0o755).link("x", "d", EntryType::Link);
            l
        }),
        ("was inside what the link replaces", {
            let mut l = TarLayer::default();
            l.file("d/x", b"x", 0o644).link("d", "d/x", EntryType::Link);
            l
        }),
        ("too many levels of symbolic links", {
            let mut l = TarLayer::default();
            l.link("a", "b", EntryType::Symlink)
                .link("b", "a", EntryType::Symlink)
                .file("a/.wh.y", b"", 0o644);
            l
        }),
        ("longer than the 255 a file name may have", {
            let mut l = TarLayer::default();
            l.file(&format!("dir/{}", "x".repeat(300)), b"x", 0o644);
            l
        }),
        ("not UTF-8", {
            let mut l = TarLayer::default();
            let h = TarLayer::header(b"bad\xff", EntryType::Regular, 0o644, 0);
            l.push(h, b"");
            l
        }),
    ];
    for (want, layer) in cases {
        let t = tree();
        let err = apply_all(
            &t.root,
            Ownership::for_this_process(),
            test_limits(),
            &[&layer],
        )
        .unwrap_err();
        let msg = err.to_string();
        assert!(matches!(err, OciError::BadLayer { layer: 0, .. }), "{msg}");
        assert!(msg.contains(want), "{msg} should say {want}");
        assert!(!t.root.parent().unwrap().join("escape").exists());
    }
}

#[test]
fn limits_are_enforced() {
    let mut l = TarLayer::default();
    for i in 0..10 {
        l.file(&format!("f{i}"), &[7u8; 4096], 0o644);
    }
    let t = tree();
    let few = Limits {
        max_entries: 5,
        ..test_limits()
    };
    let err = apply_all(&t.root, Ownership::for_this_process(), few, &[&l]).unwrap_err();
    assert!(matches!(err, OciError::TooLarge { limit: 5, .. }), "{err}");
    let t = tree();
    let small = Limits {
        max_apparent_bytes: 20_000,
        ..test_limits()
    };
    let err = apply_all(&t.root, Ownership::for_this_process(), small, &[&l]).unwrap_err();
    assert!(
        matches!(err, OciError::TooLarge { limit: 20_000, .. }),
        "{err}"
    );
    let msg = err.to_string();
    assert!(
        msg.contains("20000") && msg.contains("apparent-size limit"),
        "{msg}"
    );
}

#[test]
fn diff_ids_cover_the_uncompressed_stream_in_any_compression() {
    let mut l = TarLayer::default();
    l.file("a", b"hello", 0o644).dir("b/", 0o755);
    let raw = l.bytes();
    let want = format!("sha256:{}", hex::encode(Sha256::digest(&raw)));
    let dir = tempfile::tempdir().unwrap();
    let gz = {
        let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        std::io::Write::write_all(&mut e, &raw).unwrap();
        e.finish().unwrap()
    };
    let zst = zstd::encode_all(&raw[..], 3).unwrap();
    for (name, bytes) in [("plain", raw.clone()), ("gzip", gz), ("zstd", zst)] {
        let blob = dir.path().join(name);
        std::fs::write(&blob, bytes).unwrap();
        let t = tree();
        let mut a = Applier::new(&t.root, Ownership::for_this_process(), test_limits()).unwrap();
        let got = a.apply_blob(0, "sha256:x", &blob).unwrap();
        assert_eq!(got.diff_id, want, "{name}");
        assert_eq!(got.entries, 2);
        assert_eq!(std::fs::read(t.root.join("a")).unwrap(), b"hello");
    }
}

#[test]
fn record_mode_stages_readable_files_and_returns_owners() {
    let t = tree();
    let mut l = TarLayer::default();
    l.dir("d/", 0o700)
        .file("d/secret", b"s", 0o000)
        .file("d/suid", b"s", 0o4755)
        .link("d/ln", "secret", EntryType::Symlink)
        .link("d/hard", "d/suid", EntryType::Link);
    let done = apply_all(&t.root, Ownership::Record, test_limits(), &[&l]).unwrap();
    let secret = std::fs::metadata(t.root.join("d/secret")).unwrap();
    assert_eq!(
        secret.permissions().mode() & 0o600,
        0o600,
        "readable for mkfs"
    );
    let by_path: BTreeMap<&str, &Fixup> =
        done.fixups.iter().map(|f| (f.guest.as_str(), f)).collect();
    assert_eq!(
        by_path.keys().copied().collect::<Vec<_>>(),
        vec!["/d", "/d/hard", "/d/ln", "/d/secret", "/d/suid"]
    );
    assert_eq!(by_path["/d/secret"].mode, Some(0));
    assert_eq!(by_path["/d/suid"].mode, Some(0o4755));
    assert_eq!(by_path["/d/hard"].mode, Some(0o4755));
    assert_eq!(by_path["/d/ln"].mode, None);
    assert_eq!((by_path["/d"].uid, by_path["/d"].gid), (1000, 100));
}
