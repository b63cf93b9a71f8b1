//! Shared by the tests that boot real Linux on zygote's VMM (linux_boot, devices_linux,
//! linux_branch, linux_snapshot): find the guest kernel and the `minimal` image, boot
//! them with the kvm runtime's device set (copy-on-write root disk, vsock, rng), and
//! talk to the in-guest agent over hybrid vsock.
//!
//! These need hardware virtualization. Elsewhere they skip with the reason printed
//! (`zygote_vmm::host::linux_guests_or_skip`); the nested lane runs them inside an L1
//! host whose KVM has it, with ZYGOTE_REQUIRE_HW_VIRT=1 so that they cannot skip there.
#![allow(dead_code)] // each test binary uses a different subset

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use zygote_proto::client::{wait_healthy_with, AgentClient};
use zygote_proto::{ExecRequest, CMDLINE_TCP_KEY, CMDLINE_VSOCK_KEY, DEFAULT_VSOCK_PORT};
use zygote_vmm::devices::serial::{CallbackWriter, SerialOut};
use zygote_vmm::devices::virtio::setup::{GuestDeviceConfig, GuestDevices};
use zygote_vmm::devices::virtio::vsock::{VsockConfig, DEFAULT_GUEST_CID};
use zygote_vmm::{VmConfig, Vmm};

/// How long a guest may take from boot (or branch/restore) to an answering agent.
/// Generous: under nested emulation everything is ~15x slower than on hardware.
pub const AGENT_TIMEOUT: Duration = Duration::from_secs(120);

fn cache_dir() -> PathBuf {
    std::env::var_os("ZYGOTE_CACHE_DIR")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/zygote")))
        .expect("ZYGOTE_CACHE_DIR or HOME")
}

/// `$var` if set, else the most recently modified entry of `<cache>/<sub>` that `pick`
/// accepts.
fn newest(var: &str, sub: &str, pick: impl Fn(&Path) -> Option<PathBuf>) -> Option<PathBuf> {
    if let Some(p) = std::env::var_os(var) {
        return Some(PathBuf::from(p));
    }
    std::fs::read_dir(cache_dir().join(sub))
        .ok()?
        .flatten()
        .filter_map(|e| pick(&e.path()))
        .max_by_key(|p| std::fs::metadata(p).and_then(|m| m.modified()).ok())
}

/// The guest kernel's directory entry `file` (`vmlinux` or `bzImage`): `$ZYGOTE_KERNEL`'s
/// directory, or the newest build in zygote's cache.
pub fn kernel_file(file: &str) -> PathBuf {
    let vmlinux = newest("ZYGOTE_KERNEL", "kernel", |d| {
        Some(d.join("vmlinux")).filter(|p| p.is_file() && d.join("info").is_file())
    })
    .expect("no guest kernel: build it (make guest) or set ZYGOTE_KERNEL");
    vmlinux.with_file_name(file)
}

pub fn kernel() -> PathBuf {
    kernel_file("vmlinux")
}

/// The `minimal` root image: `$ZYGOTE_IMAGE`, or the newest build in zygote's cache.
pub fn minimal_image() -> PathBuf {
    newest("ZYGOTE_IMAGE", "images", |p| {
        let name = p.file_name()?.to_str()?;
        (name.starts_with("minimal-") && name.ends_with(".ext4")).then(|| p.to_path_buf())
    })
    .expect("no minimal image: build it (zygote image build minimal) or set ZYGOTE_IMAGE")
}

/// The base image is never written: its bytes still hash to the sha256 in its name
/// (`minimal-<sha256>.ext4`, zygote-images' content-addressed store).
pub fn assert_image_intact(image: &Path) {
    use sha2::Digest;
    use std::io::Read;
    let name = image.file_stem().unwrap().to_string_lossy().into_owned();
    let want = name.rsplit('-').next().unwrap().to_string();
    let mut f = std::fs::File::open(image).unwrap();
    let mut h = sha2::Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = f.read(&mut buf).unwrap();
        if n == 0 {
            break;
        }
        h.update(&buf[..n]);
    }
    let got: String = h.finalize().iter().map(|b| format!("{b:02x}")).collect();
    assert_eq!(got, want, "{} was modified", image.display());
}

/// The kernel command line the kvm runtime gives a guest (crates/daemon's
/// `kvm_cmd::guest_cmdline`): the agent is PID 1 and listens on vsock only.
pub fn agent_cmdline(root: &str) -> String {
    format!(
        "console=ttyS0 quiet reboot=k panic=-1 pci=off nomodule rootfstype=ext4 \
         init=/sbin/zygote-agent random.trust_cpu=on {CMDLINE_TCP_KEY}=off \
         {CMDLINE_VSOCK_KEY}={DEFAULT_VSOCK_PORT} {root}"
    )
}

/// A guest console kept in memory, shown when an assertion fails.
#[derive(Clone, Default)]
pub struct Console(Arc<Mutex<Vec<u8>>>);

impl Console {
    pub fn sink(&self) -> SerialOut {
        let buf = self.0.clone();
        Box::new(CallbackWriter(move |b: &[u8]| {
            buf.lock().unwrap().extend_from_slice(b)
        }))
    }

    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap()).into_owned()
    }

    /// The last `n` lines, for failure messages.
    pub fn tail(&self, n: usize) -> String {
        let text = self.text();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(n)..].join("\n")
    }
}

/// A Linux guest booted from the `minimal` image with the kvm runtime's devices.
pub struct LinuxVm {
    pub vmm: Vmm,
    pub console: Console,
    /// Hybrid vsock socket: `CONNECT 1024` reaches the agent.
    pub vsock: PathBuf,
    pub devices: GuestDevices,
}

