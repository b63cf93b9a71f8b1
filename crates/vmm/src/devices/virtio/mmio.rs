//! The virtio-mmio register window (virtio 1.x §4.2.2, version 2).
use std::sync::{Arc, Mutex};

use crate::memory::GuestMemoryMmap;
use kvm_ioctls::{IoEventAddress, VmFd};
use virtio_queue::{Queue, QueueT};
use vmm_sys_util::eventfd::EventFd;

use super::persist::TransportState;
use super::state::QueueSnapshot;
use super::{status, ActivateContext, VirtioDevice, VirtioInterrupt, VIRTIO_F_VERSION_1};
use crate::devices::bus::BusDevice;
use crate::event_loop::EventRegistrar;

const MAGIC: u32 = 0x7472_6976; // "virt"
const VERSION: u32 = 2;
const VENDOR_ID: u32 = 0x5a59_474f; // "ZYGO"
pub const CONFIG_SPACE_OFFSET: u64 = 0x100;
pub const QUEUE_NOTIFY_OFFSET: u64 = 0x50;

mod reg {
    pub const MAGIC: u64 = 0x00;
    pub const VERSION: u64 = 0x04;
    pub const DEVICE_ID: u64 = 0x08;
    pub const VENDOR_ID: u64 = 0x0c;
    pub const DEVICE_FEATURES: u64 = 0x10;
    pub const DEVICE_FEATURES_SEL: u64 = 0x14;
    pub const DRIVER_FEATURES: u64 = 0x20;
    pub const DRIVER_FEATURES_SEL: u64 = 0x24;
    pub const QUEUE_SEL: u64 = 0x30;
    pub const QUEUE_NUM_MAX: u64 = 0x34;
    pub const QUEUE_NUM: u64 = 0x38;
    pub const QUEUE_READY: u64 = 0x44;
    pub const QUEUE_NOTIFY: u64 = super::QUEUE_NOTIFY_OFFSET;
    pub const INTERRUPT_STATUS: u64 = 0x60;
    pub const INTERRUPT_ACK: u64 = 0x64;
    pub const STATUS: u64 = 0x70;
    pub const QUEUE_DESC_LOW: u64 = 0x80;
    pub const QUEUE_DESC_HIGH: u64 = 0x84;
    pub const QUEUE_DRIVER_LOW: u64 = 0x90;
    pub const QUEUE_DRIVER_HIGH: u64 = 0x94;
    pub const QUEUE_DEVICE_LOW: u64 = 0xa0;
    pub const QUEUE_DEVICE_HIGH: u64 = 0xa4;
    pub const CONFIG_GENERATION: u64 = 0xfc;
}

#[derive(Debug, thiserror::Error)]
pub enum TransportError {
    #[error("creating an eventfd failed: {0}")]
    EventFd(std::io::Error),
    #[error("registering {what} with KVM failed: {source}")]
    Register {
        what: &'static str,
        source: kvm_ioctls::Error,
    },
}

/// One virtio device behind an MMIO window.
pub struct MmioTransport {
    device: Arc<Mutex<dyn VirtioDevice>>,
    mem: GuestMemoryMmap,
    registrar: EventRegistrar,
    queues: Vec<Queue>,
    queue_evts: Vec<EventFd>,
    interrupt: Arc<VirtioInterrupt>,
    device_status: u32,
    device_features_sel: u32,
    driver_features_sel: u32,
    acked_features: u64,
    queue_sel: u32,
    config_generation: u32,
    activated: bool,
}

impl MmioTransport {
    pub fn new(
        device: Arc<Mutex<dyn VirtioDevice>>,
        mem: GuestMemoryMmap,
        registrar: EventRegistrar,
    ) -> Result<Self, TransportError> {
        let sizes = device.lock().unwrap().queue_max_sizes();
        let queues = sizes
            .iter()
            .map(|&s| Queue::new(s).expect("device offers a power-of-two queue size"))
            .collect();
        let queue_evts = sizes
            .iter()
            .map(|_| EventFd::new(libc::EFD_NONBLOCK).map_err(TransportError::EventFd))
            .collect::<Result<_, _>>()?;
        let irqfd = EventFd::new(libc::EFD_NONBLOCK).map_err(TransportError::EventFd)?;
        Ok(Self {
            device,
            mem,
            registrar,
            queues,
            queue_evts,
            interrupt: Arc::new(VirtioInterrupt::new(irqfd)),
            device_status: 0,
            device_features_sel: 0,
            driver_features_sel: 0,
            acked_features: 0,
            queue_sel: 0,
            config_generation: 0,
            activated: false,
        })
    }

