//! `zygote vm serve`: run one VM in this process and control it over a Unix socket
//! (see crates/vmm/CONTROL.md). This is the process a supervisor starts per VM: branch
//! forks it, and each child serves its own socket.
use std::path::PathBuf;

use zygote_vmm::control::checks::SnapshotConfinement;
use zygote_vmm::control::server::{bind, console_sink, serve_listener, ServeOptions};
use zygote_vmm::devices::virtio::block::DiskFile;
use zygote_vmm::devices::virtio::persist::DeviceHostConfig;
use zygote_vmm::devices::virtio::setup::{GuestDeviceConfig, GuestDevices};
use zygote_vmm::devices::virtio::vsock::{VsockConfig, DEFAULT_GUEST_CID};
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
    /// Root disk: a base image mapped copy-on-write (becomes /dev/vda).
    #[arg(long, value_name = "IMAGE", conflicts_with = "restore")]
    disk: Option<PathBuf>,
    /// Persistent data disk (repeatable).
    #[arg(long, value_name = "FILE", conflicts_with = "restore")]
    data_disk: Vec<PathBuf>,
    /// A data disk with an id (its GET_ID, how the guest finds it; 1-20 of
    /// `A-Za-z0-9._-`) whose writes reach FILE, e.g. a named volume (repeatable). With
    /// --restore: the saved VM's disk of that id uses FILE.
    #[arg(long, value_name = "ID=FILE", value_parser = parse_named_disk)]
    volume: Vec<(String, PathBuf)>,
    /// Like --volume, but the disk is a copy-on-write view of FILE: writes stay in the
    /// VM's memory and FILE is never written (repeatable). With --restore: how a copy of
    /// a VM gets a frozen copy of a persistent disk instead of writing into it.
    #[arg(long, value_name = "ID=FILE", value_parser = parse_named_disk)]
    volume_view: Vec<(String, PathBuf)>,
    /// virtio-vsock on this Unix socket (with --restore: the restored VM's own socket).
    #[arg(long, value_name = "SOCK")]
    vsock: Option<PathBuf>,
    /// virtio-net on this tap (with --restore: the restored VM's own tap).
    #[arg(long, value_name = "TAP")]
    net: Option<String>,
    /// Add a virtio-rng entropy device.
    #[arg(long, conflicts_with = "restore")]
    rng: bool,
    /// Let KSM merge this VM's identical pages with other VMs' (needs KSM running).
    #[arg(long)]
    ksm: bool,
    /// Accept `snapshot` requests only for paths under this existing directory (after
    /// resolving symlinks); branch children inherit the limit.
    #[arg(long, value_name = "DIR")]
    snapshot_root: Option<PathBuf>,
    /// Keep this many warm spawners: processes forked ahead with the child's KVM VM
    /// already built, caught up with the guest's writes, so that a single-child branch
    /// needs no fork and no VM build (0: every branch forks). Branch children inherit it.
    #[arg(long, default_value_t = 0, value_name = "K")]
    warm_spawners: usize,
}

/// `ID=FILE` of `--volume`/`--volume-view`: ids are limited to what the 20-byte GET_ID
/// answer holds whole, so that two ids can never read the same to the guest.
fn parse_named_disk(s: &str) -> Result<(String, PathBuf), String> {
    let (id, file) = s.split_once('=').ok_or("expected ID=FILE")?;
    let valid = |c: char| c.is_ascii_alphanumeric() || "._-".contains(c);
    if id.is_empty() || id.len() > 20 || !id.chars().all(valid) {
        return Err(format!(
            "disk id {id:?}: 1 to 20 characters of A-Z a-z 0-9 . _ -"
        ));
    }
    if file.is_empty() {
        return Err("expected ID=FILE".into());
    }
    Ok((id.to_string(), PathBuf::from(file)))
}

/// The named disks of `args`, in flag order: volumes, then views.
fn disk_files(args: &VmServeArgs) -> Vec<DiskFile> {
    let named = |list: &[(String, PathBuf)], copy_on_write: bool| {
        list.iter()
            .map(|(id, path)| DiskFile {
                id: id.clone(),
                path: path.clone(),
                copy_on_write,
            })
            .collect::<Vec<_>>()
    };
    let mut files = named(&args.volume, false);
    files.extend(named(&args.volume_view, true));
    files
}

pub fn run(args: VmServeArgs) -> anyhow::Result<i32> {
    let opts = ServeOptions {
        snapshots: match &args.snapshot_root {
            Some(dir) => SnapshotConfinement::under(dir)?,
            None => SnapshotConfinement::default(),
        },
        warm_spawners: args.warm_spawners,
    };
    // The socket first: a VMM already serving this path is found before a VM is built
    // for nothing, and a stale file is replaced. Requests that arrive while the VM
    // boots wait in the listen backlog.
    let listener = bind(&args.api_sock)?;
    let vmm = match build(&args) {
        Ok(vmm) => vmm,
        Err(e) => {
            let _ = std::fs::remove_file(&args.api_sock);
            return Err(e);
        }
    };
    Ok(serve_listener(vmm, listener, &args.api_sock, opts))
}

fn build(args: &VmServeArgs) -> anyhow::Result<Vmm> {
    let console = console_sink(args.console_log.as_deref());
    let vmm = if let Some(dir) = &args.restore {
        Vmm::restore_snapshot(
            dir,
            RestoreConfig {
                serial_out: console,
                start_paused: args.paused,
                device_host: DeviceHostConfig {
                    vsock_uds: args.vsock.clone(),
                    net_tap: args.net.clone(),
                    disk_files: disk_files(args),
                },
                device_data: Vec::new(),
                inherited_disks: Vec::new(),
            },
            args.verify,
        )?
    } else {
        let devices = GuestDevices::build(&GuestDeviceConfig {
            root_image: args.disk.clone(),
            root_read_only: false,
            data_disks: args.data_disk.clone(),
            named_disks: disk_files(args),
            vsock: args.vsock.clone().map(|uds_path| VsockConfig {
                guest_cid: DEFAULT_GUEST_CID,
                uds_path,
            }),
            net_tap: args.net.clone(),
            rng: args.rng,
        })?;
        let (kernel, cmdline) = match (&args.kernel, &args.probe) {
            (Some(k), None) => {
                let mut cmdline = args.cmdline.clone();
                if args.disk.is_some() && !cmdline.contains("root=") {
                    cmdline.push(' ');
                    cmdline.push_str(&devices.root_cmdline());
                }
                (k.clone(), cmdline)
            }
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
            virtio_devices: devices.virtio_devices(),
        })?
    };
    if args.ksm {
        vmm.guest_ram().enable_ksm()?;
    }
    Ok(vmm)
}
