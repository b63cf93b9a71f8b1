//! What to boot and how: accelerator choice, kernel command line, QEMU argv.
use std::path::{Path, PathBuf};
use std::time::Duration;

use zygote_images::{Progress, AGENT_GUEST_PATH};
use zygote_proto::{AGENT_PORT_NAME, CMDLINE_PORT_KEY, CMDLINE_TCP_KEY, CMDLINE_VSOCK_KEY};

use crate::error::QemuError;

/// How QEMU executes guest code.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Accel {
    /// Hardware virtualization through /dev/kvm.
    Kvm,
    /// QEMU's software emulation (slow, but works everywhere).
    Tcg,
}

impl Accel {
    pub fn as_str(self) -> &'static str {
        match self {
            Accel::Kvm => "kvm",
            Accel::Tcg => "tcg",
        }
    }
}

/// Picks KVM only when the CPU advertises VMX/SVM and /dev/kvm is usable.
///
/// An open /dev/kvm alone is not enough: some hosts expose a KVM that cannot
/// run a Linux guest (e.g. a shadow-paging PVM hypervisor inside a cloud VM,
/// with no `vmx`/`svm` flag), where `-accel kvm` dies in early boot instead of
/// failing cleanly, so we never "try kvm and see". `ZYGOTE_QEMU_ACCEL=kvm|tcg`
/// overrides the probe.
pub fn detect_accel() -> Accel {
    match std::env::var("ZYGOTE_QEMU_ACCEL").as_deref() {
        Ok("kvm") => return Accel::Kvm,
        Ok("tcg") => return Accel::Tcg,
        _ => {}
    }
    if kvm_unavailable_reason().is_none() {
        Accel::Kvm
    } else {
        Accel::Tcg
    }
}

/// Why `-accel kvm` would not work here, or None if it should (probed once
/// per process).
pub fn kvm_unavailable_reason() -> Option<String> {
    static REASON: std::sync::OnceLock<Option<String>> = std::sync::OnceLock::new();
    REASON
        .get_or_init(|| {
            let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
            if !cpu_has_hw_virt(&cpuinfo) {
                return Some("the CPU has no vmx/svm flag (no hardware virtualization)".into());
            }
            let kvm = std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .open("/dev/kvm");
            kvm.err().map(|e| format!("/dev/kvm: {e}"))
        })
        .clone()
}

pub(crate) fn cpu_has_hw_virt(cpuinfo: &str) -> bool {
    cpuinfo
        .lines()
        .filter(|l| l.starts_with("flags"))
        .flat_map(|l| l.split_whitespace())
        .any(|f| f == "vmx" || f == "svm")
}

/// The QEMU machine. Deliberate choices:
/// - `acpi=off`: the guest kernel has no ACPI (tinyconfig); with ACPI off
///   QEMU lists the virtio-mmio devices on the kernel command line instead
///   (`virtio_mmio.device=...`), which the kernel understands.
/// - `rtc=on`: without a CMOS clock the kernel spends ~1.6 s (under TCG)
///   failing to read the wall-clock time, then starts at 1970. With it, boot
///   is faster and the guest clock is right before any `reidentify`.
pub const MACHINE: &str = "microvm,x-option-roms=off,isa-serial=on,rtc=on,acpi=off";

/// Everything needed to boot one VM.
#[derive(Debug, Clone)]
pub struct QemuConfig {
    /// Uncompressed `vmlinux` (PVH entry), as built by zygote-images.
    pub kernel: PathBuf,
    /// Base ext4 image; never written (the VM writes to a qcow2 overlay).
    pub image: PathBuf,
    pub mem_mib: u32,
    pub vcpus: u32,
    /// None: [`detect_accel`].
    pub accel: Option<Accel>,
    /// How long to wait for the agent to answer after QEMU starts.
    pub boot_timeout: Duration,
    /// Appended to the kernel command line.
    pub extra_cmdline: Vec<String>,
    /// `qemu-system-x86_64` unless overridden.
    pub qemu_binary: PathBuf,
    /// The guest's NIC backend.
    pub net: NetBackend,
    /// Disks after the root disk (`/dev/vda`), in this order.
    pub extra_disks: Vec<ExtraDisk>,
}

/// A virtio-blk disk besides the root disk. The guest finds it by `serial` (its
/// `/sys/block/vdX/serial`): probe order is not something to rely on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExtraDisk {
    pub file: PathBuf,
    /// `raw` or `qcow2`.
    pub format: String,
    /// At most 20 bytes of `A-Za-z0-9-` (virtio-blk's serial field).
    pub serial: String,
    /// QEMU's `cache=` mode: `writeback` for data that must outlive the VM, `unsafe` for
    /// a layer thrown away with it.
    pub cache: &'static str,
}

