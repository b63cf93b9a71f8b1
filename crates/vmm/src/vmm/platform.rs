//! A VM's platform before its vCPUs run: the KVM VM over guest RAM (memory slots,
//! interrupt controllers, PIT), the legacy devices, the virtio-mmio transports on their
//! buses and the event loop. Boot, restore and warm spawners all build it here.
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use vmm_sys_util::eventfd::EventFd;

use super::VmmError;
use crate::arch::layout::{SERIAL_IRQ, VIRTIO_FIRST_IRQ, VIRTIO_MMIO_BASE, VIRTIO_MMIO_WINDOW};
use crate::devices::i8042::{I8042, I8042_DATA_PORT, I8042_PORT_RANGE};
use crate::devices::serial::{SerialDevice, SerialOut, COM1_BASE, COM_PORT_LEN};
use crate::devices::virtio::mmio::MmioTransport;
use crate::devices::virtio::persist::VirtioDeviceState;
use crate::devices::virtio::VirtioDevice;
use crate::devices::Bus;
use crate::event_loop::EventLoop;
use crate::memory::GuestRam;
use crate::vstate::vcpu::{ExitReason, IoBuses, Vcpu, VmEvent};
use crate::vstate::vm::{HostKvm, Vm};

/// A virtio device plus, when rebuilding a saved VM, its saved state.
pub(super) type DeviceSlot<'a> = (Arc<Mutex<dyn VirtioDevice>>, Option<&'a VirtioDeviceState>);

/// KVM VM plus devices, before vCPUs exist.
pub(super) struct Platform {
    pub(super) vm: Vm,
    pub(super) event_loop: EventLoop,
    pub(super) transports: Vec<Arc<Mutex<MmioTransport>>>,
    pub(super) devices: Vec<Arc<Mutex<dyn VirtioDevice>>>,
    pub(super) buses: IoBuses,
    pub(super) serial: Arc<Mutex<SerialDevice>>,
    pub(super) events_tx: Sender<VmEvent>,
    pub(super) events_rx: Receiver<VmEvent>,
    /// Command line with the virtio-mmio entries appended.
    pub(super) cmdline: String,
}

/// A new KVM VM over `ram`: memory slots, interrupt controllers and PIT.
pub(super) fn new_vm(host: &HostKvm, ram: &GuestRam) -> Result<Vm, VmmError> {
    // Where a new VM's time goes (KVM_CREATE_VM dominates under nested emulation).
    let t = Instant::now();
    let vm = Vm::new(host)?;
    let create_vm = t.elapsed();
    vm.register_memory(ram)?;
    let memory = t.elapsed() - create_vm;
    vm.create_platform()?;
    tracing::debug!(?create_vm, ?memory, irqchip = ?(t.elapsed() - create_vm - memory), "VM created");
    Ok(vm)
}

/// Everything of a VM that does not depend on its state: the KVM VM over the guest
/// RAM (memory slots, irqchip, PIT) and its vCPUs. A warm spawner builds this ahead of
/// the branch it serves; a restore builds it on the spot.
pub(crate) struct PrebuiltVm {
    pub(super) host: HostKvm,
    pub(super) vm: Vm,
    pub(super) vcpus: Vec<Vcpu>,
}

impl PrebuiltVm {
    pub(crate) fn new(ram: &GuestRam, vcpus: usize) -> Result<Self, VmmError> {
        let host = HostKvm::open()?;
        if vcpus == 0 || vcpus > host.max_vcpus {
            return Err(VmmError::TooManyVcpus {
                requested: vcpus as u8,
                kvm_max: host.max_vcpus,
            });
        }
        let vm = new_vm(&host, ram)?;
        let vcpus = (0..vcpus)
            .map(|i| Vcpu::new(&vm, i as u8))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Self { host, vm, vcpus })
    }
}

pub(super) fn build_platform(
    vm: Vm,
    ram: &GuestRam,
    serial_out: SerialOut,
    virtio_devices: &[DeviceSlot],
    cmdline: &str,
) -> Result<Platform, VmmError> {
    let (events_tx, events_rx) = channel();
    let serial_irq =
        EventFd::new(libc::EFD_NONBLOCK).map_err(|e| VmmError::Device(format!("eventfd: {e}")))?;
    vm.fd
        .register_irqfd(&serial_irq, SERIAL_IRQ)
        .map_err(|e| VmmError::Device(format!("serial irqfd: {e}")))?;
    let serial = Arc::new(Mutex::new(SerialDevice::new(serial_irq, serial_out)));
    let reset_tx = Mutex::new(events_tx.clone());
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

    let event_loop =
        EventLoop::start().map_err(|e| VmmError::Device(format!("event loop: {e}")))?;
    let mut mmio = Bus::new();
    let mut full_cmdline = cmdline.to_string();
    let mut transports = Vec::new();
    for (i, (device, _)) in virtio_devices.iter().enumerate() {
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
        let transport = Arc::new(Mutex::new(transport));
        mmio.insert(base, VIRTIO_MMIO_WINDOW, transport.clone())?;
        transports.push(transport);
        full_cmdline.push(' ');
        full_cmdline.push_str(&MmioTransport::cmdline_entry(base, gsi));
    }
    Ok(Platform {
        vm,
        event_loop,
        transports,
        devices: virtio_devices.iter().map(|(d, _)| d.clone()).collect(),
        buses: IoBuses {
            pio: Arc::new(pio),
            mmio: Arc::new(mmio),
        },
        serial,
        events_tx,
        events_rx,
        cmdline: full_cmdline,
    })
}
