//! The kvm runtime's plumbing that needs no VM: where the `zygote` binary is,
//! the `zygote vm serve` argv, a branch child's part of the VMM's `branch` request, the
//! guest kernel command line, the per-VM file layout, and how a gone VMM's end is put
//! into words.
use std::path::{Path, PathBuf};

use zygote_proto::{CMDLINE_TCP_KEY, CMDLINE_VSOCK_KEY, DEFAULT_VSOCK_PORT};
use zygote_vmm::control::protocol::ChildSpec;

use super::{RuntimeError, TapNet};

/// Overrides where the `zygote` binary (which runs `vm serve`) is found.
pub const BIN_ENV: &str = "ZYGOTE_BIN";

/// Files of one VM inside its directory.
#[derive(Debug, Clone, PartialEq)]
pub struct VmFiles {
    /// The VMM's control socket (`--api-sock`); the VMM writes `<it>.exit`.
    pub api_sock: PathBuf,
    /// Hybrid vsock Unix socket: the host reaches the agent through it.
    pub vsock: PathBuf,
    /// Guest console (the VMM keeps it bounded; see `runtime::console`).
    pub console: PathBuf,
    /// stderr of the VMM process (and of branch children forked from it).
    pub stderr: PathBuf,
}

impl VmFiles {
    pub fn in_dir(dir: &Path) -> VmFiles {
        VmFiles {
            api_sock: dir.join("api.sock"),
            vsock: dir.join("vsock.sock"),
            console: super::console::path(dir),
            stderr: dir.join("vmm.stderr"),
        }
    }

    /// Where the VMM records why its guest ended.
    pub fn exit_record(&self) -> PathBuf {
        zygote_vmm::control::server::exit_file(&self.api_sock)
    }

    /// Removes leftovers of an earlier VM in the same directory (sockets
    /// must not exist for `vm serve` and for branch children).
    pub fn clear(&self, dir: &Path) {
        for f in [
            &self.api_sock,
            &self.vsock,
            &self.exit_record(),
            &dir.join("exit"),
        ] {
            let _ = std::fs::remove_file(f);
        }
    }
}

/// One branch child in the VMM's `branch` request: it serves its control socket, vsock
/// socket and console in its own directory (`files`; every VM of this runtime has a vsock
/// device, so each child needs its own), joins its sandbox's `cgroup` before building its
/// VM, and, with a namespace of its own, joins it before opening its `tap` there.
pub fn branch_child(files: &VmFiles, cgroup: Option<&Path>, tap: Option<&TapNet>) -> ChildSpec {
    ChildSpec {
        socket: files.api_sock.clone(),
        console: Some(files.console.clone()),
        vsock: Some(files.vsock.clone()),
        tap: tap.map(|t| t.tap.clone()),
        cgroup: cgroup.map(Path::to_path_buf),
        netns: tap.map(|t| t.netns.clone()),
        // Set by the caller when the parent has volume disks (`kvm_volumes`).
        disk_files: Vec::new(),
    }
}

