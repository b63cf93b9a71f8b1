//! End to end through the real binary: `zygote vm serve` runs a probe VM controlled over
//! its socket; branch children serve their own sockets; snapshots restore into a new VMM
//! process. Skips with a reason when KVM is unavailable.
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use zygote_probe_abi as abi;
use zygote_vmm::control::protocol::{
    from_hex, to_hex, BranchInfo, ChildSpec, SnapshotInfo, StatusInfo, VmRunState,
};
use zygote_vmm::control::{ControlClient, Request};

struct Vmm {
    child: Child,
    client: ControlClient,
}

impl Drop for Vmm {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A branch child serving `socket`, with nothing else of its own.
fn child_at(socket: impl Into<PathBuf>) -> ChildSpec {
    ChildSpec {
        socket: socket.into(),
        ..Default::default()
    }
}

fn kvm_or_skip() -> bool {
    match zygote_vmm::host::kvm_usable() {
        Ok(()) => true,
        Err(why) => {
            let _ = writeln!(
                std::io::stderr(),
                "skipping: KVM unavailable on this host: {why}"
            );
            false
        }
    }
}

fn spawn(args: &[&str], sock: &Path) -> Vmm {
    let child = Command::new(env!("CARGO_BIN_EXE_zygote"))
        .args(["vm", "serve", "--api-sock"])
        .arg(sock)
        .args(args)
        .spawn()
        .expect("spawn zygote vm serve");
    let client = ControlClient::new(sock);
    client
        .wait_ready(Instant::now() + Duration::from_secs(60))
        .expect("VMM socket comes up");
    Vmm { child, client }
}

fn heartbeat(c: &ControlClient) -> u64 {
    let hex: String = c
        .request(&Request::ReadMemory {
            gpa: abi::MAILBOX_GPA + abi::MAILBOX_OFF_HEARTBEAT,
            len: 8,
        })
        .unwrap();
    u64::from_le_bytes(from_hex(&hex).unwrap().try_into().unwrap())
}

fn wait_spinning(c: &ControlClient) -> u64 {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let a = heartbeat(c);
        std::thread::sleep(Duration::from_millis(100));
        let b = heartbeat(c);
        if b > a {
            return b;
        }
        assert!(Instant::now() < deadline, "guest never started spinning");
    }
}

fn status(c: &ControlClient) -> StatusInfo {
    c.request(&Request::Status).unwrap()
}

