//! watch / unwatch over a real agent process: events as they happen, relative names,
//! recursion into new directories, the end of a watch (unwatch, a client that goes
//! away), bad paths and the limits.

mod common;

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::time::{Duration, Instant};

use common::*;
use zygote_proto::client::{AgentClient, WatchHandle, WatchNext};
use zygote_proto::watch::{
    WatchEvent, WatchEventKind, WatchRequest, MAX_WATCHERS, MAX_WATCHES_PER_WATCHER,
};
use zygote_proto::ErrorCode;

use WatchEventKind::*;

fn watch(client: &AgentClient, path: &str, recursive: bool) -> WatchHandle {
    let req = WatchRequest {
        path: path.into(),
        recursive,
    };
    client.watch(req).expect("watch")
}

/// Events until every `(name, kind)` of `want` has been seen (in that order), or 10 s.
fn expect_events(h: &mut WatchHandle, want: &[(&str, WatchEventKind)]) -> Vec<WatchEvent> {
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut seen = Vec::new();
    let mut next = 0;
    while next < want.len() && Instant::now() < deadline {
        if let WatchNext::Events(events) = h.next(Duration::from_millis(200)).unwrap() {
            for e in events {
                if next < want.len() && e.name == want[next].0 && e.kind == want[next].1 {
                    next += 1;
                }
                seen.push(e);
            }
        }
    }
    assert_eq!(next, want.len(), "wanted {want:?} in order, saw {seen:?}");
    seen
}

/// The inotify instances the agent holds.
fn inotify_fds(pid: u32) -> usize {
    fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .flatten()
        .filter(|e| fs::read_link(e.path()).is_ok_and(|t| t.to_string_lossy().contains("inotify")))
        .count()
}

#[test]
fn a_watch_streams_create_write_chmod_rename_remove_with_relative_names() {
    let agent = TestAgent::start(&[]);
    let client = agent.client();
    let dir = agent.path("w");
    fs::create_dir_all(format!("{dir}/sub")).unwrap();
    let mut h = watch(&client, &dir, false);
    fs::write(format!("{dir}/a.txt"), b"1").unwrap();
    fs::write(format!("{dir}/sub/deep.txt"), b"not reported").unwrap();
    fs::set_permissions(format!("{dir}/a.txt"), fs::Permissions::from_mode(0o600)).unwrap();
    fs::rename(format!("{dir}/a.txt"), format!("{dir}/b.txt")).unwrap();
    fs::remove_file(format!("{dir}/b.txt")).unwrap();
    let seen = expect_events(
        &mut h,
        &[
            ("a.txt", Create),
            ("a.txt", Write),
            ("a.txt", Chmod),
            ("a.txt", Rename),
            ("b.txt", Create),
            ("b.txt", Remove),
        ],
    );
    assert!(
        seen.iter().all(|e| !e.name.contains("deep")),
        "not recursive, yet: {seen:?}"
    );
    // unwatch ends it: the stream says so, and the instance is closed.
    client.unwatch(h.id()).unwrap();
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        match h.next(Duration::from_millis(200)).unwrap() {
            WatchNext::Ended => break,
            _ => assert!(Instant::now() < deadline, "the watch did not end"),
        }
    }
    assert!(eventually(Duration::from_secs(5), || inotify_fds(
        agent.pid()
    ) == 0));
    let e = client.unwatch(h.id()).unwrap_err();
    assert_eq!(e.code(), Some(ErrorCode::NotFound), "{e}");
}

