//! Materialization on whatever filesystem the temp dir is on (ext4 on the
//! dev machines, so this exercises the copy_file_range / copy fallbacks).
mod common;

use std::fs;
use std::os::unix::fs::{symlink, MetadataExt, PermissionsExt};
use std::path::Path;

use common::{assert_same_tree, leftovers, sample_tree};
use zygote_treeclone::{fs_type_name, materialize, Error, FileMethod, Method, Options};

fn with_method(method: Method) -> Options {
    Options {
        method,
        ..Options::default()
    }
}

fn reflink_capable(p: &Path) -> bool {
    matches!(fs_type_name(p).unwrap().as_str(), "xfs" | "btrfs")
}

#[test]
fn auto_on_default_fs_preserves_everything() {
    let t = tempfile::tempdir().unwrap();
    let src = sample_tree(&t.path().join("src"));
    let dst = t.path().join("dst");
    let rep = materialize(&src, &dst, &Options::default()).unwrap();
    assert_same_tree(&src, &dst);

    assert_eq!((rep.files, rep.dirs, rep.symlinks), (7, 7, 4));
    let total: u64 = [200_000u64, 70_000, 50, 4096, 10, 0, 1 << 20].iter().sum();
    assert_eq!(rep.bytes, total);
    assert_eq!(rep.per_file.len(), 7);
    let c = rep.by_method;
    assert_eq!(c.reflink + c.copy_file_range + c.copy, 7);
    assert_eq!(c.hardlink, 0);
    if !reflink_capable(t.path()) {
        // The probe must have fallen off the reflink rung, and every file
        // then started where the probe landed.
        assert_ne!(rep.probed_method, Some(FileMethod::Reflink));
        assert_eq!(c.reflink, 0);
    }
    // Symlinks are copied as symlinks, not followed.
    assert!(fs::symlink_metadata(dst.join("link_to_dir"))
        .unwrap()
        .file_type()
        .is_symlink());
    assert!(fs::symlink_metadata(dst.join("dangling"))
        .unwrap()
        .file_type()
        .is_symlink());
    assert_eq!(leftovers(t.path(), &["src", "dst"]), Vec::<String>::new());

    let json = serde_json::to_value(&rep).unwrap();
    assert_eq!(json["files"], 7);
    assert_eq!(json["requested_method"], "auto");
    assert_eq!(json["per_file"].as_array().unwrap().len(), 7);
}

#[test]
fn copy_method_uses_userspace_copy_for_every_file() {
    let t = tempfile::tempdir().unwrap();
    let src = sample_tree(&t.path().join("src"));
    let dst = t.path().join("dst");
    let rep = materialize(&src, &dst, &with_method(Method::Copy)).unwrap();
    assert_same_tree(&src, &dst);
    assert_eq!(rep.by_method.copy, 7);
    assert!(rep.per_file.iter().all(|f| f.method == FileMethod::Copy));
    assert_eq!(rep.probed_method, None);
}

#[test]
fn many_files_with_explicit_parallelism() {
    let t = tempfile::tempdir().unwrap();
    let src = t.path().join("src");
    for i in 0..300 {
        let p = src.join(format!("d{}/f{i}", i % 7));
        fs::create_dir_all(p.parent().unwrap()).unwrap();
        fs::write(&p, common::bytes(i, 1000 + i as usize * 37)).unwrap();
    }
    let dst = t.path().join("dst");
    let opts = Options {
        threads: 4,
        ..Options::default()
    };
    let rep = materialize(&src, &dst, &opts).unwrap();
    assert_eq!(rep.threads, 4);
    assert_eq!(rep.files, 300);
    assert_same_tree(&src, &dst);
}

