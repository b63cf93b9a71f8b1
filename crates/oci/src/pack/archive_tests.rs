//! The pack reader against a valid pack and damaged ones: what it takes goes to the
//! staging only, what it refuses leaves nothing, and no error names a host path.
use std::path::Path;

use super::super::fuzzing::read_and_decode;
use super::super::{assemble, sparse, PackedFile};
use super::*;
use crate::blobs::BlobStore;

/// A pack of two files (a base-image-like and a state-like one) as an export writes it.
fn sample(dir: &Path) -> Vec<u8> {
    let store = BlobStore::at(&dir.join("store")).unwrap();
    let mut files = Vec::new();
    for (role, len, seed) in [("image", 1usize << 20, 7u8), ("state/state", 64 << 10, 3)] {
        let raw = dir.join(role.replace('/', "-"));
        let mut data: Vec<u8> = (0..len / 4).map(|i| (i as u8).wrapping_mul(seed)).collect();
        data.resize(len, 0);
        std::fs::write(&raw, data).unwrap();
        let digest = store
            .put_with(|w| sparse::encode(&raw, w, &mut |_| {}))
            .unwrap();
        let blob = store.path(&digest);
        files.push(PackedFile {
            role: role.into(),
            size: std::fs::metadata(&blob).unwrap().len(),
            blob,
            digest,
        });
    }
    let p = assemble(br#"{"format":1}"#, files);
    let mut out = Vec::new();
    write_archive(&p, "t", &mut out).unwrap();
    out
}

fn entries(dir: &Path) -> usize {
    std::fs::read_dir(dir).map(|d| d.count()).unwrap_or(0)
}

#[test]
fn a_pack_is_read_into_its_staging_and_committed_only_on_request() {
    let tmp = tempfile::tempdir().unwrap();
    let tar = sample(tmp.path());
    let root = tmp.path().join("staging");
    let shared = BlobStore::at(&tmp.path().join("shared")).unwrap();
    let staging = Staging::under(&root).unwrap();
    let p = read_archive(&mut &tar[..], 1 << 30, &staging).unwrap();
    assert_eq!(p.files.len(), 2);
    assert!(p.files.iter().all(|f| f.blob.starts_with(staging.dir())));
    assert_eq!(entries(shared.dir()), 0, "nothing in the shared store yet");
    staging.commit(&p.digests(), &shared).unwrap();
    assert_eq!(entries(shared.dir()), 2);
    assert_eq!(entries(&root), 0);
}

#[test]
fn damaged_packs_are_refused_leaving_nothing_and_naming_no_host_path() {
    let tmp = tempfile::tempdir().unwrap();
    let tar = sample(tmp.path());
    let host = tmp.path().to_string_lossy().to_string();
    let root = tmp.path().join("staging");
    let read = |bytes: &[u8]| {
        let staging = Staging::under(&root).unwrap();
        read_archive(&mut &bytes[..], 1 << 30, &staging).map(|_| ())
    };
    let mut flipped = tar.clone();
    let mid = flipped.len() / 2;
    flipped[mid] ^= 1;
    let mut many = tar::Builder::new(Vec::new());
    for i in 0..=MAX_ENTRIES {
        let mut h = tar::Header::new_ustar();
        h.set_size(0);
        h.set_entry_type(tar::EntryType::Regular);
        many.append_data(&mut h, format!("x{i}"), &[][..]).unwrap();
    }
    let mut twice = tar::Builder::new(Vec::new());
    for _ in 0..2 {
        let mut h = tar::Header::new_ustar();
        h.set_size(2);
        h.set_entry_type(tar::EntryType::Regular);
        twice.append_data(&mut h, "index.json", &b"{}"[..]).unwrap();
    }
    let cases: Vec<(&str, Vec<u8>)> = vec![
        ("cut", tar[..tar.len() / 3].to_vec()),
        ("a flipped byte", flipped),
        ("too many entries", many.into_inner().unwrap()),
        ("an entry twice", twice.into_inner().unwrap()),
        ("not a tar", b"hello".repeat(300)),
    ];
    for (what, bytes) in cases {
        let e = read(&bytes).expect_err(what);
        assert!(!e.to_string().contains(&host), "{what}: {e}");
        assert_eq!(entries(&root), 0, "{what}: staging left");
    }
    // Over the size limit: refused as such.
    let staging = Staging::under(&root).unwrap();
    let e = read_archive(&mut &tar[..], 1000, &staging)
        .map(|_| ())
        .unwrap_err();
    assert!(matches!(e, OciError::TooLarge { limit: 1000, .. }), "{e}");
}

#[test]
fn random_damage_never_panics_or_outlives_its_staging() {
    let tmp = tempfile::tempdir().unwrap();
    let tar = sample(tmp.path());
    let good = read_and_decode(&tar);
    assert_eq!((good.read, good.decoded, good.staging_left), (true, 2, 0));
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    for i in 0..200 {
        let mut bytes = tar.clone();
        match next() % 3 {
            0 => bytes.truncate((next() % bytes.len() as u64) as usize),
            1 => {
                for _ in 0..1 + next() % 6 {
                    let at = (next() % bytes.len() as u64) as usize;
                    bytes[at] = next() as u8;
                }
            }
            _ => {
                let at = (next() % bytes.len() as u64) as usize;
                let junk: Vec<u8> = (0..next() % 700).map(|_| next() as u8).collect();
                bytes.splice(at..at, junk);
            }
        }
        let outcome = read_and_decode(&bytes);
        assert_eq!(outcome.staging_left, 0, "iteration {i}: {outcome:?}");
    }
}
