//! Entry points for fuzzing descriptor-chain handling (fuzz/, and the seeded
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

use crate::memory::GuestMemoryMmap;
use virtio_queue::{Queue, QueueT};
use vm_memory::{Bytes, GuestAddress};
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
    let read_only = data.get(0x300).is_some_and(|b| b & 1 == 1);
    let mut w = BlockWorker::new(
        queues(mem.clone(), qs),
        disk,
        read_only,
        *b"fuzz-disk-id-0000000",
    );
    let offered = offer_area(&mem, 0);
    w.process();
    // The queue's own count of used entries, not the used ring's idx read back: a guest
    // may point a buffer at its own rings (a read request then writes disk data over
    // them), which harms only that guest.
    let returned = w.q.queues[0].next_used();
    // For the same reason the heads the avail ring offered are only known while the
    // descriptor table and avail ring are as the guest offered them; once the guest had
    // the device overwrite them, what it offered is undefined and nothing is asserted.
    let valid = if offer_area(&mem, 0) == offered {
        valid
    } else {
        returned
    };
    Some(FuzzReport {
        returned: [returned, 0, 0],
        valid_heads: [valid, 0, 0],
    })
}

/// The descriptor table and avail ring of the queue at `base` (what the guest offers).
fn offer_area(mem: &GuestMemoryMmap, base: u64) -> Vec<u8> {
    let mut bytes = vec![0u8; 0x200];
    let _ = mem.read_slice(&mut bytes, GuestAddress(base));
    bytes
}

/// Run the virtio-vsock worker: TX chains into the muxer (whose host sockets do not
/// exist, so connection requests are reset), replies into RX chains, and a transport
/// reset into the event queue.
pub fn fuzz_vsock(data: &[u8]) -> Option<FuzzReport> {
    let (mem, mut qs) = setup(data, 3)?;
    // The device's queue order is RX, TX, event: A (TX) and B (RX) trade places.
    qs.swap(0, 1);
    let valid = QUEUE_BASES.map(|b| valid_heads(&mem, b));
    let offered = QUEUE_BASES.map(|b| offer_area(&mem, b));
    let uds = PathBuf::from("/nonexistent/zygote-fuzz/vsock");
    let mut w = VsockWorker::new(queues(mem.clone(), qs), Muxer::new(3, uds, None));
    w.process_tx();
    w.process_rx();
    w.transport_reset();
    // As in fuzz_blk: counted by the queues (device order RX, TX, event; A and B traded
    // places above), asserted only while every queue's offer is as the guest made it.
    let used = |i: usize| w.q.queues[i].next_used();
    let returned = [used(1), used(0), used(2)];
    let intact = QUEUE_BASES
        .iter()
        .zip(&offered)
        .all(|(&b, before)| offer_area(&mem, b) == *before);
    Some(FuzzReport {
        returned,
        valid_heads: if intact { valid } else { returned },
    })
}

/// A blk guest-memory image from a seed: plausible and absurd descriptors, request
/// headers of every type in the buffers they point at.
pub fn blk_input(seed: u64) -> Vec<u8> {
    let mut r = Rng(seed | 1);
    let mut data = vec![0u8; MAX_INPUT];
    fill_queue(&mut r, &mut data, 0, blk_header);
    data[0x300] = r.below(2) as u8; // read-only or not (see fuzz_blk)
    data
}

/// A vsock image from a seed: TX chains carrying packet headers, RX and event buffers.
pub fn vsock_input(seed: u64) -> Vec<u8> {
    let mut r = Rng(seed | 1);
    let mut data = vec![0u8; MAX_INPUT];
    fill_queue(&mut r, &mut data, 0x0, vsock_header);
    fill_queue(&mut r, &mut data, 0x400, |_| Vec::new());
    fill_queue(&mut r, &mut data, 0x800, |_| Vec::new());
    data
}

/// Fuzzer bytes to an image: a leading 0xff means "use the rest raw"; otherwise the
/// first 8 bytes seed the generator and the rest is XORed over its output, so
/// libFuzzer mutates inside the structure instead of having to discover it.
fn from_fuzz(data: &[u8], gen: fn(u64) -> Vec<u8>) -> Vec<u8> {
    if data.first() == Some(&0xff) {
        return data.to_vec();
    }
    let mut seed = [0u8; 8];
    let n = data.len().min(8);
    seed[..n].copy_from_slice(&data[..n]);
    let mut image = gen(u64::from_le_bytes(seed));
    for (d, s) in image.iter_mut().zip(data.iter().skip(8)) {
        *d ^= s;
    }
    image
}

