//! Whole-tree methods (btrfs subvolume snapshots, overlayfs) beside the
//! per-file ones, on btrfs and XFS made by the test on loop devices.
//! Skipped (with a printed reason) when not root, or loop devices, mkfs or
//! overlayfs are missing.
mod common;

use std::collections::BTreeMap;
use std::ffi::CString;
use std::fs::{self, File, FileTimes};
use std::io;
use std::os::unix::fs::{symlink, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, SystemTime};

use common::{leftovers, snapshot, Node};
use zygote_treeclone::btrfs::is_subvolume;
use zygote_treeclone::loopfs::{btrfs_availability, xfs_availability, LoopFs, LoopFsKind};
use zygote_treeclone::{
    materialize, materialize_owned, overlay_availability, probe_methods, remove, seal, sealed,
    Error, Method, Options, Report, Strategy as S, Validation,
};
use LoopFsKind::{Btrfs, Xfs};
use Method::{Auto, Copy, Overlay, Reflink, Subvolume};
use Validation::{Scanned, Sealed};

#[path = "whole/support.rs"]
mod support;
use support::*;

#[test]
fn every_method_on_btrfs_and_xfs_clones_faithfully_and_isolates_both_ways() {
    on_each(&[Btrfs, Xfs], |kind, root| {
        let sealed = sealed_tree(root);
        let plain = |n: &str| rich_tree(&root.join(format!("src-{n}")));
        let mut cases = vec![
            ("reflink", plain("r"), Reflink, S::PerFile),
            ("reflink_of_sealed", sealed.clone(), Reflink, S::PerFile),
            ("copy", plain("c"), Copy, S::PerFile),
            ("auto_of_plain_dir", plain("a"), Auto, S::PerFile),
        ];
        let mut sources = vec!["raw", "sealed", "src-r", "src-c", "src-a"];
        if kind == Btrfs {
            let subvol = |n: &str| rich_tree(&subvolume_at(&root.join(format!("subvol-{n}"))));
            cases.push(("snap_of_sealed", sealed.clone(), Subvolume, S::Subvolume));
            cases.push(("snap_of_subvol", subvol("s"), Subvolume, S::Subvolume));
            cases.push(("auto_of_subvol", subvol("a"), Auto, S::Subvolume));
            cases.push(("auto_of_sealed", sealed.clone(), Auto, S::Subvolume));
            sources.extend(["subvol-s", "subvol-a"]);
        }
        if have_overlay() {
            cases.push(("overlay_of_sealed", sealed.clone(), Overlay, S::Overlay));
            if kind == Xfs {
                cases.push(("auto_of_sealed", sealed.clone(), Auto, S::Overlay));
            }
        }
        for (name, src, method, strategy) in cases {
            check_clone(root, name, &src, method, strategy);
        }
        assert_eq!(leftovers(root, &sources), NONE, "{kind:?}");
    });
}

#[test]
fn sealing_makes_a_read_only_subvolume_on_btrfs_and_a_marked_dir_on_xfs() {
    on_each(&[Btrfs, Xfs], |kind, root| {
        let raw = rich_tree(&root.join("raw"));
        let dst = root.join("sealed");
        let r = seal(&raw, &dst, &keeping_xattrs()).unwrap();
        let subvol = kind == Btrfs;
        let strategy = if subvol { S::Subvolume } else { S::PerFile };
        assert_eq!((how(&r), is_subvolume(&dst)), ((strategy, Scanned), subvol));
        let info = sealed(&dst).expect("a sealed tree is recognised");
        let (raw_state, state) = (State::of(&raw), State::of(&dst));
        let counts = (info.files, info.dirs, info.symlinks, info.bytes);
        assert_eq!(counts, raw_state.counts());
        raw_state.assert_same_tree(&state, "sealed");
        assert_eq!(state.xattrs, raw_state.xattrs);
        // Sealing copies per file: the two names become two files.
        assert!(raw_state.linked && !state.linked);
        if subvol {
            // The filesystem keeps the checked tree as it was, even for root.
            let erofs =
                |r: io::Result<()>| assert_eq!(r.unwrap_err().raw_os_error(), Some(libc::EROFS));
            erofs(fs::write(dst.join("top.txt"), b"x"));
            erofs(fs::write(dst.join("new"), b"x"));
            erofs(fs::create_dir(dst.join("newdir")));
            erofs(fs::remove_file(dst.join("b/victim")));
            let mode = fs::Permissions::from_mode(0o777);
            erofs(fs::set_permissions(dst.join("a"), mode));
            erofs(set_xattr(&dst.join("a"), "user.dir", b"x"));
            assert_unchanged(&state, &dst, "sealed subvolume");
        }
        assert_eq!(leftovers(root, &["raw", "sealed"]), NONE);
    });
}