    /// Wire the queue ioeventfds and the irqfd into KVM for a window at `base` on `gsi`.
    pub fn register(&self, vm: &VmFd, base: u64, gsi: u32) -> Result<(), TransportError> {
        for (i, evt) in self.queue_evts.iter().enumerate() {
            vm.register_ioevent(
                evt,
                &IoEventAddress::Mmio(base + QUEUE_NOTIFY_OFFSET),
                i as u32,
            )
            .map_err(|source| TransportError::Register {
                what: "queue ioeventfd",
                source,
            })?;
        }
        vm.register_irqfd(self.interrupt.irqfd(), gsi)
            .map_err(|source| TransportError::Register {
                what: "irqfd",
                source,
            })
    }

    /// The `virtio_mmio.device=` kernel parameter announcing this window.
    pub fn cmdline_entry(base: u64, gsi: u32) -> String {
        format!("virtio_mmio.device=4K@{base:#x}:{gsi}")
    }

    pub fn interrupt(&self) -> &Arc<VirtioInterrupt> {
        &self.interrupt
    }

    pub fn queue_evts(&self) -> &[EventFd] {
        &self.queue_evts
    }

    pub fn device_status(&self) -> u32 {
        self.device_status
    }

    pub fn is_activated(&self) -> bool {
        self.activated
    }

    fn selected_queue(&mut self) -> Option<&mut Queue> {
        self.queues.get_mut(self.queue_sel as usize)
    }

    /// Queue registers may only change while the driver is setting up (before DRIVER_OK).
    fn queue_config_allowed(&self) -> bool {
        self.device_status & status::FEATURES_OK != 0 && self.device_status & status::DRIVER_OK == 0
    }

    fn with_queue(&mut self, f: impl FnOnce(&mut Queue)) {
        if self.queue_config_allowed() {
            if let Some(q) = self.selected_queue() {
                f(q);
            }
        }
    }

    fn reset(&mut self) {
        if self.activated || self.device_status != 0 {
            self.device.lock().unwrap().reset();
        }
        for q in &mut self.queues {
            q.reset();
        }
        self.interrupt.clear();
        self.device_status = 0;
        self.acked_features = 0;
        self.queue_sel = 0;
        self.device_features_sel = 0;
        self.driver_features_sel = 0;
        self.activated = false;
    }

    fn set_status(&mut self, value: u32) {
        if value == 0 {
            self.reset();
            return;
        }
        // The driver may only add bits, in the order the spec prescribes.
        let added = value & !self.device_status;
        if value & self.device_status != self.device_status {
            tracing::debug!("virtio-mmio: driver cleared status bits without reset; ignored");
            return;
        }
        if added & status::FEATURES_OK != 0 {
            let offered = self.device.lock().unwrap().features();
            if self.acked_features & !offered != 0 || self.acked_features & VIRTIO_F_VERSION_1 == 0
            {
                // Refuse: FEATURES_OK will read back clear and the driver gives up.
                self.device_status = value & !status::FEATURES_OK;
                return;
            }
        }
        self.device_status = value;
        if added & status::DRIVER_OK != 0 && value & status::FEATURES_OK != 0 {
            self.activate();
        }
    }

    fn activate(&mut self) {
        // The device gets its own copies; the transport keeps the driver-visible config.
        let queues = match self
            .queues
            .iter()
            .map(|q| Queue::try_from(q.state()))
            .collect()
        {
            Ok(q) => q,
            Err(e) => {
                tracing::warn!("virtio-mmio: copying queue state failed: {e}");
                self.device_status |= status::DEVICE_NEEDS_RESET;
                return;
            }
        };
        self.activate_with(queues);
    }

