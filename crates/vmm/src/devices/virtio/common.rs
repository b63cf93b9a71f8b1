//! Pieces every device worker shares: descriptor chains flattened into segments with
//! bounds-checked copies, the activated queue set, and event-loop registrations that
//! undo themselves on drop.
//!
//! Devices never trust a chain: the guest may lie about lengths, point descriptors
//! outside RAM or chain readable after writable buffers. Everything here returns errors
//! instead of panicking so a worker can answer with an error status or drop the chain.
use std::os::fd::{AsRawFd, RawFd};
use std::sync::{Arc, Mutex};

use crate::memory::GuestMemoryMmap;
use virtio_queue::{Queue, QueueOwnedT, QueueT};
use vm_memory::{Bytes, GuestAddress};
use vmm_sys_util::epoll::EventSet;
use vmm_sys_util::eventfd::EventFd;

use super::state::QueueSnapshot;
use super::{ActivateContext, ActivateError, VirtioInterrupt, INT_USED_RING};
use crate::event_loop::{EventRegistrar, SharedHandler};

/// One guest buffer of a chain.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Segment {
    pub addr: u64,
    pub len: u32,
    pub writable: bool,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ChainError {
    #[error("descriptor chain is empty")]
    Empty,
    #[error("a readable descriptor follows a writable one")]
    ReadableAfterWritable,
    #[error("buffer runs past the end of the chain")]
    TooShort,
    #[error("guest memory access at {0:#x} failed")]
    Memory(u64),
}

/// A chain split into its readable prefix and writable suffix (virtio 1.x §2.7.4.2:
/// device-readable descriptors come first).
#[derive(Debug, Default, Clone)]
pub struct Segments {
    pub readable: Vec<Segment>,
    pub writable: Vec<Segment>,
}

impl Segments {
    /// Split raw segments, enforcing readable-before-writable.
    pub fn split(descs: &[Segment]) -> Result<Self, ChainError> {
        let mut s = Segments::default();
        for &d in descs {
            if d.writable {
                s.writable.push(d);
            } else if !s.writable.is_empty() {
                return Err(ChainError::ReadableAfterWritable);
            } else {
                s.readable.push(d);
            }
        }
        if s.readable.is_empty() && s.writable.is_empty() {
            return Err(ChainError::Empty);
        }
        Ok(s)
    }

    pub fn readable_len(&self) -> u64 {
        self.readable.iter().map(|s| u64::from(s.len)).sum()
    }

    pub fn writable_len(&self) -> u64 {
        self.writable.iter().map(|s| u64::from(s.len)).sum()
    }
}

/// A byte cursor over a list of segments: `skip`, then copy in or out piece by piece.
pub struct Cursor<'a> {
    segs: &'a [Segment],
    idx: usize,
    off: u32,
}

impl<'a> Cursor<'a> {
    pub fn new(segs: &'a [Segment]) -> Self {
        Self {
            segs,
            idx: 0,
            off: 0,
        }
    }

    pub fn remaining(&self) -> u64 {
        let rest: u64 = self
            .segs
            .iter()
            .skip(self.idx)
            .map(|s| u64::from(s.len))
            .sum();
        rest - u64::from(self.off)
    }

    /// The next contiguous piece of at most `max` bytes, advancing past it.
    fn next_piece(&mut self, max: u64) -> Option<(u64, usize)> {
        while let Some(seg) = self.segs.get(self.idx) {
            let left = seg.len - self.off;
            if left == 0 {
                self.idx += 1;
                self.off = 0;
                continue;
            }
            let n = u64::from(left).min(max) as u32;
            // A wrapping guest address saturates to one no memory region contains.
            let addr = seg.addr.saturating_add(u64::from(self.off));
            self.off += n;
            return Some((addr, n as usize));
        }
        None
    }

    pub fn skip(&mut self, mut n: u64) -> Result<(), ChainError> {
        while n > 0 {
            let (_, len) = self.next_piece(n).ok_or(ChainError::TooShort)?;
            n -= len as u64;
        }
        Ok(())
    }

    /// Fill `buf` entirely from guest memory.
    pub fn read(&mut self, mem: &GuestMemoryMmap, buf: &mut [u8]) -> Result<(), ChainError> {
        let mut done = 0;
        while done < buf.len() {
            let (addr, len) = self
                .next_piece((buf.len() - done) as u64)
                .ok_or(ChainError::TooShort)?;
            mem.read_slice(&mut buf[done..done + len], GuestAddress(addr))
                .map_err(|_| ChainError::Memory(addr))?;
            done += len;
        }
        Ok(())
    }

