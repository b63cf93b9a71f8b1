//! Entry points for fuzzing descriptor-chain handling (crates/vmm/fuzz, and the seeded
//! randomized test below): arbitrary bytes become guest memory holding the queues'
//! descriptor tables, avail rings and buffers, and the block / vsock workers process
//! whatever chains that describes. Not part of the VMM's API.
//!
//! Layout of the guest memory the input is copied to (at address 0):
//! queue A (blk requests / vsock TX) at 0x0 (descriptors), 0x100 (avail), 0x200 (used);
//! queue B (vsock RX) at 0x400/0x500/0x600; queue C (vsock events) at 0x800/0x900/0xa00;
//! everything after is buffer space. Queues have 16 entries.
#![doc(hidden)]

use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use virtio_queue::{Queue, QueueT};
use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};
use vmm_sys_util::eventfd::EventFd;

use super::block::disk::Disk;
use super::block::{BlockWorker, VIRTIO_BLK_F_FLUSH};
use super::common::DeviceQueues;
use super::vsock::muxer::Muxer;
use super::vsock::VsockWorker;
use super::{VirtioInterrupt, VIRTIO_F_VERSION_1};

pub const QUEUE_SIZE: u16 = 16;
pub const MEM_SIZE: usize = 1 << 20;
/// At most this much of the input is used.
pub const MAX_INPUT: usize = 64 * 1024;
const QUEUE_BASES: [u64; 3] = [0x0, 0x400, 0x800];

/// What one run did, for invariants: every chain whose head index is valid must be
/// returned to the guest, malformed or not.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FuzzReport {
    pub returned: [u16; 3],
    pub valid_heads: [u16; 3],
}

fn setup(data: &[u8], queues: usize) -> Option<(GuestMemoryMmap, Vec<Queue>)> {
    let mem = GuestMemoryMmap::from_ranges(&[(GuestAddress(0), MEM_SIZE)]).ok()?;
    let n = data.len().min(MAX_INPUT);
    mem.write_slice(&data[..n], GuestAddress(0)).ok()?;
    let mut qs = Vec::new();
    for &base in &QUEUE_BASES[..queues] {
        // The device owns the used ring: start it clean, as a driver would.
        mem.write_slice(&[0u8; 4], GuestAddress(base + 0x200))
            .ok()?;
        let mut q = Queue::new(QUEUE_SIZE).ok()?;
        q.set_size(QUEUE_SIZE);
        q.set_desc_table_address(Some(base as u32), Some(0));
        q.set_avail_ring_address(Some(base as u32 + 0x100), Some(0));
        q.set_used_ring_address(Some(base as u32 + 0x200), Some(0));
        q.set_ready(true);
        qs.push(q);
    }
    Some((mem, qs))
}

/// Chains with an in-range head among those the avail ring offers (0 when the avail
/// index claims more than a queue's worth, which the queue rejects).
fn valid_heads(mem: &GuestMemoryMmap, base: u64) -> u16 {
    let idx: u16 = mem.read_obj(GuestAddress(base + 0x102)).unwrap_or(0);
    if idx > QUEUE_SIZE {
        return 0;
    }
    (0..idx)
        .filter(|i| {
            let head: u16 = mem
                .read_obj(GuestAddress(base + 0x104 + 2 * u64::from(*i)))
                .unwrap_or(u16::MAX);
            head < QUEUE_SIZE
        })
        .count() as u16
}

fn used_idx(mem: &GuestMemoryMmap, base: u64) -> u16 {
    mem.read_obj(GuestAddress(base + 0x202)).unwrap_or(0)
}

fn queues(mem: GuestMemoryMmap, qs: Vec<Queue>) -> DeviceQueues {
    let evts = qs
        .iter()
        .map(|_| EventFd::new(libc::EFD_NONBLOCK).expect("eventfd"))
        .collect();
    DeviceQueues {
        mem,
        queues: qs,
        evts,
        interrupt: Arc::new(VirtioInterrupt::new(
            EventFd::new(libc::EFD_NONBLOCK).expect("eventfd"),
        )),
        acked_features: VIRTIO_F_VERSION_1 | VIRTIO_BLK_F_FLUSH,
    }
}

/// Run the virtio-blk worker over chains described by `data` (64 KiB in-memory disk).
pub fn fuzz_blk(data: &[u8]) -> Option<FuzzReport> {
    let (mem, qs) = setup(data, 1)?;
    let valid = valid_heads(&mem, 0);
    let disk = Arc::new(Mutex::new(Disk::Memory(vec![0u8; 64 * 1024])));
    let read_only = data.first().is_some_and(|b| b & 1 == 1);
    let mut w = BlockWorker::new(
        queues(mem.clone(), qs),
        disk,
        read_only,
        *b"fuzz-disk-id-0000000",
    );
    w.process();
    Some(FuzzReport {
        returned: [used_idx(&mem, 0), 0, 0],
        valid_heads: [valid, 0, 0],
    })
}

/// Run the virtio-vsock worker: TX chains into the muxer (whose host sockets do not
/// exist, so connection requests are reset), replies into RX chains, and a transport
/// reset into the event queue.
pub fn fuzz_vsock(data: &[u8]) -> Option<FuzzReport> {
    let (mem, mut qs) = setup(data, 3)?;
    // The device's queue order is RX, TX, event: A (TX) and B (RX) trade places.
    qs.swap(0, 1);
    let valid = QUEUE_BASES.map(|b| valid_heads(&mem, b));
    let uds = PathBuf::from("/nonexistent/zygote-fuzz/vsock");
    let mut w = VsockWorker::new(queues(mem.clone(), qs), Muxer::new(3, uds, None));
    w.process_tx();
    w.process_rx();
    w.transport_reset();
    Some(FuzzReport {
        returned: QUEUE_BASES.map(|b| used_idx(&mem, b)),
        valid_heads: valid,
    })
}

#[cfg(test)]
#[path = "fuzzing_tests.rs"]
mod tests;
