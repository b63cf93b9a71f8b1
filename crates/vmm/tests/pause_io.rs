//! A vCPU paused while the VMM handles one of its I/O exits is captured after the
//! instruction completed: KVM finishes an I/O exit only on the next KVM_RUN, so state
//! captured before that would make a snapshot or a branch child execute the instruction
//! again (a second device write, a stale read). Skips with a reason when KVM is
//! unavailable.
mod support;

use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use vm_memory::{Bytes, GuestAddress};
use zygote_probe_abi as abi;
use zygote_vmm::devices::serial::CallbackWriter;
use zygote_vmm::probe::{self, ProbeOptions};
use zygote_vmm::{VmConfig, Vmm};

/// `out dx, al`: how the probe writes COM1.
const OUT_DX_AL: u8 = 0xee;

/// A console that passes output through until armed, then holds the vCPU inside the
/// next write (an OUT exit being handled) until released.
struct Gate {
    armed: Mutex<bool>,
    held: Mutex<Option<Sender<()>>>,
    release: Mutex<Option<Receiver<()>>>,
    lines: Mutex<Vec<u8>>,
}

#[test]
fn a_vcpu_paused_in_an_io_exit_is_captured_after_the_instruction() {
    let Some(elf) = support::probe_elf() else {
        return;
    };
    let (held_tx, held_rx) = channel();
    let (release_tx, release_rx) = channel();
    let gate = Arc::new(Gate {
        armed: Mutex::new(false),
        held: Mutex::new(Some(held_tx)),
        release: Mutex::new(Some(release_rx)),
        lines: Mutex::new(Vec::new()),
    });
    let g = gate.clone();
    let serial = CallbackWriter(move |b: &[u8]| {
        if *g.armed.lock().unwrap() {
            if let Some(tx) = g.held.lock().unwrap().take() {
                let _ = tx.send(());
                let rx = g.release.lock().unwrap().take().unwrap();
                let _ = rx.recv();
            }
        } else {
            g.lines.lock().unwrap().extend_from_slice(b);
        }
    });
    let opts = ProbeOptions {
        scenario: "spin".into(),
        ..Default::default()
    };
    let mut vmm = Vmm::boot(VmConfig {
        kernel: elf,
        initrd: None,
        cmdline: probe::probe_cmdline(&opts),
        mem_mib: opts.mem_mib,
        vcpus: 1,
        serial_out: Box::new(serial),
        start_paused: false,
        virtio_devices: Vec::new(),
    })
    .unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while !String::from_utf8_lossy(&gate.lines.lock().unwrap()).contains(abi::REPORT_READY) {
        assert!(
            std::time::Instant::now() < deadline,
            "probe never got ready"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    *gate.armed.lock().unwrap() = true;
    let chatter =
        GuestAddress(abi::MAILBOX_GPA + abi::MAILBOX_OFF_SCRATCH + 8 * abi::SCRATCH_CHATTER as u64);
    vmm.guest_ram().memory().write_obj(1u64, chatter).unwrap();
    held_rx
        .recv_timeout(Duration::from_secs(30))
        .expect("the guest writes COM1");

    // The vCPU thread is inside the OUT exit. Ask for a capture, then let it go on.
    let releaser = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(300));
        release_tx.send(()).unwrap();
    });
    let state = vmm.pause_and_capture().expect("capture");
    releaser.join().unwrap();
    let rip = state.vcpus[0].regs.rip;
    let mut around = [0u8; 2];
    // The probe runs identity-mapped: its instruction addresses are guest-physical.
    vmm.guest_ram()
        .memory()
        .read_slice(&mut around, GuestAddress(rip - 1))
        .unwrap();
    assert_eq!(
        around[0], OUT_DX_AL,
        "captured at rip {rip:#x}, which is not right after the OUT (bytes {around:02x?}): \
         the pending I/O was not completed before the capture"
    );
    assert_ne!(around[1], OUT_DX_AL, "rip {rip:#x} still at the OUT");
    vmm.resume().unwrap();
    vmm.shutdown();
}
