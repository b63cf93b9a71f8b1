//! BRANCH of a running Linux guest: fork the VMM into three children, each a full copy
//! of the live guest (memory, processes, disk) that runs its own execs through its own
//! vsock socket; children are isolated from each other and from the parent, both ways.
//! Needs hardware virtualization; elsewhere it skips with the reason printed.
mod linux_support;

use std::time::Duration;

use linux_support::{agent, boot_minimal, child_agent, sh_ok, ticks, KillOnDrop, TICKER};
use zygote_vmm::devices::virtio::persist::DeviceHostConfig;
use zygote_vmm::vmm::branch::{BranchRequest, ChildContext};

const CHILDREN: usize = 3;

#[test]
fn branch_a_running_linux_guest_into_three_isolated_children() {
    if !zygote_vmm::host::linux_guests_or_skip(
        "branch_a_running_linux_guest_into_three_isolated_children",
    ) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let mut vm = boot_minimal(dir.path(), 1, 512);
    let parent = agent(&vm.vsock);

    // Live state: a file on the CoW disk, a value only in page cache, and a process
    // counting in memory.
    sh_ok(
        &parent,
        "echo parent >/root/who; sync; echo cached >/root/unsynced",
    );
    sh_ok(&parent, TICKER);
    let (a, b) = ticks(&parent);
    assert!(b > a, "the ticker runs in the parent ({a} -> {b})");

    let child_sock = |i: usize| dir.path().join(format!("child{i}.vsock"));
    let consoles: Vec<linux_support::Console> = (0..CHILDREN).map(|_| Default::default()).collect();
    let serial = |i: usize| consoles[i].sink();
    let devices = |i: usize| DeviceHostConfig {
        vsock_uds: Some(child_sock(i)),
        net_tap: None,
        ..Default::default()
    };
    // Each child serves its VM on a control socket (for a diagnosis, should its agent
    // not answer) until the test kills it.
    let child_ctl = |i: usize| dir.path().join(format!("child{i}.sock"));
    let child_main = |ctx: ChildContext| -> i32 {
        zygote_vmm::control::server::serve(ctx.vmm, &child_ctl(ctx.index))
    };
    let report = vm
        .vmm
        .branch(&BranchRequest {
            count: CHILDREN,
            child_serial: &serial,
            child_devices: &devices,
            child_cgroup: &|_| None,
            child_netns: &|_| None,
            child_main: &child_main,
            keep_fds: Vec::new(),
            ready_timeout: Duration::from_secs(120),
        })
        .expect("branch");
    let mut pids: Vec<libc::pid_t> = report.children.iter().map(|c| c.pid).collect();
    pids.extend(report.spawner);
    let _reaper = KillOnDrop(pids);
    assert_eq!(report.children.len(), CHILDREN);
    eprintln!(
        "branched into {CHILDREN}: parent paused {:?}, children ready after {:?}",
        report.pause,
        report
            .children
            .iter()
            .map(|c| c.ready_after)
            .collect::<Vec<_>>()
    );

    // The host's first connection to each child works: it is not lost to the transport
    // reset that tells the guest its parent's connections are gone.
    for (i, console) in consoles.iter().enumerate() {
        let t = std::time::Instant::now();
        if let Err(e) = linux_support::first_connection(&child_sock(i)) {
            panic!(
                "child {i}: the first connection after the branch failed after {:?}: {e}; \
                 console:\n{}",
                t.elapsed(),
                console.tail(20)
            );
        }
        eprintln!("child {i}: first connection answered in {:?}", t.elapsed());
    }
    let children: Vec<_> = (0..CHILDREN)
        .map(|i| child_agent(&child_sock(i), &child_ctl(i), &consoles[i]))
        .collect();
    for (i, c) in children.iter().enumerate() {
        // The child continues the parent's live state...
        assert_eq!(sh_ok(c, "cat /root/who /root/unsynced"), "parent\ncached");
        let (a, b) = ticks(c);
        assert!(
            b > a,
            "child {i}: the parent's ticker keeps running ({a} -> {b}); console:\n{}",
            consoles[i].tail(30)
        );
        // ...then diverges.
        sh_ok(
            c,
            &format!("echo child{i} >/root/who; echo {i} >/root/only-child{i}"),
        );
    }
    sh_ok(
        &parent,
        "echo parent-after >/root/who; touch /root/only-parent",
    );

    // Isolation both ways: nobody sees anybody else's writes.
    assert_eq!(sh_ok(&parent, "cat /root/who"), "parent-after");
    assert_eq!(
        sh_ok(&parent, "ls /root | grep -c only-child || true"),
        "0",
        "children's files never reach the parent"
    );
    for (i, c) in children.iter().enumerate() {
        assert_eq!(sh_ok(c, "cat /root/who"), format!("child{i}"));
        assert_eq!(
            sh_ok(c, "ls /root | grep only- | tr '\\n' ' '"),
            format!("only-child{i}"),
            "child {i} sees only its own files"
        );
    }
    // The parent is unharmed and still running its own ticker.
    let (a, b) = ticks(&parent);
    assert!(b > a, "the parent's ticker runs after the branch");
    linux_support::assert_image_intact(&linux_support::minimal_image());
}