#[test]
fn reflink_required_fails_cleanly_where_unsupported() {
    let t = tempfile::tempdir().unwrap();
    if reflink_capable(t.path()) {
        eprintln!("skipping: the temp dir's filesystem supports reflink");
        return;
    }
    let src = sample_tree(&t.path().join("src"));
    let dst = t.path().join("dst");
    let err = materialize(&src, &dst, &with_method(Method::Reflink)).unwrap_err();
    assert!(matches!(err, Error::ReflinkUnsupported { .. }), "{err}");
    assert!(!dst.exists());
    assert_eq!(leftovers(t.path(), &["src"]), Vec::<String>::new());
}

#[test]
fn symlink_escapes_are_refused_and_leave_nothing() {
    let cases: [(&str, &str); 5] = [
        ("abs", "/etc/passwd"),
        ("up", "../outside"),
        ("a/b/sneaky", "../../../x"),
        ("a/b/lexical_ok_but_climbs", "c/../../../.."),
        // a/up -> .. is the root (fine), but a/up/.. is the root's parent.
        ("through_link", "a/up/.."),
    ];
    for (rel, target) in cases {
        let t = tempfile::tempdir().unwrap();
        let src = sample_tree(&t.path().join("src"));
        symlink("..", src.join("a/up")).unwrap();
        symlink(target, src.join(rel)).unwrap();
        let dst = t.path().join("dst");
        let err = materialize(&src, &dst, &Options::default()).unwrap_err();
        match &err {
            Error::SymlinkEscape {
                path, target: tgt, ..
            } => {
                assert_eq!(path, &src.join(rel));
                assert_eq!(tgt, Path::new(target));
            }
            other => panic!("{rel} -> {target}: expected SymlinkEscape, got {other}"),
        }
        // The message names the offending link.
        assert!(err.to_string().contains(rel), "{err}");
        assert!(!dst.exists());
        assert_eq!(leftovers(t.path(), &["src"]), Vec::<String>::new());
    }
}

#[test]
fn existing_destination_is_refused_and_untouched() {
    let t = tempfile::tempdir().unwrap();
    let src = sample_tree(&t.path().join("src"));
    // An empty directory: plain rename(2) would silently replace this one.
    let dst = t.path().join("dst");
    fs::create_dir(&dst).unwrap();
    let err = materialize(&src, &dst, &Options::default()).unwrap_err();
    assert!(matches!(err, Error::DestinationExists { .. }), "{err}");
    assert_eq!(fs::read_dir(&dst).unwrap().count(), 0);
    // A file, and a dangling symlink, count as existing too.
    let f = t.path().join("file");
    fs::write(&f, b"keep").unwrap();
    assert!(matches!(
        materialize(&src, &f, &Options::default()),
        Err(Error::DestinationExists { .. })
    ));
    assert_eq!(fs::read(&f).unwrap(), b"keep");
    let l = t.path().join("dangling");
    symlink("nowhere", &l).unwrap();
    assert!(matches!(
        materialize(&src, &l, &Options::default()),
        Err(Error::DestinationExists { .. })
    ));
    assert_eq!(
        leftovers(t.path(), &["src", "dst", "file", "dangling"]),
        Vec::<String>::new()
    );
}

#[test]
fn destination_inside_source_is_refused() {
    let t = tempfile::tempdir().unwrap();
    let src = sample_tree(&t.path().join("src"));
    let err = materialize(&src, &src.join("a/clone"), &Options::default()).unwrap_err();
    assert!(
        matches!(err, Error::DestinationInsideSource { .. }),
        "{err}"
    );
    assert!(!src.join("a/clone").exists());
}

#[test]
fn special_files_are_refused() {
    let t = tempfile::tempdir().unwrap();
    let src = sample_tree(&t.path().join("src"));
    let fifo = src.join("a/pipe");
    let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
    // SAFETY: valid NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o644) }, 0);
    let dst = t.path().join("dst");
    let err = materialize(&src, &dst, &Options::default()).unwrap_err();
    match err {
        Error::UnsupportedFileType { path, kind } => {
            assert_eq!(path, fifo);
            assert_eq!(kind, "fifo");
        }
        other => panic!("expected UnsupportedFileType, got {other}"),
    }
    assert!(!dst.exists());
    assert_eq!(leftovers(t.path(), &["src"]), Vec::<String>::new());
}