/// What the guest's virtio-net device is connected to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NetBackend {
    /// QEMU's user-mode network (slirp) at 10.0.2.15, gateway 10.0.2.2. `restrict`: the
    /// guest can send nothing anywhere. Without it the guest reaches whatever the host
    /// can, the host's loopback included: use [`NetBackend::Tap`] for isolation.
    User { restrict: bool },
    /// An existing tap (QEMU must run in its network namespace) and the guest's static
    /// address, `ip`'s kernel parameter form: `ip=<addr>::<gw>:<mask>::eth0:off`.
    Tap {
        ifname: String,
        mac: String,
        kernel_ip: String,
    },
}

/// The guest's static address on QEMU's user network; the kernel configures eth0
/// before init runs, so no DHCP client.
const USER_NET_IP: &str = "ip=10.0.2.15::10.0.2.2:255.255.255.0::eth0:off";

impl QemuConfig {
    pub fn new(kernel: impl Into<PathBuf>, image: impl Into<PathBuf>) -> Self {
        QemuConfig {
            kernel: kernel.into(),
            image: image.into(),
            mem_mib: 512,
            vcpus: 1,
            accel: None,
            boot_timeout: Duration::from_secs(60),
            extra_cmdline: Vec::new(),
            qemu_binary: PathBuf::from("qemu-system-x86_64"),
            net: NetBackend::User { restrict: false },
            extra_disks: Vec::new(),
        }
    }

    /// A config for a named image, building the kernel and the image first if
    /// they are not cached yet (progress lines go to `progress`).
    pub fn for_image(image: &str, progress: Progress) -> Result<Self, QemuError> {
        let kernel = zygote_images::build_kernel(progress)?;
        let image = zygote_images::build_image(image, progress)?;
        Ok(QemuConfig::new(kernel.vmlinux, image.path))
    }

