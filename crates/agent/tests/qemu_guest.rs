//! The static musl agent as PID 1 of a real Linux guest under QEMU (TCG),
//! reached through user-mode networking's `hostfwd`, exactly as the runtime
//! uses it.
//!
//! Needs `qemu-system-x86_64`, a static `/bin/busybox`, the musl agent
//! (`make agent`) and a guest kernel: `$ZYGOTE_TEST_KERNEL`, or the newest
//! `~/.cache/zygote/kernel/build/*/vmlinux` built by `make guest`. Skips with
//! the reason when any is missing.

mod common;

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::*;
use zygote_proto::client::wait_healthy;
use zygote_proto::{ExecRequest, ReidentifyRequest, Stream, UnixTime};

fn find_kernel() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("ZYGOTE_TEST_KERNEL") {
        return Some(PathBuf::from(p));
    }
    let builds = PathBuf::from(std::env::var_os("HOME")?).join(".cache/zygote/kernel/build");
    fs::read_dir(builds)
        .ok()?
        .flatten()
        .map(|e| e.path().join("vmlinux"))
        .filter(|p| p.is_file())
        .max_by_key(|p| fs::metadata(p).and_then(|m| m.modified()).ok())
}

fn musl_agent() -> PathBuf {
    // CARGO_TARGET_TMPDIR is <target dir>/tmp.
    Path::new(env!("CARGO_TARGET_TMPDIR"))
        .parent()
        .unwrap()
        .join("x86_64-unknown-linux-musl/release/zygote-agent")
}

fn prerequisites() -> Result<(PathBuf, PathBuf), String> {
    let kernel =
        find_kernel().ok_or("no guest kernel (set ZYGOTE_TEST_KERNEL or run `make guest`)")?;
    let agent = musl_agent();
    if !agent.is_file() {
        return Err(format!("{} not built (run `make agent`)", agent.display()));
    }
    if !Path::new("/bin/busybox").is_file() {
        return Err("/bin/busybox missing (Debian busybox-static)".into());
    }
    let qemu = Command::new("qemu-system-x86_64")
        .arg("--version")
        .stdout(Stdio::null())
        .status();
    if !qemu.is_ok_and(|s| s.success()) {
        return Err("qemu-system-x86_64 missing".into());
    }
    Ok((kernel, agent))
}

/// Minimal writer for the kernel's initramfs format ("newc" cpio).
struct Cpio {
    out: Vec<u8>,
    ino: u32,
}

impl Cpio {
    fn entry(&mut self, name: &str, mode: u32, data: &[u8], rdev: (u32, u32)) {
        self.ino += 1;
        let fields = [
            self.ino,
            mode,
            0,
            0,
            1,
            0,
            data.len() as u32,
            0,
            0,
            rdev.0,
            rdev.1,
            name.len() as u32 + 1,
            0,
        ];
        self.out.extend_from_slice(b"070701");
        for f in fields {
            self.out.extend_from_slice(format!("{f:08x}").as_bytes());
        }
        self.out.extend_from_slice(name.as_bytes());
        self.out.push(0);
        self.pad();
        self.out.extend_from_slice(data);
        self.pad();
    }

    fn pad(&mut self) {
        while !self.out.len().is_multiple_of(4) {
            self.out.push(0);
        }
    }

    fn build(agent: &Path) -> Vec<u8> {
        let mut c = Cpio {
            out: Vec::new(),
            ino: 0,
        };
        for dir in ["bin", "dev", "proc", "sys", "tmp", "run", "etc", "root"] {
            c.entry(dir, 0o040755, &[], (0, 0));
        }
        c.entry("dev/console", 0o020600, &[], (5, 1));
        c.entry("init", 0o100755, &fs::read(agent).unwrap(), (0, 0));
        c.entry(
            "bin/busybox",
            0o100755,
            &fs::read("/bin/busybox").unwrap(),
            (0, 0),
        );
        for applet in [
            "sh", "cat", "echo", "sleep", "hostname", "date", "ls", "head", "wc", "awk",
        ] {
            c.entry(&format!("bin/{applet}"), 0o120777, b"busybox", (0, 0));
        }
        c.entry("TRAILER!!!", 0, &[], (0, 0));
        c.out
    }
}

struct Qemu {
    child: Child,
    console: PathBuf,
}

impl Qemu {
    fn console(&self) -> String {
        fs::read_to_string(&self.console).unwrap_or_default()
    }
}

