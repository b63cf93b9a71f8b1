//! The control socket against hostile or buggy clients (issue 19): endless lines are cut
//! off, stuck clients do not hold up others, branch requests are bounded by the line
//! limit (the daemon decides how many children to ask for), snapshot paths
//! are checked and confined, and a live socket is never taken over. A spinning probe VM
//! is served on a thread of this test (as `zygote vm serve` serves it on its main
//! thread). Skips with a reason when KVM is unavailable.
mod support;

use std::io::{BufRead, BufReader, ErrorKind, Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use zygote_probe_abi as abi;
use zygote_vmm::control::checks::SnapshotConfinement;
use zygote_vmm::control::protocol::{
    to_hex, ChildSpec, Reply, SnapshotInfo, StatusInfo, VmRunState, MAX_MEMORY_IO,
};
use zygote_vmm::control::server::{
    bind, serve_listener, BindError, ServeOptions, IDLE_TIMEOUT, MAX_CONNECTIONS, MAX_REQUEST_LINE,
};
use zygote_vmm::control::{ControlClient, Request};
use zygote_vmm::probe::{self, ProbeOptions};
use zygote_vmm::vmm::snapshot::SnapshotMode;

/// A probe VM served on `sock` by a thread of this process; stopped on drop.
struct Served {
    dir: tempfile::TempDir,
    sock: PathBuf,
    thread: Option<JoinHandle<i32>>,
}

impl Served {
    fn client(&self) -> ControlClient {
        // Short: every request here is answered in milliseconds unless something blocks.
        ControlClient::new(&self.sock).with_timeout(Duration::from_secs(10))
    }

    fn status(&self) -> StatusInfo {
        self.client().request(&Request::Status).unwrap()
    }

    /// Refused with `code`, and the message mentions `needle`.
    fn refused(&self, req: &Request, code: &str, needle: &str) {
        let err = self
            .client()
            .call(req)
            .unwrap()
            .error
            .expect("an error reply");
        assert_eq!(err.code, code, "{}", err.message);
        assert!(err.message.contains(needle), "{:?}", err.message);
    }
}

impl Drop for Served {
    fn drop(&mut self) {
        let _ = self.client().call(&Request::Stop);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Boot a small spinning probe and serve it; `opts` sees the test's directory.
fn serve(opts: impl FnOnce(&Path) -> ServeOptions) -> Option<Served> {
    let elf = support::probe_elf()?;
    let mut vm = probe::boot_probe(
        &elf,
        &ProbeOptions {
            scenario: "spin".into(),
            vcpus: 1,
            mem_mib: 64,
        },
    )
    .unwrap();
    vm.wait_for_line(Duration::from_secs(60), |_| {}, |l| l == abi::REPORT_READY)
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("vm.sock");
    let opts = opts(dir.path());
    let listener = bind(&sock).unwrap();
    let vmm = vm.vmm;
    let path = sock.clone();
    let thread = std::thread::spawn(move || serve_listener(vmm, listener, &path, opts));
    Some(Served {
        dir,
        sock,
        thread: Some(thread),
    })
}

fn branch(children: Vec<ChildSpec>) -> Request {
    Request::Branch {
        children,
        point_snapshot: None,
        ready_timeout_ms: 1000,
    }
}

/// `n` children with sockets in `dir` (none exists yet).
fn children_in(dir: &Path, n: usize) -> Vec<ChildSpec> {
    (0..n)
        .map(|i| ChildSpec {
            socket: dir.join(format!("child{i}.sock")),
            ..Default::default()
        })
        .collect()
}

fn read_reply(stream: &UnixStream) -> Reply {
    let mut line = String::new();
    BufReader::new(stream).read_line(&mut line).unwrap();
    serde_json::from_str(&line).unwrap_or_else(|e| panic!("{e}: {line:?}"))
}

/// Whether the server closed `stream` (end of file or reset) within `limit`.
fn closed_within(stream: &mut UnixStream, limit: Duration) -> bool {
    stream.set_read_timeout(Some(limit)).unwrap();
    let mut buf = [0u8; 4096];
    loop {
        match stream.read(&mut buf) {
            Ok(0) => return true,
            Ok(_) => continue,
            Err(e) if e.kind() == ErrorKind::ConnectionReset => return true,
            Err(_) => return false,
        }
    }
}

#[test]
fn an_endless_line_is_refused_and_the_largest_real_requests_fit() {
    let Some(vm) = serve(|_| ServeOptions::default()) else {
        return;
    };
    let mut stream = UnixStream::connect(&vm.sock).unwrap();
    let mut writer = stream.try_clone().unwrap();
    // Up to 64 MiB without a newline: the server must stop taking it near the limit.
    let sender = std::thread::spawn(move || {
        let junk = vec![b'x'; 1 << 20];
        let mut sent = 0usize;
        while sent < 64 << 20 && writer.write_all(&junk).is_ok() {
            sent += junk.len();
        }
        sent
    });
    stream
        .set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    let reply = read_reply(&stream);
    let err = reply.error.expect("an error reply");
    assert_eq!(err.code, "bad_request");
    assert!(err.message.contains("exceeds"), "{}", err.message);
    assert!(closed_within(&mut stream, Duration::from_secs(5)));
    let sent = sender.join().unwrap();
    assert!(
        sent <= MAX_REQUEST_LINE + (4 << 20),
        "the server kept reading: {sent} bytes went in"
    );
    assert_eq!(vm.status().state, VmRunState::Running);

    // The largest legitimate requests fit the limit: a write_memory of its maximum...
    let gpa = 48 << 20;
    let bytes: Vec<u8> = (0..MAX_MEMORY_IO).map(|i| (i % 251) as u8).collect();
    let c = vm.client();
    let n: usize = c
        .request(&Request::WriteMemory {
            gpa,
            hex: to_hex(&bytes),
        })
        .unwrap();
    assert_eq!(n, bytes.len());
    let back: String = c
        .request(&Request::ReadMemory {
            gpa,
            len: MAX_MEMORY_IO,
        })
        .unwrap();
    assert!(back == to_hex(&bytes), "memory read back differs");
    // ... and a branch request of as many children with PATH_MAX-long console and cgroup
    // paths as fit the line (more than the daemon ever asks for): judged on its content
    // (no such cgroup), not refused for its length or its count.
    let long = PathBuf::from(format!("/{}", format!("{}/", "c".repeat(200)).repeat(20)));
    assert!(long.as_os_str().len() > 4000);
    let child = |c: ChildSpec| ChildSpec {
        console: Some(long.clone()),
        cgroup: Some(long.clone()),
        ..c
    };
    let per_child = serde_json::to_vec(&child(children_in(vm.dir.path(), 1).remove(0)))
        .unwrap()
        .len();
    let count = (MAX_REQUEST_LINE - 4096) / (per_child + 1);
    let children: Vec<ChildSpec> = children_in(vm.dir.path(), count)
        .into_iter()
        .map(child)
        .collect();
    let req = branch(children);
    let len = serde_json::to_vec(&req).unwrap().len();
    assert!(
        len > MAX_REQUEST_LINE - 64 * 1024 && len < MAX_REQUEST_LINE,
        "{len}"
    );
    vm.refused(&req, "bad_request", "is not a cgroup directory");
}

#[test]
fn stuck_clients_do_not_delay_anyone_else() {
    let Some(vm) = serve(|_| ServeOptions::default()) else {
        return;
    };
    // One connects and sends nothing, one sends half a line, one asks for 2 MiB replies
    // again and again and never reads them.
    let _silent = UnixStream::connect(&vm.sock).unwrap();
    let mut half = UnixStream::connect(&vm.sock).unwrap();
    half.write_all(br#"{"op":"sta"#).unwrap();
    let mut greedy = UnixStream::connect(&vm.sock).unwrap();
    let ask = serde_json::to_string(&Request::ReadMemory {
        gpa: 0,
        len: MAX_MEMORY_IO,
    })
    .unwrap();
    for _ in 0..20 {
        greedy.write_all(format!("{ask}\n").as_bytes()).unwrap();
    }
    std::thread::sleep(Duration::from_millis(200));
    for _ in 0..5 {
        let t = Instant::now();
        assert_eq!(vm.status().state, VmRunState::Running);
        assert!(
            t.elapsed() < Duration::from_secs(1),
            "status took {:?}",
            t.elapsed()
        );
    }
    // The half line was kept: completing it gets its answer.
    half.write_all(b"tus\"}\n").unwrap();
    half.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let reply = read_reply(&half);
    assert!(reply.ok, "{reply:?}");
    assert_eq!(reply.data.unwrap()["state"], "running");

    // More idle connections than the server keeps: new clients still get through (the
    // idlest connection makes room).
    let flood: Vec<UnixStream> = (0..2 * MAX_CONNECTIONS)
        .map(|_| UnixStream::connect(&vm.sock).unwrap())
        .collect();
    std::thread::sleep(Duration::from_millis(200));
    let t = Instant::now();
    assert_eq!(vm.status().state, VmRunState::Running);
    assert!(
        t.elapsed() < Duration::from_secs(1),
        "status took {:?}",
        t.elapsed()
    );
    drop(flood);

    // A connection on which nothing happens is closed after the idle timeout.
    let mut idle = UnixStream::connect(&vm.sock).unwrap();
    let t = Instant::now();
    assert!(closed_within(
        &mut idle,
        IDLE_TIMEOUT + Duration::from_secs(5)
    ));
    assert!(
        t.elapsed() >= IDLE_TIMEOUT - Duration::from_secs(1),
        "closed after {:?}, before the idle timeout",
        t.elapsed()
    );
}

#[test]
fn branches_of_no_children_or_beyond_the_line_limit_are_refused() {
    let Some(vm) = serve(|_| ServeOptions::default()) else {
        return;
    };
    vm.refused(&branch(vec![]), "bad_request", "at least one child");
    // The count has no bound of its own here: a request for more children than its
    // line can name is cut off by the line limit, before anything is parsed.
    let count = MAX_REQUEST_LINE / "{\"socket\":\"/\"},".len() + 1;
    let mut line = serde_json::to_vec(&branch(children_in(vm.dir.path(), count))).unwrap();
    assert!(line.len() > MAX_REQUEST_LINE);
    line.push(b'\n');
    let mut stream = UnixStream::connect(&vm.sock).unwrap();
    let mut writer = stream.try_clone().unwrap();
    // The server stops reading at the limit: the rest of the line may not go in.
    let sender = std::thread::spawn(move || {
        let _ = writer.write_all(&line);
    });
    stream
        .set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    let err = read_reply(&stream).error.expect("an error reply");
    assert_eq!(err.code, "bad_request");
    assert!(err.message.contains("exceeds"), "{}", err.message);
    assert!(closed_within(&mut stream, Duration::from_secs(5)));
    sender.join().unwrap();
    // Nothing was bound or forked for them.
    assert!((0..count).all(|i| !vm.dir.path().join(format!("child{i}.sock")).exists()));
    let st = vm.status();
    assert!(st.children.is_empty(), "{:?}", st.children);
    assert_eq!(st.state, VmRunState::Running);
}

#[test]
fn snapshot_paths_are_checked_and_confined_to_the_root() {
    let Some(vm) = serve(|dir| {
        std::fs::create_dir(dir.join("snaps")).unwrap();
        ServeOptions {
            snapshots: SnapshotConfinement::under(&dir.join("snaps")).unwrap(),
            warm_spawners: 0,
        }
    }) else {
        return;
    };
    let root = vm.dir.path().join("snaps");
    let outside = vm.dir.path().join("other");
    std::fs::create_dir(&outside).unwrap();
    std::os::unix::fs::symlink(&outside, root.join("link")).unwrap();
    std::fs::create_dir(root.join("taken")).unwrap();
    let snap = |path: PathBuf| Request::Snapshot {
        mode: SnapshotMode::Full,
        path,
    };
    for (path, needle) in [
        (PathBuf::from("snaps/s"), "must be absolute"),
        (root.join("../other/s"), "must not contain `..`"),
        (root.join("taken"), "already exists"),
        (root.join("missing/s"), "does not exist"),
        (outside.join("s"), "outside the snapshot root"),
        (root.join("link/s"), "outside the snapshot root"),
    ] {
        vm.refused(&snap(path), "bad_request", needle);
    }
    assert!(std::fs::read_dir(&outside).unwrap().next().is_none());

    // Inside the root it works, and the VM runs on.
    let info: SnapshotInfo = vm.client().request(&snap(root.join("s1"))).unwrap();
    assert_eq!(info.path, root.join("s1"));
    assert!(root.join("s1").is_dir());
    assert_eq!(vm.status().state, VmRunState::Running);
}

#[test]
fn a_served_socket_is_not_taken_over_and_a_stale_one_is() {
    // A socket file whose listener is gone (a crashed VMM) is replaced.
    let dir = tempfile::tempdir().unwrap();
    let stale = dir.path().join("stale.sock");
    // Bound by a process that then exits: bound here, the listener's descriptor could be
    // inherited by a VMM another test of this binary forks meanwhile, and stay live.
    let made = std::process::Command::new("python3")
        .args([
            "-c",
            "import socket, sys; socket.socket(socket.AF_UNIX).bind(sys.argv[1])",
        ])
        .arg(&stale)
        .status()
        .expect("python3 (the project's scripts need it)");
    assert!(made.success() && stale.exists());
    let replaced = bind(&stale).expect("a stale socket is replaced");
    let _c = UnixStream::connect(&stale).unwrap();
    assert!(replaced.accept().is_ok());

    let Some(vm) = serve(|_| ServeOptions::default()) else {
        return;
    };
    match bind(&vm.sock) {
        Err(e @ BindError::InUse(_)) => {
            assert!(e.to_string().contains("another process is serving"), "{e}")
        }
        other => panic!("expected InUse, got {other:?}"),
    }
    // The serving VMM keeps its socket.
    assert_eq!(vm.status().state, VmRunState::Running);
    // Nor may a branch child take it.
    vm.refused(
        &branch(vec![ChildSpec {
            socket: vm.sock.clone(),
            ..Default::default()
        }]),
        "bad_request",
        "already exists",
    );
    assert_eq!(vm.status().state, VmRunState::Running);
}