    /// Activate the device with `queues` (the transport's config, or a restored device's
    /// queues including their ring positions).
    fn activate_with(&mut self, queues: Vec<Queue>) {
        for (i, q) in self.queues.iter().enumerate() {
            if q.ready() && !q.is_valid(&self.mem) {
                tracing::warn!("virtio-mmio: queue {i} is not valid; device needs reset");
                self.device_status |= status::DEVICE_NEEDS_RESET;
                return;
            }
        }
        let evts = match self
            .queue_evts
            .iter()
            .map(EventFd::try_clone)
            .collect::<Result<Vec<_>, _>>()
        {
            Ok(e) => e,
            Err(e) => {
                tracing::warn!("virtio-mmio: cloning queue eventfds failed: {e}");
                self.device_status |= status::DEVICE_NEEDS_RESET;
                return;
            }
        };
        let ctx = ActivateContext {
            mem: self.mem.clone(),
            queues,
            queue_evts: evts,
            interrupt: self.interrupt.clone(),
            acked_features: self.acked_features,
            registrar: self.registrar.clone(),
        };
        match self.device.lock().unwrap().activate(ctx) {
            Ok(()) => self.activated = true,
            Err(e) => {
                tracing::warn!("virtio-mmio: activation failed: {e}");
                self.device_status |= status::DEVICE_NEEDS_RESET;
            }
        }
    }

    fn read_reg(&mut self, offset: u64) -> u32 {
        match offset {
            reg::MAGIC => MAGIC,
            reg::VERSION => VERSION,
            reg::DEVICE_ID => self.device.lock().unwrap().device_type(),
            reg::VENDOR_ID => VENDOR_ID,
            reg::DEVICE_FEATURES => {
                let f = self.device.lock().unwrap().features();
                match self.device_features_sel {
                    0 => f as u32,
                    1 => (f >> 32) as u32,
                    _ => 0,
                }
            }
            reg::QUEUE_NUM_MAX => self.selected_queue().map_or(0, |q| u32::from(q.max_size())),
            reg::QUEUE_READY => self.selected_queue().map_or(0, |q| u32::from(q.ready())),
            reg::INTERRUPT_STATUS => self.interrupt.status(),
            reg::STATUS => self.device_status,
            reg::CONFIG_GENERATION => self.config_generation,
            _ => 0,
        }
    }

    fn write_reg(&mut self, offset: u64, value: u32) {
        let features_allowed = self.device_status & status::DRIVER != 0
            && self.device_status & status::FEATURES_OK == 0;
        match offset {
            reg::DEVICE_FEATURES_SEL => self.device_features_sel = value,
            reg::DRIVER_FEATURES_SEL => self.driver_features_sel = value,
            reg::DRIVER_FEATURES if features_allowed => match self.driver_features_sel {
                0 => self.acked_features = (self.acked_features & !0xffff_ffff) | u64::from(value),
                1 => {
                    self.acked_features =
                        (self.acked_features & 0xffff_ffff) | (u64::from(value) << 32)
                }
                _ => {}
            },
            reg::QUEUE_SEL => self.queue_sel = value,
            reg::QUEUE_NUM => self.with_queue(|q| q.set_size(value as u16)),
            reg::QUEUE_READY => self.with_queue(|q| q.set_ready(value == 1)),
            reg::QUEUE_DESC_LOW => self.with_queue(|q| q.set_desc_table_address(Some(value), None)),
            reg::QUEUE_DESC_HIGH => {
                self.with_queue(|q| q.set_desc_table_address(None, Some(value)))
            }
            reg::QUEUE_DRIVER_LOW => {
                self.with_queue(|q| q.set_avail_ring_address(Some(value), None))
            }
            reg::QUEUE_DRIVER_HIGH => {
                self.with_queue(|q| q.set_avail_ring_address(None, Some(value)))
            }
            reg::QUEUE_DEVICE_LOW => {
                self.with_queue(|q| q.set_used_ring_address(Some(value), None))
            }
            reg::QUEUE_DEVICE_HIGH => {
                self.with_queue(|q| q.set_used_ring_address(None, Some(value)))
            }
            reg::QUEUE_NOTIFY => {
                // Normally KVM consumes these through the ioeventfd; this is the fallback.
                if let Some(evt) = self.queue_evts.get(value as usize) {
                    let _ = evt.write(1);
                }
            }
            reg::INTERRUPT_ACK => self.interrupt.ack(value),
            reg::STATUS => self.set_status(value),
            _ => tracing::debug!("virtio-mmio: ignored write of {value:#x} at {offset:#x}"),
        }
    }
}

