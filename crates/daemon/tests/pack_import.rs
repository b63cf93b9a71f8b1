//! Issue 33, defects 2 and 10: what importing a snapshot pack may and may not leave.
//! - A pack never takes over an image name or reference: its base image is stored
//!   under its content, and `create --image` naming what the pack's config claims
//!   answers as if the pack had never been imported.
//! - A refused pack (bad checksum, malformed disk, truncated tar, ...) leaves no file
//!   in the blob store, the image store or the state directory, and its 4xx names no
//!   host path; an upload larger than any pack or than the free space is refused up
//!   front (413, 507), and one that outgrows the free space while arriving, or whose
//!   files would decode past it, is stopped (507) with nothing left.
//! - A daemon killed mid-import (at each step, and in the middle of the upload) leaves
//!   nothing a later import or restore trusts: start-up sweeps the staging.
//!
//! Packs are made by hand (tests/pack_util): no VM boots here. The e2e with real
//! snapshots moving between daemons is tests/packs.rs.
mod common;
mod pack_util;

use std::io::{Read, Write};
use std::time::Duration;

use hyper::Method;
use serde_json::{json, Value};
use zygote_daemon::model::SnapshotList;

use common::{eventually, free_bytes, mount_tmpfs};
use pack_util::{diff, encode, image_names, import, summary, Host, PackParts};

macro_rules! require_tools {
    ($test:literal) => {
        if let Err(why) = pack_util::require_tools() {
            eprintln!("skipping {}: {why}", $test);
            return;
        }
    };
}

/// The error code a create naming `image` gets.
async fn create_error(c: &zygote_daemon::client::Client, image: &str) -> String {
    match c
        .json::<Value>(
            Method::POST,
            "/v1/sandboxes",
            Some(&json!({"image": image, "mem_mib": 256})),
        )
        .await
    {
        Ok(v) => panic!("create --image {image} made a sandbox: {v}"),
        Err(e) => format!("{} ({e})", e.code().unwrap_or("no code")),
    }
}

fn code(s: &str) -> &str {
    s.split(' ').next().unwrap_or_default()
}

