//! Test-only "guest driver" over virtio-queue's MockSplitQueue: post chains (including
//! malformed ones), read back the used ring, and build activation contexts.
use std::sync::Arc;

use crate::memory::GuestMemoryMmap;
use virtio_queue::desc::{split::Descriptor, RawDescriptor};
use virtio_queue::mock::MockSplitQueue;
use virtio_queue::Queue;
use vm_memory::{Bytes, GuestAddress};
use vmm_sys_util::eventfd::EventFd;

use super::{ActivateContext, VirtioInterrupt};

pub const F_NEXT: u16 = 1;
pub const F_WRITE: u16 = 2;

pub fn guest_mem(mib: usize) -> GuestMemoryMmap {
    GuestMemoryMmap::from_ranges(&[(GuestAddress(0), mib << 20)]).unwrap()
}

pub struct Driver<'a> {
    mem: &'a GuestMemoryMmap,
    mock: MockSplitQueue<'a, GuestMemoryMmap>,
    size: u16,
    next_desc: u16,
    used_seen: u16,
}

impl<'a> Driver<'a> {
    pub fn new(mem: &'a GuestMemoryMmap, base: u64, size: u16) -> Self {
        Self {
            mem,
            mock: MockSplitQueue::create(mem, GuestAddress(base), size),
            size,
            next_desc: 0,
            used_seen: 0,
        }
    }

    pub fn queue(&self) -> Queue {
        self.mock.create_queue::<Queue>().unwrap()
    }

    /// Post one chain of (addr, len, device-writable) buffers; returns its head.
    pub fn add(&mut self, segs: &[(u64, u32, bool)]) -> u16 {
        let descs: Vec<(u64, u32, u16)> = segs
            .iter()
            .map(|&(a, l, w)| (a, l, if w { F_WRITE } else { 0 }))
            .collect();
        self.add_raw(&descs)
    }

    /// Post a chain with explicit flags (NEXT and `next` are filled in).
    pub fn add_raw(&mut self, descs: &[(u64, u32, u16)]) -> u16 {
        if usize::from(self.next_desc) + descs.len() > usize::from(self.size) {
            self.next_desc = 0;
        }
        let head = self.next_desc;
        for (i, &(addr, len, flags)) in descs.iter().enumerate() {
            let idx = head + i as u16;
            let last = i + 1 == descs.len();
            let flags = if last { flags } else { flags | F_NEXT };
            let d = Descriptor::new(addr, len, flags, idx + 1);
            self.mock
                .desc_table()
                .store(idx, RawDescriptor::from(d))
                .unwrap();
        }
        self.next_desc += descs.len() as u16;
        self.publish(head);
        head
    }

    /// Put `head` on the avail ring (also for hand-made descriptor tables).
    pub fn publish(&mut self, head: u16) {
        let avail = self.mock.avail();
        let idx = avail.idx().load();
        avail
            .ring()
            .ref_at(usize::from(idx % self.size))
            .unwrap()
            .store(head);
        avail.idx().store(idx.wrapping_add(1));
    }

    /// Write one raw descriptor into the table (for loops and bad indices).
    pub fn store_desc(&self, idx: u16, addr: u64, len: u32, flags: u16, next: u16) {
        let d = Descriptor::new(addr, len, flags, next);
        self.mock
            .desc_table()
            .store(idx, RawDescriptor::from(d))
            .unwrap();
    }

    /// Used-ring entries (head, len) added since the last call.
    pub fn used(&mut self) -> Vec<(u32, u32)> {
        let used = self.mock.used();
        let idx = used.idx().load();
        let mut out = Vec::new();
        while self.used_seen != idx {
            let e = used
                .ring()
                .ref_at(usize::from(self.used_seen % self.size))
                .unwrap()
                .load();
            out.push((e.id(), e.len()));
            self.used_seen = self.used_seen.wrapping_add(1);
        }
        out
    }

    pub fn mem(&self) -> &GuestMemoryMmap {
        self.mem
    }

    pub fn read(&self, addr: u64, len: usize) -> Vec<u8> {
        let mut v = vec![0u8; len];
        self.mem.read_slice(&mut v, GuestAddress(addr)).unwrap();
        v
    }

    pub fn write(&self, addr: u64, data: &[u8]) {
        self.mem.write_slice(data, GuestAddress(addr)).unwrap();
    }
}

/// An activation context over `queues`; the registrar's loop thread is already stopped,
/// so tests drive workers by hand. Returns the queue-notify writers too.
pub fn activate_ctx(
    mem: &GuestMemoryMmap,
    queues: Vec<Queue>,
    acked_features: u64,
) -> (ActivateContext, Vec<EventFd>, Arc<VirtioInterrupt>) {
    let evts: Vec<EventFd> = queues
        .iter()
        .map(|_| EventFd::new(libc::EFD_NONBLOCK).unwrap())
        .collect();
    let writers = evts.iter().map(|e| e.try_clone().unwrap()).collect();
    let interrupt = Arc::new(VirtioInterrupt::new(
        EventFd::new(libc::EFD_NONBLOCK).unwrap(),
    ));
    let registrar = crate::event_loop::EventLoop::start()
        .unwrap()
        .registrar()
        .clone();
    (
        ActivateContext {
            mem: mem.clone(),
            queues,
            queue_evts: evts,
            interrupt: interrupt.clone(),
            acked_features,
            registrar,
        },
        writers,
        interrupt,
    )
}
