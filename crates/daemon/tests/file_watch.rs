//! Issue 35, native file watching: `GET /v1/sandboxes/{id}/files/watch` streams a guest
//! directory's changes (inotify in the guest's agent) as NDJSON, with names relative to
//! the directory, into new subdirectories when recursive; bad paths are 4xx before the
//! stream; a client that leaves ends the guest's watch; the guest's watcher cap is a 429.
mod common;

use std::io::{Read, Write};
use std::time::{Duration, Instant};

use serde_json::json;
use tokio::sync::mpsc;
use zygote_api::client::{block_on, Client, ClientError};
use zygote_daemon::model::FileWatchEvent;
use zygote_proto::watch::MAX_WATCHERS;

use common::{create, qemu_guest_ready, sh, start_daemon, step, Daemon, Scratch};

/// Starts a watch on a thread of its own (the client's streaming future is not
/// `Send`): its lines arrive on the receiver (an HTTP error as an `Error` line);
/// dropping the receiver ends the watch (the callback answers false on the next line).
fn start_watch(
    c: &Client,
    id: &str,
    path: &str,
    recursive: bool,
) -> mpsc::Receiver<FileWatchEvent> {
    let (tx, rx) = mpsc::channel(4096);
    let (c, id, path) = (c.clone(), id.to_string(), path.to_string());
    std::thread::spawn(move || {
        let watching = c.watch_dir(&id, &path, recursive, |ev| tx.try_send(ev).is_ok());
        if let Err(ClientError::Api { code, message, .. }) = block_on(watching) {
            let _ = tx.try_send(FileWatchEvent::Error { code, message });
        }
    });
    rx
}

/// A watch on a raw connection, as any HTTP client makes one: the status, and the
/// connection (open once the `started` line arrived). Dropping it is a client leaving.
fn raw_watch(d: &Daemon, id: &str, path: &str) -> (u16, std::net::TcpStream) {
    let addr = d.url.trim_start_matches("http://").trim_end_matches('/');
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    let req = format!(
        "GET /v1/sandboxes/{id}/files/watch?path={path} HTTP/1.1\r\nHost: {addr}\r\n\
         Authorization: Bearer {}\r\n\r\n",
        d.token()
    );
    s.write_all(req.as_bytes()).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        let n = s.read(&mut buf).unwrap();
        assert!(n > 0, "closed: {}", String::from_utf8_lossy(&got));
        got.extend_from_slice(&buf[..n]);
        let text = String::from_utf8_lossy(&got);
        let status: u16 = text
            .split(' ')
            .nth(1)
            .and_then(|c| c.parse().ok())
            .unwrap_or(0);
        if (status != 0 && status != 200 && text.contains("\r\n\r\n")) || text.contains("started") {
            return (status, s);
        }
    }
}

/// [`start_watch`], once the daemon said `started`.
async fn watch(
    c: &Client,
    id: &str,
    path: &str,
    recursive: bool,
) -> mpsc::Receiver<FileWatchEvent> {
    let mut rx = start_watch(c, id, path, recursive);
    match tokio::time::timeout(Duration::from_secs(30), rx.recv()).await {
        Ok(Some(FileWatchEvent::Started)) => rx,
        other => panic!("watch {path}: {other:?}"),
    }
}

/// Lines until every `(name, kind)` of `want` was seen in that order; all of them.
async fn expect(
    rx: &mut mpsc::Receiver<FileWatchEvent>,
    want: &[(&str, &str)],
) -> Vec<(String, String)> {
    let mut seen = Vec::new();
    let mut next = 0;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while next < want.len() {
        let ev = tokio::time::timeout_at(deadline, rx.recv()).await;
        let Ok(Some(ev)) = ev else {
            panic!("wanted {:?}, saw {seen:?} ({ev:?})", &want[next..]);
        };
        if let FileWatchEvent::Event { name, kind } = ev {
            if (name.as_str(), kind.as_str()) == want[next] {
                next += 1;
            }
            seen.push((name, kind));
        }
    }
    seen
}

