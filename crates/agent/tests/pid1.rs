//! The agent as PID 1, without a VM: it runs as init of fresh PID, mount, UTS
//! and network namespaces (`unshare`), so its mounts, hostname and `lo` are
//! private to the sandbox and the host is untouched. `reboot(2)` from the init
//! of a child PID namespace only ends that namespace. The clock is not
//! namespaced, so `reidentify` is never given a time here.
//!
//! Needs root and util-linux `unshare`; skipped with a reason otherwise.

mod common;

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::thread;
use std::time::Duration;

use common::*;
use zygote_proto::client::AgentClient;
use zygote_proto::{ExecRequest, ReidentifyRequest};

const UNSHARE: &[&str] = &[
    "--pid",
    "--fork",
    "--kill-child",
    "--mount",
    "--uts",
    "--net",
    "--propagation",
    "private",
];

fn namespaces_available() -> Result<(), String> {
    if unsafe { libc::geteuid() } != 0 {
        return Err("not root".into());
    }
    let status = Command::new("unshare")
        .args(UNSHARE)
        .arg("true")
        .stderr(Stdio::null())
        .status()
        .map_err(|e| format!("cannot run unshare: {e}"))?;
    if !status.success() {
        return Err(format!("unshare failed: {status}"));
    }
    Ok(())
}

struct Pid1Agent {
    unshare: Child,
    socket: PathBuf,
    _dir: tempfile::TempDir,
}

impl Pid1Agent {
    fn start() -> Option<Pid1Agent> {
        if let Err(why) = namespaces_available() {
            eprintln!("SKIP: cannot create namespaces ({why})");
            return None;
        }
        // Not under /tmp: the agent mounts a fresh tmpfs there.
        // As PID 1 the agent mounts fresh tmpfs over /tmp, /run and /dev/shm in its mount
        // namespace: the socket must live elsewhere (the checkout itself may be in /tmp).
        let dir = tempfile::Builder::new()
            .prefix("zygote-pid1-")
            .tempdir_in("/var/tmp")
            .unwrap();
        let socket = dir.path().join("pid1.sock");
        let mut unshare = Command::new("unshare")
            .args(UNSHARE)
            .arg(env!("CARGO_BIN_EXE_zygote-agent"))
            .arg("--unix")
            .arg(&socket)
            .stdin(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let stderr = unshare.stderr.take().unwrap();
        let (tx, rx) = mpsc::channel();
        thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                eprintln!("[pid1 agent] {line}");
                if line.contains(" ready ") {
                    let _ = tx.send(line);
                }
            }
        });
        let ready = rx
            .recv_timeout(Duration::from_secs(20))
            .expect("agent ready");
        assert!(ready.contains("live"), "{ready}");
        Some(Pid1Agent {
            unshare,
            socket,
            _dir: dir,
        })
    }

    fn client(&self) -> AgentClient {
        AgentClient::connect_unix(&self.socket).unwrap()
    }

    /// Host pid of the agent (the child of `unshare`).
    fn host_pid(&self) -> u32 {
        let pid = self.unshare.id();
        let children = std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children")).unwrap();
        children.split_whitespace().next().unwrap().parse().unwrap()
    }

    fn exited_within(&mut self, limit: Duration) -> bool {
        eventually(limit, || self.unshare.try_wait().unwrap().is_some())
    }
}

impl Drop for Pid1Agent {
    fn drop(&mut self) {
        let _ = self.unshare.kill();
        let _ = self.unshare.wait();
    }
}

fn sh(client: &AgentClient, script: &str) -> String {
    let out = client.exec_output(ExecRequest::shell(script)).unwrap();
    assert!(
        out.result.success(),
        "{script}: {:?} {}",
        out.result,
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

#[test]
fn init_duties_reaping_reidentify_and_shutdown() {
    let Some(mut agent) = Pid1Agent::start() else {
        return;
    };
    let client = agent.client();
    let host_name = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap();

    let h = client.health().unwrap();
    assert!(h.pid1 && !h.dry_run, "{h:?}");
    assert_eq!(h.hostname, "zygote");

    let mounts = client.read_file("/proc/mounts").unwrap();
    let mounts = String::from_utf8(mounts).unwrap();
    for (target, fstype) in [
        ("/proc", "proc"),
        ("/sys", "sysfs"),
        ("/dev", "devtmpfs"),
        ("/dev/pts", "devpts"),
        ("/tmp", "tmpfs"),
        ("/run", "tmpfs"),
    ] {
        assert!(
            mounts.lines().any(|l| l.split(' ').nth(1) == Some(target)
                && l.split(' ').nth(2) == Some(fstype)),
            "{target} ({fstype}) not mounted:\n{mounts}"
        );
    }
    // lo is up (IFF_UP = 0x1) in the sandbox's network namespace.
    let flags = sh(&client, "cat /sys/class/net/lo/flags");
    let flags = u32::from_str_radix(flags.trim().trim_start_matches("0x"), 16).unwrap();
    assert_eq!(flags & 1, 1, "lo flags {flags:#x}");
    assert!(sh(&client, "echo $PATH").contains("/bin"));

    // Orphans are re-parented to PID 1, which must reap them.
    sh(&client, "for i in 1 2 3 4; do sleep 0.2 & done; exit 0");
    thread::sleep(Duration::from_millis(800));
    let zombies = sh(
        &client,
        "for f in /proc/[0-9]*/stat; do read -r l < $f 2>/dev/null && echo \"$l\"; done | awk '$3 == \"Z\"'",
    );
    assert_eq!(zombies, "", "zombies under PID 1");

    // Hostname is namespaced: safe to really set it here.
    let report = client
        .reidentify(ReidentifyRequest {
            hostname: Some("branch-7".into()),
            ..Default::default()
        })
        .unwrap();
    assert!(report.hostname_set && !report.dry_run && !report.clock_set);
    assert_eq!(client.health().unwrap().hostname, "branch-7");
    assert_eq!(
        std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap(),
        host_name,
        "the host's hostname changed"
    );

    // shutdown: answered, then reboot(2), which ends the namespace's init.
    client.shutdown().unwrap();
    assert!(
        agent.exited_within(Duration::from_secs(10)),
        "agent did not go down"
    );
}

#[test]
fn sigterm_powers_off() {
    let Some(mut agent) = Pid1Agent::start() else {
        return;
    };
    agent.client().health().unwrap();
    let pid = agent.host_pid();
    unsafe { libc::kill(pid as libc::pid_t, libc::SIGTERM) };
    assert!(
        agent.exited_within(Duration::from_secs(10)),
        "SIGTERM ignored"
    );
}