/// What the VMM runs.
#[derive(Debug, Clone, PartialEq)]
pub enum Boot<'a> {
    /// A Linux kernel with the base image as copy-on-write root disk.
    Kernel {
        kernel: &'a Path,
        image: &'a Path,
        cmdline: &'a str,
    },
    /// zygote's probe guest (tests: it boots on shadow-paging KVM too).
    Probe { scenario: &'a str },
    /// A snapshot directory written by the VMM's `snapshot` op.
    Restore { dir: &'a Path },
}

/// `zygote vm serve ...` arguments (without the binary).
pub fn serve_argv(files: &VmFiles, boot: &Boot, mem_mib: u32, vcpus: u32) -> Vec<String> {
    let s = |p: &Path| p.display().to_string();
    let mut a: Vec<String> = vec!["vm".into(), "serve".into()];
    a.extend(["--api-sock".into(), s(&files.api_sock)]);
    a.extend(["--console-log".into(), s(&files.console)]);
    // With --restore this is the restored VM's own socket.
    a.extend(["--vsock".into(), s(&files.vsock)]);
    match boot {
        Boot::Kernel {
            kernel,
            image,
            cmdline,
        } => {
            a.extend(["--kernel".into(), s(kernel)]);
            a.extend(["--disk".into(), s(image)]);
            a.extend(["--cmdline".into(), cmdline.to_string()]);
            a.push("--rng".into());
        }
        Boot::Probe { scenario } => a.extend(["--probe".into(), scenario.to_string()]),
        Boot::Restore { dir } => a.extend(["--restore".into(), s(dir)]),
    }
    // A restored VM keeps the size it was saved with.
    if !matches!(boot, Boot::Restore { .. }) {
        a.extend(["--mem-mib".into(), mem_mib.to_string()]);
        a.extend(["--vcpus".into(), vcpus.to_string()]);
    }
    a
}

/// The guest kernel command line under zygote's VMM. `vm serve` appends
/// `root=/dev/vda rw` for the disk; the agent is PID 1 and listens on vsock
/// only (there is no network device).
pub fn guest_cmdline() -> String {
    [
        "console=ttyS0",
        "quiet",
        "reboot=k",
        // A panic (e.g. the agent dying as PID 1) resets at once: the VMM
        // records the end and exits instead of leaving a hung guest.
        "panic=-1",
        "pci=off",
        "nomodule",
        "rootfstype=ext4",
        &format!("init={}", zygote_images::AGENT_GUEST_PATH),
        "random.trust_cpu=on",
        &format!("{CMDLINE_TCP_KEY}=off"),
        &format!("{CMDLINE_VSOCK_KEY}={DEFAULT_VSOCK_PORT}"),
    ]
    .join(" ")
}

/// The `zygote` binary: `$ZYGOTE_BIN`, else `zygote` next to this executable
/// (the daemon binary, or `zygote serve` itself).
pub fn locate_binary() -> Result<PathBuf, RuntimeError> {
    let candidate = match std::env::var_os(BIN_ENV) {
        Some(p) if !p.is_empty() => PathBuf::from(p),
        _ => std::env::current_exe()
            .map_err(RuntimeError::io("locating the running executable"))?
            .with_file_name("zygote"),
    };
    if candidate.is_file() {
        Ok(candidate)
    } else {
        Err(RuntimeError::Unavailable(format!(
            "the zygote binary (runs `zygote vm serve`) is not at {} (set {BIN_ENV})",
            candidate.display()
        )))
    }
}

/// What the VMM wrote to `<api sock>.exit`: `{"exit": reason, "clean": bool}`.
pub fn read_exit_record(path: &Path) -> Option<(String, bool)> {
    let v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(path).ok()?).ok()?;
    Some((
        v.get("exit")?.as_str()?.to_string(),
        v.get("clean").and_then(|c| c.as_bool()).unwrap_or(false),
    ))
}

/// Why a VMM that recorded its guest's end is gone.
pub fn describe_guest_end(reason: &str, clean: bool) -> String {
    if clean {
        format!("the guest ended ({reason}); zygote's VMM exited normally")
    } else {
        format!("the guest ended with an error: {reason}")
    }
}

