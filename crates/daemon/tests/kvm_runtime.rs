//! The kvm runtime's process management against real `zygote vm serve`
//! processes running the probe guest (which boots under any usable KVM, unlike
//! Linux on this kind of host): start under the supervisor, full/diff/live
//! snapshots, fork branch with per-child sockets, restore, re-attach from
//! serialized records with a fresh runtime, exit reasons, destroy leaving
//! nothing behind. The agent path (vsock, reidentify) needs a Linux guest and
//! is covered by the e2e suite on hosts with hardware virtualization.
//!
//! Needs the `zygote` binary: `$ZYGOTE_BIN`, else `target/<profile>/zygote`
//! (`cargo build -p zygote-cli`); skips with the reason when it or KVM is missing.
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use zygote_daemon::model::SnapshotKind;
use zygote_daemon::runtime::guest_agent::AgentAuth;
use zygote_daemon::runtime::kvm::KvmRuntime;
use zygote_daemon::runtime::{
    BootSource, Runtime, RuntimeError, SnapshotData, StartSpec, VmRecord,
};
use zygote_vmm::control::protocol::{StatusInfo, VmRunState};
use zygote_vmm::control::{ControlClient, Request};

fn skip(why: &str) {
    let _ = writeln!(std::io::stderr(), "skipping the kvm runtime test: {why}");
}

fn zygote_bin() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("ZYGOTE_BIN") {
        return Some(PathBuf::from(p));
    }
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target"));
    // This test binary lives in target/<profile>/deps.
    let profile = std::env::current_exe()
        .ok()
        .and_then(|p| Some(p.parent()?.parent()?.file_name()?.to_owned()))
        .unwrap_or_else(|| "debug".into());
    let bin = target.join(profile).join("zygote");
    bin.is_file().then_some(bin)
}

/// Every process whose command line names `dir` (our VMMs, their forks).
fn processes_under(dir: &Path) -> Vec<u32> {
    let needle = dir.to_string_lossy().to_string();
    let mut out = Vec::new();
    for e in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
            continue;
        };
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        let zombie = stat
            .rsplit_once(')')
            .is_some_and(|(_, r)| r.trim_start().starts_with('Z'));
        if !zombie && String::from_utf8_lossy(&cmdline).contains(&needle) {
            out.push(pid);
        }
    }
    out
}

/// Kills (by pid) whatever this test started, should an assertion fail.
struct Reaper(PathBuf);

impl Drop for Reaper {
    fn drop(&mut self) {
        for pid in processes_under(&self.0) {
            // SAFETY: plain kill(2) of a process running from our temp dir.
            unsafe { libc::kill(pid as i32, libc::SIGKILL) };
        }
    }
}

fn spec(root: &Path, name: &str, source: BootSource) -> StartSpec {
    let dir = root.join("vms").join(name);
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::create_dir_all(root.join("snapshots")).unwrap();
    StartSpec {
        dir,
        disk: root.join("layers").join(format!("{name}.qcow2")),
        mem_mib: 64,
        vcpus: 1,
        source,
        cgroup: None,
        hostname: name.into(),
        // Probe guests have no agent: tokens are never shown to anyone.
        auth: AgentAuth {
            token: format!("token-of-{name}"),
            boot_token: None,
        },
        // Confined as the daemon does it: every snapshot of this test goes under here.
        snapshot_root: Some(root.join("snapshots")),
        // No NIC: the runtime-level tests run without the daemon's network namespaces.
        net: zygote_daemon::runtime::GuestNet::User { restrict: false },
        identity: zygote_proto::SandboxIdentity {
            sandbox_id: name.into(),
            ..Default::default()
        },
        volumes: Vec::new(),
    }
}

fn status(vm: &VmRecord) -> StatusInfo {
    ControlClient::new(&vm.control)
        .with_timeout(Duration::from_secs(30))
        .request(&Request::Status)
        .unwrap()
}

fn snapshot(rt: &dyn Runtime, root: &Path, vm: &mut VmRecord, kind: SnapshotKind) -> SnapshotData {
    let dir = root.join("snapshots").join(kind.as_str());
    std::fs::create_dir_all(&dir).unwrap();
    let next = root.join("layers").join(format!("next-{}", kind.as_str()));
    let data = rt.snapshot(vm, kind, &dir, &next).expect("snapshot");
    assert_eq!(vm.disk, next, "the record moves to the next layer");
    assert!(data.state_file.is_file(), "{data:?}");
    // A diff of an idle stretch may legitimately hold no page.
    if kind != SnapshotKind::Diff {
        assert!(data.size_bytes() > 0, "{data:?}");
    }
    assert_eq!(
        status(vm).state,
        VmRunState::Running,
        "runs on after {kind:?}"
    );
    data
}