#[test]
fn clone_of_a_clone_snapshot_is_scanned_and_overlay_falls_back_to_per_file() {
    on_each(&[Btrfs], |_, root| {
        let sealed = sealed_tree(root);
        // A writable snapshot of the sealed tree is not sealed: a snapshot of
        // it must be scanned.
        let (first, second) = (root.join("first"), root.join("second"));
        materialize(&sealed, &first, &with(Subvolume)).unwrap();
        let r = materialize(&first, &second, &Options::default()).unwrap();
        assert_eq!(how(&r), (S::Subvolume, Scanned));
        let both_ways = |a: &Path, b: &Path| {
            State::of(a).assert_same_tree(&State::of(b), "clone of clone");
            let before = State::of(a);
            mutate(b, b"b");
            assert_unchanged(&before, a, "b -> a");
            let before = State::of(b);
            mutate(a, b"a");
            assert_unchanged(&before, b, "a -> b");
        };
        both_ways(&first, &second);
        if !have_overlay() {
            return;
        }
        let ovl = materialize_owned(&sealed, &root.join("ovl"), &with(Overlay)).unwrap();
        let out = root.join("out");
        fs::create_dir(&out).unwrap();
        // Not sealed (overlayfs forbids changing a mounted lower tree)...
        let err = materialize(ovl.path(), &out.join("x"), &with(Overlay)).unwrap_err();
        assert!(matches!(err, Error::NotSealed { .. }), "{err}");
        assert_eq!(leftovers(&out, &NONE), NONE);
        // ...so Auto copies it per file.
        let r = materialize(ovl.path(), &out.join("copy"), &Options::default()).unwrap();
        assert_eq!(how(&r), (S::PerFile, Scanned));
        both_ways(ovl.path(), &out.join("copy"));
        assert_eq!(leftovers(&out, &["copy"]), NONE);
    });
}

/// Entries no tree may hold: (name in `a/`, symlink target or "" for a FIFO).
const BAD: [(&str, &str); 3] = [("abs", "/etc/passwd"), ("up", "../.."), ("pipe", "")];

fn add_bad_entry(root: &Path, (name, target): (&str, &str)) -> PathBuf {
    fs::create_dir_all(root.join("a")).unwrap();
    fs::write(root.join("a/ok.txt"), b"fine").unwrap();
    let p = root.join("a").join(name);
    if target.is_empty() {
        // SAFETY: a NUL-terminated path.
        let rc = unsafe { libc::mkfifo(cstr(p.to_str().unwrap()).as_ptr(), 0o644) };
        assert_eq!(rc, 0);
    } else {
        symlink(target, &p).unwrap();
    }
    root.to_path_buf()
}

fn assert_refused(err: &Error, (name, target): (&str, &str)) {
    let ok = match err {
        Error::SymlinkEscape {
            path, target: t, ..
        } => path.ends_with(name) && t == Path::new(target),
        Error::UnsupportedFileType { path, kind } => path.ends_with(name) && *kind == "fifo",
        _ => false,
    };
    assert!(ok, "{name}: wrong refusal: {err}");
}