/// The error a watch request is refused with: (HTTP status, code).
async fn refused(c: &Client, id: &str, path: &str) -> (u16, String) {
    match c.watch_dir(id, path, false, |_| false).await {
        Err(ClientError::Api { status, code, .. }) => (status, code),
        other => panic!("watch {path}: {other:?}"),
    }
}

/// inotify instances the guest's agent (PID 1) holds.
async fn guest_watchers(c: &Client, id: &str) -> usize {
    let out = sh(c, id, "ls -l /proc/1/fd | grep inotify | wc -l")
        .await
        .unwrap();
    out.trim().parse().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watch_streams_changes_and_ends_with_its_client() {
    if !qemu_guest_ready("a_watch_streams_changes_and_ends_with_its_client") {
        return;
    }
    let t0 = Instant::now();
    let scratch = Scratch::new();
    let d = start_daemon(
        &scratch.state,
        &["--listen", "127.0.0.1:0", "--runtime", "qemu"],
    );
    let c = d.client();
    let body = json!({"image": "minimal", "name": "watch", "mem_mib": 256});
    let id = create(&c, body, &scratch.cleanup).await[0].id.clone();
    sh(&c, &id, "mkdir -p /w/sub").await.unwrap();
    step(t0, &format!("sandbox {id}"));

    let mut rx = watch(&c, &id, "/w", true).await;
    sh(
        &c,
        &id,
        "echo 1 > /w/a.txt; chmod 600 /w/a.txt; echo 2 > /w/sub/b; mkdir /w/new; \
         echo 3 > /w/new/c; mv /w/a.txt /w/d.txt; rm /w/d.txt",
    )
    .await
    .unwrap();
    let seen = expect(
        &mut rx,
        &[
            ("a.txt", "create"),
            ("a.txt", "write"),
            ("a.txt", "chmod"),
            ("sub/b", "create"),
            ("new", "create"),
            ("new/c", "create"),
            ("a.txt", "rename"),
            ("d.txt", "create"),
            ("d.txt", "remove"),
        ],
    )
    .await;
    assert!(seen.iter().all(|(n, _)| !n.starts_with('/')), "{seen:?}");
    step(t0, "changes streamed with relative names, recursively");

    // A client that leaves (its connection closed, as curl killed does) ends the
    // guest's watch.
    let before = guest_watchers(&c, &id).await;
    let (status, conn) = raw_watch(&d, &id, "/w");
    assert_eq!(status, 200);
    assert_eq!(guest_watchers(&c, &id).await, before + 1);
    drop(conn);
    let mut left = usize::MAX;
    for _ in 0..50 {
        left = guest_watchers(&c, &id).await;
        if left == before {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(
        left, before,
        "the guest still watches after its client left"
    );
    step(t0, "a client that leaves ends the guest's watch");

    // Bad input is refused before any stream.
    sh(&c, &id, "echo x > /w/file").await.unwrap();
    assert_eq!(
        refused(&c, &id, "/no/such").await,
        (404, "guest_not_found".into())
    );
    assert_eq!(
        refused(&c, &id, "/w/file").await,
        (400, "guest_bad_request".into())
    );
    assert_eq!(
        refused(&c, &id, "relative").await,
        (400, "invalid_argument".into())
    );
    assert_eq!(
        refused(&c, "sb-nope", "/w").await,
        (404, "not_found".into())
    );
    step(t0, "missing, file, relative path, unknown sandbox refused");

    // The guest's watcher cap is a 429 that names it; one ended makes room.
    let mut open: Vec<_> = (before..MAX_WATCHERS)
        .map(|_| {
            let (status, conn) = raw_watch(&d, &id, "/w");
            assert_eq!(status, 200);
            conn
        })
        .collect();
    let (status, code) = refused(&c, &id, "/w").await;
    assert_eq!((status, code.as_str()), (429, "guest_limit_reached"));
    drop(open.pop());
    let mut again = 0;
    for _ in 0..50 {
        sh(&c, &id, "touch /w/.wake").await.unwrap(); // the stream notices its client left
        again = raw_watch(&d, &id, "/w").0;
        if again == 200 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(again, 200, "no room after one watch ended");
    drop(rx);
    step(
        t0,
        &format!("{MAX_WATCHERS} watchers, then 429 guest_limit_reached"),
    );
}