fn wait_exit(rt: &dyn Runtime, vm: &VmRecord) -> String {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if let Some(e) = rt.exit_status(vm) {
            return e.reason;
        }
        assert!(Instant::now() < deadline, "{} still runs", vm.dir.display());
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// What each test here needs: KVM, the `zygote` binary, a scratch root (with `layers/`)
/// whose processes are killed at the end. None (after saying why) to skip.
struct Setup {
    bin: PathBuf,
    root: PathBuf,
    // Dropped after the reaper: processes go before their directory.
    _reaper: Reaper,
    _tmp: tempfile::TempDir,
}

fn setup() -> Option<Setup> {
    if let Err(why) = zygote_vmm::host::kvm_usable() {
        skip(&format!("KVM unavailable on this host: {why}"));
        return None;
    }
    let Some(bin) = zygote_bin() else {
        skip("no zygote binary (run `cargo build -p zygote-cli` or set ZYGOTE_BIN)");
        return None;
    };
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().to_path_buf();
    std::fs::create_dir_all(root.join("layers")).unwrap();
    Some(Setup {
        bin,
        _reaper: Reaper(root.clone()),
        root,
        _tmp: tmp,
    })
}

#[test]
fn kvm_runtime_manages_vmm_processes() {
    let Some(env) = setup() else { return };
    let (bin, root) = (env.bin.clone(), env.root.clone());
    let rt = KvmRuntime::with_probe(bin.clone(), "spin");
    assert_eq!(rt.name(), "kvm");
    assert!(rt.snapshot_kinds().contains(&SnapshotKind::Live));

    // Start: a supervised VMM serving its socket, with a vsock socket.
    let mut a = rt
        .start(&spec(&root, "a", BootSource::Image(PathBuf::new())))
        .expect("start");
    assert!(a.process.is_alive() && a.supervisor.as_ref().unwrap().is_alive());
    assert_eq!(status(&a).pid as u32, a.process.pid);
    assert_eq!(status(&a).state, VmRunState::Running);
    assert!(
        Path::new(&a.agent_addr).exists(),
        "vsock socket {}",
        a.agent_addr
    );
    assert_eq!(a.accel, "kvm");
    assert!(rt.exit_status(&a).is_none());

    // Snapshots of every kind; the VM keeps running.
    let full = snapshot(&rt, &root, &mut a, SnapshotKind::Full);
    let diff = snapshot(&rt, &root, &mut a, SnapshotKind::Diff);
    let live = snapshot(&rt, &root, &mut a, SnapshotKind::Live);
    let meta = std::fs::read_to_string(diff.state_file.with_file_name("meta.json")).unwrap();
    assert!(
        meta.contains(full.state_file.parent().unwrap().to_str().unwrap()),
        "{meta}"
    );

    // Branch: two children, each its own process and sockets.
    let kids = [
        spec(&root, "b", BootSource::Image(PathBuf::new())),
        spec(&root, "c", BootSource::Image(PathBuf::new())),
    ];
    let point_dir = root.join("snapshots").join("point");
    std::fs::create_dir_all(&point_dir).unwrap();
    let next = root.join("layers").join("after-branch");
    let (point, results) = rt
        .branch(&mut a, &point_dir, &next, &kids, false)
        .expect("branch");
    assert_eq!(a.disk, next);
    let children: Vec<VmRecord> = results.into_iter().map(|r| r.expect("child")).collect();
    for (child, s) in children.iter().zip(&kids) {
        assert!(child.process.is_alive());
        assert_ne!(child.process.pid, a.process.pid);
        assert!(
            child.supervisor.is_none(),
            "forked by the VMM, not supervised"
        );
        assert_eq!(child.control, s.dir.join("api.sock"));
        assert_eq!(status(child).pid as u32, child.process.pid);
        assert_eq!(status(child).state, VmRunState::Running);
        assert!(Path::new(&child.agent_addr).starts_with(&s.dir));
    }
    assert_eq!(status(&a).state, VmRunState::Running, "the parent runs on");
    // A fork-based branch point has no state to restore from.
    let err = rt
        .start(&spec(&root, "x", BootSource::Snapshot(point.clone())))
        .unwrap_err();
    assert!(matches!(err, RuntimeError::Unsupported(_)), "{err}");
    // (The manager discards a failed sandbox's directory.)
    std::fs::remove_dir_all(root.join("vms/x")).unwrap();

    // A kept point (for merges): the VMM's spawner writes it once the child runs,
    // and a VM then starts from it.
    let kept_dir = root.join("snapshots").join("kept-point");
    std::fs::create_dir_all(&kept_dir).unwrap();
    let kept_kid = [spec(&root, "k", BootSource::Image(PathBuf::new()))];
    let after_kept = root.join("layers").join("after-kept");
    let (kept, kept_results) = rt
        .branch(&mut a, &kept_dir, &after_kept, &kept_kid, true)
        .expect("branch keeping its point");
    assert_eq!(a.disk, after_kept);
    let kept_child = kept_results.into_iter().next().unwrap().expect("child");
    let deadline = Instant::now() + Duration::from_secs(60);
    while !kept.state_file.exists() {
        assert!(
            Instant::now() < deadline,
            "the kept point {} was never written",
            kept.state_file.display()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let from_point = rt
        .start(&spec(&root, "from-point", BootSource::Snapshot(kept)))
        .expect("start from a kept branch point");
    assert_eq!(status(&from_point).state, VmRunState::Running);
    rt.destroy(&from_point);
    rt.destroy(&kept_child);

    // Restore from the full and the diff snapshot: new supervised VMMs.
    let mut restored = Vec::new();
    for (name, data) in [("r-full", &full), ("r-diff", &diff), ("r-live", &live)] {
        let r = rt
            .start(&spec(&root, name, BootSource::Snapshot(data.clone())))
            .unwrap_or_else(|e| panic!("restore {name}: {e}"));
        assert!(r.supervisor.is_some());
        assert_eq!(status(&r).state, VmRunState::Running, "{name}");
        restored.push(r);
    }

    // "Daemon restart": records go through JSON, a new runtime re-attaches
    // and resumes a VM left paused by an interrupted operation.
    let mut all = vec![a.clone()];
    all.extend(children.iter().cloned());
    all.extend(restored.iter().cloned());
    let stored = serde_json::to_string(&all).unwrap();
    drop(rt);
    let rt = KvmRuntime::with_probe(bin, "spin");
    let all: Vec<VmRecord> = serde_json::from_str(&stored).unwrap();
    let c = &all[2];
    let paused: StatusInfo = ControlClient::new(&c.control)
        .request(&Request::Pause)
        .unwrap();
    assert_eq!(paused.state, VmRunState::Paused);
    for vm in &all {
        rt.reattach(vm).expect("reattach");
        assert_eq!(
            status(vm).state,
            VmRunState::Running,
            "{}",
            vm.dir.display()
        );
        assert!(rt.exit_status(vm).is_none());
    }

    // Exit reasons: a stopped VMM, a killed supervised one, a killed child.
    let a = &all[0];
    let _: StatusInfo = ControlClient::new(&a.control)
        .request(&Request::Stop)
        .unwrap();
    let why = wait_exit(&rt, a);
    assert!(why.contains("exited normally"), "{why}");
    let r = &all[3];
    r.process.signal(libc::SIGKILL);
    let why = wait_exit(&rt, r);
    assert!(why.contains("signal 9"), "{why}");
    let b = &all[1];
    b.process.signal(libc::SIGKILL);
    let why = wait_exit(&rt, b);
    assert!(why.contains("killed by a signal"), "{why}");
    assert_eq!(status(c).state, VmRunState::Running, "the sibling lives on");

    // Destroy everything: no process, socket or directory is left.
    let pids: Vec<u32> = processes_under(&root);
    assert!(!pids.is_empty());
    for vm in &all {
        rt.destroy(vm);
        assert!(!vm.dir.exists(), "{}", vm.dir.display());
        assert!(!vm.process.is_alive());
    }
    // The spawner of the two children exits once its last child is gone.
    let deadline = Instant::now() + Duration::from_secs(10);
    while !processes_under(&root).is_empty() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(
        processes_under(&root).is_empty(),
        "left running: {:?}",
        processes_under(&root)
    );
    let left: Vec<_> = std::fs::read_dir(root.join("vms")).unwrap().collect();
    assert!(left.is_empty(), "{left:?}");
    let layers: Vec<_> = std::fs::read_dir(root.join("layers")).unwrap().collect();
    assert!(
        layers.is_empty(),
        "the kvm runtime keeps disks in memory: {layers:?}"
    );
}

/// The probe's mailbox (crates/probe-abi): its heartbeat counter, and scratch words
/// (`spin` writes "SPIN" into scratch[1] once its boot checks passed; scratch[7] is free).
const MAILBOX_HEARTBEAT: u64 = 0x5_0000 + 16;
const SPIN_READY: u64 = 0x5_0000 + 32 + 8;
const MARKER: u64 = 0x5_0000 + 32 + 8 * 7;

fn read_word(vm: &VmRecord, gpa: u64) -> u64 {
    let hex: String = ControlClient::new(&vm.control)
        .request(&Request::ReadMemory { gpa, len: 8 })
        .unwrap();
    u64::from_str_radix(&hex, 16).unwrap().swap_bytes()
}

/// Waits for the probe to pass its boot checks (it tests all RAM first) and spin.
fn wait_spinning(vm: &VmRecord) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while read_word(vm, SPIN_READY) != 0x5350_494e {
        assert!(
            Instant::now() < deadline,
            "the probe never started spinning"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// With warm spawners (`zygote serve --warm-spawners`), a single-child branch is the
/// spawner the VMM kept: no fork, its VM (with the vsock device) restored into the one
/// it built ahead; the child serves its own sockets and its guest runs; destroying
/// everything leaves no process behind.
#[test]
fn kvm_runtime_branches_a_child_through_a_warm_spawner() {
    let Some(env) = setup() else { return };
    let (bin, root) = (env.bin.clone(), env.root.clone());
    let rt = KvmRuntime::with_probe(bin, "spin").with_warm_spawners(1);
    let mut a = rt
        .start(&spec(&root, "a", BootSource::Image(PathBuf::new())))
        .expect("start");
    wait_spinning(&a);
    let deadline = Instant::now() + Duration::from_secs(30);
    let spawner = loop {
        if let Some(s) = status(&a).spawners.iter().find(|s| s.ready) {
            break s.pid;
        }
        assert!(Instant::now() < deadline, "no warm spawner ready");
        std::thread::sleep(Duration::from_millis(20));
    };
    // What the daemon's /metrics reports: the spawner, ready, with memory of its own.
    let kept = rt.warm_spawners(&a);
    assert_eq!(kept.len(), 1, "{kept:?}");
    assert!(kept[0].ready && kept[0].pid == spawner, "{kept:?}");
    assert!(
        kept[0].private_bytes > 0,
        "its VM's memory is its own: {kept:?}"
    );
    let kid = [spec(&root, "w", BootSource::Image(PathBuf::new()))];
    let point_dir = root.join("snapshots").join("warm-point");
    std::fs::create_dir_all(&point_dir).unwrap();
    let next = root.join("layers").join("after-warm");
    let (_, results) = rt
        .branch(&mut a, &point_dir, &next, &kid, false)
        .expect("branch");
    let child = results.into_iter().next().unwrap().expect("child");
    assert_eq!(
        child.process.pid as i32, spawner,
        "the spawner became the child"
    );
    assert_eq!(status(&child).state, VmRunState::Running);
    assert!(Path::new(&child.agent_addr).starts_with(&kid[0].dir));
    let beat = read_word(&child, MAILBOX_HEARTBEAT);
    let deadline = Instant::now() + Duration::from_secs(10);
    while read_word(&child, MAILBOX_HEARTBEAT) <= beat {
        assert!(
            Instant::now() < deadline,
            "the warm child's guest does not run"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(status(&a).state, VmRunState::Running, "the parent runs on");
    for vm in [&child, &a] {
        rt.destroy(vm);
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    while !processes_under(&root).is_empty() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(
        processes_under(&root).is_empty(),
        "left running: {:?}",
        processes_under(&root)
    );
}

/// Pause to disk and resume in place: the state is saved under the park directory, the
/// VMM process ends, and a VM started from it (`BootSource::Parked`) runs on with the
/// guest memory it had (a host-written marker survives, the heartbeat goes on from
/// where it was).
#[test]
fn kvm_runtime_parks_a_vm_and_resumes_it_in_place() {
    let Some(env) = setup() else { return };
    let (bin, root) = (env.bin.clone(), env.root.clone());
    let rt = KvmRuntime::with_probe(bin, "spin");
    let sp = spec(&root, "p", BootSource::Image(PathBuf::new()));
    let a = rt.start(&sp).expect("start");
    wait_spinning(&a);
    let _: usize = ControlClient::new(&a.control)
        .request(&Request::WriteMemory {
            gpa: MARKER,
            hex: "edfe0d0000000000".into(),
        })
        .unwrap();

    let dir = root.join("snapshots").join("p.park-1");
    std::fs::create_dir_all(&dir).unwrap();
    let expected = rt.park_data(&a, &dir);
    assert!(
        !expected.state_file.exists(),
        "no state before the pause: {expected:?}"
    );
    let t = Instant::now();
    let parked = rt.park(&a, &dir).expect("park");
    eprintln!(
        "    kvm park of a 64 MiB probe VM: {:.1} ms (vCPUs stopped {:.1} ms)",
        t.elapsed().as_secs_f64() * 1e3,
        parked.pause_ms.unwrap_or_default()
    );
    assert_eq!(parked.state_file, expected.state_file);
    assert!(parked.state_file.is_file(), "{parked:?}");
    assert!(parked.pause_ms.is_some());
    assert!(!a.process.is_alive(), "the VMM ended with the pause");
    assert!(
        processes_under(&root).is_empty(),
        "{:?}",
        processes_under(&root)
    );
    // The heartbeat as saved (the memory file is guest RAM from address 0).
    let saved_beat = {
        use std::io::{Read, Seek};
        let mut f = std::fs::File::open(&parked.state_file).unwrap();
        f.seek(std::io::SeekFrom::Start(MAILBOX_HEARTBEAT)).unwrap();
        let mut b = [0u8; 8];
        f.read_exact(&mut b).unwrap();
        u64::from_le_bytes(b)
    };
    assert!(saved_beat > 0);

    let mut again = sp.clone();
    again.source = BootSource::Parked(parked.clone());
    let t = Instant::now();
    let b = rt.start(&again).expect("resume");
    eprintln!(
        "    kvm resume (restore, memory file mapped MAP_PRIVATE): {:.1} ms",
        t.elapsed().as_secs_f64() * 1e3
    );
    assert_eq!(status(&b).state, VmRunState::Running);
    assert_ne!(b.process.pid, a.process.pid);
    assert_eq!(
        read_word(&b, MARKER),
        0xdfeed,
        "the guest's memory came back"
    );
    let deadline = Instant::now() + Duration::from_secs(30);
    while read_word(&b, MAILBOX_HEARTBEAT) <= saved_beat {
        assert!(Instant::now() < deadline, "the guest does not run on");
        std::thread::sleep(Duration::from_millis(20));
    }
    // The restored VMM reads the memory file lazily: the park directory stays.
    assert!(rt.resumed_needs_park());
    rt.destroy(&b);
    assert!(!b.process.is_alive());
}

mod volumes {
    //! A volume under the kvm runtime, driven through the probe's `blkspin` scenario (the
    //! volume is its only, so first, disk): the owner's writes reach the volume's image;
    //! a branch child, a VM started from a snapshot, and their writes never do.
    use super::*;
    use zygote_daemon::runtime::VolumeDisk;
    use zygote_probe_abi as abi;

    fn scratch(i: usize) -> u64 {
        abi::MAILBOX_GPA + abi::MAILBOX_OFF_SCRATCH + 8 * i as u64
    }

    /// Has the guest write its spin sector with `cmd`'s pattern; true if that worked.
    fn blk_command(vm: &VmRecord, cmd: u64) -> bool {
        let _: usize = ControlClient::new(&vm.control)
            .request(&Request::WriteMemory {
                gpa: scratch(abi::SCRATCH_BLK_CMD),
                hex: hex::encode(cmd.to_le_bytes()),
            })
            .unwrap();
        let deadline = Instant::now() + Duration::from_secs(30);
        while read_word(vm, scratch(abi::SCRATCH_BLK_ACK)) != cmd {
            assert!(
                Instant::now() < deadline,
                "the guest never ran command {cmd}"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
        read_word(vm, scratch(abi::SCRATCH_BLK_RESULT)) == 1
    }

    /// Which command last wrote the spin sector of `file` (0: none of 1..=16).
    fn spin_of(file: &Path) -> u64 {
        let data = std::fs::read(file).unwrap();
        let at = (abi::BLK_SPIN_SECTOR * 512) as usize;
        let word = u64::from_le_bytes(data[at..at + 8].try_into().unwrap());
        (1..=16)
            .find(|&c| abi::blk_spin_word(c, 0) == word)
            .unwrap_or(0)
    }

    fn volume_image(path: &Path) {
        let mut data = vec![0x33u8; 1 << 20];
        for w in 0..64u64 {
            let at = 8 * w as usize;
            data[at..at + 8].copy_from_slice(&abi::blk_base_word(w).to_le_bytes());
        }
        std::fs::write(path, &data).unwrap();
    }

    /// Waits for the guest to pass its boot checks (RAM, disk) and obey commands.
    fn wait_ready(vm: &VmRecord) {
        let console = zygote_daemon::runtime::console::path(&vm.dir);
        let deadline = Instant::now() + Duration::from_secs(60);
        while !std::fs::read_to_string(&console)
            .unwrap_or_default()
            .contains(abi::REPORT_READY)
        {
            assert!(Instant::now() < deadline, "the probe never got ready");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    #[test]
    fn kvm_runtime_keeps_a_volume_its_owners() {
        let Some(env) = setup() else { return };
        let (bin, root) = (env.bin.clone(), env.root.clone());
        let rt = KvmRuntime::with_probe(bin, "blkspin");
        assert!(rt.volumes_supported());
        let image = root.join("vol-0123456789ab.ext4");
        volume_image(&image);
        let mut sp = spec(&root, "owner", BootSource::Image(PathBuf::new()));
        sp.volumes = vec![VolumeDisk {
            volume: "vol-0123456789ab".into(),
            name: "data".into(),
            path: "/data".into(),
            file: image.clone(),
            format: "raw".into(),
            writes_volume: true,
        }];
        let mut owner = rt.start(&sp).expect("start with a volume");
        wait_ready(&owner);
        assert!(blk_command(&owner, 1));
        assert_eq!(spin_of(&image), 1, "the owner's writes reach the volume");

        // Branch: the child's disk is a view of a copy frozen while the owner paused.
        let point = root.join("snapshots").join("point");
        std::fs::create_dir_all(&point).unwrap();
        let child_spec = spec(&root, "child", BootSource::Image(PathBuf::new()));
        let next = root.join("layers").join("next");
        let (_, mut results) = rt
            .branch(
                &mut owner,
                &point,
                &next,
                std::slice::from_ref(&child_spec),
                false,
            )
            .expect("branch");
        let child = results.remove(0).expect("child");
        let copy = child_spec.dir.join("vol-0123456789ab.raw");
        assert_eq!(child.volumes[0].file, copy);
        assert!(!child.volumes[0].writes_volume);
        assert!(blk_command(&child, 3), "the child drives its view");
        assert_eq!(spin_of(&image), 1, "the child never wrote the volume");
        assert_eq!(spin_of(&copy), 1, "nor its frozen copy");
        assert!(blk_command(&owner, 4));
        assert_eq!(spin_of(&image), 4, "the owner still writes the volume");

        // A snapshot: its own copy, and a VM started from it gets a view of that.
        let snap = snapshot(&rt, &root, &mut owner, SnapshotKind::Full);
        assert_eq!(snap.volumes.len(), 1, "{snap:?}");
        assert_eq!(spin_of(&snap.volumes[0].file), 4);
        let from_snap = rt
            .start(&spec(&root, "restored", BootSource::Snapshot(snap.clone())))
            .expect("start from the snapshot");
        assert!(blk_command(&from_snap, 5));
        assert_eq!(spin_of(&image), 4, "the restored VM never wrote the volume");
        assert_eq!(spin_of(&snap.volumes[0].file), 4, "nor the snapshot's copy");

        // Pause to disk and back: the owner writes its volume again.
        let park = root.join("snapshots").join("owner.park-1");
        std::fs::create_dir_all(&park).unwrap();
        let parked = rt.park(&owner, &park).expect("park");
        assert_eq!(parked.volumes, owner.volumes);
        let resumed = rt
            .start(&spec(&root, "owner", BootSource::Parked(parked)))
            .expect("resume");
        assert!(blk_command(&resumed, 6));
        assert_eq!(spin_of(&image), 6, "the resumed owner writes its volume");
        for vm in [&child, &from_snap, &resumed] {
            rt.destroy(vm);
        }
    }
}
