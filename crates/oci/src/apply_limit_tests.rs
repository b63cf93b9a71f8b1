//! The applier against layers aimed outside the tree or at the host's disk: whiteouts
//! that name no entry, decompression bombs, GNU sparse entries, and each bound of
//! `budget.rs` with the error that names it.
use std::io::{Read, Seek, SeekFrom};
use std::os::unix::fs::MetadataExt;

use zygote_images::space::free_bytes;

use super::tests::{apply_all, test_limits, tree, TarLayer};
use super::*;

/// Bytes allocated by everything under `dir`.
fn allocated(dir: &Path) -> u64 {
    let mut total = 0;
    for entry in std::fs::read_dir(dir).unwrap() {
        let m = entry.as_ref().unwrap().metadata().unwrap();
        total += m.blocks() * 512;
        if m.is_dir() {
            total += allocated(&entry.unwrap().path());
        }
    }
    total
}

fn gzip(data: &[u8]) -> Vec<u8> {
    let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
    std::io::Write::write_all(&mut e, data).unwrap();
    e.finish().unwrap()
}

/// A layer blob on disk.
fn blob(bytes: &[u8]) -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("blob");
    std::fs::write(&path, bytes).unwrap();
    (dir, path)
}

/// A layer of `files` files of `size` bytes of 0x5a each, streamed (never in memory).
fn filled_layer(files: usize, size: u64) -> impl Read {
    let mut stream: Box<dyn Read> = Box::new(io::empty());
    for i in 0..files {
        let mut h = TarLayer::header(format!("f{i}").as_bytes(), EntryType::Regular, 0o644, size);
        h.set_cksum();
        let pad = (512 - size % 512) % 512;
        stream = Box::new(
            stream
                .chain(io::Cursor::new(h.as_bytes().to_vec()))
                .chain(io::repeat(0x5a).take(size))
                .chain(io::repeat(0).take(pad)),
        );
    }
    stream.chain(io::repeat(0).take(1024))
}

/// The error (and its message) applying [`filled_layer`] to `root` ends with.
fn fill_refused(root: &Path, limits: Limits, files: usize, size: u64) -> (OciError, String) {
    let mut a = Applier::new(root, Ownership::for_this_process(), limits).unwrap();
    let err = a
        .apply(0, "sha256:fill", filled_layer(files, size))
        .unwrap_err();
    let msg = err.to_string();
    (err, msg)
}

#[test]
fn whiteouts_that_name_no_entry_are_refused_and_touch_nothing() {
    for name in [".wh...", "d/.wh...", ".wh..", "d/.wh..", "d/.wh.", ".wh."] {
        let t = tree();
        // Other builds' and pulls' work next to the staging root.
        let sibling = t.root.parent().unwrap().join("other-build");
        std::fs::create_dir(&sibling).unwrap();
        std::fs::write(sibling.join("keep"), b"k").unwrap();
        let mut lower = TarLayer::default();
        lower.file("d/x", b"1", 0o644).file("top", b"1", 0o644);
        let mut upper = TarLayer::default();
        upper.file(name, b"", 0o644);
        let result = apply_all(
            &t.root,
            Ownership::for_this_process(),
            test_limits(),
            &[&lower, &upper],
        );
        assert!(
            sibling.join("keep").exists(),
            "{name} removed a sibling of the staging root"
        );
        assert!(
            t.root.join("d/x").exists() && t.root.join("top").exists(),
            "{name} removed lower layers' files"
        );
        let err = result.expect_err(name);
        let msg = err.to_string();
        assert!(
            matches!(err, OciError::BadLayer { layer: 1, .. }),
            "{name}: {msg}"
        );
        assert!(
            msg.contains("whiteout must name an entry of its directory"),
            "{name}: {msg}"
        );
    }
}

#[test]
fn a_gzip_layer_of_zeros_stops_at_the_stream_limit_having_written_almost_nothing() {
    // 128 MiB of zeros in 32 files, about 128 KiB of gzip.
    let mut l = TarLayer::default();
    let zeros = vec![0u8; 4 << 20];
    for i in 0..32 {
        l.file(&format!("z{i}"), &zeros, 0o644);
    }
    let (_dir, blob) = blob(&gzip(&l.bytes()));
    let t = tree();
    let limits = Limits {
        max_stream_bytes: 64 << 20,
        // (Not this test's limit: the ratio test is below.)
        max_expansion_ratio: 1 << 40,
        ..test_limits()
    };
    let err = Applier::new(&t.root, Ownership::for_this_process(), limits)
        .unwrap()
        .apply_blob(0, "sha256:zeros", &blob)
        .unwrap_err();
    let msg = err.to_string();
    assert!(
        matches!(err, OciError::TooLarge { limit, .. } if limit == 64 << 20),
        "{msg}"
    );
    assert!(
        msg.contains("stream limit") && msg.contains("layer 0 (sha256:zeros)"),
        "{msg}"
    );
    let written = allocated(&t.root);
    assert!(written < 1 << 20, "{written} bytes written for zeros");
}