impl Drop for Qemu {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn agent_serves_as_pid1_of_a_linux_guest() {
    let (kernel, agent_bin) = match prerequisites() {
        Ok(p) => p,
        Err(why) => return eprintln!("SKIP: {why}"),
    };
    let dir = tempfile::tempdir().unwrap();
    let initrd = dir.path().join("initramfs.cpio");
    fs::write(&initrd, Cpio::build(&agent_bin)).unwrap();
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let console = dir.path().join("console.log");
    let child = Command::new("qemu-system-x86_64")
        .args([
            "-M",
            // acpi=off: QEMU then announces the virtio-mmio devices on the
            // kernel command line (the minimal kernel has no ACPI).
            "microvm,x-option-roms=off,isa-serial=on,rtc=off,acpi=off",
            "-accel",
            "tcg",
            "-cpu",
            "max",
            "-m",
            "256",
            "-smp",
            "1",
            "-no-reboot",
            "-display",
            "none",
            "-monitor",
            "none",
        ])
        .arg("-serial")
        .arg(format!("file:{}", console.display()))
        .arg("-kernel")
        .arg(&kernel)
        .arg("-initrd")
        .arg(&initrd)
        .args([
            "-append",
            // reboot=t: microvm has no ACPI or keyboard controller to reset through, and
            // the kernel's default sequence retries those for a long time under TCG.
            "console=ttyS0 panic=-1 reboot=t rdinit=/init ip=10.0.2.15::10.0.2.2:255.255.255.0::eth0:off",
            "-netdev",
            &format!("user,id=n0,hostfwd=tcp:127.0.0.1:{port}-:10240"),
            "-device",
            "virtio-net-device,netdev=n0",
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let mut vm = Qemu { child, console };
    eprintln!("booting {} with {}", kernel.display(), agent_bin.display());

    let boot = Instant::now();
    let client = match wait_healthy(
        &format!("127.0.0.1:{port}"),
        boot + Duration::from_secs(120),
    ) {
        Ok(c) => c,
        Err(e) => panic!("agent never became healthy: {e}\n{}", vm.console()),
    };
    eprintln!("healthy after {:?}", boot.elapsed());
    let h = client.health().unwrap();
    assert!(h.pid1 && !h.dry_run, "{h:?}");
    assert_eq!(h.hostname, "zygote");

    // Streaming through slirp: the first line long before the end.
    let start = Instant::now();
    let mut first = None;
    let result = client
        .exec(ExecRequest::shell("echo a; sleep 1; echo b"), |s, _| {
            assert_eq!(s, Stream::Stdout);
            first.get_or_insert(start.elapsed());
        })
        .unwrap();
    assert!(result.success());
    assert!(first.unwrap() + Duration::from_millis(500) < start.elapsed());

    // Orphans are reaped by the agent as init.
    client
        .exec_output(ExecRequest::shell("for i in 1 2 3; do sleep 0.2 & done"))
        .unwrap();
    std::thread::sleep(Duration::from_millis(800));
    let zombies = client
        .exec_output(ExecRequest::shell(
            "for f in /proc/[0-9]*/stat; do read -r l < $f && echo \"$l\"; done | awk '$3 == \"Z\"'",
        ))
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&zombies.stdout), "");

    let report = client
        .reidentify(ReidentifyRequest {
            entropy: vec![0x5a; 32],
            hostname: Some("branch-2".into()),
            time: Some(UnixTime {
                secs: 1_900_000_000,
                nanos: 0,
            }),
            net: None,
            identity: None,
        })
        .unwrap();
    assert!(
        report.entropy_credited && report.hostname_set && report.clock_set,
        "{report:?}"
    );
    let out = client
        .exec_output(ExecRequest::shell("hostname; date +%s"))
        .unwrap();
    let text = String::from_utf8(out.stdout).unwrap();
    let mut lines = text.lines();
    assert_eq!(lines.next(), Some("branch-2"));
    let now: i64 = lines.next().unwrap().parse().unwrap();
    assert!((1_900_000_000..1_900_000_600).contains(&now), "{now}");

    let data: Vec<u8> = (0..1_000_000u32).map(|i| (i % 253) as u8).collect();
    client.write_file("/tmp/blob", &data, Some(0o600)).unwrap();
    assert!(client.read_file("/tmp/blob").unwrap() == data);

    // shutdown → reboot(2) → QEMU (-no-reboot) exits.
    client.shutdown().unwrap();
    let exited = eventually(Duration::from_secs(30), || {
        vm.child.try_wait().unwrap().is_some()
    });
    assert!(
        exited,
        "QEMU still running after shutdown\n{}",
        vm.console()
    );
    assert!(vm.console().contains("zygote-agent: shutdown requested"));
}