/// A file we cannot read, in the middle of a tree whose other files are
/// being copied by several workers: the error names it, and neither the
/// destination nor the staging directory survives.
///
/// Root reads everything, so this runs without root's privileges (see
/// `common::unprivileged`).
#[test]
fn unreadable_file_mid_tree_leaves_nothing_behind() {
    let t = tempfile::tempdir().unwrap();
    fs::set_permissions(t.path(), fs::Permissions::from_mode(0o777)).unwrap();
    let src = t.path().join("src");
    fs::create_dir(&src).unwrap();
    for i in 0..120 {
        fs::write(src.join(format!("f{i:03}")), common::bytes(i, 20_000)).unwrap();
    }
    let secret = src.join("f060_secret");
    fs::write(&secret, b"no").unwrap();
    fs::set_permissions(&secret, fs::Permissions::from_mode(0o000)).unwrap();
    let out = t.path().join("out");
    fs::create_dir(&out).unwrap();
    fs::set_permissions(&out, fs::Permissions::from_mode(0o777)).unwrap();
    let dst = out.join("dst");

    let (src2, dst2) = (src.clone(), dst.clone());
    let result = common::unprivileged(move || {
        let opts = Options {
            threads: 2,
            ..Options::default()
        };
        materialize(&src2, &dst2, &opts)
    });
    let err = result.unwrap_err();
    match &err {
        Error::Io { op, path, source } => {
            assert_eq!(*op, "open for reading");
            assert_eq!(path, &secret);
            assert_eq!(source.raw_os_error(), Some(libc::EACCES));
        }
        other => panic!("expected an Io error on the secret file, got {other}"),
    }
    assert!(err.to_string().contains("f060_secret"), "{err}");
    assert!(!dst.exists());
    assert_eq!(leftovers(&out, &[]), Vec::<String>::new());
    // The source is untouched.
    assert_eq!(fs::read_dir(&src).unwrap().count(), 121);
}

/// The documented way to write into a clone of a read-only file, and the
/// owner_writable shortcut; either way the source must not change.
#[test]
fn clone_of_readonly_source_is_writable_without_touching_source() {
    let t = tempfile::tempdir().unwrap();
    let src = sample_tree(&t.path().join("src"));
    let ro = Path::new("modes/readonly.txt");
    let original = fs::read(src.join(ro)).unwrap();

    let dst = t.path().join("dst");
    materialize(&src, &dst, &Options::default()).unwrap();
    let f = dst.join(ro);
    assert_eq!(fs::metadata(&f).unwrap().mode() & 0o777, 0o444);
    // We own the clone, so chmod u+w is always allowed.
    assert_eq!(fs::metadata(&f).unwrap().uid(), unsafe { libc::geteuid() });
    fs::set_permissions(&f, fs::Permissions::from_mode(0o644)).unwrap();
    fs::write(&f, b"changed in the clone").unwrap();
    assert_eq!(fs::read(src.join(ro)).unwrap(), original);
    assert_eq!(fs::metadata(src.join(ro)).unwrap().mode() & 0o777, 0o444);

    let dst2 = t.path().join("dst2");
    let opts = Options {
        owner_writable: true,
        ..Options::default()
    };
    materialize(&src, &dst2, &opts).unwrap();
    let f2 = dst2.join(ro);
    assert_eq!(fs::metadata(&f2).unwrap().mode() & 0o777, 0o644);
    assert_eq!(
        fs::metadata(dst2.join("modes")).unwrap().mode() & 0o7777,
        0o2750
    );
    fs::write(&f2, b"also changed").unwrap();
    assert_eq!(fs::read(src.join(ro)).unwrap(), original);
}

