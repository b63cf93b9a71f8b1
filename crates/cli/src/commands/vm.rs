//! `zygote vm run`: boot an arbitrary kernel on zygote's VMM with the console on this
//! terminal. Linux guests need hardware virtualization (see `zygote doctor`).
use std::io::{Read, Write};
use std::path::PathBuf;

use zygote_vmm::devices::virtio::setup::{GuestDeviceConfig, GuestDevices};
use zygote_vmm::devices::virtio::vsock::VsockConfig;
use zygote_vmm::{VmConfig, Vmm};

const DEFAULT_CMDLINE: &str =
    "console=ttyS0 reboot=k panic=1 pci=off nomodule i8042.noaux i8042.nomux i8042.dumbkbd";

#[derive(clap::Subcommand)]
pub enum VmCommand {
    /// Boot a kernel (ELF vmlinux or bzImage) with the serial console on stdio.
    Run(VmRunArgs),
    /// Run one VM controlled over a Unix socket (the per-VM process a supervisor starts).
    Serve(super::vm_serve::VmServeArgs),
}

#[derive(clap::Args)]
pub struct VmRunArgs {
    /// Kernel image: an ELF vmlinux or a bzImage.
    #[arg(long)]
    kernel: PathBuf,
    /// Initial ramdisk.
    #[arg(long)]
    initrd: Option<PathBuf>,
    /// Kernel command line.
    #[arg(long, default_value = DEFAULT_CMDLINE)]
    cmdline: String,
    /// Guest memory in MiB.
    #[arg(long, default_value_t = 512)]
    mem_mib: u64,
    /// Number of vCPUs.
    #[arg(long, default_value_t = 1)]
    vcpus: u8,
    /// Root disk: a base image mapped copy-on-write (the file is never written; guest
    /// writes stay private to this VM). Becomes /dev/vda; `root=/dev/vda` is added to
    /// the command line unless it names a root already.
    #[arg(long, value_name = "IMAGE")]
    disk: Option<PathBuf>,
    /// Expose the root disk read-only.
    #[arg(long, requires = "disk")]
    disk_ro: bool,
    /// Persistent data disk (writes go to the file); repeatable: /dev/vdb, /dev/vdc, ...
    #[arg(long, value_name = "FILE")]
    data_disk: Vec<PathBuf>,
    /// virtio-vsock with its host side on this Unix socket: connect and send
    /// `CONNECT <port>\n` to reach a guest port; guest connections to port P go to
    /// `<SOCK>_<P>`.
    #[arg(long, value_name = "SOCK")]
    vsock: Option<PathBuf>,
    /// Guest CID for vsock.
    #[arg(long, requires = "vsock", default_value_t = zygote_vmm::devices::virtio::vsock::DEFAULT_GUEST_CID)]
    cid: u64,
    /// virtio-net on this tap interface (created if missing; needs CAP_NET_ADMIN).
    #[arg(long, value_name = "TAP")]
    net: Option<String>,
    /// Leave out the virtio-rng entropy device.
    #[arg(long)]
    no_rng: bool,
}

pub fn run(cmd: VmCommand) -> anyhow::Result<i32> {
    match cmd {
        VmCommand::Run(args) => vm_run(args),
        VmCommand::Serve(args) => super::vm_serve::run(args),
    }
}

fn vm_run(args: VmRunArgs) -> anyhow::Result<i32> {
    let devices = GuestDevices::build(&GuestDeviceConfig {
        root_image: args.disk.clone(),
        root_read_only: args.disk_ro,
        data_disks: args.data_disk.clone(),
        named_disks: Vec::new(),
        vsock: args.vsock.clone().map(|uds_path| VsockConfig {
            guest_cid: args.cid,
            uds_path,
        }),
        net_tap: args.net.clone(),
        rng: !args.no_rng,
    })?;
    let mut cmdline = args.cmdline;
    let root = devices.root_cmdline();
    if !root.is_empty() && !cmdline.split_whitespace().any(|w| w.starts_with("root=")) {
        cmdline = format!("{cmdline} {root}");
    }
    if let Some(net) = &devices.net {
        eprintln!("zygote: virtio-net on tap {}", net.lock().unwrap().ifname());
    }
    let mut vmm = Vmm::boot(VmConfig {
        kernel: args.kernel,
        initrd: args.initrd,
        cmdline,
        mem_mib: args.mem_mib,
        vcpus: args.vcpus,
        serial_out: Box::new(std::io::stdout()),
        start_paused: false,
        virtio_devices: devices.virtio_devices(),
    })?;
    let serial = vmm.serial();
    // Console input: a detached thread; it dies with the process.
    std::thread::spawn(move || {
        let mut buf = [0u8; 256];
        let mut stdin = std::io::stdin();
        while let Ok(n) = stdin.read(&mut buf) {
            if n == 0 {
                break;
            }
            serial.lock().unwrap().enqueue_input(&buf[..n]);
        }
    });
    let exit = vmm.wait(None).cloned();
    let _ = std::io::stdout().flush();
    if devices.root.is_some() {
        eprintln!(
            "zygote: root disk private bytes: {}",
            devices.root_private_bytes()
        );
    }
    match exit {
        Some(e) if e.is_clean() => {
            eprintln!("zygote: VM exited: {e}");
            Ok(0)
        }
        Some(e) => {
            eprintln!("zygote: VM failed: {e}");
            Ok(1)
        }
        None => anyhow::bail!("VM event channel closed unexpectedly"),
    }
}
