//! `zygote vm serve`: run one VM in this process and control it over a Unix socket
//! (see crates/vmm/CONTROL.md). This is the process a supervisor starts per VM: branch
//! forks it, and each child serves its own socket.
use std::path::PathBuf;

use zygote_vmm::control::server::{console_sink, serve};
use zygote_vmm::probe::{self, ProbeOptions};
use zygote_vmm::vmm::RestoreConfig;
use zygote_vmm::{VmConfig, Vmm};

#[derive(clap::Args)]
pub struct VmServeArgs {
    /// Control socket to create.
    #[arg(long, value_name = "PATH")]
    api_sock: PathBuf,
    /// Kernel to boot (ELF vmlinux or bzImage).
    #[arg(long, conflicts_with_all = ["probe", "restore"])]
    kernel: Option<PathBuf>,
    /// Boot zygote's probe guest with this scenario instead of a kernel.
    #[arg(long, value_name = "SCENARIO", conflicts_with = "restore")]
    probe: Option<String>,
    /// Restore this snapshot directory instead of booting.
    #[arg(long, value_name = "DIR")]
    restore: Option<PathBuf>,
    /// Initial ramdisk (with --kernel).
    #[arg(long, requires = "kernel")]
    initrd: Option<PathBuf>,
    /// Kernel command line (with --kernel).
    #[arg(
        long,
        requires = "kernel",
        default_value = "console=ttyS0 reboot=k panic=1 pci=off nomodule"
    )]
    cmdline: String,
    /// Guest memory in MiB.
    #[arg(long, default_value_t = 256)]
    mem_mib: u64,
    /// Number of vCPUs.
    #[arg(long, default_value_t = 1)]
    vcpus: u8,
    /// Append the guest console to this file (default: discard).
    #[arg(long, value_name = "FILE")]
    console_log: Option<PathBuf>,
    /// Start with the vCPUs paused.
    #[arg(long)]
    paused: bool,
    /// With --restore: recompute the snapshot's memory checksums first.
    #[arg(long, requires = "restore")]
    verify: bool,
}

pub fn run(args: VmServeArgs) -> anyhow::Result<i32> {
    let console = console_sink(args.console_log.as_deref());
    let vmm = if let Some(dir) = &args.restore {
        Vmm::restore_snapshot(
            dir,
            RestoreConfig {
                serial_out: console,
                start_paused: args.paused,
            },
            args.verify,
        )?
    } else {
        let (kernel, cmdline) = match (&args.kernel, &args.probe) {
            (Some(k), None) => (k.clone(), args.cmdline.clone()),
            (None, Some(scenario)) => {
                let opts = ProbeOptions {
                    mem_mib: args.mem_mib,
                    vcpus: args.vcpus,
                    scenario: scenario.clone(),
                };
                (probe::locate_probe(true)?, probe::probe_cmdline(&opts))
            }
            _ => anyhow::bail!("give one of --kernel, --probe or --restore"),
        };
        Vmm::boot(VmConfig {
            kernel,
            initrd: args.initrd.clone(),
            cmdline,
            mem_mib: args.mem_mib,
            vcpus: args.vcpus,
            serial_out: console,
            start_paused: args.paused,
            virtio_devices: Vec::new(),
        })?
    };
    Ok(serve(vmm, &args.api_sock))
}
