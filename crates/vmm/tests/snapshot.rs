//! Snapshots of a live probe VM: full, diff chains and live snapshots restore to exactly
//! the captured guest state; corrupt or foreign state is refused. Skips with a reason when
//! KVM is unavailable.
mod support;

use std::path::Path;
use std::time::{Duration, Instant};

use vm_memory::{Bytes, GuestAddress};
use zygote_probe_abi as abi;
use zygote_vmm::persist::{CpuIdentity, PersistError, VmState};
use zygote_vmm::probe;
use zygote_vmm::vmm::snapshot::{SnapshotError, SnapshotMode};
use zygote_vmm::vmm::RestoreConfig;
use zygote_vmm::Vmm;

fn scratch_addr(i: usize) -> GuestAddress {
    GuestAddress(abi::MAILBOX_GPA + abi::MAILBOX_OFF_SCRATCH + 8 * i as u64)
}

/// Have the guest rewrite its dirty area with `cmd` and wait for the acknowledgement.
fn guest_dirties(vmm: &Vmm, cmd: u64) {
    let mem = vmm.guest_ram().memory();
    mem.write_obj(cmd, scratch_addr(abi::SCRATCH_DIRTY_CMD))
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    while mem
        .read_obj::<u64>(scratch_addr(abi::SCRATCH_DIRTY_ACK))
        .unwrap()
        != cmd
    {
        assert!(
            Instant::now() < deadline,
            "guest never acknowledged command {cmd}"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// The dirty area holds the words for `cmd` (0: never written).
fn assert_dirty_area(vmm: &Vmm, cmd: u64) {
    let mem = vmm.guest_ram().memory();
    for page in 0..abi::DIRTY_AREA_PAGES {
        for (k, off) in abi::DIRTY_WORD_OFFSETS.iter().enumerate() {
            let got: u64 = mem
                .read_obj(GuestAddress(abi::DIRTY_AREA_GPA + page * 4096 + off))
                .unwrap();
            let want = if cmd == 0 {
                0
            } else {
                abi::dirty_word(cmd, page, k as u64)
            };
            assert_eq!(got, want, "page {page} word {k} for command {cmd}");
        }
    }
}

fn paused_restore(dir: &Path) -> Vmm {
    Vmm::restore_snapshot(dir, RestoreConfig::new(support::sink(), true), true)
        .unwrap_or_else(|e| panic!("restore {}: {e}", dir.display()))
}

fn heartbeat(vmm: &Vmm) -> u64 {
    probe::read_mailbox(vmm.guest_ram()).unwrap().heartbeat
}

#[test]
fn full_snapshot_restores_the_exact_state_and_runs_on() {
    let Some(mut vm) = support::boot_spin(1) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let snap = dir.path().join("full");
    guest_dirties(&vm.vmm, 7);
    vm.vmm.pause().unwrap();
    let h0 = heartbeat(&vm.vmm);
    let report = vm.vmm.snapshot(SnapshotMode::Full, &snap).unwrap();
    assert!(vm.vmm.is_paused(), "a paused VM stays paused");
    assert!(report.pages_written > 0);
    vm.vmm.shutdown();

    let mut restored = paused_restore(&snap);
    assert_eq!(heartbeat(&restored), h0, "memory is exactly the snapshot's");
    assert_dirty_area(&restored, 7);
    restored.resume().unwrap();
    std::thread::sleep(Duration::from_millis(300));
    assert!(
        heartbeat(&restored) > h0,
        "restored vCPUs continue the loop"
    );
    // The restored VM is a full VM: it takes part in the guest command protocol.
    guest_dirties(&restored, 8);
    assert_dirty_area(&restored, 8);
    restored.shutdown();
}

#[test]
fn diff_chain_of_three_restores_each_layer() {
    let Some(mut vm) = support::boot_spin(1) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let base = dir.path().join("base");
    vm.vmm.snapshot(SnapshotMode::Full, &base).unwrap();
    let mut layers = Vec::new();
    for cmd in 1..=3u64 {
        guest_dirties(&vm.vmm, cmd);
        let d = dir.path().join(format!("diff{cmd}"));
        let r = vm.vmm.snapshot(SnapshotMode::Diff, &d).unwrap();
        assert!(
            r.pages_written >= abi::DIRTY_AREA_PAGES && r.pages_written < 1000,
            "a diff stores the dirtied pages only: {}",
            r.pages_written
        );
        layers.push((cmd, d));
    }
    vm.vmm.shutdown();

    let restored = paused_restore(&base);
    assert_dirty_area(&restored, 0);
    restored.shutdown();
    let mut last_beat = 0;
    for (cmd, d) in &layers {
        let restored = paused_restore(d);
        assert_dirty_area(&restored, *cmd);
        let beat = heartbeat(&restored);
        assert!(beat > last_beat, "later layers hold later guest state");
        last_beat = beat;
        restored.shutdown();
    }
}

#[test]
fn diffs_include_pages_the_vmm_wrote_for_the_guest() {
    // Devices write guest memory from the host (read buffers, used rings); KVM's dirty log
    // does not see those writes, so a diff must also carry vm-memory's record of them.
    let Some(mut vm) = support::boot_spin(1) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    vm.vmm
        .snapshot(SnapshotMode::Full, &dir.path().join("base"))
        .unwrap();
    let at = GuestAddress(0x600_0000 + 0x123 * 8);
    vm.vmm
        .guest_ram()
        .memory()
        .write_obj(0x0dd_ba11_u64, at)
        .unwrap();
    let diff = dir.path().join("diff");
    vm.vmm.snapshot(SnapshotMode::Diff, &diff).unwrap();
    vm.vmm.shutdown();
    let restored = paused_restore(&diff);
    assert_eq!(
        restored.guest_ram().memory().read_obj::<u64>(at).unwrap(),
        0x0dd_ba11,
        "the host-side write is in the diff"
    );
    restored.shutdown();
}

#[test]
fn live_snapshot_pauses_briefly_and_layers_diffs() {
    let Some(mut vm) = support::boot_spin(1) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let live = dir.path().join("live");
    guest_dirties(&vm.vmm, 11);
    let report = vm.vmm.snapshot(SnapshotMode::Live, &live).unwrap();
    eprintln!(
        "live snapshot: pause {:?}, total {:?}",
        report.pause, report.total
    );
    assert!(report.pause <= report.total);
    assert!(!vm.vmm.is_paused(), "the VM runs while the copy is written");
    guest_dirties(&vm.vmm, 12);
    let diff = dir.path().join("after-live");
    vm.vmm.snapshot(SnapshotMode::Diff, &diff).unwrap();
    let now = heartbeat(&vm.vmm);
    vm.vmm.shutdown();

    let restored = paused_restore(&live);
    assert_dirty_area(&restored, 11);
    assert!(heartbeat(&restored) < now);
    restored.shutdown();
    let restored = paused_restore(&diff);
    assert_dirty_area(&restored, 12);
    restored.shutdown();
}

#[test]
fn refuses_diff_without_base_corrupt_state_and_foreign_cpu() {
    let Some(mut vm) = support::boot_spin(1) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let err = vm
        .vmm
        .snapshot(SnapshotMode::Diff, &dir.path().join("orphan"))
        .unwrap_err();
    assert!(matches!(err, SnapshotError::NoBase), "{err}");
    assert!(
        !vm.vmm.is_paused(),
        "a refused snapshot leaves the VM running"
    );
    assert!(!dir.path().join("orphan").exists());

    let snap = dir.path().join("s");
    vm.vmm.snapshot(SnapshotMode::Full, &snap).unwrap();
    let err = vm.vmm.snapshot(SnapshotMode::Full, &snap).unwrap_err();
    assert!(err.to_string().contains("already exists"), "{err}");
    vm.vmm.shutdown();

    let state_path = snap.join("state.bin");
    let original = std::fs::read(&state_path).unwrap();
    let state = VmState::read_from(&mut original.as_slice(), &CpuIdentity::host()).unwrap();

    let restore =
        |dir: &Path| Vmm::restore_snapshot(dir, RestoreConfig::new(support::sink(), true), false);
    let mut corrupt = original.clone();
    let n = corrupt.len();
    corrupt[n - 3] ^= 0x55;
    std::fs::write(&state_path, &corrupt).unwrap();
    let err = restore(&snap).err().expect("corrupt state refused");
    assert!(
        matches!(err, SnapshotError::Persist(PersistError::Checksum)),
        "{err}"
    );

    let foreign = CpuIdentity {
        vendor: "OtherVendorCPU".into(),
        family: 0x42,
        model: 0x7,
    };
    let mut buf = Vec::new();
    state.write_to(&mut buf, &foreign).unwrap();
    std::fs::write(&state_path, &buf).unwrap();
    let err = restore(&snap).err().expect("foreign CPU refused");
    assert!(err.to_string().contains("incompatible CPU"), "{err}");
    assert!(err.to_string().contains("OtherVendorCPU"), "{err}");
}

#[test]
fn a_failed_diff_or_live_snapshot_loses_no_pages_for_the_next_diff() {
    // A diff reads (and thereby clears) KVM's dirty log before its writer runs; a live
    // snapshot restarts the log. If the writer then fails (here: the destination's parent
    // is a file; on a host, a full disk), the next diff still layers on the last
    // snapshot that exists, so it must also write the pages the failed one took.
    let Some(mut vm) = support::boot_spin(1) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let blocker = dir.path().join("not-a-dir");
    std::fs::write(&blocker, b"").unwrap();
    let base = dir.path().join("base");
    vm.vmm.snapshot(SnapshotMode::Full, &base).unwrap();

    guest_dirties(&vm.vmm, 21);
    let err = vm
        .vmm
        .snapshot(SnapshotMode::Diff, &blocker.join("diff"))
        .unwrap_err();
    assert!(matches!(err, SnapshotError::Writer { .. }), "{err}");
    assert!(err.to_string().contains("diff snapshot"), "{err}");
    assert!(!vm.vmm.is_paused(), "a failed diff leaves the VM running");
    let err = vm
        .vmm
        .snapshot(SnapshotMode::Live, &blocker.join("live"))
        .unwrap_err();
    assert!(matches!(err, SnapshotError::Writer { .. }), "{err}");

    let diff = dir.path().join("diff");
    let r = vm.vmm.snapshot(SnapshotMode::Diff, &diff).unwrap();
    assert!(r.pages_written >= abi::DIRTY_AREA_PAGES, "{r:?}");
    vm.vmm.shutdown();
    let restored = paused_restore(&diff);
    assert_dirty_area(&restored, 21);
    restored.shutdown();
}
