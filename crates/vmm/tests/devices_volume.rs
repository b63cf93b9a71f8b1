//! A persistent disk (a named volume's image) under branch and snapshot: the VM that
//! owns it keeps writing the file; a branch child or a restored snapshot gets a frozen
//! copy opened copy-on-write (`DiskFile`), so neither ever writes the volume nor the
//! copy; a branch that would give a child the parent's file is refused.
mod support;

use std::path::Path;
use std::time::Duration;

use zygote_probe_abi as abi;
use zygote_vmm::devices::virtio::block::{Block, BlockConfig, DiskFile};
use zygote_vmm::devices::virtio::persist::DeviceHostConfig;
use zygote_vmm::vmm::branch::{BranchError, BranchRequest, ChildContext};
use zygote_vmm::vmm::snapshot::SnapshotMode;
use zygote_vmm::vmm::RestoreConfig;
use zygote_vmm::Vmm;

const ID: &str = "vol-0123456789ab";

/// Which command last wrote the spin sector of `file` (0: none of 1..=16).
fn spin_of(file: &Path) -> u64 {
    let data = std::fs::read(file).unwrap();
    let at = (abi::BLK_SPIN_SECTOR * 512) as usize;
    let word = u64::from_le_bytes(data[at..at + 8].try_into().unwrap());
    (1..=16)
        .find(|&c| abi::blk_spin_word(c, 0) == word)
        .unwrap_or(0)
}

fn view(path: &Path) -> DiskFile {
    DiskFile {
        id: ID.into(),
        path: path.to_path_buf(),
        copy_on_write: true,
    }
}

/// Branch `vm` into one child that runs `cmd` and reports whether it worked.
fn branch_one(vmm: &mut Vmm, disk_files: Vec<DiskFile>, cmd: u64) -> Result<bool, BranchError> {
    let report = support::ChildReport::new();
    let w = report.write_fd();
    let child_main = move |ctx: ChildContext| -> i32 {
        support::ChildReport::send(w, support::blk_command(ctx.vmm.guest_ram(), cmd));
        0
    };
    let sink = |_: usize| support::sink();
    let devices = |_: usize| DeviceHostConfig {
        disk_files: disk_files.clone(),
        ..Default::default()
    };
    let result = vmm.branch(&BranchRequest {
        count: 1,
        child_serial: &sink,
        child_devices: &devices,
        child_cgroup: &|_| None,
        child_netns: &|_| None,
        child_main: &child_main,
        keep_fds: vec![w],
        ready_timeout: Duration::from_secs(30),
    });
    result.map(|_| report.wait())
}

#[test]
fn copies_of_a_vm_never_write_its_persistent_disk() {
    let Some(elf) = support::probe_elf() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let volume = dir.path().join("volume.img");
    support::make_blk_image(&volume);
    let disk = Block::open(BlockConfig {
        id: Some(ID.into()),
        ..BlockConfig::persistent(&volume)
    })
    .unwrap();
    let mut vm = support::boot_blkspin(&elf, disk);
    assert!(support::blk_command(vm.vmm.guest_ram(), 1));
    assert_eq!(spin_of(&volume), 1, "the owner's writes reach the volume");

    // A child without a file of its own would write the parent's: refused, parent runs.
    match branch_one(&mut vm.vmm, Vec::new(), 9) {
        Err(BranchError::SharedPersistentDisk { index: 0, id }) => assert_eq!(id, ID),
        other => panic!("a branch sharing the volume must be refused, got {other:?}"),
    }
    assert!(
        support::blk_command(vm.vmm.guest_ram(), 2),
        "the parent runs on"
    );
    assert_eq!(spin_of(&volume), 2);

    // The daemon's way: paused, the volume frozen, then the branch; the child writes
    // only its copy-on-write view of the copy.
    vm.vmm.pause().unwrap();
    let frozen = dir.path().join("frozen.img");
    std::fs::copy(&volume, &frozen).unwrap();
    assert!(branch_one(&mut vm.vmm, vec![view(&frozen)], 3).unwrap());
    assert_eq!(
        spin_of(&volume),
        2,
        "the child's write never reached the volume"
    );
    assert_eq!(spin_of(&frozen), 2, "nor the frozen copy");
    vm.vmm.resume().unwrap();
    assert!(support::blk_command(vm.vmm.guest_ram(), 4));
    assert_eq!(spin_of(&volume), 4, "the parent still owns the volume");
    assert_eq!(spin_of(&frozen), 2);
    assert_eq!(vm.vmm.reap_children(true).len(), 1);

    // A snapshot restored over its own frozen copy, copy-on-write.
    vm.vmm.pause().unwrap();
    let frozen_snap = dir.path().join("frozen-snap.img");
    std::fs::copy(&volume, &frozen_snap).unwrap();
    let snap = dir.path().join("snap");
    vm.vmm.snapshot(SnapshotMode::Full, &snap).unwrap();
    vm.vmm.shutdown();
    let restore = |files: Vec<DiskFile>| {
        let mut cfg = RestoreConfig::new(support::sink(), false);
        cfg.device_host.disk_files = files;
        Vmm::restore_snapshot(&snap, cfg, false)
    };
    let wrong = DiskFile {
        id: "vol-other".into(),
        ..view(&frozen_snap)
    };
    let err = restore(vec![wrong])
        .err()
        .expect("an id the VM lacks is refused");
    assert!(err.to_string().contains("vol-other"), "{err}");
    let mut restored = restore(vec![view(&frozen_snap)]).unwrap();
    assert!(
        support::blk_command(restored.guest_ram(), 5),
        "restored guest drives its view"
    );
    assert_eq!(
        spin_of(&volume),
        4,
        "the restored VM never wrote the volume"
    );
    assert_eq!(spin_of(&frozen_snap), 4, "nor its frozen copy");
    restored.pause().unwrap();
    restored.shutdown();
}
