//! Building and driving one VM: memory, KVM objects, boot structures or restored state,
//! devices, vCPU threads. The caller owns the event loop (`wait`) and the controls
//! (pause/resume, capture, branch, snapshot).
use std::path::PathBuf;
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::arch::boot::{self, BootError, BootSetup};
use crate::arch::layout::{IOAPIC_PINS, VIRTIO_FIRST_IRQ};
use crate::arch::mptable;
use crate::devices::serial::{SerialDevice, SerialOut};
use crate::devices::virtio::mmio::MmioTransport;
use crate::devices::virtio::persist::{
    adopt_block, check_disk_files, restore_device, DeviceHostConfig, DeviceRestoreError,
    VirtioDeviceState,
};
use crate::devices::virtio::state::DeviceState;
use crate::devices::virtio::VirtioDevice;
use crate::devices::BusError;
use crate::event_loop::{EventLoop, EventRegistrar};
use crate::memory::{self, GuestRam, MemoryError};
use crate::persist::{CpuIdentity, DevicesState, VmState};
use crate::vstate::capture::{self, StateError, XsaveFormat};
use crate::vstate::vcpu::{CaptureParams, ExitReason, Vcpu, VcpuError, VcpuHandle, VmEvent};
use crate::vstate::vm::{HostKvm, Vm, VmError};

pub mod branch;
pub mod diagnose;
pub mod dirty;
mod inherit;
mod platform;
pub(crate) mod ready;
pub mod snapshot;
pub mod warm;

pub(crate) use platform::PrebuiltVm;
use platform::{build_platform, new_vm, DeviceSlot, Platform};

/// What to boot.
pub struct VmConfig {
    pub kernel: PathBuf,
    pub initrd: Option<PathBuf>,
    pub cmdline: String,
    pub mem_mib: u64,
    pub vcpus: u8,
    /// Where the guest's COM1 output goes.
    pub serial_out: SerialOut,
    /// Create vCPU threads parked (resume with [`Vmm::resume`]).
    pub start_paused: bool,
    /// virtio devices, each behind its own virtio-mmio window and IRQ; their
    /// `virtio_mmio.device=` entries are appended to the command line.
    pub virtio_devices: Vec<Arc<Mutex<dyn VirtioDevice>>>,
}

/// Host-side resources for a VM rebuilt from a [`VmState`] (restore, branch child).
pub struct RestoreConfig {
    pub serial_out: SerialOut,
    pub start_paused: bool,
    /// Host resources the restored devices need (their own vsock socket, tap).
    pub device_host: DeviceHostConfig,
    /// Per saved virtio device, the private data it wrote out (empty: none).
    pub device_data: Vec<Vec<u8>>,
    /// Per saved virtio device, a copy-on-write disk this process inherited to adopt
    /// instead (a fork(2) copy of the VMM: see `inherit`); empty: none.
    pub inherited_disks: inherit::InheritedDisks,
}

