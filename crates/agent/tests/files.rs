//! File requests against a real agent process.

mod common;

use std::os::unix::fs::PermissionsExt;

use common::*;
use zygote_proto::{ErrorCode, FileKind, ReidentifyRequest, UnixTime, WriteFileRequest};

#[test]
fn ten_mib_file_round_trips_byte_exact() {
    let agent = TestAgent::start(&[]);
    let client = agent.client();
    let path = agent.path("big.bin");
    // Not a repeating pattern, so misplaced chunks would be caught.
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
    let data: Vec<u8> = (0..10 * 1024 * 1024)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect();
    client.write_file(&path, &data, Some(0o640)).unwrap();
    // Written through the agent, checked directly on disk.
    assert!(std::fs::read(&path).unwrap() == data);
    let meta = client.stat(&path).unwrap();
    assert_eq!(meta.size, data.len() as u64);
    assert_eq!(meta.mode, 0o640);
    assert_eq!(meta.kind, FileKind::File);
    let back = client.read_file(&path).unwrap();
    assert_eq!(back.len(), data.len());
    assert!(back == data);
    // No staging or temp files left behind.
    let names: Vec<String> = client
        .list_dir(agent.dir.path().to_str().unwrap())
        .unwrap()
        .into_iter()
        .map(|e| e.name)
        .collect();
    assert_eq!(names, vec!["agent.sock", "big.bin"]);
}

#[test]
fn write_modes_append_and_parents() {
    let agent = TestAgent::start(&[]);
    let client = agent.client();
    let path = agent.path("a/b/c.txt");
    let err = client.write_file(&path, b"x", None).unwrap_err();
    assert_eq!(err.code(), Some(ErrorCode::NotFound));
    client
        .write_file_with(WriteFileRequest {
            path: path.clone(),
            data: b"one\n".to_vec(),
            mode: Some(0o600),
            append: false,
            create_parents: true,
            owner: None,
        })
        .unwrap();
    client
        .write_file_with(WriteFileRequest {
            path: path.clone(),
            data: b"two\n".to_vec(),
            mode: None,
            append: true,
            create_parents: false,
            owner: None,
        })
        .unwrap();
    assert_eq!(std::fs::read(&path).unwrap(), b"one\ntwo\n");
    // Replacing keeps the existing mode when none is given.
    client.write_file(&path, b"three\n", None).unwrap();
    let perms = std::fs::metadata(&path).unwrap().permissions();
    assert_eq!(perms.mode() & 0o7777, 0o600);
    assert_eq!(client.read_file(&path).unwrap(), b"three\n");
    // Empty files work too.
    client.write_file(&path, b"", None).unwrap();
    assert_eq!(client.read_file(&path).unwrap(), b"");
}

#[test]
fn writes_and_new_parents_belong_to_the_owner_given() {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!(
            "skipping writes_and_new_parents_belong_to_the_owner_given: not root, chown needs it"
        );
        return;
    }
    use std::os::unix::fs::MetadataExt;
    let agent = TestAgent::start(&[]);
    let client = agent.client();
    let owner = Some(zygote_proto::Owner {
        uid: 4242,
        gid: 4343,
    });
    let ids = |p: &str| {
        let m = std::fs::metadata(p).unwrap();
        (m.uid(), m.gid())
    };
    for (name, append, size) in [
        ("new/dir/f", false, 3),
        ("app/f", true, 3),
        ("new/dir/big", false, (9 << 20) + 1),
    ] {
        client
            .write_file_with(WriteFileRequest {
                path: agent.path(name),
                data: vec![7; size],
                mode: None,
                append,
                create_parents: true,
                owner,
            })
            .unwrap();
        assert_eq!(ids(&agent.path(name)), (4242, 4343), "{name}");
    }
    assert_eq!(ids(&agent.path("new")), (4242, 4343));
    assert_eq!(ids(&agent.path("new/dir")), (4242, 4343));
    assert_eq!(
        ids(agent.dir.path().to_str().unwrap()),
        (0, 0),
        "an existing parent keeps its owner"
    );
    // The apply op, on a symlink itself.
    let link = agent.path("link");
    std::os::unix::fs::symlink("new", &link).unwrap();
    client
        .apply(vec![zygote_proto::TreeOp::Chown {
            path: link.clone(),
            uid: 7,
            gid: 8,
        }])
        .unwrap();
    let m = std::fs::symlink_metadata(&link).unwrap();
    assert_eq!((m.uid(), m.gid()), (7, 8));
    assert_eq!(ids(&agent.path("new")), (4242, 4343), "not its target");
}

#[test]
fn read_ranges_and_special_files() {
    let agent = TestAgent::start(&[]);
    let client = agent.client();
    let path = agent.path("r.txt");
    std::fs::write(&path, b"0123456789").unwrap();
    let c = client.read_file_range(&path, 3, Some(4)).unwrap();
    assert_eq!(
        (c.data.as_slice(), c.offset, c.size, c.eof),
        (&b"3456"[..], 3, 10, false)
    );
    let c = client.read_file_range(&path, 8, Some(100)).unwrap();
    assert_eq!((c.data.as_slice(), c.eof), (&b"89"[..], true));
    let c = client.read_file_range(&path, 50, None).unwrap();
    assert!(c.data.is_empty() && c.eof);
    // /proc files report size 0 but have content.
    let status = client.read_file("/proc/self/status").unwrap();
    assert!(String::from_utf8_lossy(&status).contains("Pid:"));
}