#[test]
fn hardlink_mode_shares_inodes_so_is_for_readers_only() {
    let t = tempfile::tempdir().unwrap();
    let src = sample_tree(&t.path().join("src"));
    let dst = t.path().join("dst");
    let rep = materialize(&src, &dst, &with_method(Method::Hardlink)).unwrap();
    assert_eq!(rep.by_method.hardlink, 7);
    assert_same_tree(&src, &dst);
    let (a, b) = (src.join("top.bin"), dst.join("top.bin"));
    assert_eq!(
        fs::metadata(&a).unwrap().ino(),
        fs::metadata(&b).unwrap().ino()
    );
    // Directories and symlinks are still new inodes.
    assert_ne!(
        fs::metadata(src.join("a")).unwrap().ino(),
        fs::metadata(dst.join("a")).unwrap().ino()
    );
    // The documented hazard: writing through the "clone" changes the source.
    fs::write(&b, b"oops").unwrap();
    assert_eq!(fs::read(&a).unwrap(), b"oops");

    let err = materialize(
        &src,
        &t.path().join("dst2"),
        &Options {
            method: Method::Hardlink,
            owner_writable: true,
            ..Options::default()
        },
    )
    .unwrap_err();
    assert!(matches!(err, Error::InvalidOptions(_)), "{err}");
}

