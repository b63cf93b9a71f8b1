//! Boot zygote's probe guest through the real KVM path. These run on any host with a
//! usable /dev/kvm (including shadow-paging hypervisors that cannot boot Linux) and skip
//! with a printed reason when KVM is unavailable.
mod support;

use std::time::{Duration, Instant};

use zygote_probe_abi as abi;
use zygote_vmm::probe::{self, ProbeOptions};

const TIMEOUT: Duration = Duration::from_secs(120);

use support::probe_elf;

fn run(opts: ProbeOptions) -> Vec<String> {
    let Some(elf) = probe_elf() else {
        return Vec::new();
    };
    let out = probe::run_probe(&elf, &opts, TIMEOUT, |l| eprintln!("  | {l}"))
        .unwrap_or_else(|e| panic!("probe {opts:?} failed: {e}"));
    assert!(out.exit.as_ref().is_some_and(|e| e.is_clean()));
    out.transcript
}

fn has(transcript: &[String], prefix: &str) -> bool {
    transcript.iter().any(|l| l.starts_with(prefix))
}

#[test]
fn boots_with_one_vcpu_256_mib() {
    let t = run(ProbeOptions::default());
    if t.is_empty() {
        return;
    }
    for check in ["boot_signature", "cmdline", "e820", "apic_id", "memory"] {
        assert!(
            has(&t, &format!("check {check} ok")),
            "missing {check}: {t:?}"
        );
    }
    assert!(has(&t, "check e820 ok entries=3 ram_mib=256"), "{t:?}");
}

#[test]
fn boots_with_two_vcpus_and_wakes_the_ap() {
    let t = run(ProbeOptions {
        vcpus: 2,
        scenario: "smp".into(),
        ..Default::default()
    });
    if t.is_empty() {
        return;
    }
    assert!(has(&t, "check smp ok cpus=2 mask=0x3"), "{t:?}");
}

#[test]
fn boots_with_4_gib_across_the_mmio_hole() {
    let t = run(ProbeOptions {
        mem_mib: 4096,
        ..Default::default()
    });
    if t.is_empty() {
        return;
    }
    // 3 GiB below the hole + 1 GiB above 4 GiB, all of it visible to the guest.
    assert!(has(&t, "check e820 ok entries=4 ram_mib=4096"), "{t:?}");
    assert!(has(&t, "check memory ok"), "{t:?}");
}

fn heartbeat_after(vm: &probe::ProbeVm, wait: Duration) -> u64 {
    std::thread::sleep(wait);
    vm.mailbox().unwrap().heartbeat
}

#[test]
fn pause_stops_the_guest_and_resume_continues_it() {
    let Some(elf) = probe_elf() else { return };
    let mut vm = probe::boot_probe(
        &elf,
        &ProbeOptions {
            scenario: "spin".into(),
            ..Default::default()
        },
    )
    .unwrap();
    vm.wait_for_line(TIMEOUT, |l| eprintln!("  | {l}"), |l| l == "PROBE READY")
        .unwrap();
    let mb = vm.mailbox().unwrap();
    assert_eq!(mb.magic, abi::MAILBOX_MAGIC);
    let a = heartbeat_after(&vm, Duration::from_millis(50));
    let b = heartbeat_after(&vm, Duration::from_millis(200));
    assert!(b > a, "guest is running: heartbeat {a} -> {b}");

    let t = Instant::now();
    vm.vmm.pause().unwrap();
    eprintln!("pause took {:?}", t.elapsed());
    let p1 = heartbeat_after(&vm, Duration::ZERO);
    let p2 = heartbeat_after(&vm, Duration::from_millis(300));
    assert_eq!(p1, p2, "paused guest must not run");

    vm.vmm.resume().unwrap();
    let r = heartbeat_after(&vm, Duration::from_millis(300));
    assert!(
        r > p2,
        "resumed guest continues from where it stopped: {p2} -> {r}"
    );

    // Pause and resume again, twice in a row each, to check the controls are idempotent.
    vm.vmm.pause().unwrap();
    vm.vmm.pause().unwrap();
    let q = heartbeat_after(&vm, Duration::from_millis(100));
    assert_eq!(q, heartbeat_after(&vm, Duration::from_millis(100)));
    vm.vmm.resume().unwrap();
    vm.vmm.resume().unwrap();
    assert!(heartbeat_after(&vm, Duration::from_millis(300)) > q);
    assert!(
        vm.vmm.wait(Some(Duration::ZERO)).is_none(),
        "spin never exits by itself"
    );
    vm.vmm.shutdown();
}

#[test]
fn a_faulting_guest_ends_with_an_error_and_register_dump() {
    let Some(elf) = probe_elf() else { return };
    let mut vm = probe::boot_probe(
        &elf,
        &ProbeOptions {
            scenario: "fault".into(),
            ..Default::default()
        },
    )
    .unwrap();
    let exit = vm
        .vmm
        .wait(Some(TIMEOUT))
        .cloned()
        .expect("the VM ends instead of hanging");
    assert!(!exit.is_clean(), "{exit}");
    let text = exit.to_string();
    assert!(
        matches!(
            exit,
            zygote_vmm::ExitReason::TripleFault { .. }
                | zygote_vmm::ExitReason::InternalError { .. }
        ),
        "{text}"
    );
    assert!(
        text.contains("rip=") && text.contains("cr0="),
        "register dump: {text}"
    );
}
