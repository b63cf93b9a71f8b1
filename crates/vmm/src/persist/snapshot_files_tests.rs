use super::*;

fn mem_with(pages: usize, filled: &[usize]) -> Vec<u8> {
    let mut m = vec![0u8; pages * PAGE];
    for &p in filled {
        m[p * PAGE..(p + 1) * PAGE].fill(p as u8 + 1);
    }
    m
}

#[test]
fn full_memory_is_sparse_and_verifiable() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(MEMORY_FILE);
    let m = mem_with(64, &[1, 2, 40]);
    let (n, crc) = write_memory(&path, &MemoryView { bytes: &m }, |_| true, true).unwrap();
    assert_eq!(n, 3);
    assert_eq!(std::fs::read(&path).unwrap(), m, "holes read back as zero");
    let meta = SnapshotMeta {
        format_version: crate::persist::FORMAT_VERSION,
        mode: SnapshotMode::Full,
        parent: None,
        mem_bytes: m.len() as u64,
        pages_written: n,
        memory_crc32: crc,
        created_unix: 0,
    };
    verify_memory(dir.path(), &meta).unwrap();
    // Corrupt one stored byte: verification fails.
    let f = open_rw(&path).unwrap();
    f.write_all_at(&[0xee], (40 * PAGE + 7) as u64).unwrap();
    assert!(matches!(
        verify_memory(dir.path(), &meta),
        Err(PersistError::Checksum)
    ));
}

#[test]
fn diff_memory_stores_selected_pages_only() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(MEMORY_FILE);
    let m = mem_with(128, &[3, 70, 71]);
    let mut bitmap = vec![0u64; 2];
    for p in [3usize, 71, 100] {
        bitmap[p / 64] |= 1 << (p % 64);
    }
    let (n, _) = write_memory(
        &path,
        &MemoryView { bytes: &m },
        |p| bit_set(&bitmap, p),
        false,
    )
    .unwrap();
    assert_eq!(n, 3, "dirty zero page 100 is stored too");
    let back = std::fs::read(&path).unwrap();
    assert_eq!(
        &back[70 * PAGE..71 * PAGE],
        &vec![0u8; PAGE][..],
        "clean page 70 not stored"
    );
    assert_eq!(&back[71 * PAGE..72 * PAGE], &m[71 * PAGE..72 * PAGE]);
}

#[test]
fn pending_snapshot_is_atomic() {
    let dir = tempfile::tempdir().unwrap();
    let dest = dir.path().join("snap");
    {
        let p = PendingSnapshot::create(&dest).unwrap();
        write_file_synced(&p.file("x"), b"partial").unwrap();
        // Dropped without commit: nothing is left.
    }
    assert!(!dest.exists());
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
    let p = PendingSnapshot::create(&dest).unwrap();
    let meta = SnapshotMeta {
        format_version: crate::persist::FORMAT_VERSION,
        mode: SnapshotMode::Full,
        parent: None,
        mem_bytes: 0,
        pages_written: 0,
        memory_crc32: 0,
        created_unix: 0,
    };
    p.commit(&meta).unwrap();
    assert_eq!(read_meta(&dest).unwrap().mode, SnapshotMode::Full);
    assert!(
        PendingSnapshot::create(&dest).is_err(),
        "existing snapshot refused"
    );
}

#[test]
fn chains_follow_parents_to_the_base() {
    let dir = tempfile::tempdir().unwrap();
    let mk = |name: &str, mode: SnapshotMode, parent: Option<PathBuf>| {
        let dest = dir.path().join(name);
        let p = PendingSnapshot::create(&dest).unwrap();
        p.commit(&SnapshotMeta {
            format_version: crate::persist::FORMAT_VERSION,
            mode,
            parent,
            mem_bytes: 0,
            pages_written: 0,
            memory_crc32: 0,
            created_unix: 0,
        })
        .unwrap()
    };
    let base = mk("base", SnapshotMode::Full, None);
    let d1 = mk("d1", SnapshotMode::Diff, Some(base.clone()));
    let d2 = mk("d2", SnapshotMode::Diff, Some(d1.clone()));
    let names: Vec<PathBuf> = chain(&d2).unwrap().into_iter().map(|(p, _)| p).collect();
    assert_eq!(names, vec![base, d1, d2]);
    assert_eq!("live".parse::<SnapshotMode>().unwrap(), SnapshotMode::Live);
    assert!("bogus".parse::<SnapshotMode>().is_err());
}