fn set_xattr(p: &Path, name: &str, value: &[u8]) -> std::io::Result<()> {
    let (cp, cn) = (
        std::ffi::CString::new(p.to_str().unwrap()).unwrap(),
        std::ffi::CString::new(name).unwrap(),
    );
    // SAFETY: NUL-terminated strings and a readable value buffer.
    let rc = unsafe {
        libc::setxattr(
            cp.as_ptr(),
            cn.as_ptr(),
            value.as_ptr().cast(),
            value.len(),
            0,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

fn get_xattr(p: &Path, name: &str) -> Option<Vec<u8>> {
    let (cp, cn) = (
        std::ffi::CString::new(p.to_str().unwrap()).unwrap(),
        std::ffi::CString::new(name).unwrap(),
    );
    let mut buf = vec![0u8; 256];
    // SAFETY: buf is writable for its length.
    let n = unsafe { libc::getxattr(cp.as_ptr(), cn.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
    (n >= 0).then(|| buf[..n as usize].to_vec())
}

#[test]
fn user_xattrs_are_copied_only_when_asked() {
    let t = tempfile::tempdir().unwrap();
    let src = sample_tree(&t.path().join("src"));
    if let Err(e) = set_xattr(&src.join("top.bin"), "user.origin", b"agent-7") {
        eprintln!("skipping: user xattrs unsupported here: {e}");
        return;
    }
    // Non-root owners need write permission to set xattrs on a 0444 file.
    let ro = src.join("modes/readonly.txt");
    fs::set_permissions(&ro, fs::Permissions::from_mode(0o644)).unwrap();
    set_xattr(&ro, "user.k", b"v").unwrap();
    fs::set_permissions(&ro, fs::Permissions::from_mode(0o444)).unwrap();
    set_xattr(&src.join("a/b"), "user.dir", b"yes").unwrap();
    let with = t.path().join("with");
    let opts = Options {
        preserve_xattrs: true,
        ..Options::default()
    };
    materialize(&src, &with, &opts).unwrap();
    assert_eq!(
        get_xattr(&with.join("top.bin"), "user.origin").as_deref(),
        Some(&b"agent-7"[..])
    );
    assert_eq!(
        get_xattr(&with.join("modes/readonly.txt"), "user.k").as_deref(),
        Some(&b"v"[..])
    );
    assert_eq!(
        get_xattr(&with.join("a/b"), "user.dir").as_deref(),
        Some(&b"yes"[..])
    );
    assert_same_tree(&src, &with);

    let without = t.path().join("without");
    materialize(&src, &without, &Options::default()).unwrap();
    assert_eq!(get_xattr(&without.join("top.bin"), "user.origin"), None);
}

/// Without DAC override: read-only files and directories are cloned with
/// their modes (files are created straight at 0444, directories get 0555
/// only at the end), with every method and with xattrs, and the caller can
/// then chmod and write the clone; the source never changes.
#[test]
fn unprivileged_clone_of_read_only_entries() {
    let t = tempfile::tempdir().unwrap();
    fs::set_permissions(t.path(), fs::Permissions::from_mode(0o777)).unwrap();
    let src = t.path().join("src");
    fs::create_dir_all(src.join("ro_dir/inner")).unwrap();
    fs::write(src.join("ro_dir/inner/data"), common::bytes(9, 100_000)).unwrap();
    fs::write(src.join("ro_dir/script"), b"#!/bin/sh\n").unwrap();
    fs::write(src.join("plain"), b"plain").unwrap();
    for (rel, mode) in [
        ("ro_dir/inner/data", 0o444),
        ("ro_dir/script", 0o555),
        ("plain", 0o644),
        ("ro_dir/inner", 0o555),
        ("ro_dir", 0o555),
    ] {
        fs::set_permissions(src.join(rel), fs::Permissions::from_mode(mode)).unwrap();
    }
    let xattrs = set_xattr(&src.join("plain"), "user.k", b"v").is_ok();
    let out = t.path().join("out");
    fs::create_dir(&out).unwrap();
    fs::set_permissions(&out, fs::Permissions::from_mode(0o777)).unwrap();
    let before = common::snapshot(&src);

    let (src2, out2) = (src.clone(), out.clone());
    common::unprivileged(move || {
        for (name, method, preserve_xattrs) in [
            ("auto", Method::Auto, false),
            ("copy", Method::Copy, false),
            ("auto_xattrs", Method::Auto, xattrs),
        ] {
            let dst = out2.join(name);
            let opts = Options {
                method,
                preserve_xattrs,
                ..Options::default()
            };
            materialize(&src2, &dst, &opts).unwrap_or_else(|e| panic!("{name}: {e}"));
            assert_same_tree(&src2, &dst);
            if preserve_xattrs {
                assert_eq!(
                    get_xattr(&dst.join("plain"), "user.k").as_deref(),
                    Some(&b"v"[..])
                );
            }
            // Writing needs the documented chmod first: the clone is 0444
            // in a 0555 directory, and we are not root here.
            let data = dst.join("ro_dir/inner/data");
            assert!(
                fs::write(&data, b"x").is_err(),
                "{name}: clone should be read-only"
            );
            for d in ["ro_dir", "ro_dir/inner"] {
                fs::set_permissions(dst.join(d), fs::Permissions::from_mode(0o755)).unwrap();
            }
            fs::set_permissions(&data, fs::Permissions::from_mode(0o644)).unwrap();
            fs::write(&data, b"written by the consumer").unwrap();
            fs::write(dst.join("ro_dir/new_file"), b"new").unwrap();
        }
    });
    assert_eq!(common::snapshot(&src), before, "source changed");
}

#[test]
fn ownership_is_kept_only_when_asked() {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("skipping: chown to other users needs root");
        return;
    }
    let t = tempfile::tempdir().unwrap();
    let src = sample_tree(&t.path().join("src"));
    for rel in ["top.bin", "a/b", "a/link_to_file"] {
        std::os::unix::fs::lchown(src.join(rel), Some(4321), Some(8765)).unwrap();
    }
    let with = t.path().join("with");
    let opts = Options {
        preserve_owner: true,
        ..Options::default()
    };
    materialize(&src, &with, &opts).unwrap();
    assert_same_tree(&src, &with);
    for rel in ["top.bin", "a/b", "a/link_to_file"] {
        let m = fs::symlink_metadata(with.join(rel)).unwrap();
        assert_eq!((m.uid(), m.gid()), (4321, 8765), "{rel}");
    }
    let without = t.path().join("without");
    materialize(&src, &without, &Options::default()).unwrap();
    assert_eq!(fs::metadata(without.join("top.bin")).unwrap().uid(), 0);
}
