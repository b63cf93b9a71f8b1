//! Reflink behaviour on a real XFS made by the test on a loop device.
//! Skipped (with a printed reason) when not root or loop/mkfs.xfs are missing.
mod common;

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::Command;

use common::{assert_same_tree, leftovers, sample_tree, xfs_or_skip};
use zygote_treeclone::fiemap::{extents, fully_shared};
use zygote_treeclone::{materialize, syncfs, Error, FileMethod, Method, Options};

/// Bytes in use on the filesystem holding `p`.
fn used_bytes(p: &Path) -> u64 {
    syncfs(p).unwrap();
    let c = std::ffi::CString::new(p.to_str().unwrap()).unwrap();
    // SAFETY: statvfs fills the zeroed struct.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    assert_eq!(unsafe { libc::statvfs(c.as_ptr(), &mut st) }, 0);
    (st.f_blocks - st.f_bfree) * st.f_frsize
}

#[test]
fn reflinked_clone_shares_extents_and_writes_stay_private() {
    let Some(xfs) = xfs_or_skip() else { return };
    let root = xfs.path();
    let src = sample_tree(&root.join("src"));
    // Some bulk so "no new data blocks" is measurable: 32 MiB.
    for i in 0..8 {
        fs::write(
            src.join(format!("bulk{i}")),
            common::bytes(100 + i, 4 << 20),
        )
        .unwrap();
    }
    let before = used_bytes(root);

    let dst = root.join("dst");
    let rep = materialize(&src, &dst, &Options::default()).unwrap();
    assert_eq!(rep.probed_method, Some(FileMethod::Reflink));
    assert_eq!(rep.by_method.reflink, rep.files, "{:?}", rep.by_method);
    assert_same_tree(&src, &dst);

    // O(metadata): 33+ MiB cloned, well under 1 MiB of new space used.
    let grew = used_bytes(root).saturating_sub(before);
    assert!(grew < 1 << 20, "cloning allocated {grew} bytes");

    // FIEMAP: every non-empty file, on both sides, is entirely shared, and
    // the clone maps the very same physical extents as its source.
    for rec in rep.per_file.iter().filter(|r| r.bytes > 0) {
        let (a, b) = (src.join(&rec.path), dst.join(&rec.path));
        assert!(fully_shared(&b).unwrap(), "{b:?} not shared");
        assert!(fully_shared(&a).unwrap(), "{a:?} not shared");
        let phys = |p: &Path| {
            extents(p)
                .unwrap()
                .iter()
                .map(|e| (e.logical, e.physical, e.length))
                .collect::<Vec<_>>()
        };
        assert_eq!(phys(&a), phys(&b), "{:?}", rec.path);
    }
    // Cross-check with filefrag when it is installed.
    if let Ok(out) = Command::new("filefrag")
        .arg("-v")
        .arg(dst.join("bulk0"))
        .output()
    {
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(text.contains("shared"), "filefrag disagrees:\n{text}");
    }

    // Write into the clone (the read-only one, the documented way: chmod first).
    let ro = Path::new("modes/readonly.txt");
    let original = fs::read(src.join(ro)).unwrap();
    fs::set_permissions(dst.join(ro), fs::Permissions::from_mode(0o644)).unwrap();
    fs::write(dst.join(ro), vec![0xAB; 4096]).unwrap();
    let bulk_src = fs::read(src.join("bulk3")).unwrap();
    {
        use std::os::unix::fs::FileExt;
        let f = fs::OpenOptions::new()
            .write(true)
            .open(dst.join("bulk3"))
            .unwrap();
        f.write_all_at(&[0x55; 8192], 1 << 20).unwrap();
    }
    syncfs(root).unwrap();
    assert_eq!(fs::read(src.join(ro)).unwrap(), original);
    assert_eq!(fs::read(dst.join(ro)).unwrap(), vec![0xAB; 4096]);
    assert_eq!(fs::read(src.join("bulk3")).unwrap(), bulk_src);
    let changed = fs::read(dst.join("bulk3")).unwrap();
    assert_eq!(&changed[(1 << 20)..(1 << 20) + 8192], &[0x55; 8192][..]);
    assert_eq!(&changed[..1 << 20], &bulk_src[..1 << 20]);
    // Copy-on-write: the written range got private blocks, the rest is
    // still shared.
    let ex = extents(&dst.join("bulk3")).unwrap();
    assert!(ex.iter().any(|e| !e.is_shared()), "{ex:?}");
    assert!(ex.iter().any(|e| e.is_shared()), "{ex:?}");
    drop(xfs);
}