pub fn blk_from_fuzz(data: &[u8]) -> Vec<u8> {
    from_fuzz(data, blk_input)
}

pub fn vsock_from_fuzz(data: &[u8]) -> Vec<u8> {
    from_fuzz(data, vsock_input)
}

/// xorshift64*: tiny and deterministic, enough to spread generated inputs.
pub struct Rng(pub u64);

impl Rng {
    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n
    }
    pub fn pick<T: Copy>(&mut self, xs: &[T]) -> T {
        xs[self.below(xs.len() as u64) as usize]
    }
}

const BUF_START: u64 = 0x1000;

fn put(data: &mut [u8], at: u64, bytes: &[u8]) {
    let at = at as usize;
    if at + bytes.len() <= data.len() {
        data[at..at + bytes.len()].copy_from_slice(bytes);
    }
}

/// A descriptor table, avail ring and buffer contents at `base` with mostly-sane values.
pub fn fill_queue(r: &mut Rng, data: &mut [u8], base: u64, header: impl Fn(&mut Rng) -> Vec<u8>) {
    for i in 0..QUEUE_SIZE as u64 {
        let addr = match r.below(8) {
            0 => r.next_u64(),                  // anywhere, mostly unmapped
            1 => MEM_SIZE as u64 - r.below(64), // straddling the end of RAM
            _ => BUF_START + r.below(0xe000),   // buffer space
        };
        let len: u32 = match r.below(8) {
            0 => r.next_u64() as u32,
            1 => r.pick(&[0, 1, 15, 16, 17, 43, 44, 45, 511, 512, 513, u32::MAX]),
            _ => r.below(2048) as u32,
        };
        let mut flags = r.pick(&[0u16, 1, 2, 3, 3, 1, 2]);
        if r.below(32) == 0 {
            flags |= 4; // indirect
        }
        let next = if r.below(8) == 0 {
            r.next_u64() as u16
        } else {
            r.below(QUEUE_SIZE as u64) as u16
        };
        let d = base + 16 * i;
        put(data, d, &addr.to_le_bytes());
        put(data, d + 8, &len.to_le_bytes());
        put(data, d + 12, &flags.to_le_bytes());
        put(data, d + 14, &next.to_le_bytes());
        if addr >= BUF_START && addr + 64 < data.len() as u64 {
            let h = header(r);
            put(data, addr, &h);
        }
    }
    let avail_idx = if r.below(16) == 0 {
        r.next_u64() as u16
    } else {
        r.below(QUEUE_SIZE as u64 + 1) as u16
    };
    put(data, base + 0x102, &avail_idx.to_le_bytes());
    for i in 0..QUEUE_SIZE as u64 {
        let head = if r.below(16) == 0 {
            r.next_u64() as u16
        } else {
            r.below(QUEUE_SIZE as u64) as u16
        };
        put(data, base + 0x104 + 2 * i, &head.to_le_bytes());
    }
}

pub fn blk_header(r: &mut Rng) -> Vec<u8> {
    let kind: u32 = r.pick(&[0, 1, 4, 8, 0, 1, 99, u32::MAX]);
    let sector: u64 = match r.below(4) {
        0 => r.next_u64(),
        1 => 128 - r.below(3),
        _ => r.below(128),
    };
    let mut h = kind.to_le_bytes().to_vec();
    h.extend_from_slice(&0u32.to_le_bytes());
    h.extend_from_slice(&sector.to_le_bytes());
    h
}

pub fn vsock_header(r: &mut Rng) -> Vec<u8> {
    use super::vsock::packet::Header;
    Header {
        src_cid: if r.below(8) == 0 { r.next_u64() } else { 3 },
        dst_cid: if r.below(8) == 0 { r.next_u64() } else { 2 },
        src_port: r.below(4) as u32,
        dst_port: r.below(4) as u32 + 1000,
        len: if r.below(4) == 0 {
            r.next_u64() as u32
        } else {
            r.below(256) as u32
        },
        kind: if r.below(8) == 0 {
            r.next_u64() as u16
        } else {
            1
        },
        op: r.below(9) as u16,
        flags: r.below(4) as u32,
        buf_alloc: r.next_u64() as u32,
        fwd_cnt: r.next_u64() as u32,
    }
    .to_bytes()
    .to_vec()
}

#[cfg(test)]
#[path = "fuzzing_tests.rs"]
mod tests;
