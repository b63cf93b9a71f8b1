//! The image store's tests: naming, lookup, pruning, hashing, locking.
use super::*;

#[test]
fn a_lock_in_a_directory_not_yet_made_creates_it() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("cache/images/.lock-minimal");
    let lock = FileLock::acquire(&path, &mut |_| {}).unwrap();
    assert!(path.is_file(), "{} was not created", path.display());
    drop(lock);
}

#[test]
fn sha256_of_a_sparse_file_is_that_of_its_bytes() {
    use sha2::Digest;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("sparse");
    let f = File::create(&path).unwrap();
    f.set_len(10 << 20).unwrap();
    use std::os::unix::fs::FileExt;
    f.write_all_at(b"in the middle", 5 << 20).unwrap();
    f.write_all_at(b"at the end", (10 << 20) - 10).unwrap();
    f.write_all_at(&[7u8; 70_000], 4096).unwrap();
    drop(f);
    let bytes = std::fs::read(&path).unwrap();
    assert_eq!(
        sha256_file(&path).unwrap(),
        hex::encode(sha2::Sha256::digest(&bytes))
    );
    let empty = dir.path().join("empty");
    File::create(&empty).unwrap().set_len(3 << 20).unwrap();
    let zeros = vec![0u8; 3 << 20];
    assert_eq!(
        sha256_file(&empty).unwrap(),
        hex::encode(sha2::Sha256::digest(&zeros))
    );
}

#[test]
fn sha256_of_file_matches_known_vector() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("f");
    std::fs::write(&path, b"abc").unwrap();
    assert_eq!(
        sha256_file(&path).unwrap(),
        "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
    );
}

fn info(name: &str, sha: &str, key: &str, built_at: u64) -> ImageInfo {
    ImageInfo {
        name: name.into(),
        sha256: sha.into(),
        path: PathBuf::new(),
        size_bytes: 1,
        disk_bytes: 1,
        recipe_key: key.into(),
        recipe_path: "/r".into(),
        description: String::new(),
        base: "busybox".into(),
        agent_sha256: "0".into(),
        built_at,
        build_secs: 0.0,
        oci: None,
    }
}

#[test]
fn save_lookup_list_locate() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let old = info("mini", &"a".repeat(64), "k1", 10);
    let new = info("mini", &format!("ab{}", "0".repeat(62)), "k2", 20);
    let other = info("py", &"c".repeat(64), "k3", 5);
    for i in [&old, &new, &other] {
        save_info(d, i).unwrap();
    }
    // Metadata without its image file does not count as built.
    assert!(list_images_in(d).unwrap().is_empty());
    assert!(lookup_by_recipe_key(d, "mini", "k1").is_none());
    for i in [&old, &new, &other] {
        std::fs::write(image_path(d, &i.name, &i.sha256), b"x").unwrap();
    }
    let listed: Vec<_> = list_images_in(d)
        .unwrap()
        .into_iter()
        .map(|i| i.built_at)
        .collect();
    assert_eq!(listed, vec![20, 10, 5], "by name, newest first");
    let hit = lookup_by_recipe_key(d, "mini", "k1").unwrap();
    assert_eq!(hit.sha256, old.sha256);
    assert_eq!(hit.path, d.join(format!("mini-{}.ext4", old.sha256)));
    assert!(lookup_by_recipe_key(d, "mini", "k9").is_none());
    assert_eq!(locate_image_in(d, "mini").unwrap().built_at, 20);
    assert_eq!(locate_image_in(d, "cccccccc").unwrap().name, "py");
    assert_eq!(
        locate_image_in(d, &format!("mini-{}", old.sha256))
            .unwrap()
            .built_at,
        10
    );
    // "a" prefixes: aaaa... and ab00...: ambiguous below 2 digits, too short anyway.
    assert!(matches!(locate_image_in(d, "aaaaaaaa"), Ok(i) if i.built_at == 10));
    assert!(matches!(
        locate_image_in(d, "nope"),
        Err(ImageError::ImageNotFound(_))
    ));
    assert!(matches!(
        locate_image_in(d, "ccc"),
        Err(ImageError::ImageNotFound(_))
    ));

    // Pruning keeps the newest of each name and drops the old one's files
    // and index entry.
    let removed = prune_in(d).unwrap();
    assert_eq!(removed.len(), 1);
    assert_eq!(removed[0].sha256, old.sha256);
    assert!(!image_path(d, "mini", &old.sha256).exists());
    assert!(lookup_by_recipe_key(d, "mini", "k1").is_none());
    assert!(lookup_by_recipe_key(d, "mini", "k2").is_some());
    let names: Vec<_> = list_images_in(d)
        .unwrap()
        .into_iter()
        .map(|i| i.name)
        .collect();
    assert_eq!(names, vec!["mini", "py"]);
}

