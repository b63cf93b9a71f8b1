//! Building and driving one VM: memory, KVM objects, boot structures, devices, vCPU
//! threads. The caller owns the event loop (`wait`) and the pause/resume controls.
use std::path::PathBuf;
use std::sync::mpsc::{channel, Receiver, RecvTimeoutError};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use vmm_sys_util::eventfd::EventFd;

use crate::arch::boot::{self, BootError, BootSetup, LoadedKernel};
use crate::arch::layout::{
    IOAPIC_PINS, SERIAL_IRQ, VIRTIO_FIRST_IRQ, VIRTIO_MMIO_BASE, VIRTIO_MMIO_WINDOW,
};
use crate::arch::mptable;
use crate::devices::i8042::{I8042, I8042_DATA_PORT, I8042_PORT_RANGE};
use crate::devices::serial::{SerialDevice, SerialOut, COM1_BASE, COM_PORT_LEN};
use crate::devices::virtio::mmio::MmioTransport;
use crate::devices::virtio::VirtioDevice;
use crate::devices::{Bus, BusError};
use crate::event_loop::{EventLoop, EventRegistrar};
use crate::memory::{self, GuestRam, MemoryError};
use crate::vstate::vcpu::{ExitReason, IoBuses, Vcpu, VcpuError, VcpuHandle, VmEvent};
use crate::vstate::vm::{HostKvm, Vm, VmError};

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
    #[error("device set-up failed: {0}")]
    Device(String),
    #[error("the VM has already stopped")]
    Stopped,
}

impl From<BusError> for VmmError {
    fn from(e: BusError) -> Self {
        VmmError::Device(e.to_string())
    }
}

/// A running (or paused) VM.
pub struct Vmm {
    // Field order is drop order: vCPU threads stop before the VM fd closes, and the VM
    // fd closes before guest RAM is unmapped.
    vcpus: Vec<VcpuHandle>,
    event_loop: EventLoop,
    vm: Vm,
    ram: Arc<GuestRam>,
    events: Receiver<VmEvent>,
    kernel: LoadedKernel,
    serial: Arc<Mutex<SerialDevice>>,
    exit: Option<ExitReason>,
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
        let vm = Vm::new(&host)?;
        vm.register_memory(&ram)?;
        vm.create_platform()?;

        let (kernel, setup_header) = boot::load_kernel(ram.memory(), &cfg.kernel)?;
        let ranges: Vec<(u64, u64)> = ram
            .ranges()
            .iter()
            .map(|r| (r.guest_addr, r.size))
            .collect();
        let initrd = match &cfg.initrd {
            Some(path) => Some(boot::load_initrd(
                ram.memory(),
                path,
                ranges[0].1,
                kernel.end,
            )?),
            None => None,
        };
        let event_loop =
            EventLoop::start().map_err(|e| VmmError::Device(format!("event loop: {e}")))?;
        let mut mmio = Bus::new();
        let mut cmdline = cfg.cmdline.clone();
        for (i, device) in cfg.virtio_devices.iter().enumerate() {
            let base = VIRTIO_MMIO_BASE + i as u64 * VIRTIO_MMIO_WINDOW;
            let gsi = VIRTIO_FIRST_IRQ + i as u32;
            let transport = MmioTransport::new(
                device.clone(),
                ram.memory().clone(),
                event_loop.registrar().clone(),
            )
            .map_err(|e| VmmError::Device(e.to_string()))?;
            transport
                .register(&vm.fd, base, gsi)
                .map_err(|e| VmmError::Device(e.to_string()))?;
            mmio.insert(base, VIRTIO_MMIO_WINDOW, Arc::new(Mutex::new(transport)))?;
            cmdline.push(' ');
            cmdline.push_str(&MmioTransport::cmdline_entry(base, gsi));
        }
        boot::write_boot_structures(
            ram.memory(),
            &BootSetup {
                cmdline: &cmdline,
                num_cpus: cfg.vcpus,
                ram_ranges: &ranges,
                kernel,
                setup_header,
                initrd,
            },
        )?;

        let (tx, events) = channel();
        let serial_irq = EventFd::new(libc::EFD_NONBLOCK)
            .map_err(|e| VmmError::Device(format!("eventfd: {e}")))?;
        vm.fd
            .register_irqfd(&serial_irq, SERIAL_IRQ)
            .map_err(|e| VmmError::Device(format!("serial irqfd: {e}")))?;
        let serial = Arc::new(Mutex::new(SerialDevice::new(serial_irq, cfg.serial_out)));
        let reset_tx = Mutex::new(tx.clone());
        let i8042 = I8042::new(Box::new(move || {
            let _ = reset_tx
                .lock()
                .unwrap()
                .send(VmEvent::Exit(ExitReason::Reset));
        }));
        let mut pio = Bus::new();
        pio.insert(COM1_BASE, COM_PORT_LEN, serial.clone())?;
        pio.insert(
            I8042_DATA_PORT,
            I8042_PORT_RANGE,
            Arc::new(Mutex::new(i8042)),
        )?;
        let buses = IoBuses {
            pio: Arc::new(pio),
            mmio: Arc::new(mmio),
        };

        let mut configured = Vec::new();
        for index in 0..cfg.vcpus {
            let vcpu = Vcpu::new(&vm, index)?;
            vcpu.configure_boot(&host, cfg.vcpus, kernel.entry)?;
            configured.push(vcpu);
        }
        let mut vcpus = Vec::new();
        for vcpu in configured {
            vcpus.push(vcpu.spawn(buses.clone(), tx.clone(), cfg.start_paused)?);
        }
        Ok(Self {
            vcpus,
            event_loop,
            vm,
            ram,
            events,
            kernel,
            serial,
            exit: None,
        })
    }

    /// Stop every vCPU outside KVM_RUN and wait until all are parked.
    pub fn pause(&self) -> Result<(), VmmError> {
        if self.exit.is_some() {
            return Err(VmmError::Stopped);
        }
        for v in &self.vcpus {
            v.request_pause();
        }
        for v in &self.vcpus {
            v.wait_parked();
        }
        // Devices stop after the vCPUs so no request is left half-seen.
        self.event_loop.park();
        Ok(())
    }

    /// Let paused vCPUs run again.
    pub fn resume(&self) -> Result<(), VmmError> {
        if self.exit.is_some() {
            return Err(VmmError::Stopped);
        }
        self.event_loop.unpark();
        for v in &self.vcpus {
            v.resume();
        }
        Ok(())
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
                self.stop_vcpus();
                self.exit = Some(reason);
            }
        }
        self.exit.as_ref()
    }

    fn stop_vcpus(&mut self) {
        for v in &mut self.vcpus {
            v.stop();
        }
        self.event_loop.stop();
    }

    /// Where devices and backends register fds with the VM's event thread.
    pub fn event_registrar(&self) -> &EventRegistrar {
        self.event_loop.registrar()
    }

    /// Stop the VM now (if still running) and release everything.
    pub fn shutdown(mut self) -> Option<ExitReason> {
        self.stop_vcpus();
        self.exit.take()
    }

    pub fn guest_ram(&self) -> &Arc<GuestRam> {
        &self.ram
    }

    pub fn kernel(&self) -> &LoadedKernel {
        &self.kernel
    }

    pub fn vm_fd(&self) -> &kvm_ioctls::VmFd {
        &self.vm.fd
    }

    /// The guest's COM1, e.g. for a thread forwarding console input.
    pub fn serial(&self) -> Arc<Mutex<SerialDevice>> {
        self.serial.clone()
    }
}
