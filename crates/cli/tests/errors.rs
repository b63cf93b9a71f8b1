//! Bad input gets a clear error from the CLI, never a panic.
use std::io::Write;
use std::os::unix::process::CommandExt;
use std::process::{Command, Output};

fn zygote(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_zygote"))
        .args(args)
        .output()
        .unwrap()
}

fn assert_clear_error(out: &Output, needle: &str) {
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "should fail: {err}");
    assert!(!err.contains("panicked"), "{err}");
    assert!(err.contains(needle), "expected {needle:?} in: {err}");
}

fn kvm_or_skip(test: &str) -> bool {
    match zygote_vmm::host::kvm_usable() {
        Ok(()) => true,
        Err(why) => {
            let _ = writeln!(std::io::stderr(), "skipping {test}: KVM unavailable: {why}");
            false
        }
    }
}

#[test]
fn vm_input_errors() {
    if !kvm_or_skip("vm_input_errors") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("no-such-vmlinux");
    let out = zygote(&["vm", "run", "--kernel", missing.to_str().unwrap()]);
    assert_clear_error(&out, "cannot open kernel");
    let junk = dir.path().join("junk");
    std::fs::write(&junk, vec![7u8; 4096]).unwrap();
    let out = zygote(&["vm", "run", "--kernel", junk.to_str().unwrap()]);
    assert_clear_error(&out, "neither an ELF vmlinux nor a bzImage");
    assert_clear_error(&zygote(&["probe", "--mem-mib", "0"]), "below the minimum");
    assert_clear_error(
        &zygote(&["probe", "--mem-mib", "100000000"]),
        "exceeds host memory",
    );
    assert_clear_error(&zygote(&["probe", "--vcpus", "0"]), "at least one vCPU");
    assert_clear_error(&zygote(&["probe", "--vcpus", "200"]), "vCPUs requested");
    assert_clear_error(&zygote(&["probe", "--vcpus", "300"]), "invalid value");
}

#[test]
fn no_kvm_permission_is_explained() {
    if unsafe { libc::geteuid() } != 0 {
        let _ = writeln!(
            std::io::stderr(),
            "skipping no_kvm_permission_is_explained: needs root to drop to an unprivileged user"
        );
        return;
    }
    let meta = match std::fs::metadata("/dev/kvm") {
        Ok(m) => m,
        Err(_) => {
            let _ = writeln!(
                std::io::stderr(),
                "skipping no_kvm_permission_is_explained: no /dev/kvm"
            );
            return;
        }
    };
    use std::os::unix::fs::PermissionsExt;
    if meta.permissions().mode() & 0o006 != 0 {
        let _ = writeln!(
            std::io::stderr(),
            "skipping no_kvm_permission_is_explained: /dev/kvm is world-accessible here"
        );
        return;
    }
    // The binary must be reachable by the unprivileged user.
    let out = Command::new(env!("CARGO_BIN_EXE_zygote"))
        .args(["probe"])
        .env("ZYGOTE_PROBE", "/nonexistent/probe")
        .uid(65534)
        .gid(65534)
        .output();
    let Ok(out) = out else {
        let _ = writeln!(
            std::io::stderr(),
            "skipping no_kvm_permission_is_explained: cannot run the binary as nobody"
        );
        return;
    };
    assert_clear_error(&out, "permission denied opening /dev/kvm");
}
