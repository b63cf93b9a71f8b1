//! `zygote vm run`: boot an arbitrary kernel on zygote's VMM with the console on this
//! terminal. Linux guests need hardware virtualization (see `zygote doctor`).
use std::io::{Read, Write};
use std::path::PathBuf;

use zygote_vmm::{VmConfig, Vmm};

const DEFAULT_CMDLINE: &str =
    "console=ttyS0 reboot=k panic=1 pci=off nomodule i8042.noaux i8042.nomux i8042.dumbkbd";

#[derive(clap::Subcommand)]
pub enum VmCommand {
    /// Boot a kernel (ELF vmlinux or bzImage) with the serial console on stdio.
    Run(VmRunArgs),
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
}

pub fn run(cmd: VmCommand) -> anyhow::Result<i32> {
    match cmd {
        VmCommand::Run(args) => vm_run(args),
    }
}

fn vm_run(args: VmRunArgs) -> anyhow::Result<i32> {
    let mut vmm = Vmm::boot(VmConfig {
        kernel: args.kernel,
        initrd: args.initrd,
        cmdline: args.cmdline,
        mem_mib: args.mem_mib,
        vcpus: args.vcpus,
        serial_out: Box::new(std::io::stdout()),
        start_paused: false,
        virtio_devices: Vec::new(),
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