/// Why a branch child (forked by its parent VMM, so no supervisor saw its
/// status) is gone without an exit record. The VMM handles no termination
/// signal and always writes the record when it ends by itself or on `stop`,
/// so the only way to vanish without one is a fatal signal (or a crash).
pub fn describe_unrecorded_end(socket_left: bool) -> String {
    let how = if socket_left {
        "its control socket is still there"
    } else {
        "its control socket is gone"
    };
    format!(
        "zygote's VMM was killed by a signal (signal 9/SIGKILL or another fatal signal; \
         it left no exit record and {how}; as a branch child its exact status went to its \
         parent VMM)"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pos(a: &[String], flag: &str) -> Option<String> {
        a.iter()
            .position(|x| x == flag)
            .and_then(|i| a.get(i + 1).cloned())
    }

    #[test]
    fn kernel_boot_argv() {
        let f = VmFiles::in_dir(Path::new("/s/vms/sb1"));
        let cmd = guest_cmdline();
        let a = serve_argv(
            &f,
            &Boot::Kernel {
                kernel: Path::new("/k/vmlinux"),
                image: Path::new("/i/minimal.ext4"),
                cmdline: &cmd,
            },
            512,
            2,
        );
        assert_eq!(&a[..2], ["vm", "serve"]);
        assert_eq!(pos(&a, "--api-sock").unwrap(), "/s/vms/sb1/api.sock");
        assert_eq!(pos(&a, "--vsock").unwrap(), "/s/vms/sb1/vsock.sock");
        assert_eq!(pos(&a, "--console-log").unwrap(), "/s/vms/sb1/serial.log");
        assert_eq!(pos(&a, "--kernel").unwrap(), "/k/vmlinux");
        assert_eq!(pos(&a, "--disk").unwrap(), "/i/minimal.ext4");
        assert_eq!(pos(&a, "--cmdline").unwrap(), cmd);
        assert_eq!(pos(&a, "--mem-mib").unwrap(), "512");
        assert_eq!(pos(&a, "--vcpus").unwrap(), "2");
        assert!(a.contains(&"--rng".to_string()));
        assert!(!a.iter().any(|x| x == "--restore" || x == "--probe"));
    }

    #[test]
    fn restore_and_probe_argv() {
        let f = VmFiles::in_dir(Path::new("/d"));
        let a = serve_argv(
            &f,
            &Boot::Restore {
                dir: Path::new("/snap/vm"),
            },
            256,
            1,
        );
        assert_eq!(pos(&a, "--restore").unwrap(), "/snap/vm");
        assert_eq!(pos(&a, "--vsock").unwrap(), "/d/vsock.sock");
        // vm serve refuses --rng/--disk/--kernel with --restore; sizes come from the snapshot.
        for flag in [
            "--rng",
            "--disk",
            "--kernel",
            "--mem-mib",
            "--vcpus",
            "--cmdline",
        ] {
            assert!(!a.iter().any(|x| x == flag), "{flag} in {a:?}");
        }
        let p = serve_argv(&f, &Boot::Probe { scenario: "spin" }, 64, 1);
        assert_eq!(pos(&p, "--probe").unwrap(), "spin");
        assert_eq!(pos(&p, "--mem-mib").unwrap(), "64");
        assert!(!p.iter().any(|x| x == "--disk" || x == "--rng"));
    }

    #[test]
    fn the_largest_branch_the_api_allows_fits_the_vmm_request_line() {
        // The VMM bounds a branch only by its request line: the daemon's limit must fit.
        // Children's directories as long as their sockets' 108-byte `sun_path` allows,
        // PATH_MAX-long cgroup, namespace and branch point paths, IFNAMSIZ-long taps.
        let long = |c: char| PathBuf::from(format!("/{}", c.to_string().repeat(4094)));
        let tap = TapNet {
            netns: long('n'),
            tap: "t".repeat(15),
            mac: "02:00:00:00:00:01".into(),
            address: std::net::Ipv4Addr::new(10, 0, 0, 2),
            prefix: 30,
            gateway: std::net::Ipv4Addr::new(10, 0, 0, 1),
        };
        let cgroup = long('g');
        let children: Vec<ChildSpec> = (0..crate::model::MAX_BRANCH_COUNT)
            .map(|i| {
                let name = format!("{i}");
                let dir = format!("/{}{name}", "d".repeat(95 - name.len()));
                let files = VmFiles::in_dir(Path::new(&dir));
                assert!(files.vsock.as_os_str().len() <= 107, "{dir}");
                branch_child(&files, Some(&cgroup), Some(&tap))
            })
            .collect();
        let one = &children[0];
        assert_eq!(one.tap.as_deref(), Some(tap.tap.as_str()));
        assert_eq!(one.netns.as_ref(), Some(&tap.netns));
        assert_eq!(one.cgroup.as_ref(), Some(&cgroup));
        assert!(one.console.is_some() && one.vsock.is_some());
        let req = zygote_vmm::control::Request::Branch {
            children,
            point_snapshot: Some(long('p')),
            ready_timeout_ms: u64::MAX,
        };
        let line = serde_json::to_vec(&req).unwrap().len();
        let limit = zygote_vmm::control::conn::MAX_REQUEST_LINE;
        assert!(line <= limit, "{line} bytes, the VMM reads at most {limit}");
    }

    #[test]
    fn cmdline_runs_the_agent_on_vsock_only() {
        let c = guest_cmdline();
        let words: Vec<&str> = c.split_whitespace().collect();
        for w in [
            "init=/sbin/zygote-agent",
            "zygote.agent.tcp=off",
            "zygote.agent.vsock=1024",
            "console=ttyS0",
            "panic=-1",
        ] {
            assert!(words.contains(&w), "{w} missing from {c}");
        }
        // vm serve adds the root disk parameters itself.
        assert!(!c.contains("root="), "{c}");
    }

    #[test]
    fn exit_records_and_words() {
        let dir = tempfile::tempdir().unwrap();
        let f = VmFiles::in_dir(dir.path());
        assert_eq!(f.exit_record(), dir.path().join("api.sock.exit"));
        assert_eq!(read_exit_record(&f.exit_record()), None);
        std::fs::write(f.exit_record(), r#"{"exit":"triple fault","clean":false}"#).unwrap();
        let (reason, clean) = read_exit_record(&f.exit_record()).unwrap();
        assert_eq!((reason.as_str(), clean), ("triple fault", false));
        assert!(describe_guest_end(&reason, clean).contains("error: triple fault"));
        assert!(describe_guest_end("power-off", true).contains("exited normally"));
        assert!(describe_unrecorded_end(true).contains("signal 9"));
        f.clear(dir.path());
        assert!(!f.exit_record().exists());
    }

    #[test]
    fn binary_override() {
        // Only this test touches the variable in this binary.
        let dir = tempfile::tempdir().unwrap();
        let bin = dir.path().join("zygote");
        std::env::set_var(BIN_ENV, &bin);
        assert!(matches!(
            locate_binary(),
            Err(RuntimeError::Unavailable(m)) if m.contains(BIN_ENV)
        ));
        std::fs::write(&bin, b"").unwrap();
        assert_eq!(locate_binary().unwrap(), bin);
        std::env::remove_var(BIN_ENV);
    }
}