#[test]
fn a_name_means_its_last_build_not_the_newest_file() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let old = info("mini", &"a".repeat(64), "k1", 10);
    let new = info("mini", &"b".repeat(64), "k2", 20);
    for i in [&old, &new] {
        save_info(d, i).unwrap();
        std::fs::write(image_path(d, &i.name, &i.sha256), b"x").unwrap();
    }
    assert_eq!(locate_image_in(d, "mini").unwrap().sha256, new.sha256);
    // A build resolved the older inputs again (cache hit): the name follows it.
    mark_current(d, &old).unwrap();
    assert_eq!(locate_image_in(d, "mini").unwrap().sha256, old.sha256);
    // Pruning keeps what the name means.
    let removed = prune_in(d).unwrap();
    assert_eq!(removed.len(), 1);
    assert_eq!(removed[0].sha256, new.sha256);
    assert_eq!(locate_image_in(d, "mini").unwrap().sha256, old.sha256);
    // Removing it drops the pointer; the name falls back to the newest left.
    mark_current(d, &old).unwrap();
    save_info(d, &new).unwrap();
    std::fs::write(image_path(d, &new.name, &new.sha256), b"x").unwrap();
    remove_in(d, &old).unwrap();
    assert!(current_sha(d, "mini").is_none());
    assert_eq!(locate_image_in(d, "mini").unwrap().sha256, new.sha256);
}

#[test]
fn a_snapshot_pack_base_is_found_by_its_content_only() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let sha = format!("cafebabe{}", "1".repeat(56));
    let mut base = info(
        &format!("pack-base-{sha}"),
        &sha,
        &format!("pack-{sha}"),
        30,
    );
    // As earlier versions adopted one: under the name its pack claimed, made current.
    let legacy_sha = format!("deadbeef{}", "2".repeat(56));
    let legacy = info("mini", &legacy_sha, &format!("pack-{legacy_sha}"), 40);
    let own = info("mini", &"a".repeat(64), "k1", 10);
    for i in [&base, &legacy, &own] {
        save_info(d, i).unwrap();
        std::fs::write(image_path(d, &i.name, &i.sha256), b"x").unwrap();
    }
    mark_current(d, &legacy).unwrap();
    assert!(base.is_pack_base() && legacy.is_pack_base() && !own.is_pack_base());
    // No query resolves to a pack base: name, file stem, name-sha, hash or its prefix.
    for q in [
        base.name.clone(),
        base.file_stem(),
        sha.clone(),
        "cafebabe".into(),
        legacy_sha.clone(),
        "deadbeef".into(),
    ] {
        assert!(
            matches!(locate_image_in(d, &q), Err(ImageError::ImageNotFound(_))),
            "{q} resolved"
        );
    }
    // The name means the image of its own, newer file and current pointer or not.
    assert_eq!(locate_image_in(d, "mini").unwrap().sha256, own.sha256);
    // Its content finds it; prune keeps it.
    base.path = image_path(d, &base.name, &sha);
    assert_eq!(find_by_sha256_in(d, &sha).unwrap(), Some(base.clone()));
    assert_eq!(find_by_sha256_in(d, "cafebabe").unwrap(), None);
    assert!(prune_in(d).unwrap().is_empty());
    assert_eq!(list_images_in(d).unwrap().len(), 3);
}

/// CI failure (crash.rs, three tests calling `build_image("minimal")` at once): the
/// temporary file was named by process, so one thread renamed another's away and that
/// thread's rename failed with ENOENT. Every writer must succeed.
#[test]
fn threads_recording_the_same_image_at_once_all_succeed() {
    let dir = tempfile::tempdir().unwrap();
    let image = info("minimal", &"ab".repeat(32), "key", 1);
    std::thread::scope(|s| {
        let writers: Vec<_> = (0..8)
            .map(|_| {
                s.spawn(|| {
                    (0..200)
                        .map(|_| mark_current(dir.path(), &image))
                        .collect::<Result<Vec<()>>>()
                })
            })
            .collect();
        for w in writers {
            w.join()
                .unwrap()
                .expect("every concurrent mark_current succeeds");
        }
    });
    assert_eq!(
        current_sha(dir.path(), "minimal"),
        Some(image.sha256.clone())
    );
    let strays: Vec<_> = std::fs::read_dir(dir.path().join("index"))
        .map(|d| d.flatten().map(|e| e.file_name()).collect())
        .unwrap_or_default();
    assert_eq!(
        strays.len(),
        1,
        "only the record itself is left: {strays:?}"
    );
}
