//! The cgroup code path against fake cgroup directories (this host's cgroup
//! v2 has no controllers, so the "limits applied" path is only reachable
//! this way; the real-hierarchy path runs in the end-to-end suite).
use std::path::Path;

use zygote_daemon::cgroup::{self, Cgroups};
use zygote_daemon::model::Limits;

fn fake_root(dir: &Path, controllers: &str) {
    std::fs::create_dir_all(dir).unwrap();
    std::fs::write(dir.join("cgroup.controllers"), controllers).unwrap();
    // What the kernel would show once the controllers are delegated.
    std::fs::write(dir.join("cgroup.subtree_control"), controllers).unwrap();
}

fn limits() -> Limits {
    Limits {
        memory_mib: Some(512),
        cpu_percent: Some(150),
        pids: Some(64),
    }
}

#[test]
fn limits_are_written_when_controllers_exist() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("zygote");
    fake_root(&root, "cpuset cpu io memory pids");
    let cg = Cgroups::detect(Some(root.clone()));
    let info = cg.info();
    assert_eq!(info.controllers, ["memory", "cpu", "pids"]);
    assert!(info.limitations.is_empty(), "{:?}", info.limitations);

    let report = cg.create("sb-test", &limits());
    let dir = root.join("sb-test");
    assert_eq!(report.path.as_deref(), Some(dir.to_str().unwrap()));
    assert!(report.not_applied.is_empty(), "{:?}", report.not_applied);
    assert_eq!(report.applied.len(), 3);
    let read = |f: &str| std::fs::read_to_string(dir.join(f)).unwrap();
    assert_eq!(read("memory.max"), (512u64 << 20).to_string());
    assert_eq!(read("cpu.max"), "150000 100000");
    assert_eq!(read("pids.max"), "64");

    // Nothing requested: a cgroup for grouping, no files written.
    let plain = cg.create("sb-plain", &Limits::default());
    assert!(plain.applied.is_empty() && plain.not_applied.is_empty());
    assert!(!root.join("sb-plain/memory.max").exists());

    cgroup::destroy(&dir).unwrap();
    assert!(!dir.exists());
    cgroup::destroy(&dir).expect("destroying twice is fine");
}

#[test]
fn missing_controllers_are_reported_not_fatal() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("zygote");
    // Like this CI host's hybrid hierarchy: cgroup v2 without controllers.
    fake_root(&root, "");
    let cg = Cgroups::detect(Some(root.clone()));
    let info = cg.info();
    assert!(info.controllers.is_empty());
    assert!(
        info.limitations
            .iter()
            .any(|l| l.contains("memory/cpu/pids")),
        "{:?}",
        info.limitations
    );
    let report = cg.create("sb-x", &limits());
    assert!(report.path.is_some(), "the VM still gets its own cgroup");
    assert!(report.applied.is_empty());
    for f in ["memory.max", "cpu.max", "pids.max"] {
        let why = report
            .not_applied
            .get(f)
            .unwrap_or_else(|| panic!("{f} unexplained"));
        assert!(why.contains("controller"), "{why}");
    }
}

#[test]
fn only_some_controllers() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("zygote");
    fake_root(&root, "pids");
    let cg = Cgroups::detect(Some(root.clone()));
    let report = cg.create("sb-y", &limits());
    assert_eq!(report.applied, ["pids.max=64"]);
    assert_eq!(
        report.not_applied.keys().collect::<Vec<_>>(),
        ["cpu.max", "memory.max"]
    );
}

#[test]
fn unusable_root_is_reported() {
    let tmp = tempfile::tempdir().unwrap();
    let file = tmp.path().join("not-a-dir");
    std::fs::write(&file, "").unwrap();
    let cg = Cgroups::detect(Some(file.join("zygote")));
    assert!(cg.info().root.is_none());
    let report = cg.create("sb-z", &limits());
    assert!(report.path.is_none());
    assert_eq!(report.not_applied.len(), 3);
}
