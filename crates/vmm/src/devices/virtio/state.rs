//! Serializable device state for snapshots and fork-branches.
//!
//! What is saved is what the guest can observe: negotiated features, each queue's
//! configuration and ring positions, and device configuration. Host-side resources
//! (files, sockets, taps, event registrations) are not state: `restore` re-opens them
//! from the configuration, and a forked child re-registers them with its new VM.
use serde::{Deserialize, Serialize};
use virtio_queue::{Queue, QueueState};

/// One split virtqueue as the driver configured it plus the device's ring positions.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct QueueSnapshot {
    pub max_size: u16,
    pub size: u16,
    pub ready: bool,
    pub desc_table: u64,
    pub avail_ring: u64,
    pub used_ring: u64,
    pub next_avail: u16,
    pub next_used: u16,
    pub event_idx: bool,
}

impl QueueSnapshot {
    pub fn from_queue(q: &Queue) -> Self {
        let s = q.state();
        Self {
            max_size: s.max_size,
            size: s.size,
            ready: s.ready,
            desc_table: s.desc_table,
            avail_ring: s.avail_ring,
            used_ring: s.used_ring,
            next_avail: s.next_avail,
            next_used: s.next_used,
            event_idx: s.event_idx_enabled,
        }
    }

    /// Rebuild the queue; fails on values no driver could have configured (the state is
    /// untrusted input when read from disk).
    pub fn to_queue(&self) -> Result<Queue, virtio_queue::Error> {
        Queue::try_from(QueueState {
            max_size: self.max_size,
            next_avail: self.next_avail,
            next_used: self.next_used,
            event_idx_enabled: self.event_idx,
            size: self.size,
            ready: self.ready,
            desc_table: self.desc_table,
            avail_ring: self.avail_ring,
            used_ring: self.used_ring,
        })
    }
}

/// Transport-independent state common to every device.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct VirtioState {
    pub device_type: u32,
    pub acked_features: u64,
    /// Whether the driver had set DRIVER_OK (queues are live).
    pub activated: bool,
    /// Empty unless activated.
    pub queues: Vec<QueueSnapshot>,
}

pub use super::block::BlockState;
pub use super::net::NetState;
pub use super::rng::RngState;
pub use super::vsock::VsockState;

/// The saved state of any zygote virtio device.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum DeviceState {
    Block(BlockState),
    Vsock(VsockState),
    Rng(RngState),
    Net(NetState),
}

impl DeviceState {
    pub fn virtio(&self) -> &VirtioState {
        match self {
            DeviceState::Block(s) => &s.virtio,
            DeviceState::Vsock(s) => &s.virtio,
            DeviceState::Rng(s) => &s.virtio,
            DeviceState::Net(s) => &s.virtio,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use virtio_queue::QueueT;

    #[test]
    fn queue_snapshot_round_trips_and_rejects_garbage() {
        let mut q = Queue::new(16).unwrap();
        q.set_size(8);
        q.set_desc_table_address(Some(0x1000), Some(0));
        q.set_avail_ring_address(Some(0x2000), Some(0));
        q.set_used_ring_address(Some(0x3000), Some(0));
        q.set_ready(true);
        q.set_next_avail(5);
        q.set_next_used(4);
        let snap = QueueSnapshot::from_queue(&q);
        let back = snap.to_queue().unwrap();
        assert_eq!(QueueSnapshot::from_queue(&back), snap);
        assert_eq!(back.next_avail(), 5);
        let json = serde_json::to_string(&snap).unwrap();
        assert_eq!(serde_json::from_str::<QueueSnapshot>(&json).unwrap(), snap);
        let bad = QueueSnapshot { size: 3, ..snap };
        assert!(bad.to_queue().is_err(), "non-power-of-two size");
        let bad = QueueSnapshot {
            desc_table: 0x1001,
            ..snap
        };
        assert!(bad.to_queue().is_err(), "misaligned table");
    }
}