#[test]
fn strict_reflink_and_cross_filesystem_fallback() {
    let Some(xfs) = xfs_or_skip() else { return };
    let root = xfs.path();
    let src = sample_tree(&root.join("src"));
    let strict = Options {
        method: Method::Reflink,
        ..Options::default()
    };
    let rep = materialize(&src, &root.join("strict"), &strict).unwrap();
    assert_eq!(rep.by_method.reflink, 7);
    assert_same_tree(&src, &root.join("strict"));

    // Source on another filesystem: FICLONE says EXDEV. Strict mode must
    // fail and leave nothing; Auto must fall back and still be exact.
    let other = tempfile::tempdir().unwrap();
    let far_src = sample_tree(&other.path().join("src"));
    let err = materialize(&far_src, &root.join("far_strict"), &strict).unwrap_err();
    match &err {
        Error::ReflinkUnsupported { source, .. } => {
            assert_eq!(source.raw_os_error(), Some(libc::EXDEV));
        }
        other => panic!("expected ReflinkUnsupported, got {other}"),
    }
    assert!(!root.join("far_strict").exists());
    let rep = materialize(&far_src, &root.join("far_auto"), &Options::default()).unwrap();
    assert_ne!(rep.probed_method, Some(FileMethod::Reflink));
    assert_eq!(rep.by_method.reflink, 0);
    assert_same_tree(&far_src, &root.join("far_auto"));

    // Without root's DAC override, a 0444 file is created at its final mode
    // and reflinked through the write descriptor from O_CREAT.
    fs::set_permissions(root, fs::Permissions::from_mode(0o777)).unwrap();
    let usrc = root.join("usrc");
    fs::create_dir_all(usrc.join("d")).unwrap();
    fs::write(usrc.join("ro.txt"), common::bytes(5, 1 << 20)).unwrap();
    fs::write(usrc.join("d/x"), common::bytes(6, 5000)).unwrap();
    fs::set_permissions(usrc.join("ro.txt"), fs::Permissions::from_mode(0o444)).unwrap();
    let (src2, dst2) = (usrc.clone(), root.join("unpriv"));
    let rep = common::unprivileged(move || materialize(&src2, &dst2, &strict)).unwrap();
    assert_eq!(rep.by_method.reflink, 2);
    assert_same_tree(&usrc, &root.join("unpriv"));
    assert!(fully_shared(&root.join("unpriv/ro.txt")).unwrap());

    assert_eq!(
        leftovers(root, &["src", "strict", "far_auto", "usrc", "unpriv"]),
        Vec::<String>::new()
    );
}

/// Unmounts a filesystem mounted inside a test tree, even on failure.
struct Mount(std::path::PathBuf);
impl Drop for Mount {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.0).status();
    }
}

/// Probe once per tree, fall back per file: a tree on XFS with a tmpfs
/// mounted inside it. The probe (first file, on XFS) picks reflink; files
/// under the tmpfs get EXDEV from FICLONE and must fall back individually.
#[test]
fn per_file_fallback_inside_one_tree() {
    let Some(xfs) = xfs_or_skip() else { return };
    let root = xfs.path();
    let src = root.join("src");
    fs::create_dir_all(src.join("sub")).unwrap();
    fs::write(src.join("a_first.bin"), common::bytes(1, 50_000)).unwrap();
    fs::write(src.join("z_last.bin"), common::bytes(2, 50_000)).unwrap();
    let ok = Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=16m", "tmpfs"])
        .arg(src.join("sub"))
        .status()
        .map(|s| s.success())
        .unwrap_or(false);
    if !ok {
        eprintln!("skipping: cannot mount a tmpfs inside the tree");
        return;
    }
    let _guard = Mount(src.join("sub"));
    for i in 0..3 {
        fs::write(src.join(format!("sub/t{i}")), common::bytes(10 + i, 30_000)).unwrap();
    }
    let dst = root.join("dst");
    let rep = materialize(&src, &dst, &Options::default()).unwrap();
    assert_eq!(rep.probed_method, Some(FileMethod::Reflink));
    for rec in &rep.per_file {
        let on_tmpfs = rec.path.starts_with("sub");
        if on_tmpfs {
            assert_ne!(rec.method, FileMethod::Reflink, "{:?}", rec.path);
        } else {
            assert_eq!(rec.method, FileMethod::Reflink, "{:?}", rec.path);
        }
        assert_eq!(
            fs::read(src.join(&rec.path)).unwrap(),
            fs::read(dst.join(&rec.path)).unwrap()
        );
    }
    assert_eq!(rep.by_method.reflink, 2);
    assert_eq!(rep.files, 5);
}