/// Boot the `minimal` image (copy-on-write root, vsock, rng) with its vsock socket in
/// `dir`, and wait until its agent answers.
pub fn boot_minimal(dir: &Path, vcpus: u8, mem_mib: u64) -> LinuxVm {
    let vsock = dir.join("vm.vsock");
    let devices = GuestDevices::build(&GuestDeviceConfig {
        root_image: Some(minimal_image()),
        vsock: Some(VsockConfig {
            guest_cid: DEFAULT_GUEST_CID,
            uds_path: vsock.clone(),
        }),
        rng: true,
        ..Default::default()
    })
    .expect("device set-up");
    let console = Console::default();
    let vmm = Vmm::boot(VmConfig {
        kernel: kernel(),
        initrd: None,
        cmdline: agent_cmdline(&devices.root_cmdline()),
        mem_mib,
        vcpus,
        serial_out: console.sink(),
        start_paused: false,
        virtio_devices: devices.virtio_devices(),
    })
    .expect("VM boots");
    let vm = LinuxVm {
        vmm,
        console,
        vsock,
        devices,
    };
    let mut vm = vm;
    if let Err(e) = try_agent(&vm.vsock, Instant::now() + AGENT_TIMEOUT) {
        let state = vm.vmm.diagnose().unwrap_or_else(|e| e.to_string());
        panic!(
            "the agent never answered on {}: {e}\nconsole:\n{}\nVM state:\n{state}",
            vm.vsock.display(),
            vm.console.tail(60)
        );
    }
    vm
}

/// Connect to the agent behind hybrid vsock socket `uds` and check it answers.
pub fn try_agent(uds: &Path, deadline: Instant) -> Result<AgentClient, String> {
    wait_healthy_with(deadline, |_| {
        AgentClient::connect_vsock_uds(uds, DEFAULT_VSOCK_PORT)
    })
    .map(|c| c.with_request_timeout(Some(Duration::from_secs(60))))
    .map_err(|e| e.to_string())
}

/// One connection attempt, no retry: connect, then one health request.
pub fn first_connection(uds: &Path) -> Result<AgentClient, String> {
    let c = AgentClient::connect_vsock_uds(uds, DEFAULT_VSOCK_PORT).map_err(|e| e.to_string())?;
    c.health().map_err(|e| e.to_string())?;
    Ok(c)
}

pub fn agent(uds: &Path) -> AgentClient {
    try_agent(uds, Instant::now() + AGENT_TIMEOUT)
        .unwrap_or_else(|e| panic!("agent on {}: {e}", uds.display()))
}

/// [`agent`] for a VM served on control socket `ctl` (a branch child): when the agent
/// does not answer, the failure shows the guest's console and the VM's state.
pub fn child_agent(uds: &Path, ctl: &Path, console: &Console) -> AgentClient {
    try_agent(uds, Instant::now() + AGENT_TIMEOUT).unwrap_or_else(|e| {
        let client = zygote_vmm::control::ControlClient::new(ctl);
        let state = client
            .wait_ready(Instant::now() + Duration::from_secs(10))
            .map_err(|e| e.to_string())
            .and_then(|_| {
                client
                    .request::<String>(&zygote_vmm::control::Request::Diagnose)
                    .map_err(|e| e.to_string())
            })
            .unwrap_or_else(|e| format!("(no diagnosis: {e})"));
        panic!(
            "the agent on {} never answered: {e}\nconsole:\n{}\nVM state:\n{state}",
            uds.display(),
            console.tail(40)
        )
    })
}

/// Run `script` with `sh -c` in the guest; returns (exit code, stdout).
pub fn sh(agent: &AgentClient, script: &str) -> (Option<i32>, String) {
    let out = agent
        .exec_output(ExecRequest {
            argv: vec!["sh".into(), "-c".into(), script.into()],
            timeout_ms: Some(60_000),
            ..Default::default()
        })
        .unwrap_or_else(|e| panic!("exec {script:?}: {e}"));
    (
        out.result.exit_code,
        String::from_utf8_lossy(&out.stdout).into_owned(),
    )
}

/// [`sh`] that must succeed; returns stdout without the trailing newline.
pub fn sh_ok(agent: &AgentClient, script: &str) -> String {
    let (code, out) = sh(agent, script);
    assert_eq!(code, Some(0), "{script:?} failed; stdout: {out}");
    out.trim_end().to_string()
}

/// A guest shell loop that counts in memory and publishes the count to `/tmp/tick`
/// every 50 ms (write + rename: a reader never sees a half-written file): a running
/// process whose state only lives in guest RAM.
pub const TICKER: &str = "(i=0; while :; do i=$((i+1)); echo $i >/tmp/tick.new; \
                          mv /tmp/tick.new /tmp/tick; sleep 0.05; done) >/dev/null 2>&1 </dev/null &";

/// Reads the ticker twice, `gap` apart; returns both values (the process must be
/// alive and counting for the second to be larger).
pub fn ticks(agent: &AgentClient) -> (u64, u64) {
    let v = sh_ok(agent, "cat /tmp/tick; sleep 0.5; cat /tmp/tick");
    let mut it = v
        .lines()
        .map(|l| l.trim().parse::<u64>().expect("a tick count"));
    (it.next().unwrap(), it.next().unwrap())
}

/// Kills (SIGKILL) and reaps the given processes when dropped: branch children and
/// spawners must not outlive a failed assertion.
pub struct KillOnDrop(pub Vec<libc::pid_t>);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        for &pid in &self.0 {
            // SAFETY: signalling and reaping processes this test forked.
            unsafe {
                libc::kill(pid, libc::SIGKILL);
                libc::waitpid(pid, std::ptr::null_mut(), 0);
            }
        }
    }
}
