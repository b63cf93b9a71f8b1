//! Shared scaffolding for the VMM's KVM integration tests: find the probe guest (or
//! skip with a printed reason when KVM is unavailable), boot a spinning probe, discard
//! consoles, drive the `blkspin` scenario's disk, hear from branch children, branch
//! through warm spawners.
#![allow(dead_code)] // each test binary uses a different subset

use std::io::Write;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use vm_memory::{Bytes, GuestAddress};

use zygote_probe_abi as abi;
use zygote_vmm::devices::serial::{CallbackWriter, SerialOut};
use zygote_vmm::devices::virtio::block::Block;
use zygote_vmm::memory::GuestRam;
use zygote_vmm::probe::{self, ProbeOptions, ProbeVm};
use zygote_vmm::vmm::warm::{ChildSetup, Payload, WarmBranchRequest, WarmReport};
use zygote_vmm::Vmm;

/// The probe ELF, or None (with the reason on stderr) when KVM is unusable here.
pub fn probe_elf() -> Option<PathBuf> {
    if let Err(why) = zygote_vmm::host::kvm_usable() {
        // Straight to stderr so the reason shows despite the test harness's capture.
        let _ = writeln!(
            std::io::stderr(),
            "skipping: KVM unavailable on this host: {why}"
        );
        return None;
    }
    Some(probe::locate_probe(true).expect("probe guest builds"))
}

/// Boot the `spin` probe with `vcpus` vCPUs and wait until it spins.
pub fn boot_spin(vcpus: u8) -> Option<ProbeVm> {
    let elf = probe_elf()?;
    let mut vm = probe::boot_probe(
        &elf,
        &ProbeOptions {
            scenario: "spin".into(),
            vcpus,
            ..Default::default()
        },
    )
    .unwrap();
    vm.wait_for_line(Duration::from_secs(60), |_| {}, |l| l == abi::REPORT_READY)
        .unwrap();
    Some(vm)
}

/// A console that discards output.
pub fn sink() -> SerialOut {
    Box::new(CallbackWriter(|_: &[u8]| {}))
}

fn scratch(i: usize) -> GuestAddress {
    GuestAddress(abi::MAILBOX_GPA + abi::MAILBOX_OFF_SCRATCH + 8 * i as u64)
}

/// Asks the `blkspin` guest to re-verify its earlier writes and write its spin sector
/// with `cmd`'s pattern; true if that worked.
pub fn blk_command(ram: &GuestRam, cmd: u64) -> bool {
    let mem = ram.memory();
    mem.write_obj(cmd, scratch(abi::SCRATCH_BLK_CMD)).unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while mem.read_obj::<u64>(scratch(abi::SCRATCH_BLK_ACK)).unwrap() != cmd {
        assert!(
            Instant::now() < deadline,
            "guest never acknowledged block command {cmd}"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    mem.read_obj::<u64>(scratch(abi::SCRATCH_BLK_RESULT))
        .unwrap()
        == 1
}

/// A 1 MiB disk image whose sector 0 holds the pattern the `blk` checks read; returns
/// its bytes.
pub fn make_blk_image(path: &std::path::Path) -> Vec<u8> {
    let mut data = vec![0x33u8; 1 << 20];
    for w in 0..64u64 {
        let at = 8 * w as usize;
        data[at..at + 8].copy_from_slice(&abi::blk_base_word(w).to_le_bytes());
    }
    std::fs::write(path, &data).unwrap();
    data
}

/// Boot the `blkspin` probe with `disk` as its virtio-blk device and wait until it is
/// ready (its `blk` checks done, the device live).
pub fn boot_blkspin(elf: &std::path::Path, disk: Block) -> ProbeVm {
    let mut vm = probe::boot_probe_with_devices(
        elf,
        &ProbeOptions {
            scenario: "blkspin".into(),
            ..Default::default()
        },
        vec![Arc::new(Mutex::new(disk))],
    )
    .unwrap();
    vm.wait_for_line(
        Duration::from_secs(60),
        |l| eprintln!("  | {l}"),
        |l| l == abi::REPORT_READY,
    )
    .unwrap();
    vm
}

/// A one-byte report from a branch child to the test: the child calls
/// [`ChildReport::send`] on [`ChildReport::write_fd`] (kept open across the branch),
/// the test [`ChildReport::wait`]s.
pub struct ChildReport {
    read: OwnedFd,
    write: OwnedFd,
}

impl ChildReport {
    pub fn new() -> Self {
        let mut fds = [0; 2];
        assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
        // SAFETY: fresh descriptors from pipe(2), owned from here on.
        unsafe {
            Self {
                read: OwnedFd::from_raw_fd(fds[0]),
                write: OwnedFd::from_raw_fd(fds[1]),
            }
        }
    }

    /// The end a child writes to (list it in the branch's `keep_fds`).
    pub fn write_fd(&self) -> RawFd {
        self.write.as_raw_fd()
    }

    /// In the child: report `ok`.
    pub fn send(fd: RawFd, ok: bool) {
        unsafe { libc::write(fd, [ok as u8].as_ptr().cast(), 1) };
    }

    /// Close this process's write end, then wait (up to 60 s) for the child's report.
    pub fn wait(self) -> bool {
        drop(self.write);
        let mut pfd = libc::pollfd {
            fd: self.read.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        assert!(
            unsafe { libc::poll(&mut pfd, 1, 60_000) } > 0,
            "child reports"
        );
        let mut byte = [0u8; 1];
        assert_eq!(
            unsafe { libc::read(self.read.as_raw_fd(), byte.as_mut_ptr().cast(), 1) },
            1
        );
        byte[0] == 1
    }
}

/// No host resources: the child of a VM without vsock or network devices.
pub fn no_child_resources(_: &mut Payload) -> ChildSetup {
    ChildSetup {
        serial: sink(),
        devices: Default::default(),
        cgroup: None,
        netns: None,
    }
}

/// Wait (up to 30 s) until one of `vmm`'s warm spawners has built its VM.
pub fn wait_for_ready_spawner(vmm: &mut Vmm) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !vmm.spawners().unwrap().iter().any(|s| s.ready) {
        assert!(Instant::now() < deadline, "no spawner built its VM in 30 s");
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// A warm branch that takes any ready spawner however stale and verifies the child's
/// memory against the parent's.
pub fn verified_warm_branch(vmm: &mut Vmm) -> WarmReport {
    vmm.branch_warm(&WarmBranchRequest {
        payload: b"",
        fds: &[],
        ready_timeout: Duration::from_secs(30),
        max_pages: u64::MAX,
        by_cost: false,
        verify: true,
    })
    .unwrap()
}
