//! virtio devices and the virtio-mmio transport (virtio 1.x, "version 2" MMIO layout).
//!
//! A device implements [`VirtioDevice`]; an [`mmio::MmioTransport`] exposes it to the guest
//! through a 4 KiB register window, with one ioeventfd per queue (queue notifications are
//! handled in the kernel, never as a vCPU exit to us) and one irqfd per device.
use std::sync::atomic::{AtomicU32, Ordering};

use crate::memory::GuestMemoryMmap;
use virtio_queue::Queue;
use vmm_sys_util::eventfd::EventFd;

pub mod block;
pub mod common;
pub mod fuzzing;
pub mod mmio;
pub mod net;
pub mod persist;
pub mod rng;
pub mod setup;
pub mod state;
#[cfg(test)]
pub mod testutil;
pub mod vsock;

/// VIRTIO_F_VERSION_1: required of every device on the version-2 MMIO transport.
pub const VIRTIO_F_VERSION_1: u64 = 1 << 32;

/// Device status bits (virtio 1.x §2.1).
pub mod status {
    pub const ACKNOWLEDGE: u32 = 1;
    pub const DRIVER: u32 = 2;
    pub const DRIVER_OK: u32 = 4;
    pub const FEATURES_OK: u32 = 8;
    pub const DEVICE_NEEDS_RESET: u32 = 64;
    pub const FAILED: u32 = 128;
}

/// Interrupt status bits.
pub const INT_USED_RING: u32 = 1;
pub const INT_CONFIG_CHANGE: u32 = 2;

/// A device's interrupt line: status bits the guest reads and acks, plus the irqfd KVM
/// turns into an IOAPIC interrupt.
pub struct VirtioInterrupt {
    status: AtomicU32,
    irqfd: EventFd,
}

impl VirtioInterrupt {
    pub fn new(irqfd: EventFd) -> Self {
        Self {
            status: AtomicU32::new(0),
            irqfd,
        }
    }

    /// Tell the guest the device used buffers (`INT_USED_RING`) or changed its config.
    pub fn signal(&self, bits: u32) -> std::io::Result<()> {
        self.status.fetch_or(bits, Ordering::SeqCst);
        self.irqfd.write(1)
    }

    pub fn status(&self) -> u32 {
        self.status.load(Ordering::SeqCst)
    }

    fn ack(&self, bits: u32) {
        self.status.fetch_and(!bits, Ordering::SeqCst);
    }

    fn clear(&self) {
        self.status.store(0, Ordering::SeqCst);
    }

    /// Restore the status bits a saved VM had pending, and re-raise the line if any are
    /// set (the guest had not acknowledged them yet).
    fn restore(&self, bits: u32) {
        self.status.store(bits, Ordering::SeqCst);
        if bits != 0 {
            let _ = self.irqfd.write(1);
        }
    }

    pub fn irqfd(&self) -> &EventFd {
        &self.irqfd
    }
}

/// Everything a device needs to start serving its queues.
pub struct ActivateContext {
    pub mem: GuestMemoryMmap,
    pub queues: Vec<Queue>,
    /// One per queue, signalled by KVM when the guest notifies that queue.
    pub queue_evts: Vec<EventFd>,
    pub interrupt: std::sync::Arc<VirtioInterrupt>,
    pub acked_features: u64,
    /// Where the device registers its queue eventfds and backend fds.
    pub registrar: crate::event_loop::EventRegistrar,
}

#[derive(Debug, thiserror::Error)]
pub enum ActivateError {
    #[error("queue {0} is not valid in guest memory")]
    BadQueue(usize),
    #[error("device activation failed: {0}")]
    Device(String),
}

/// The device side of virtio: identity, features, config space, queue processing.
pub trait VirtioDevice: Send {
    /// Device ID (virtio 1.x §5): 2 = block, 4 = entropy, 1 = network, 19 = vsock.
    fn device_type(&self) -> u32;
    /// Feature bits offered; must include [`VIRTIO_F_VERSION_1`].
    fn features(&self) -> u64;
    /// Maximum size of each queue; the length is the number of queues.
    fn queue_max_sizes(&self) -> Vec<u16>;
    fn read_config(&self, offset: u64, data: &mut [u8]);
    fn write_config(&mut self, offset: u64, data: &[u8]);
    /// The driver set DRIVER_OK: start processing.
    fn activate(&mut self, ctx: ActivateContext) -> Result<(), ActivateError>;
    /// The driver wrote 0 to status: stop processing and forget negotiated state.
    fn reset(&mut self);
    /// Serializable device state for snapshots and branches (None: not supported).
    fn save(&self) -> Option<state::DeviceState> {
        None
    }
    /// Host data the saved state refers to but does not contain (a block device's
    /// private copy-on-write pages), in the format its restore reads back.
    fn write_private_data(&self, _out: &mut dyn std::io::Write) -> std::io::Result<()> {
        Ok(())
    }
    /// This device as a block device, if it is one (its disk can be handed to a copy
    /// of the VM without serializing it: see `Block::adopt`).
    fn as_block(&self) -> Option<&block::Block> {
        None
    }
}