    /// Write all of `buf` to guest memory.
    pub fn write(&mut self, mem: &GuestMemoryMmap, buf: &[u8]) -> Result<(), ChainError> {
        let mut done = 0;
        while done < buf.len() {
            let (addr, len) = self
                .next_piece((buf.len() - done) as u64)
                .ok_or(ChainError::TooShort)?;
            mem.write_slice(&buf[done..done + len], GuestAddress(addr))
                .map_err(|_| ChainError::Memory(addr))?;
            done += len;
        }
        Ok(())
    }
}

/// The queues of an activated device, with their notification eventfds and interrupt.
pub struct DeviceQueues {
    pub mem: GuestMemoryMmap,
    pub queues: Vec<Queue>,
    pub evts: Vec<EventFd>,
    pub interrupt: Arc<VirtioInterrupt>,
    pub acked_features: u64,
}

impl DeviceQueues {
    /// Take the queues out of an activation context; the registrar is returned for the
    /// caller's registrations.
    pub fn from_ctx(
        ctx: ActivateContext,
        expected: usize,
    ) -> Result<(Self, EventRegistrar), ActivateError> {
        if ctx.queues.len() != expected || ctx.queue_evts.len() != expected {
            return Err(ActivateError::Device(format!(
                "expected {expected} queues, got {}",
                ctx.queues.len()
            )));
        }
        Ok((
            Self {
                mem: ctx.mem,
                queues: ctx.queues,
                evts: ctx.queue_evts,
                interrupt: ctx.interrupt,
                acked_features: ctx.acked_features,
            },
            ctx.registrar,
        ))
    }

    /// Which queue `fd` notifies, consuming the pending notification count.
    pub fn queue_for_fd(&self, fd: RawFd) -> Option<usize> {
        let i = self.evts.iter().position(|e| e.as_raw_fd() == fd)?;
        // Non-blocking eventfd: EAGAIN just means a spurious wake-up.
        let _ = self.evts[i].read();
        Some(i)
    }

    /// The next available chain of queue `q` as raw segments (possibly empty when the
    /// head itself is bad), with its head index for `add_used`.
    pub fn pop(&mut self, q: usize) -> Option<(u16, Vec<Segment>)> {
        let queue = self.queues.get_mut(q)?;
        if !queue.ready() {
            return None;
        }
        let chain = queue.pop_descriptor_chain(&self.mem)?;
        let head = chain.head_index();
        let segs = chain
            .map(|d| Segment {
                addr: d.addr().0,
                len: d.len(),
                writable: d.is_write_only(),
            })
            .collect();
        Some((head, segs))
    }

    /// Undo the last `pop` (the device could not use the chain yet).
    pub fn unpop(&mut self, q: usize) {
        if let Some(queue) = self.queues.get_mut(q) {
            queue.go_to_previous_position();
        }
    }

    pub fn add_used(&mut self, q: usize, head: u16, len: u32) {
        if let Some(queue) = self.queues.get_mut(q) {
            if let Err(e) = queue.add_used(&self.mem, head, len) {
                tracing::warn!("virtio: add_used on queue {q} failed: {e}");
            }
        }
    }

    /// Tell the guest about used buffers. Without EVENT_IDX this is unconditional.
    pub fn signal_used(&self) {
        if let Err(e) = self.interrupt.signal(INT_USED_RING) {
            tracing::warn!("virtio: raising the interrupt failed: {e}");
        }
    }

    pub fn snapshot(&self) -> Vec<QueueSnapshot> {
        self.queues.iter().map(QueueSnapshot::from_queue).collect()
    }
}

/// A running device's worker and the fds it registered.
pub type Active<W> = Option<(Arc<Mutex<W>>, Registration)>;

/// Stop a device's processing (virtio reset): deregister its fds first, so the event
/// thread can no longer dispatch to the worker, then drop the worker (and with it any
/// host connections it owns).
pub fn deactivate<W>(active: &mut Active<W>) {
    if let Some((worker, reg)) = active.take() {
        drop(reg);
        drop(worker);
    }
}

/// A set of fds registered with the event loop; deregistered on drop so a reset device
/// leaves nothing behind in epoll.
pub struct Registration {
    registrar: EventRegistrar,
    tokens: Vec<u64>,
}

impl Registration {
    pub fn new(registrar: EventRegistrar) -> Self {
        Self {
            registrar,
            tokens: Vec::new(),
        }
    }

    pub fn add(
        &mut self,
        fd: RawFd,
        events: EventSet,
        handler: SharedHandler,
    ) -> Result<u64, ActivateError> {
        let token = self
            .registrar
            .add(fd, events, handler)
            .map_err(|e| ActivateError::Device(format!("registering fd {fd}: {e}")))?;
        self.tokens.push(token);
        Ok(token)
    }

    pub fn registrar(&self) -> &EventRegistrar {
        &self.registrar
    }
}

impl Drop for Registration {
    fn drop(&mut self) {
        for t in self.tokens.drain(..) {
            self.registrar.remove(t);
        }
    }
}