#[test]
fn list_dir_and_stat() {
    let agent = TestAgent::start(&[]);
    let client = agent.client();
    let root = agent.path("tree");
    std::fs::create_dir(&root).unwrap();
    std::fs::write(format!("{root}/file"), b"12345").unwrap();
    std::fs::create_dir(format!("{root}/dir")).unwrap();
    std::os::unix::fs::symlink("file", format!("{root}/link")).unwrap();

    let entries = client.list_dir(&root).unwrap();
    let summary: Vec<(&str, FileKind, u64)> = entries
        .iter()
        .map(|e| (e.name.as_str(), e.meta.kind, e.meta.size))
        .collect();
    assert_eq!(summary[0], ("dir", FileKind::Dir, summary[0].2));
    assert_eq!(summary[1], ("file", FileKind::File, 5));
    assert_eq!(summary[2].0, "link");
    assert_eq!(summary[2].1, FileKind::Symlink);
    assert_eq!(entries[2].meta.symlink_target.as_deref(), Some("file"));

    let followed = client.stat(&format!("{root}/link")).unwrap();
    assert_eq!((followed.kind, followed.size), (FileKind::File, 5));
    let link = client.stat_with(&format!("{root}/link"), false).unwrap();
    assert_eq!(link.kind, FileKind::Symlink);
    let host = std::fs::metadata(format!("{root}/file")).unwrap();
    let meta = client.stat(&format!("{root}/file")).unwrap();
    use std::os::unix::fs::MetadataExt;
    assert_eq!(
        (meta.mtime, meta.uid, meta.mode),
        (host.mtime(), host.uid(), host.mode() & 0o7777)
    );

    let err = client.list_dir(&format!("{root}/missing")).unwrap_err();
    assert_eq!(err.code(), Some(ErrorCode::NotFound));
    let err = client.stat("relative/path").unwrap_err();
    assert_eq!(err.code(), Some(ErrorCode::BadRequest));
    let err = client.read_file(&format!("{root}/dir")).unwrap_err();
    assert_eq!(err.code(), Some(ErrorCode::BadRequest));
}

#[test]
fn rename_and_remove() {
    let agent = TestAgent::start(&[]);
    let client = agent.client();
    let a = agent.path("a");
    let b = agent.path("b");
    client.write_file(&a, b"x", None).unwrap();
    client.rename(&a, &b).unwrap();
    assert!(!exists(a.as_ref()) && exists(b.as_ref()));
    let d = agent.path("d");
    std::fs::create_dir_all(format!("{d}/e/f")).unwrap();
    let err = client.remove(&d, false).unwrap_err();
    assert_ne!(err.code(), None);
    client.remove(&d, true).unwrap();
    client.remove(&b, false).unwrap();
    assert!(!exists(d.as_ref()) && !exists(b.as_ref()));
    assert_eq!(
        client.remove(&b, false).unwrap_err().code(),
        Some(ErrorCode::NotFound)
    );
}

#[test]
fn reidentify_in_dry_run_changes_nothing_on_the_host() {
    let agent = TestAgent::start(&[]);
    let client = agent.client();
    let health = client.health().unwrap();
    assert!(health.dry_run && !health.pid1);
    let before_host = health.hostname.clone();
    let before_time = std::time::SystemTime::now();
    let report = client
        .reidentify(ReidentifyRequest {
            entropy: vec![7; 64],
            hostname: Some("zygote-must-not-apply".into()),
            time: Some(UnixTime {
                secs: 86_400,
                nanos: 0,
            }),
            net: None,
            identity: None,
        })
        .unwrap();
    assert!(report.dry_run);
    assert!(!report.hostname_set && !report.clock_set && !report.entropy_credited);
    assert_eq!(report.entropy_bytes, 64);
    assert_eq!(client.health().unwrap().hostname, before_host);
    // The clock was not set back to 1970.
    assert!(std::time::SystemTime::now() >= before_time);

    let err = client
        .reidentify(ReidentifyRequest {
            hostname: Some("bad host".into()),
            ..Default::default()
        })
        .unwrap_err();
    assert_eq!(err.code(), Some(ErrorCode::BadRequest));
    let err = client
        .reidentify(ReidentifyRequest {
            time: Some(UnixTime {
                secs: 1,
                nanos: 2_000_000_000,
            }),
            ..Default::default()
        })
        .unwrap_err();
    assert_eq!(err.code(), Some(ErrorCode::BadRequest));
    // Shutdown is refused in dry-run mode, and the agent keeps running.
    assert_eq!(
        client.shutdown().unwrap_err().code(),
        Some(ErrorCode::Unsupported)
    );
    assert!(client.health().is_ok());
}