    pub fn kernel_cmdline(&self, accel: Accel) -> String {
        let mut words: Vec<String> = [
            "console=ttyS0",
            "root=/dev/vda",
            "rootfstype=ext4",
            "rw",
            // The agent is PID 1: no init system to wait for.
            &format!("init={AGENT_GUEST_PATH}"),
            match &self.net {
                NetBackend::User { .. } => USER_NET_IP,
                NetBackend::Tap { kernel_ip, .. } => kernel_ip.as_str(),
            },
            // A panic (e.g. the agent dying as PID 1) reboots at once, and
            // -no-reboot turns that into QEMU exiting: fail fast, not by timeout.
            "panic=-1",
            // Reboot by triple fault: microvm has no keyboard controller, and
            // probing for one takes seconds under TCG before the fallback.
            "reboot=t",
            // Seed the RNG from RDRAND instead of waiting for jitter entropy.
            "random.trust_cpu=on",
            // microvm has no PCI bus: do not probe for one (the kernel has PCI for
            // its other role, the nested lane's L1 host).
            "pci=off",
            // The agent serves a virtio-serial port whose host end is a Unix
            // socket in the VM's directory: no TCP port in the guest or on the
            // host that another sandbox (or host user) could reach.
            &format!("{CMDLINE_PORT_KEY}={AGENT_PORT_NAME}"),
            &format!("{CMDLINE_TCP_KEY}=off"),
            &format!("{CMDLINE_VSOCK_KEY}=off"),
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        if accel == Accel::Tcg {
            words.extend(Self::tcg_cmdline());
        }
        words.extend(self.extra_cmdline.iter().cloned());
        words.join(" ")
    }

    /// Words the command line needs only under TCG.
    pub(crate) fn tcg_cmdline() -> Vec<String> {
        // TCG's TSC is the host's, but the guest cannot calibrate it (no
        // HPET/PM timer, PIT calibration fails under emulation) and falls back
        // to the jiffies clocksource: 10 ms resolution and a clock that lags
        // whenever the host is busy. Measuring the frequency here fixes both.
        match host_tsc_khz() {
            Some(khz) => vec![format!("tsc_early_khz={khz}"), "tsc=reliable".into()],
            None => Vec::new(),
        }
    }

    /// The full QEMU argv (without the binary). `agent_socket`: where QEMU listens
    /// for the host end of the agent's virtio-serial port (one client at a time).
    pub(crate) fn qemu_args(
        &self,
        accel: Accel,
        overlay: &Path,
        serial_log: &Path,
        agent_socket: &Path,
    ) -> Vec<String> {
        let mut args: Vec<String> = Vec::new();
        let mut push = |items: &[&str]| args.extend(items.iter().map(|s| s.to_string()));
        push(&["-M", MACHINE]);
        match accel {
            Accel::Kvm => push(&["-accel", "kvm", "-cpu", "host"]),
            Accel::Tcg => push(&["-accel", "tcg", "-cpu", "max"]),
        }
        push(&[
            "-m",
            &self.mem_mib.to_string(),
            "-smp",
            &self.vcpus.to_string(),
        ]);
        push(&["-nodefaults", "-no-user-config", "-no-reboot", "-nographic"]);
        push(&["-serial", &format!("file:{}", serial_log.display())]);
        push(&["-kernel", &self.kernel.display().to_string()]);
        push(&["-append", &self.kernel_cmdline(accel)]);
        // cache=unsafe: the overlay is thrown away with the VM, so guest
        // fsyncs need not reach the host disk.
        push(&[
            "-drive",
            &format!(
                "id=root,file={},format=qcow2,if=none,cache=unsafe,discard=unmap",
                overlay.display()
            ),
            "-device",
            "virtio-blk-device,drive=root",
        ]);
        for (i, d) in self.extra_disks.iter().enumerate() {
            let serial: String = d
                .serial
                .chars()
                .filter(|c| c.is_ascii_alphanumeric() || *c == '-')
                .take(20)
                .collect();
            push(&[
                "-drive",
                &format!(
                    "id=disk{i},file={},format={},if=none,cache={},discard=unmap",
                    chardev_path(&d.file),
                    if d.format == "qcow2" { "qcow2" } else { "raw" },
                    d.cache
                ),
                "-device",
                &format!("virtio-blk-device,drive=disk{i},serial={serial}"),
            ]);
        }
        // The guest's own traffic; no port is forwarded from the host: the agent is
        // reached over virtio-serial only.
        match &self.net {
            NetBackend::User { restrict } => push(&[
                "-netdev",
                if *restrict {
                    "user,id=net0,restrict=on"
                } else {
                    "user,id=net0"
                },
                "-device",
                "virtio-net-device,netdev=net0",
            ]),
            NetBackend::Tap { ifname, mac, .. } => push(&[
                "-netdev",
                &format!("tap,id=net0,ifname={ifname},script=no,downscript=no"),
                "-device",
                &format!("virtio-net-device,netdev=net0,mac={mac}"),
            ]),
        }
        push(&[
            "-chardev",
            &format!(
                "socket,id=agent,path={},server=on,wait=off",
                chardev_path(agent_socket)
            ),
            "-device",
            "virtio-serial-device,max_ports=2",
            "-device",
            &format!("virtserialport,chardev=agent,name={AGENT_PORT_NAME}"),
        ]);
        push(&["-device", "virtio-rng-device"]);
        args
    }
}

/// A path as a QEMU option value: commas are doubled (QEMU's escape for them).
fn chardev_path(p: &Path) -> String {
    p.display().to_string().replace(',', ",,")
}

/// The host TSC frequency in kHz, if the TSC is usable as a clock (constant
/// and non-stop); measured once against CLOCK_MONOTONIC.
pub fn host_tsc_khz() -> Option<u64> {
    static KHZ: std::sync::OnceLock<Option<u64>> = std::sync::OnceLock::new();
    *KHZ.get_or_init(|| {
        let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").ok()?;
        let flags = cpuinfo.lines().find(|l| l.starts_with("flags"))?;
        let has = |f: &str| flags.split_whitespace().any(|x| x == f);
        if !(has("constant_tsc") && has("nonstop_tsc")) {
            return None;
        }
        measure_tsc_khz()
    })
}

#[cfg(target_arch = "x86_64")]
fn measure_tsc_khz() -> Option<u64> {
    use std::time::Instant;
    // SAFETY: RDTSC has no preconditions on x86_64.
    let rdtsc = || unsafe { core::arch::x86_64::_rdtsc() };
    let (t0, c0) = (Instant::now(), rdtsc());
    std::thread::sleep(Duration::from_millis(50));
    let (c1, t1) = (rdtsc(), Instant::now());
    let nanos = t1.duration_since(t0).as_nanos() as u64;
    let khz = c1.checked_sub(c0)?.checked_mul(1_000_000)? / nanos.max(1);
    // Anything outside 100 MHz..10 GHz is a broken measurement.
    (100_000..10_000_000).contains(&khz).then_some(khz)
}

#[cfg(not(target_arch = "x86_64"))]
fn measure_tsc_khz() -> Option<u64> {
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hardware_virt_flags() {
        let with_vmx = "processor\t: 0\nflags\t\t: fpu vme vmx sse\n";
        let with_svm = "flags\t\t: fpu svm\n";
        let without = "flags\t\t: fpu vme sse hypervisor\nvmx flags\t: none\n";
        assert!(cpu_has_hw_virt(with_vmx));
        assert!(cpu_has_hw_virt(with_svm));
        assert!(!cpu_has_hw_virt(without));
    }

    #[test]
    fn qemu_argv_has_the_essentials() {
        let mut cfg = QemuConfig::new("/k/vmlinux", "/i/base.ext4");
        cfg.mem_mib = 256;
        cfg.vcpus = 2;
        cfg.extra_cmdline.push("quiet".into());
        let args = cfg.qemu_args(
            Accel::Tcg,
            Path::new("/w/overlay.qcow2"),
            Path::new("/w/serial.log"),
            Path::new("/w/a,b/agent.sock"),
        );
        let joined = args.join(" ");
        for needle in [
            "-M microvm,x-option-roms=off,isa-serial=on,rtc=on,acpi=off",
            "-accel tcg -cpu max",
            "-m 256 -smp 2",
            "-nodefaults",
            "-no-reboot",
            "-serial file:/w/serial.log",
            "-kernel /k/vmlinux",
            "file=/w/overlay.qcow2,format=qcow2",
            "-netdev user,id=net0 ",
            "virtio-net-device",
            "-chardev socket,id=agent,path=/w/a,,b/agent.sock,server=on,wait=off",
            "virtserialport,chardev=agent,name=org.zygote.agent",
        ] {
            assert!(joined.contains(needle), "missing {needle:?} in {joined}");
        }
        // The base image is only ever a backing file, never a drive.
        assert!(!joined.contains("/i/base.ext4"));
        // No host port leads to the guest (issue 19: any sandbox could reach it).
        assert!(!joined.contains("hostfwd"), "{joined}");
        let append = &args[args.iter().position(|a| a == "-append").unwrap() + 1];
        assert!(append.contains("init=/sbin/zygote-agent"));
        assert!(append.contains("ip=10.0.2.15::10.0.2.2:255.255.255.0::eth0:off"));
        assert!(append.contains("zygote.agent.port=org.zygote.agent"));
        assert!(append.contains("zygote.agent.tcp=off"));
        assert!(append.ends_with(" quiet"), "user words come last: {append}");
        if host_tsc_khz().is_some() {
            assert!(append.contains("tsc_early_khz="), "{append}");
        }
        cfg.net = NetBackend::Tap {
            ifname: "tap0".into(),
            mac: "02:7a:63:00:00:05".into(),
            kernel_ip: "ip=10.213.0.6::10.213.0.1:255.255.0.0::eth0:off".into(),
        };
        let tap = cfg
            .qemu_args(
                Accel::Tcg,
                Path::new("/o"),
                Path::new("/s"),
                Path::new("/a"),
            )
            .join(" ");
        assert!(tap.contains("-netdev tap,id=net0,ifname=tap0,script=no,downscript=no"));
        assert!(tap.contains("virtio-net-device,netdev=net0,mac=02:7a:63:00:00:05"));
        assert!(tap.contains("ip=10.213.0.6::10.213.0.1:255.255.0.0::eth0:off"));
        assert!(!tap.contains("10.0.2.15"), "{tap}");
        cfg.net = NetBackend::User { restrict: false };
        let kvm = cfg
            .qemu_args(
                Accel::Kvm,
                Path::new("/o"),
                Path::new("/s"),
                Path::new("/a"),
            )
            .join(" ");
        assert!(kvm.contains("-accel kvm -cpu host"));
        assert!(!kvm.contains("tsc_early_khz"), "kvmclock needs no help");
    }

    #[test]
    fn tsc_measurement_is_plausible() {
        if let Some(khz) = host_tsc_khz() {
            // Two measurements agree within 1% (the value is cached, so
            // measure again directly).
            let again = measure_tsc_khz().unwrap();
            let diff = khz.abs_diff(again) as f64 / khz as f64;
            assert!(diff < 0.01, "{khz} vs {again}");
        }
    }
}