#[test]
fn bad_entries_are_refused_by_seal_auto_and_subvolume_leaving_nothing() {
    on_each(&[Btrfs, Xfs], |kind, root| {
        for (i, bad) in BAD.into_iter().enumerate() {
            let dir = root.join(format!("seal{i}"));
            let src = add_bad_entry(&dir.join("src"), bad);
            let err = seal(&src, &dir.join("sealed"), &Options::default()).unwrap_err();
            assert_refused(&err, bad);
            assert_eq!(leftovers(&dir, &["src"]), NONE, "{kind:?} {bad:?}");
            if kind == Xfs {
                continue;
            }
            // An unsealed subvolume is snapshotted, and the snapshot scanned.
            let src = add_bad_entry(&subvolume_at(&root.join(format!("subvol{i}"))), bad);
            for method in [Auto, Subvolume] {
                let out = root.join(format!("out{i}-{method:?}"));
                fs::create_dir(&out).unwrap();
                let err = materialize(&src, &out.join("dst"), &with(method)).unwrap_err();
                assert_refused(&err, bad);
                assert_eq!(leftovers(&out, &NONE), NONE, "{bad:?} {method:?}");
            }
        }
    });
}

#[test]
fn whole_tree_methods_refuse_a_wrong_source_or_existing_destination_leaving_nothing() {
    on_each(&[Btrfs, Xfs], |kind, root| {
        let sealed = sealed_tree(root);
        let plain = rich_tree(&root.join("plain"));
        let mut cases = vec![(plain.clone(), Overlay), (plain, Subvolume)];
        if kind == Btrfs {
            cases.push((rich_tree(&subvolume_at(&root.join("subvol"))), Overlay));
        } else {
            // On XFS a sealed tree is a plain directory.
            cases.push((sealed.clone(), Subvolume));
        }
        for (i, (src, method)) in cases.iter().enumerate() {
            let (out, what) = (root.join(format!("out{i}")), format!("{kind:?} {method:?}"));
            fs::create_dir(&out).unwrap();
            match (method, materialize(src, &out.join("dst"), &with(*method))) {
                (Overlay, Err(Error::NotSealed { path }))
                | (Subvolume, Err(Error::NotASubvolume { path })) => assert_eq!(&path, src),
                (_, r) => panic!("{what} {src:?}: {r:?}"),
            }
            assert!(gone(&out.join("dst")), "{what}");
            assert_eq!(leftovers(&out, &NONE), NONE, "{what}");
        }
        // An existing destination is refused, and left as it was.
        let (out, dst) = (root.join("out"), root.join("out/dst"));
        fs::create_dir_all(&dst).unwrap();
        fs::write(dst.join("keep"), b"mine").unwrap();
        let mut methods = vec![Auto];
        methods.extend((kind == Btrfs).then_some(Subvolume));
        methods.extend(have_overlay().then_some(Overlay));
        for method in methods {
            let err = materialize(&sealed, &dst, &with(method)).unwrap_err();
            assert!(matches!(err, Error::DestinationExists { .. }), "{err}");
            assert_eq!(leftovers(&dst, &NONE), ["keep"]);
            assert_eq!(fs::read(dst.join("keep")).unwrap(), b"mine");
            assert!(!mounted(&dst) && !is_subvolume(&dst));
            assert_eq!(leftovers(&out, &["dst"]), NONE, "{method:?}");
        }
        if kind == Btrfs {
            let subvol = root.join("subvol");
            for method in [Auto, Subvolume] {
                let err = materialize(&subvol, &dst, &with(method)).unwrap_err();
                assert!(matches!(err, Error::DestinationExists { .. }), "{err}");
            }
            assert_eq!(leftovers(&out, &["dst"]), NONE);
            assert_eq!(leftovers(&dst, &NONE), ["keep"]);
        }
    });
}