impl RestoreConfig {
    /// A restore with no device resources: fine for VMs without vsock/net devices.
    pub fn new(serial_out: SerialOut, start_paused: bool) -> Self {
        Self {
            serial_out,
            start_paused,
            device_host: DeviceHostConfig::default(),
            device_data: Vec::new(),
            inherited_disks: Vec::new(),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum VmmError {
    #[error("at least one vCPU is required")]
    NoVcpus,
    #[error("{requested} vCPUs requested; this host's KVM allows {kvm_max} and zygote's MP table at most {}", mptable::MAX_VCPUS)]
    TooManyVcpus { requested: u8, kvm_max: usize },
    #[error(transparent)]
    Memory(#[from] MemoryError),
    #[error(transparent)]
    Kvm(#[from] VmError),
    #[error(transparent)]
    Boot(#[from] BootError),
    #[error(transparent)]
    Vcpu(#[from] VcpuError),
    #[error(transparent)]
    State(#[from] StateError),
    #[error("device set-up failed: {0}")]
    Device(String),
    #[error("the VM has stopped ({0})")]
    Stopped(String),
    #[error("capturing vCPU {index} failed: {detail}")]
    Capture { index: u8, detail: String },
    #[error(
        "virtio device {index} cannot save its state, so this VM cannot be branched or snapshotted"
    )]
    DeviceNotSaveable { index: usize },
    #[error(transparent)]
    DeviceRestore(#[from] DeviceRestoreError),
    #[error("saved memory layout ({saved:?}) does not match the guest RAM ({ram:?})")]
    LayoutMismatch {
        saved: Vec<(u64, u64)>,
        ram: Vec<(u64, u64)>,
    },
}

impl From<BusError> for VmmError {
    fn from(e: BusError) -> Self {
        VmmError::Device(e.to_string())
    }
}

/// Guest RAM must have the layout the state was captured with.
fn check_layout(ram: &GuestRam, state: &VmState) -> Result<(), VmmError> {
    let layout = ram.layout();
    if layout.ranges != state.memory.ranges {
        return Err(VmmError::LayoutMismatch {
            saved: state.memory.ranges.clone(),
            ram: layout.ranges,
        });
    }
    Ok(())
}

/// A running (or paused) VM.
pub struct Vmm {
    // Field order is drop order: vCPU threads stop before the VM fd closes, and the VM
    // fd closes before guest RAM is unmapped.
    vcpus: Vec<VcpuHandle>,
    event_loop: EventLoop,
    transports: Vec<Arc<Mutex<MmioTransport>>>,
    devices: Vec<Arc<Mutex<dyn VirtioDevice>>>,
    vm: Vm,
    ram: Arc<GuestRam>,
    events: Receiver<VmEvent>,
    serial: Arc<Mutex<SerialDevice>>,
    exit: Option<ExitReason>,
    cmdline: String,
    cpu: CpuIdentity,
    paused: bool,
    /// Branch children not yet reaped.
    children: Vec<libc::pid_t>,
    /// A snapshot is the base for diffs (since the last full/live snapshot or
    /// restore): `unsaved_dirty` collects what the next diff must write.
    dirty_logging: bool,
    /// KVM's dirty log is on for all RAM (for diffs or for warm spawners).
    kvm_log_on: bool,
    /// Warm spawners forked ahead of branches (see `warm`).
    spawners: Vec<warm::Spawner>,
    spawner_sources: dirty::DirtySources,
    /// What copying into spawners, forking and building VMs cost here (warm::cost).
    warm_costs: warm::cost::CostModel,
    /// The snapshot a `diff` layers on.
    last_snapshot: Option<PathBuf>,
    /// Pages the next diff snapshot must write that are no longer in the logs: read
    /// out for a spawner, or by a failed diff (bitmap over all RAM; empty: none).
    unsaved_dirty: Vec<u64>,
}

impl Vmm {
    /// Validate the config, build the VM and start its vCPUs.
    pub fn boot(cfg: VmConfig) -> Result<Self, VmmError> {
        if cfg.vcpus == 0 {
            return Err(VmmError::NoVcpus);
        }
        let max_devices = (IOAPIC_PINS - VIRTIO_FIRST_IRQ) as usize;
        if cfg.virtio_devices.len() > max_devices {
            return Err(VmmError::Device(format!(
                "{} virtio devices requested; at most {max_devices} fit the IOAPIC",
                cfg.virtio_devices.len()
            )));
        }
        boot::check_cmdline(&cfg.cmdline)?;
        let host = HostKvm::open()?;
        if cfg.vcpus > mptable::MAX_VCPUS || usize::from(cfg.vcpus) > host.max_vcpus {
            return Err(VmmError::TooManyVcpus {
                requested: cfg.vcpus,
                kvm_max: host.max_vcpus,
            });
        }
        let ram = GuestRam::new(cfg.mem_mib, memory::host_total_mib())?;
        let slots: Vec<DeviceSlot> = cfg
            .virtio_devices
            .iter()
            .map(|d| (d.clone(), None))
            .collect();
        let vm = new_vm(&host, &ram)?;
        let platform = build_platform(vm, &ram, cfg.serial_out, &slots, &cfg.cmdline)?;

        let (kernel, setup_header) = boot::load_kernel(ram.memory(), &cfg.kernel)?;
        let ranges = ram.layout().ranges;
        let initrd = match &cfg.initrd {
            Some(path) => Some(boot::load_initrd(
                ram.memory(),
                path,
                ranges[0].1,
                kernel.end,
            )?),
            None => None,
        };
        boot::write_boot_structures(
            ram.memory(),
            &BootSetup {
                cmdline: &platform.cmdline,
                num_cpus: cfg.vcpus,
                ram_ranges: &ranges,
                kernel,
                setup_header,
                initrd,
            },
        )?;
        tracing::debug!(entry = kernel.entry, format = ?kernel.format, pvh = ?kernel.pvh_entry, "kernel loaded");

        let mut vcpus = Vec::new();
        for index in 0..cfg.vcpus {
            let vcpu = Vcpu::new(&platform.vm, index)?;
            vcpu.configure_boot(&host, cfg.vcpus, kernel.entry)?;
            vcpus.push(vcpu);
        }
        let capture = Arc::new(CaptureParams {
            msr_indices: capture::saveable_msrs(&vcpus[0].fd, &host.msr_index_list),
            xsave: XsaveFormat {
                xsave2_size: host.xsave2_size,
            },
            has_xcrs: host.has_xcrs,
        });
        Self::start(platform, ram, vcpus, capture, &host, cfg.start_paused)
    }

    /// Rebuild a VM from `state` over `ram` (restored from a snapshot, or inherited by a
    /// forked child) and start it.
    pub fn restore(
        ram: Arc<GuestRam>,
        state: &VmState,
        cfg: RestoreConfig,
    ) -> Result<Self, VmmError> {
        check_layout(&ram, state)?;
        let prebuilt = PrebuiltVm::new(&ram, state.vcpus.len())?;
        Self::restore_prebuilt(prebuilt, ram, state, cfg)
    }

    /// [`Vmm::restore`] onto a VM built ahead (a warm spawner's).
    pub(crate) fn restore_prebuilt(
        prebuilt: PrebuiltVm,
        ram: Arc<GuestRam>,
        state: &VmState,
        cfg: RestoreConfig,
    ) -> Result<Self, VmmError> {
        check_layout(&ram, state)?;
        let t = Instant::now();
        let PrebuiltVm {
            host,
            vm,
            vcpus: mut made_ahead,
        } = prebuilt;
        if state.vcpus.is_empty() || state.vcpus.len() > host.max_vcpus {
            return Err(VmmError::TooManyVcpus {
                requested: state.vcpus.len() as u8,
                kvm_max: host.max_vcpus,
            });
        }
        check_disk_files(&state.devices.virtio, &cfg.device_host)?;
        let mut slots: Vec<DeviceSlot> = Vec::new();
        for (i, saved) in state.devices.virtio.iter().enumerate() {
            let mut data = cfg
                .device_data
                .get(i)
                .map(Vec::as_slice)
                .filter(|d| !d.is_empty());
            let reader = data.as_mut().map(|d| d as &mut dyn std::io::Read);
            let inherited = cfg.inherited_disks.get(i).cloned().flatten();
            let device = match (inherited, &saved.device) {
                (Some(disk), DeviceState::Block(b)) => adopt_block(b, disk)?,
                _ => restore_device(&saved.device, &cfg.device_host, reader)?,
            };
            slots.push((device, Some(saved)));
        }
        let devices = t.elapsed();
        let mut platform = build_platform(vm, &ram, cfg.serial_out, &slots, "")?;
        let platform_built = t.elapsed();
        platform.cmdline = state.cmdline.clone();
        capture::restore_platform(&platform.vm.fd, &state.platform)?;
        let xsave = XsaveFormat {
            xsave2_size: host.xsave2_size,
        };
        let mut vcpus = Vec::new();
        for st in &state.vcpus {
            let vcpu = match made_ahead.iter().position(|v| v.index == st.index) {
                Some(i) => made_ahead.swap_remove(i),
                None => Vcpu::new(&platform.vm, st.index)?,
            };
            capture::restore_vcpu(&vcpu.fd, st, xsave)?;
            vcpus.push(vcpu);
        }
        let vcpus_restored = t.elapsed();
        // Devices come back last: a restored device may raise its interrupt at once (a
        // pending status, vsock's transport reset), and KVM delivers it asynchronously
        // into the irqchip and LAPICs, which must already hold their restored state or
        // the interrupt is overwritten and lost.
        for (i, (transport, (_, saved))) in platform.transports.iter().zip(&slots).enumerate() {
            if let Some(st) = saved {
                transport
                    .lock()
                    .unwrap()
                    .restore_state(&st.transport, &st.device.virtio().queues)
                    .map_err(|e| VmmError::Device(format!("virtio device {i}: {e}")))?;
            }
        }
        tracing::debug!(
            ?devices,
            platform = ?(platform_built - devices),
            vcpus = ?(vcpus_restored - platform_built),
            transports = ?(t.elapsed() - vcpus_restored),
            "VM state restored"
        );
        let capture = Arc::new(CaptureParams {
            msr_indices: state.vcpus[0].msrs.iter().map(|m| m.index).collect(),
            xsave,
            has_xcrs: host.has_xcrs,
        });
        Self::start(platform, ram, vcpus, capture, &host, cfg.start_paused)
    }

    fn start(
        platform: Platform,
        ram: Arc<GuestRam>,
        vcpus: Vec<Vcpu>,
        capture: Arc<CaptureParams>,
        host: &HostKvm,
        start_paused: bool,
    ) -> Result<Self, VmmError> {
        let mut handles = Vec::new();
        for vcpu in vcpus {
            handles.push(vcpu.spawn(
                host.vcpu_mmap_size,
                platform.buses.clone(),
                platform.events_tx.clone(),
                start_paused,
                capture.clone(),
            )?);
        }
        if start_paused {
            platform.event_loop.park();
        }
        Ok(Self {
            vcpus: handles,
            event_loop: platform.event_loop,
            transports: platform.transports,
            devices: platform.devices,
            vm: platform.vm,
            ram,
            events: platform.events_rx,
            serial: platform.serial,
            exit: None,
            cmdline: platform.cmdline,
            cpu: host.cpu.clone(),
            paused: start_paused,
            children: Vec::new(),
            dirty_logging: false,
            kvm_log_on: false,
            spawners: Vec::new(),
            spawner_sources: Default::default(),
            warm_costs: Default::default(),
            last_snapshot: None,
            unsaved_dirty: Vec::new(),
        })
    }

    fn ensure_running(&self) -> Result<(), VmmError> {
        match &self.exit {
            Some(e) => Err(VmmError::Stopped(e.to_string())),
            None => Ok(()),
        }
    }

    fn pause_inner(&mut self, capture: bool) -> Result<(), VmmError> {
        self.ensure_running()?;
        for v in &self.vcpus {
            v.request_pause(capture);
        }
        for v in &self.vcpus {
            v.wait_parked();
        }
        // Devices stop after the vCPUs so no request is left half-seen.
        self.event_loop.park();
        self.paused = true;
        Ok(())
    }

    /// Stop every vCPU outside KVM_RUN and park the device thread.
    pub fn pause(&mut self) -> Result<(), VmmError> {
        self.pause_inner(false)
    }

    /// Pause (if running) and capture the complete VM state.
    pub fn pause_and_capture(&mut self) -> Result<VmState, VmmError> {
        self.pause_inner(true)?;
        let mut vcpus = Vec::with_capacity(self.vcpus.len());
        for v in &self.vcpus {
            match v.take_captured() {
                Some(Ok(st)) => vcpus.push(st),
                Some(Err(detail)) => {
                    return Err(VmmError::Capture {
                        index: v.index,
                        detail,
                    })
                }
                None => {
                    return Err(VmmError::Capture {
                        index: v.index,
                        detail: "vCPU exited before capturing".into(),
                    })
                }
            }
        }
        let mut virtio = Vec::with_capacity(self.transports.len());
        for (index, (t, d)) in self.transports.iter().zip(&self.devices).enumerate() {
            let device = d
                .lock()
                .unwrap()
                .save()
                .ok_or(VmmError::DeviceNotSaveable { index })?;
            virtio.push(VirtioDeviceState {
                transport: t.lock().unwrap().save_state(),
                device,
            });
        }
        Ok(VmState {
            memory: self.ram.layout(),
            platform: capture::capture_platform(&self.vm.fd)?,
            vcpus,
            devices: DevicesState { virtio },
            cmdline: self.cmdline.clone(),
        })
    }

    /// Each virtio device's private data (see `VirtioDevice::write_private_data`), for
    /// a branch child or a snapshot. Call while paused, right after capturing state.
    pub fn device_private_data(&self) -> std::io::Result<Vec<Vec<u8>>> {
        self.private_data_not_inherited(&Vec::new())
    }

    /// Let paused vCPUs run again.
    pub fn resume(&mut self) -> Result<(), VmmError> {
        self.ensure_running()?;
        self.event_loop.unpark();
        for v in &self.vcpus {
            v.resume();
        }
        self.paused = false;
        Ok(())
    }

    pub fn is_paused(&self) -> bool {
        self.paused
    }

    /// Wait for the VM to end (or `timeout`); returns the exit reason once known.
    pub fn wait(&mut self, timeout: Option<Duration>) -> Option<&ExitReason> {
        if self.exit.is_none() {
            let ev = match timeout {
                Some(t) => match self.events.recv_timeout(t) {
                    Ok(ev) => Some(ev),
                    Err(RecvTimeoutError::Timeout) => None,
                    Err(RecvTimeoutError::Disconnected) => None,
                },
                None => self.events.recv().ok(),
            };
            if let Some(VmEvent::Exit(reason)) = ev {
                self.stop_threads();
                self.exit = Some(reason);
            }
        }
        self.exit.as_ref()
    }

    fn stop_threads(&mut self) {
        for v in &mut self.vcpus {
            v.stop();
        }
        self.event_loop.stop();
    }

    /// Stop the VM now (if still running) and release everything.
    pub fn shutdown(mut self) -> Option<ExitReason> {
        self.stop_threads();
        self.exit.take()
    }

    pub fn guest_ram(&self) -> &Arc<GuestRam> {
        &self.ram
    }

    pub fn vm_fd(&self) -> &kvm_ioctls::VmFd {
        &self.vm.fd
    }

    pub fn cmdline(&self) -> &str {
        &self.cmdline
    }

    pub fn cpu_identity(&self) -> &CpuIdentity {
        &self.cpu
    }

    /// The snapshot a `diff` would layer on.
    pub fn last_snapshot(&self) -> Option<&std::path::Path> {
        self.last_snapshot.as_deref()
    }

    pub fn vcpu_count(&self) -> usize {
        self.vcpus.len()
    }

    /// Where devices and backends register fds with the VM's event thread.
    pub fn event_registrar(&self) -> &EventRegistrar {
        self.event_loop.registrar()
    }

    /// The guest's COM1, e.g. for a thread forwarding console input.
    pub fn serial(&self) -> Arc<Mutex<SerialDevice>> {
        self.serial.clone()
    }
}