fn gone(pid: i32) -> bool {
    let deadline = Instant::now() + Duration::from_secs(10);
    while unsafe { libc::kill(pid, 0) } == 0 {
        if Instant::now() > deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    true
}

#[test]
fn serve_pause_branch_snapshot_restore_stop() {
    if !kvm_or_skip() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("parent.sock");
    let mut parent = spawn(&["--probe", "spin", "--vcpus", "2"], &sock);
    let c = parent.client.clone();
    wait_spinning(&c);
    let st = status(&c);
    assert_eq!(st.state, VmRunState::Running);
    assert_eq!((st.vcpus, st.mem_mib), (2, 256));
    assert_eq!(st.pid as u32, parent.child.id());

    // A diagnosis describes both vCPUs and leaves the guest running.
    let text: String = c.request(&Request::Diagnose).unwrap();
    for needle in [
        "vCPU 0: mp_state",
        "vCPU 1: mp_state",
        "rip=",
        "lapic: tpr=",
        "ioapic: irr=",
    ] {
        assert!(text.contains(needle), "{needle:?} missing from:\n{text}");
    }
    assert_eq!(status(&c).state, VmRunState::Running);
    wait_spinning(&c);

    // Pause holds the guest still; resume lets it run.
    let paused: StatusInfo = c.request(&Request::Pause).unwrap();
    assert_eq!(paused.state, VmRunState::Paused);
    let h = heartbeat(&c);
    std::thread::sleep(Duration::from_millis(200));
    assert_eq!(heartbeat(&c), h);
    let _: StatusInfo = c.request(&Request::Resume).unwrap();
    wait_spinning(&c);

    // Branch into two children, each serving its own socket.
    let sockets: Vec<PathBuf> = (0..2)
        .map(|i| dir.path().join(format!("child{i}.sock")))
        .collect();
    let info: BranchInfo = c
        .request(&Request::Branch {
            children: sockets.iter().map(child_at).collect(),
            point_snapshot: None,
            ready_timeout_ms: 30_000,
        })
        .unwrap();
    assert_eq!(info.children.len(), 2);
    // Each child's socket is bound before the reply: usable at once, no waiting.
    for s in &sockets {
        assert!(
            s.exists(),
            "{} not bound when the branch replied",
            s.display()
        );
    }
    let kids: Vec<ControlClient> = sockets.iter().map(ControlClient::new).collect();
    for (k, ci) in kids.iter().zip(&info.children) {
        let st = status(k);
        assert_eq!(st.pid, ci.pid);
        assert_eq!(st.state, VmRunState::Running);
        wait_spinning(k);
    }
    // A host-side write in one child is invisible to its sibling and the parent.
    let marker = abi::MAILBOX_GPA + abi::MAILBOX_OFF_SCRATCH + 8 * 7;
    let _: usize = kids[0]
        .request(&Request::WriteMemory {
            gpa: marker,
            hex: to_hex(&0xfeed_u64.to_le_bytes()),
        })
        .unwrap();
    let read = |c: &ControlClient| -> String {
        c.request(&Request::ReadMemory {
            gpa: marker,
            len: 8,
        })
        .unwrap()
    };
    assert_eq!(read(&kids[0]), to_hex(&0xfeed_u64.to_le_bytes()));
    assert_ne!(read(&kids[1]), read(&kids[0]));
    assert_ne!(read(&c), read(&kids[0]));
    // Stopping a child leaves the other and the parent running.
    let _: StatusInfo = kids[0].request(&Request::Stop).unwrap();
    assert!(gone(info.children[0].pid), "stopped child exits");
    wait_spinning(&kids[1]);
    wait_spinning(&c);

    // Bad requests are refused with a code, not a crash.
    let err = c
        .request::<BranchInfo>(&Request::Branch {
            children: vec![child_at(&sockets[1])],
            point_snapshot: None,
            ready_timeout_ms: 1000,
        })
        .unwrap_err();
    assert_eq!(err.code(), Some("bad_request"), "{err}");
    let err = c
        .request::<String>(&Request::ReadMemory {
            gpa: 0,
            len: 1 << 30,
        })
        .unwrap_err();
    assert_eq!(err.code(), Some("bad_request"));
    let raw = c.call(&Request::Snapshot {
        mode: zygote_vmm::vmm::snapshot::SnapshotMode::Diff,
        path: dir.path().join("no-base"),
    });
    assert_eq!(raw.unwrap().error.unwrap().code, "bad_request");

    // Snapshot, restore into a new VMM process (paused), compare, run.
    let _: StatusInfo = c.request(&Request::Pause).unwrap();
    let h0 = heartbeat(&c);
    let snap: SnapshotInfo = c
        .request(&Request::Snapshot {
            mode: zygote_vmm::vmm::snapshot::SnapshotMode::Full,
            path: dir.path().join("snap"),
        })
        .unwrap();
    let restored_sock = dir.path().join("restored.sock");
    let restored = spawn(
        &[
            "--restore",
            snap.path.to_str().unwrap(),
            "--paused",
            "--verify",
        ],
        &restored_sock,
    );
    assert_eq!(status(&restored.client).state, VmRunState::Paused);
    assert_eq!(heartbeat(&restored.client), h0);
    let _: StatusInfo = restored.client.request(&Request::Resume).unwrap();
    assert!(wait_spinning(&restored.client) > h0);

    // Stop everything; processes exit cleanly and sockets disappear.
    let _: StatusInfo = kids[1].request(&Request::Stop).unwrap();
    assert!(gone(info.children[1].pid), "stopped child exits");
    assert!(!kids[1].path().exists(), "socket removed on stop");
    let mut restored = restored;
    for vmm in [&mut restored, &mut parent] {
        let _: StatusInfo = vmm.client.request(&Request::Stop).unwrap();
        let code = vmm.child.wait().unwrap();
        assert!(code.success(), "{code:?}");
        assert!(!vmm.client.path().exists(), "socket removed on stop");
    }
}

#[test]
fn guest_end_is_recorded_and_the_process_exits() {
    if !kvm_or_skip() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("vm.sock");
    let mut vmm = spawn(&["--probe", "boot"], &sock);
    let status = vmm.child.wait().unwrap();
    assert!(status.success(), "clean guest reset exits 0: {status:?}");
    let exit = std::fs::read_to_string(zygote_vmm::control::server::exit_file(&sock)).unwrap();
    assert!(exit.contains("\"clean\":true"), "{exit}");
    assert!(exit.contains("guest reset"), "{exit}");
}

#[test]
fn refuses_bad_invocations() {
    let out = Command::new(env!("CARGO_BIN_EXE_zygote"))
        .args([
            "vm",
            "serve",
            "--api-sock",
            "/nonexistent-dir/x.sock",
            "--probe",
            "spin",
            "--mem-mib",
            "0",
        ])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    // Whatever fails first (no KVM, bad size), it is a clear message, not a panic.
    assert!(err.contains("zygote: error:"), "{err}");
    assert!(!err.contains("panicked"), "{err}");
}