#[test]
fn a_recursive_watch_follows_new_and_moved_directories() {
    let agent = TestAgent::start(&[]);
    let client = agent.client();
    let dir = agent.path("r");
    fs::create_dir_all(format!("{dir}/old/inner")).unwrap();
    let mut h = watch(&client, &dir, true);
    fs::write(format!("{dir}/old/inner/x"), b"1").unwrap();
    expect_events(&mut h, &[("old/inner/x", Create)]);
    // mkdir -p: the deeper levels appear before the agent watches their parents.
    fs::create_dir_all(format!("{dir}/new/a/b")).unwrap();
    expect_events(&mut h, &[("new", Create), ("new/a/b", Create)]);
    fs::write(format!("{dir}/new/a/b/f"), b"1").unwrap();
    expect_events(&mut h, &[("new/a/b/f", Create), ("new/a/b/f", Write)]);
    // A new directory's entries are created once, whether the walk of the new
    // directory or the kernel (or both, for one that appeared in between) saw them.
    fs::create_dir(format!("{dir}/burst")).unwrap();
    for i in 0..50 {
        fs::write(format!("{dir}/burst/{i}"), b"").unwrap();
    }
    let seen = expect_events(&mut h, &[("burst/49", Create)]);
    fs::write(format!("{dir}/end"), b"").unwrap();
    let rest = expect_events(&mut h, &[("end", Create)]);
    for i in 0..50 {
        let name = format!("burst/{i}");
        let creates = seen
            .iter()
            .chain(&rest)
            .filter(|e| e.name == name && e.kind == Create)
            .count();
        assert_eq!(creates, 1, "{name}: {seen:?} {rest:?}");
    }
    // A moved directory reports under its new name.
    fs::rename(format!("{dir}/old"), format!("{dir}/moved")).unwrap();
    fs::write(format!("{dir}/moved/inner/y"), b"1").unwrap();
    let seen = expect_events(
        &mut h,
        &[
            ("old", Rename),
            ("moved", Create),
            ("moved/inner/y", Create),
        ],
    );
    assert!(seen.iter().all(|e| !e.name.starts_with("old/")), "{seen:?}");
    // Removing the watched directory itself ends the watch.
    fs::remove_dir_all(&dir).unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match h.next(Duration::from_millis(200)).unwrap() {
            WatchNext::Ended => break,
            _ => assert!(Instant::now() < deadline, "the watch did not end"),
        }
    }
}

#[test]
fn a_client_that_goes_away_ends_its_watches() {
    let agent = TestAgent::start(&[]);
    let dir = agent.path("g");
    fs::create_dir(&dir).unwrap();
    {
        let client = agent.client();
        let _a = watch(&client, &dir, false);
        let _b = watch(&client, &dir, true);
        assert_eq!(inotify_fds(agent.pid()), 2);
        // Dropping the client (and the handles) closes the connection.
    }
    assert!(
        eventually(Duration::from_secs(5), || inotify_fds(agent.pid()) == 0),
        "the agent still holds {} inotify instances",
        inotify_fds(agent.pid())
    );
}

#[test]
fn bad_paths_are_refused_with_their_reason() {
    let agent = TestAgent::start(&[]);
    let client = agent.client();
    let file = agent.path("file");
    fs::write(&file, b"x").unwrap();
    let cases = [
        (agent.path("missing"), ErrorCode::NotFound),
        (file, ErrorCode::BadRequest),
        ("relative/dir".to_string(), ErrorCode::BadRequest),
    ];
    for (path, code) in cases {
        let req = WatchRequest {
            path: path.clone(),
            recursive: false,
        };
        let e = client.watch(req).err().expect("refused");
        assert_eq!(e.code(), Some(code), "{path}: {e}");
    }
    assert_eq!(inotify_fds(agent.pid()), 0);
}

#[test]
fn watchers_and_watched_directories_are_capped() {
    let agent = TestAgent::start(&[]);
    let client = agent.client();
    let dir = agent.path("c");
    fs::create_dir(&dir).unwrap();
    let mut open: Vec<WatchHandle> = (0..MAX_WATCHERS)
        .map(|_| watch(&client, &dir, false))
        .collect();
    let req = WatchRequest {
        path: dir.clone(),
        recursive: false,
    };
    let e = client
        .watch(req.clone())
        .err()
        .expect("one watcher too many");
    assert_eq!(e.code(), Some(ErrorCode::LimitReached), "{e}");
    assert!(e.to_string().contains("watchers are open"), "{e}");
    // One ended: one more fits.
    open.pop();
    assert!(eventually(Duration::from_secs(5), || client
        .watch(req.clone())
        .map(|h| open.push(h))
        .is_ok()));
    drop(open);

    // A tree with more directories than one watcher watches is refused whole.
    let big = agent.path("big");
    for i in 0..=MAX_WATCHES_PER_WATCHER {
        fs::create_dir_all(format!("{big}/{i}")).unwrap();
    }
    let e = client
        .watch(WatchRequest {
            path: big.clone(),
            recursive: true,
        })
        .err()
        .expect("too many directories");
    assert_eq!(e.code(), Some(ErrorCode::LimitReached), "{e}");
    // Watched without recursion it is one directory.
    let mut h = watch(&client, &big, false);
    fs::write(format!("{big}/f"), b"").unwrap();
    expect_events(&mut h, &[("f", Create)]);
}