#[test]
fn owned_trees_of_every_strategy_are_removed_on_drop_unless_kept() {
    on_each(&[Btrfs, Xfs], |kind, root| {
        let sealed = sealed_tree(root);
        let out = root.join("out");
        fs::create_dir(&out).unwrap();
        let mut cases = vec![("copy", Copy, S::PerFile)];
        if kind == Btrfs {
            cases.push(("snap", Subvolume, S::Subvolume));
        }
        if have_overlay() {
            cases.push(("ovl", Overlay, S::Overlay));
        }
        for (name, method, strategy) in cases {
            let dst = out.join(name);
            let tree = materialize_owned(&sealed, &dst, &with(method)).unwrap();
            assert_eq!(tree.report().strategy, strategy);
            assert!(tree.path() == dst && dst.join("top.txt").is_file());
            let upper = overlay_state(&dst).join("upper");
            assert_eq!([mounted(&dst), upper.is_dir()], [strategy == S::Overlay; 2]);
            assert_eq!(is_subvolume(&dst), strategy == S::Subvolume);
            // Even with a file open in it (an overlay is then detached lazily).
            let open = File::open(dst.join("top.txt")).unwrap();
            drop(tree);
            assert!(gone(&dst), "{name}");
            drop(open);
            // Kept, it outlives its handle until remove(), which is idempotent.
            let kept = materialize_owned(&sealed, &dst, &with(method)).unwrap();
            assert_eq!(kept.keep().strategy, strategy);
            assert!(dst.join("top.txt").is_file());
            remove(&dst).unwrap();
            assert!(gone(&dst), "{name}");
            remove(&dst).unwrap();
            assert_eq!(leftovers(&out, &NONE), NONE, "{name}");
        }
        // remove() also deletes sealed trees (a read-only subvolume on btrfs).
        for p in ["sealed", "raw", "out", "never-existed"].map(|n| root.join(n)) {
            remove(&p).unwrap_or_else(|e| panic!("{p:?}: {e}"));
            assert!(!p.exists(), "{p:?}");
        }
        assert_eq!(leftovers(root, &NONE), NONE, "{kind:?}");
    });
}

#[test]
fn copies_and_clones_of_a_sealed_tree_are_not_sealed() {
    on_each(&[Btrfs, Xfs], |kind, root| {
        let sealed_path = sealed_tree(root);
        assert!(sealed(&sealed_path).is_some() && get_xattr(&sealed_path, MARK).is_some());
        let mut clones = vec![("copy_with_xattrs", keeping_xattrs())];
        if kind == Btrfs {
            clones.push(("snapshot", with(Subvolume)));
        }
        if have_overlay() {
            clones.push(("overlay", with(Overlay)));
        }
        for (name, opts) in clones {
            let dst = root.join(name);
            let t = materialize_owned(&sealed_path, &dst, &opts).unwrap();
            assert_eq!(sealed(&dst), None, "{kind:?} {name}");
            assert_eq!(get_xattr(&dst, MARK), None, "{kind:?} {name}: mark kept");
            assert_eq!(get_xattr(&dst.join("a"), "user.dir"), Some(b"a".to_vec()));
            t.remove().unwrap();
        }
        assert!(sealed(&sealed_path).is_some(), "{kind:?}: unsealed");
    });
}

#[test]
fn probe_methods_offers_subvolume_on_btrfs_but_not_on_xfs() {
    on_each(&[Btrfs, Xfs], |kind, root| {
        let got = probe_methods(root);
        let find = |m: &str| got.iter().find(|s| s.method == m).unwrap();
        let sub = find("subvolume");
        assert_eq!(sub.available, kind == Btrfs, "{sub:?}");
        if kind == Xfs {
            assert_eq!(sub.detail, "xfs, not btrfs");
        }
        assert!(find("reflink").available, "{got:?}");
        let overlay = overlay_availability().is_ok();
        assert_eq!(find("overlay").available, overlay, "{got:?}");
        assert_eq!(leftovers(root, &NONE), NONE, "{kind:?}: probe leftovers");
    });
}