#[test]
fn the_expansion_ratio_refuses_a_bomb_early_and_only_past_its_floor() {
    // 16 MiB of zeros: about 16 KiB of gzip, some 1000:1.
    let mut l = TarLayer::default();
    l.file("zeros", &vec![0u8; 16 << 20], 0o644);
    let raw = l.bytes();
    let (_gz_dir, gz) = blob(&gzip(&raw));
    let (_raw_dir, plain) = blob(&raw);
    let ratio = Limits {
        max_expansion_ratio: 100,
        expansion_floor_bytes: 1 << 20,
        ..test_limits()
    };
    let apply = |blob: &Path, limits: Limits| {
        let t = tree();
        let r = Applier::new(&t.root, Ownership::for_this_process(), limits)
            .unwrap()
            .apply_blob(0, "sha256:bomb", blob);
        (t, r)
    };
    let (_t, r) = apply(&gz, ratio);
    let err = r.unwrap_err();
    let msg = err.to_string();
    assert!(msg.contains("expansion-ratio limit (100:1)"), "{msg}");
    match err {
        // Stopped after a few MiB, not at the end of the 16.
        OciError::TooLarge { size, .. } => assert!(size < 8 << 20, "{msg}"),
        other => panic!("{other}"),
    }
    // The same bytes uncompressed expand 1:1.
    let (t, r) = apply(&plain, ratio);
    r.unwrap();
    assert_eq!(
        std::fs::metadata(t.root.join("zeros")).unwrap().len(),
        16 << 20
    );
    // Under the floor, any ratio.
    let floor = Limits {
        expansion_floor_bytes: 32 << 20,
        ..ratio
    };
    apply(&gz, floor).1.unwrap();
}

#[test]
fn a_gnu_sparse_entry_is_written_as_holes_and_its_logical_size_is_bounded() {
    const LOGICAL: u64 = 3 << 30;
    let head = [1u8; 512];
    let mut l = TarLayer::default();
    l.sparse("big", LOGICAL, &[(0, &head), (LOGICAL - 4, b"tail")]);
    assert!(l.bytes().len() < 4096, "a layer of a few blocks");

    let t = tree();
    let done = apply_all(&t.root, Ownership::for_this_process(), test_limits(), &[&l]).unwrap();
    let path = t.root.join("big");
    let m = std::fs::metadata(&path).unwrap();
    assert_eq!(m.len(), LOGICAL);
    assert!(
        m.blocks() * 512 <= 64 << 10,
        "{} bytes allocated for two data blocks",
        m.blocks() * 512
    );
    assert_eq!((done.file_bytes, done.disk_bytes), (LOGICAL, 8192));
    let mut f = std::fs::File::open(&path).unwrap();
    let mut buf = [0u8; 512];
    f.read_exact(&mut buf).unwrap();
    assert_eq!(buf, head);
    f.seek(SeekFrom::Start(LOGICAL / 2)).unwrap();
    f.read_exact(&mut buf[..4]).unwrap();
    assert_eq!(&buf[..4], &[0; 4], "a hole reads as zeros");
    f.seek(SeekFrom::Start(LOGICAL - 4)).unwrap();
    f.read_exact(&mut buf[..4]).unwrap();
    assert_eq!(&buf[..4], b"tail");

    // Past the apparent-size limit it is refused before anything is written.
    let t = tree();
    let limits = Limits {
        max_apparent_bytes: 1 << 30,
        ..test_limits()
    };
    let err = apply_all(&t.root, Ownership::for_this_process(), limits, &[&l]).unwrap_err();
    let msg = err.to_string();
    assert!(
        msg.contains("apparent-size limit") && msg.contains("/big"),
        "{msg}"
    );
    assert!(!t.root.join("big").exists());
}

#[test]
fn the_disk_budget_refuses_data_before_writing_it() {
    let t = tree();
    let limits = Limits {
        max_disk_bytes: Some(256 << 10),
        ..test_limits()
    };
    let (_, msg) = fill_refused(&t.root, limits, 10, 64 << 10);
    assert!(
        msg.contains("disk budget") && msg.contains("262144"),
        "{msg}"
    );
    assert!(
        !msg.contains("free space"),
        "a budget given, not measured: {msg}"
    );
    let written = allocated(&t.root);
    assert!(written <= 256 << 10, "{written} bytes written");
}

#[test]
fn the_default_disk_budget_is_half_the_free_space_beyond_the_reserve() {
    let t = tree();
    let free = free_bytes(&t.root).unwrap();
    // Leaves a budget of about 32 MiB, then offers 48.
    let limits = Limits {
        max_disk_bytes: None,
        reserve_bytes: free - (64 << 20),
        ..test_limits()
    };
    let (_, msg) = fill_refused(&t.root, limits, 3, 16 << 20);
    assert!(
        msg.contains("disk budget (half the free space where images are staged"),
        "{msg}"
    );
    let written = allocated(&t.root);
    assert!(written < 40 << 20, "{written} bytes written");
}

#[test]
fn the_reserve_is_checked_before_and_while_writing() {
    let t = tree();
    let all = Limits {
        reserve_bytes: u64::MAX / 2,
        ..test_limits()
    };
    let err = Applier::new(&t.root, Ownership::for_this_process(), all)
        .err()
        .expect("a reserve larger than the disk");
    let msg = err.to_string();
    assert!(matches!(err, OciError::NoSpace { .. }), "{msg}");
    assert!(
        msg.contains("not enough free disk space to unpack"),
        "{msg}"
    );

    // A reserve 96 MiB under what is free now, and 512 MiB to write: the check after
    // 128 MiB stops it.
    let free = free_bytes(&t.root).unwrap();
    let limits = Limits {
        reserve_bytes: free - (96 << 20),
        max_disk_bytes: Some(1 << 40),
        ..test_limits()
    };
    let (err, msg) = fill_refused(&t.root, limits, 8, 64 << 20);
    assert!(matches!(err, OciError::NoSpace { .. }), "{msg}");
    assert!(msg.contains("while unpacking"), "{msg}");
    let written = allocated(&t.root);
    assert!(written <= 192 << 20, "{written} bytes written");
}
