//! Warm spawners in a served VMM (`zygote vm serve --warm-spawners K`): the loop keeps
//! one ready, a single-child branch goes through it (the reply says `warm`), the child
//! serves its own socket with its guest running, the loop forks a replacement, and a
//! branch it cannot take (several children) forks as before. Skips with a reason when
//! KVM is unavailable.
mod support;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use zygote_probe_abi as abi;
use zygote_vmm::control::protocol::{BranchInfo, ChildSpec, StatusInfo, VmRunState};
use zygote_vmm::control::server::{bind, serve_listener, ServeOptions};
use zygote_vmm::control::{ControlClient, Request};
use zygote_vmm::probe::{self, ProbeOptions};

fn client(sock: &PathBuf) -> ControlClient {
    ControlClient::new(sock).with_timeout(Duration::from_secs(20))
}

fn status(sock: &PathBuf) -> StatusInfo {
    client(sock).request(&Request::Status).unwrap()
}

fn wait_for_ready_spawner(sock: &PathBuf) -> i32 {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Some(s) = status(sock).spawners.iter().find(|s| s.ready) {
            return s.pid;
        }
        assert!(Instant::now() < deadline, "no warm spawner ready in 30 s");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The heartbeat word read through `sock`'s memory access.
fn heartbeat(sock: &PathBuf) -> u64 {
    let hex: String = client(sock)
        .request(&Request::ReadMemory {
            gpa: abi::MAILBOX_GPA + abi::MAILBOX_OFF_HEARTBEAT,
            len: 8,
        })
        .unwrap();
    let bytes = zygote_vmm::control::protocol::from_hex(&hex).unwrap();
    u64::from_le_bytes(bytes.try_into().unwrap())
}

#[test]
fn a_served_vmm_branches_through_a_warm_spawner_and_keeps_one_ready() {
    let Some(elf) = support::probe_elf() else {
        return;
    };
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
    let listener = bind(&sock).unwrap();
    let opts = ServeOptions {
        warm_spawners: 1,
        ..Default::default()
    };
    let path = sock.clone();
    let vmm = vm.vmm;
    let thread = std::thread::spawn(move || serve_listener(vmm, listener, &path, opts));

    let spawner = wait_for_ready_spawner(&sock);
    let child_sock = dir.path().join("child.sock");
    let info: BranchInfo = client(&sock)
        .request(&Request::Branch {
            children: vec![ChildSpec {
                socket: child_sock.clone(),
                ..Default::default()
            }],
            point_snapshot: None,
            ready_timeout_ms: 10_000,
        })
        .unwrap();
    assert!(info.warm, "{info:?}");
    assert_eq!(
        info.children[0].pid, spawner,
        "the spawner became the child"
    );
    let child = status(&child_sock);
    assert_eq!(child.state, VmRunState::Running);
    assert!(child.spawners.is_empty() || child.spawners.len() <= 1);
    let before = heartbeat(&child_sock);
    let deadline = Instant::now() + Duration::from_secs(10);
    while heartbeat(&child_sock) <= before {
        assert!(
            Instant::now() < deadline,
            "the warm child's guest does not run"
        );
        std::thread::sleep(Duration::from_millis(5));
    }

    // The loop forks a replacement; a branch into two children forks as before.
    let replacement = wait_for_ready_spawner(&sock);
    assert_ne!(replacement, spawner);
    let two: BranchInfo = client(&sock)
        .request(&Request::Branch {
            children: (0..2)
                .map(|i| ChildSpec {
                    socket: dir.path().join(format!("fork{i}.sock")),
                    ..Default::default()
                })
                .collect(),
            point_snapshot: None,
            ready_timeout_ms: 10_000,
        })
        .unwrap();
    assert!(!two.warm);
    assert_eq!(two.children.len(), 2);

    for s in [
        child_sock,
        dir.path().join("fork0.sock"),
        dir.path().join("fork1.sock"),
    ] {
        let _ = client(&s).call(&Request::Stop);
    }
    let _ = client(&sock).call(&Request::Stop);
    assert_eq!(thread.join().unwrap(), 0);
    // Stopping the parent ended its spawner.
    // SAFETY: signal 0 only asks whether the process exists.
    let alive = unsafe { libc::kill(replacement, 0) } == 0;
    assert!(!alive, "spawner {replacement} outlived its VMM");
}