async fn snapshots(c: &zygote_daemon::client::Client) -> usize {
    let l: SnapshotList = c
        .json(Method::GET, "/v1/snapshots", None::<&()>)
        .await
        .unwrap();
    l.snapshots.len()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pack_never_takes_over_an_image_name_or_reference() {
    require_tools!("a_pack_never_takes_over_an_image_name_or_reference");
    let tmp = tempfile::tempdir().unwrap();
    let host = Host::start(tmp.path(), &[]);
    let c = host.client();
    // A plain name and a reference (pulls are off on this host: refused as such).
    let claims = ["zz-claimed", "127.0.0.1:9/team/app:1"];
    let mut before = Vec::new();
    for name in claims {
        before.push(create_error(&c, name).await);
    }
    assert_eq!(code(&before[0]), "not_found", "{}", before[0]);
    for (i, name) in claims.iter().enumerate() {
        let mut parts = PackParts::synthetic(tmp.path(), 10 + i as u64, 1 << 20);
        parts.config["image"]["name"] = json!(name);
        let snap = import(&c, parts.tar()).await.expect("a valid pack imports");
        assert!(snap.pack.is_some());
    }
    for (name, was) in claims.iter().zip(&before) {
        let now = create_error(&c, name).await;
        assert_eq!(
            code(&now),
            code(was),
            "create --image {name} after importing a pack that claims it: {now} (before: {was})"
        );
    }
    // The packs' bases are stored under their content, nothing else.
    let names = image_names(&c).await;
    assert!(
        names.iter().all(|n| n.starts_with("pack-base-")) && names.len() == 2,
        "{names:?}"
    );
}

/// Flips a byte of `tar` in the middle of the first occurrence of `blob`.
fn flip_inside(tar: &mut [u8], blob: &[u8]) {
    let probe = &blob[..64];
    let at = tar
        .windows(probe.len())
        .position(|w| w == probe)
        .expect("the blob is in the tar");
    tar[at + blob.len() / 2] ^= 0x40;
}

/// A qcow2 header saying the data is in an external file (incompatible feature bit 2).
fn with_external_data_file(mut qcow2: Vec<u8>) -> Vec<u8> {
    assert_eq!(&qcow2[..4], b"QFI\xfb");
    qcow2[79] |= 1 << 2;
    qcow2
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_packs_leave_nothing_and_name_no_host_path() {
    require_tools!("refused_packs_leave_nothing_and_name_no_host_path");
    let tmp = tempfile::tempdir().unwrap();
    let work = tmp.path().join("work");
    std::fs::create_dir_all(&work).unwrap();
    let host = Host::start(&tmp.path().join("host"), &[]);
    let c = host.client();
    let good = PackParts::synthetic(&work, 1, 4 << 20);
    let mut cases: Vec<(&str, Vec<u8>)> = Vec::new();
    let mut t = good.tar();
    flip_inside(&mut t, &good.files[0].1);
    cases.push(("a flipped byte in the base image's blob", t));
    let mut p = good.clone();
    *p.file_mut("disk") = encode(&work, "junk", &vec![7u8; 1 << 20]);
    cases.push(("a disk layer that is no qcow2", p.tar()));
    let mut p = good.clone();
    let layer = pack_util::qcow2_layer(&work, 4 << 20);
    *p.file_mut("disk") = encode(&work, "ext", &with_external_data_file(layer));
    cases.push(("a disk layer with an external data file", p.tar()));
    let t = good.tar();
    cases.push(("a tar cut in the middle", t[..t.len() * 2 / 3].to_vec()));
    let mut p = good.clone();
    p.config["image"]["sha256"] = json!("ab".repeat(32));
    cases.push(("a base image that is not what its hash says", p.tar()));
    let mut p = good.clone();
    p.config["mem_mib"] = json!(1 << 30);
    cases.push(("a config asking for 1 PiB of memory", p.tar()));
    let mut p = good.clone();
    p.files[2].0 = "state/../../escape".into();
    cases.push(("a state file named to climb out", p.tar()));
    cases.push(("not a tar", b"not a tar at all".repeat(100)));

    let before = host.footprint();
    assert_eq!(snapshots(&c).await, 0);
    for (what, body) in cases {
        let e = import(&c, body).await.expect_err(what);
        let zygote_daemon::client::ClientError::Api {
            status, message, ..
        } = &e
        else {
            panic!("{what}: {e}");
        };
        assert!((400..500).contains(status), "{what}: {e}");
        for p in host.paths() {
            assert!(!message.contains(&p), "{what}: {message:?} names {p}");
        }
        let after = host.footprint();
        assert_eq!(
            diff(&before, &after),
            Vec::<String>::new(),
            "{what} ({e}) left files behind"
        );
        eprintln!("refused, nothing left: {what}: {e}");
    }
    assert_eq!(snapshots(&c).await, 0, "nothing registered");
    // The same pack undamaged is taken (so each refusal was the damage's).
    import(&c, good.tar()).await.expect("the undamaged pack");
    let after = host.footprint();
    assert!(after.len() > before.len(), "{}", summary(&after));
}

/// Sends a request by hand: the head, then `body`; returns the answer (status line
/// and JSON) or None when the daemon closed without one.
fn send_raw(host: &Host, head_extra: &str, body: &[u8]) -> Option<(u16, Value)> {
    let url = host.daemon.url.clone();
    let mut s = std::net::TcpStream::connect(url.trim_start_matches("http://")).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    let head = format!(
        "POST /v1/snapshots/import HTTP/1.1\r\nHost: zygote\r\nAuthorization: Bearer {}\r\n\
         Content-Type: application/x-tar\r\nConnection: close\r\n{head_extra}\r\n",
        host.daemon.token()
    );
    s.write_all(head.as_bytes()).unwrap();
    let _ = s.write_all(body);
    let mut answer = Vec::new();
    let _ = s.read_to_end(&mut answer);
    let text = String::from_utf8_lossy(&answer);
    let status = text.split(' ').nth(1)?.parse().ok()?;
    let json = text
        .split_once("\r\n\r\n")
        .and_then(|(_, b)| serde_json::from_str(b.trim()).ok())
        .unwrap_or(Value::Null);
    Some((status, json))
}

/// A chunked body of `parts` as the HTTP/1.1 framing has it.
fn chunked(parts: &[&[u8]]) -> Vec<u8> {
    let mut out = Vec::new();
    for p in parts {
        out.extend_from_slice(format!("{:x}\r\n", p.len()).as_bytes());
        out.extend_from_slice(p);
        out.extend_from_slice(b"\r\n");
    }
    out.extend_from_slice(b"0\r\n\r\n");
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upload_is_held_to_the_largest_pack_and_the_free_space() {
    require_tools!("an_upload_is_held_to_the_largest_pack_and_the_free_space");
    let tmp = tempfile::tempdir().unwrap();
    let host = Host::start(tmp.path(), &[]);
    let before = host.footprint();
    // Over any pack: refused from its Content-Length, before a byte is read.
    let (status, body) = send_raw(&host, "Content-Length: 300000000000\r\n", b"").unwrap();
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (413, Some("payload_too_large")),
        "{body}"
    );
    let said = body["error"]["message"].as_str().unwrap();
    assert!(
        said.contains(&(256u64 << 30).to_string()),
        "names the limit: {said}"
    );
    // Over the free space of the cache's filesystem (if that is below the largest pack).
    let free = free_bytes(&host.cache);
    if free + (1 << 30) < 256 << 30 {
        let n = free + (1 << 30);
        let (status, body) = send_raw(&host, &format!("Content-Length: {n}\r\n"), b"").unwrap();
        assert_eq!(
            (status, body["error"]["code"].as_str()),
            (507, Some("no_space")),
            "{body}"
        );
        let said = body["error"]["message"].as_str().unwrap();
        assert!(
            said.contains("MiB free") && said.contains("needed"),
            "{said}"
        );
        for p in host.paths() {
            assert!(!said.contains(&p), "{said:?} names {p}");
        }
    } else {
        eprintln!("the up-front free-space check is not exercised: {free} bytes free");
    }
    assert_eq!(diff(&before, &host.footprint()), Vec::<String>::new());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pack_outgrowing_the_free_space_is_stopped_with_nothing_left() {
    require_tools!("a_pack_outgrowing_the_free_space_is_stopped_with_nothing_left");
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("small");
    // State and cache on a 512 MiB tmpfs (root only): 384 MiB may be written.
    let _mount = match mount_tmpfs(&root, 512) {
        Ok(m) => m,
        Err(e) => {
            eprintln!(
                "skipping a_pack_outgrowing_the_free_space_is_stopped_with_nothing_left: cannot \
                 mount a tmpfs ({e}); needs root"
            );
            return;
        }
    };
    let work = tmp.path().join("work");
    std::fs::create_dir_all(&work).unwrap();
    let host = Host::start(&root, &[]);
    let before = host.footprint();

    // Streamed without a length: stopped once it passes what the filesystem can spare.
    let big = vec![0x5au8; 64 << 20];
    let entry =
        pack_util::tar_of(&[("blobs/sha256/".to_string() + &"0".repeat(64), big.repeat(7))]);
    let body = chunked(&entry.chunks(8 << 20).collect::<Vec<_>>());
    let (status, answer) = send_raw(&host, "Transfer-Encoding: chunked\r\n", &body).unwrap();
    assert_eq!(
        (status, answer["error"]["code"].as_str()),
        (507, Some("no_space")),
        "{answer}"
    );
    assert_eq!(
        diff(&before, &host.footprint()),
        Vec::<String>::new(),
        "{answer}"
    );

    // A few MiB of zstd that decode to more than the state directory can spare.
    let mut bomb = PackParts::synthetic(&work, 3, 1 << 20);
    let raw = work.join("bomb.raw");
    std::fs::write(&raw, vec![1u8; 600 << 20]).unwrap();
    let enc = work.join("bomb.enc");
    zygote_oci::pack::sparse::encode_to(&raw, &enc, &mut |_| {}).unwrap();
    std::fs::remove_file(&raw).unwrap();
    bomb.files[2].1 = std::fs::read(&enc).unwrap();
    assert!(bomb.files[2].1.len() < 8 << 20);
    let e = import(&host.client(), bomb.tar()).await.unwrap_err();
    assert_eq!(e.code(), Some("no_space"), "{e}");
    assert!(e.to_string().contains("state file"), "{e}");
    assert_eq!(
        diff(&before, &host.footprint()),
        Vec::<String>::new(),
        "{e}"
    );
    drop(host);
}

/// Restarts `host`'s daemon without a fault; checks the staging is swept.
fn restart(root: &std::path::Path) -> Host {
    let host = Host::start(root, &[]);
    let staging = host.cache.join("oci/staging");
    let left: Vec<_> = std::fs::read_dir(&staging)
        .map(|d| d.flatten().map(|e| e.path()).collect())
        .unwrap_or_default();
    assert!(left.is_empty(), "staging left after start-up: {left:?}");
    host
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_daemon_killed_mid_import_leaves_nothing_trusted() {
    require_tools!("a_daemon_killed_mid_import_leaves_nothing_trusted");
    let tmp = tempfile::tempdir().unwrap();
    let work = tmp.path().join("work");
    std::fs::create_dir_all(&work).unwrap();
    let pack = PackParts::synthetic(&work, 5, 4 << 20);
    let base_file = format!("pack-base-{0}-{0}.ext4", pack.base_sha256);

    // Killed while the upload arrives: a staged partial blob is all there is.
    let root = tmp.path().join("upload");
    let host = Host::start(&root, &[]);
    let before = host.footprint();
    let tar = pack.tar();
    let url = host.daemon.url.clone();
    let mut s = std::net::TcpStream::connect(url.trim_start_matches("http://")).unwrap();
    let head = format!(
        "POST /v1/snapshots/import HTTP/1.1\r\nHost: zygote\r\nAuthorization: Bearer {}\r\n\
         Content-Length: {}\r\n\r\n",
        host.daemon.token(),
        tar.len()
    );
    s.write_all(head.as_bytes()).unwrap();
    s.write_all(&tar[..tar.len() / 2]).unwrap();
    let staging = host.cache.join("oci/staging");
    let staged = eventually(Duration::from_secs(20), async || {
        let n = common::files_under(&staging)
            .iter()
            .filter(|p| p.is_file() && !p.to_string_lossy().ends_with(".lock"))
            .count();
        (n > 0).then_some(n)
    })
    .await;
    assert!(staged.is_some(), "the upload is staged as it arrives");
    host.daemon.kill9();
    drop(s);
    let host = restart(&root);
    assert_eq!(diff(&before, &host.footprint()), Vec::<String>::new());
    import(&host.client(), pack.tar())
        .await
        .expect("imported after the crash");
    drop(host);

    // Killed at each step after the upload.
    for (point, snapshot_kept, base_kept) in [
        ("pack-import.unpacked", false, false),
        ("pack-import.base-stored", false, true),
        ("pack-import.recorded", true, true),
    ] {
        let root = tmp.path().join(point);
        let host = Host::start(&root, &[("ZYGOTE_FAULT", point)]);
        let before = host.footprint();
        let e = import(&host.client(), pack.tar()).await;
        assert!(e.is_err(), "{point}: the daemon answered {e:?}");
        host.daemon.kill9();
        let host = restart(&root);
        let left = diff(&before, &host.footprint());
        let c = host.client();
        assert_eq!(snapshots(&c).await, snapshot_kept as usize, "{point}");
        // Only what is trusted stays: the snapshot's files with its record, and the base
        // image stored under its hash (and holding exactly those bytes).
        let base = host.cache.join("images").join(&base_file);
        assert_eq!(base.exists(), base_kept, "{point}: {left:?}");
        if base_kept {
            assert_eq!(zygote_images::sha256_file(&base).unwrap(), pack.base_sha256);
        }
        for l in &left {
            let ok = l.contains(&format!("pack-base-{}", pack.base_sha256))
                || (snapshot_kept && (l.contains("/snapshots/") || l.contains("/layers/")));
            assert!(ok, "{point}: left {l}");
        }
        import(&c, pack.tar())
            .await
            .unwrap_or_else(|e| panic!("{point}: importing again: {e}"));
        assert_eq!(snapshots(&c).await, snapshot_kept as usize + 1, "{point}");
        eprintln!(
            "killed at {point}: start-up left {} trusted files",
            left.len()
        );
    }
}