impl MmioTransport {
    /// The driver-visible register state, for `VmState`.
    pub fn save_state(&self) -> TransportState {
        TransportState {
            device_status: self.device_status,
            acked_features: self.acked_features,
            interrupt_status: self.interrupt.status(),
            config_generation: self.config_generation,
            queue_sel: self.queue_sel,
            device_features_sel: self.device_features_sel,
            driver_features_sel: self.driver_features_sel,
            queues: self.queues.iter().map(QueueSnapshot::from_queue).collect(),
        }
    }

    /// Put a freshly created transport (for a restored device) into the saved state. A
    /// device the driver had activated is activated again with `device_queues`, the
    /// device's own queues with their ring positions.
    pub fn restore_state(
        &mut self,
        st: &TransportState,
        device_queues: &[QueueSnapshot],
    ) -> Result<(), String> {
        if st.queues.len() != self.queues.len() {
            return Err(format!(
                "saved transport has {} queues, the device {}",
                st.queues.len(),
                self.queues.len()
            ));
        }
        self.queues = st
            .queues
            .iter()
            .map(QueueSnapshot::to_queue)
            .collect::<Result<_, _>>()
            .map_err(|e| format!("saved queue: {e}"))?;
        self.device_status = st.device_status;
        self.acked_features = st.acked_features;
        self.config_generation = st.config_generation;
        self.queue_sel = st.queue_sel;
        self.device_features_sel = st.device_features_sel;
        self.driver_features_sel = st.driver_features_sel;
        self.interrupt.restore(st.interrupt_status);
        let live = status::FEATURES_OK | status::DRIVER_OK;
        if st.device_status & live == live && st.device_status & status::DEVICE_NEEDS_RESET == 0 {
            let queues = device_queues
                .iter()
                .map(QueueSnapshot::to_queue)
                .collect::<Result<Vec<_>, _>>()
                .map_err(|e| format!("saved device queue: {e}"))?;
            if queues.len() != self.queues.len() {
                return Err("saved device queues do not match the transport".into());
            }
            self.activate_with(queues);
            if !self.activated {
                return Err("the restored device failed to activate".into());
            }
        }
        Ok(())
    }
}

impl BusDevice for MmioTransport {
    fn read(&mut self, offset: u64, data: &mut [u8]) {
        if offset >= CONFIG_SPACE_OFFSET {
            self.device
                .lock()
                .unwrap()
                .read_config(offset - CONFIG_SPACE_OFFSET, data);
        } else if data.len() == 4 && offset.is_multiple_of(4) {
            data.copy_from_slice(&self.read_reg(offset).to_le_bytes());
        } else {
            // Registers are 32-bit only (§4.2.2.2); other widths read as zero.
            data.fill(0);
        }
    }

    fn write(&mut self, offset: u64, data: &[u8]) {
        if offset >= CONFIG_SPACE_OFFSET {
            self.device
                .lock()
                .unwrap()
                .write_config(offset - CONFIG_SPACE_OFFSET, data);
            self.config_generation = self.config_generation.wrapping_add(1);
        } else if data.len() == 4 && offset.is_multiple_of(4) {
            let value = u32::from_le_bytes(data.try_into().expect("4 bytes"));
            self.write_reg(offset, value);
        }
    }
}

#[cfg(test)]
#[path = "mmio_tests.rs"]
mod tests;