/// Run `f` as `nobody` on a thread of its own. The raw setres[ug]id
/// syscalls change only that thread's credentials (glibc's wrappers would
/// change the whole test process), and leaving uid 0 drops its capabilities.
fn as_nobody<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
    let thread = std::thread::spawn(move || {
        // SAFETY: these syscalls change only the calling thread's credentials.
        unsafe {
            if libc::geteuid() == 0 {
                let no_groups = std::ptr::null::<libc::gid_t>();
                assert_eq!(libc::syscall(libc::SYS_setgroups, 0, no_groups), 0);
                assert_eq!(libc::syscall(libc::SYS_setresgid, 65534, 65534, 65534), 0);
                assert_eq!(libc::syscall(libc::SYS_setresuid, 65534, 65534, 65534), 0);
            }
            assert_ne!(libc::geteuid(), 0);
        }
        f()
    });
    thread.join().unwrap()
}

#[test]
fn overlay_is_refused_without_root_and_auto_then_copies_per_file() {
    let t = tempfile::tempdir().unwrap();
    chmod(t.path(), 0o777);
    let dir = t.path().to_path_buf();
    as_nobody(move || {
        let src = dir.join("src");
        fs::create_dir(&src).unwrap();
        fs::write(src.join("f"), b"data").unwrap();
        let sealed_path = dir.join("sealed");
        match seal(&src, &sealed_path, &Options::default()) {
            Err(Error::Io { source, .. }) if source.raw_os_error() == Some(libc::EOPNOTSUPP) => {
                return eprintln!("skipping: no user xattrs on {}", dir.display());
            }
            r => assert!(r.is_ok(), "{r:?}"),
        }
        // Sealed by non-root: marked with user.*, which non-root trusts.
        assert!(sealed(&sealed_path).is_some());
        let dst = dir.join("dst");
        match materialize(&sealed_path, &dst, &with(Overlay)) {
            Err(Error::MethodUnavailable { method, reason }) => {
                assert!(method == "overlay" && reason.contains("root"), "{reason}")
            }
            r => panic!("expected MethodUnavailable, got {r:?}"),
        }
        assert_eq!(leftovers(&dir, &["src", "sealed"]), NONE);
        let r = materialize(&sealed_path, &dst, &Options::default()).unwrap();
        assert_eq!(r.strategy, S::PerFile);
        assert_eq!(fs::read(dst.join("f")).unwrap(), b"data");
    });
}

/// An overlay mount's root takes its attributes from the upper directory, so
/// that one has to be made to look like the source's root.
#[test]
fn overlay_clone_root_keeps_the_source_roots_attributes() {
    on_each(&[Xfs], |_, root| {
        let raw = rich_tree(&root.join("raw"));
        set_xattr(&raw, "user.root", b"r").unwrap();
        stamp_dirs(&raw, 1_500_000_000);
        let sealed_path = root.join("sealed");
        seal(&raw, &sealed_path, &keeping_xattrs()).unwrap();
        let t = materialize_owned(&sealed_path, &root.join("ovl"), &with(Overlay)).unwrap();
        let attrs = |p: &Path| {
            let m = fs::metadata(p).unwrap();
            let xattr = get_xattr(p, "user.root");
            (m.mode(), m.mtime(), m.mtime_nsec(), m.uid(), m.gid(), xattr)
        };
        assert_eq!(attrs(t.path()), attrs(&sealed_path));
    });
}

/// A refusal should name the offending entry of the source, not of the
/// hidden snapshot that was scanned (and is deleted by the time the caller
/// reads the error).
#[test]
fn subvolume_refusal_names_the_source_entry() {
    on_each(&[Btrfs], |_, root| {
        let src = add_bad_entry(&subvolume_at(&root.join("src")), BAD[0]);
        match materialize(&src, &root.join("dst"), &with(Subvolume)) {
            Err(Error::SymlinkEscape { path, .. }) => assert_eq!(path, src.join("a/abs")),
            r => panic!("expected SymlinkEscape, got {r:?}"),
        }
    });
}
