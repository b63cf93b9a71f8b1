//! Warm spawners with a Linux guest whose devices are busy: while the guest rewrites a
//! file on its copy-on-write disk in a loop and the host keeps running execs over
//! vsock, each round forks a spawner, lets it wait, and branches through it with
//! verification: the child's RAM must equal the parent's at the branch instant page for
//! page (device writes into guest memory are the classic miss), and the child must go on
//! with the parent's processes and files. Needs hardware virtualization; elsewhere it
//! skips with the reason printed.
mod linux_support;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use linux_support::{agent, boot_minimal, child_agent, sh_ok, ticks, Console, KillOnDrop, TICKER};
use zygote_vmm::devices::virtio::persist::DeviceHostConfig;
use zygote_vmm::vmm::branch::ChildContext;
use zygote_vmm::vmm::warm::{ChildSetup, Payload, SpawnerSetup, WarmBranchRequest};

const ROUNDS: usize = 3;

#[test]
fn warm_branches_of_a_busy_linux_guest_match_the_parent_page_for_page() {
    if !zygote_vmm::host::linux_guests_or_skip(
        "warm_branches_of_a_busy_linux_guest_match_the_parent_page_for_page",
    ) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let mut vm = boot_minimal(dir.path(), 1, 512);
    let parent = agent(&vm.vsock);
    sh_ok(&parent, "echo parent >/root/who; sync");
    sh_ok(&parent, TICKER);
    // Disk traffic that never stops: the block device keeps filling guest buffers.
    sh_ok(
        &parent,
        "(while :; do dd if=/dev/urandom of=/root/churn bs=64k count=8 2>/dev/null; \
         sync; cat /root/churn >/dev/null; done) >/dev/null 2>&1 </dev/null &",
    );
    // And vsock traffic from the host, through the branch instant.
    let busy = Arc::new(AtomicBool::new(true));
    let chatter = {
        let busy = busy.clone();
        let uds = vm.vsock.clone();
        std::thread::spawn(move || {
            let a = agent(&uds);
            let mut n = 0u64;
            while busy.load(Ordering::Relaxed) {
                sh_ok(&a, "echo chatter");
                n += 1;
            }
            n
        })
    };

    let mut reaper = KillOnDrop(Vec::new());
    for round in 0..ROUNDS {
        let console = Console::default();
        let child_vsock = dir.path().join(format!("warm{round}.vsock"));
        let child_ctl = dir.path().join(format!("warm{round}.sock"));
        let setup_child = |_: &mut Payload| ChildSetup {
            serial: console.sink(),
            devices: DeviceHostConfig {
                vsock_uds: Some(child_vsock.clone()),
                ..Default::default()
            },
            cgroup: None,
            netns: None,
        };
        let child_main = |ctx: ChildContext, _: Payload| -> i32 {
            zygote_vmm::control::server::serve(ctx.vmm, &child_ctl)
        };
        vm.vmm
            .prepare_spawner(&SpawnerSetup {
                cgroup: None,
                child: &setup_child,
                child_main: &child_main,
                keep_fds: Vec::new(),
            })
            .expect("prepare a spawner");
        let deadline = Instant::now() + Duration::from_secs(120);
        while !vm.vmm.spawners().unwrap().iter().any(|s| s.ready) {
            assert!(Instant::now() < deadline, "no spawner built its VM");
            std::thread::sleep(Duration::from_millis(10));
        }
        // Let the guest run on (and the spawner go stale) while everything is busy.
        std::thread::sleep(Duration::from_millis(500));
        let r = vm
            .vmm
            .branch_warm(&WarmBranchRequest {
                payload: b"",
                fds: &[],
                ready_timeout: Duration::from_secs(120),
                max_pages: u64::MAX,
                by_cost: false,
                verify: true,
            })
            .expect("warm branch");
        reaper.0.push(r.child.pid);
        eprintln!(
            "round {round}: pause {:?} ({} pages caught up before it in {:?}, {} copied in it), \
             child ready after {:?}, {:?} mismatches",
            r.pause,
            r.pages_caught_up,
            r.catch_up,
            r.pages_copied,
            r.child.ready_after,
            r.memory_mismatches
        );
        assert_eq!(r.memory_mismatches, Some(0), "round {round}: {r:?}");
        let child = child_agent(&child_vsock, &child_ctl, &console);
        assert_eq!(sh_ok(&child, "cat /root/who"), "parent");
        let (a, b) = ticks(&child);
        assert!(
            b > a,
            "round {round}: the parent's ticker runs on in the child"
        );
        sh_ok(&child, &format!("echo warm{round} >/root/who"));
        assert_eq!(sh_ok(&child, "cat /root/who"), format!("warm{round}"));
    }
    busy.store(false, Ordering::Relaxed);
    let execs = chatter.join().unwrap();
    assert!(execs > 0);
    assert_eq!(
        sh_ok(&parent, "cat /root/who"),
        "parent",
        "children's writes stay theirs"
    );
    let (a, b) = ticks(&parent);
    assert!(b > a, "the parent runs on");
    linux_support::assert_image_intact(&linux_support::minimal_image());
}
