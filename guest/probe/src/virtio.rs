//! A minimal polling virtio-mmio (version 2) driver: find a device from the
//! `virtio_mmio.device=` command-line entries, negotiate features, set up split
//! queues in probe memory, post descriptor chains and poll the used ring.
//! Interrupts stay off; every register access is a VM exit, so the sequence is
//! kept to what the spec requires.

use crate::arch;
use core::ptr::{read_volatile, write_volatile};
use core::sync::atomic::{compiler_fence, Ordering};

const MAGIC: u32 = 0x7472_6976;
const R_MAGIC: u64 = 0x00;
const R_VERSION: u64 = 0x04;
const R_DEVICE_ID: u64 = 0x08;
const R_DEVICE_FEATURES: u64 = 0x10;
const R_DEVICE_FEATURES_SEL: u64 = 0x14;
const R_DRIVER_FEATURES: u64 = 0x20;
const R_DRIVER_FEATURES_SEL: u64 = 0x24;
const R_QUEUE_SEL: u64 = 0x30;
const R_QUEUE_NUM_MAX: u64 = 0x34;
const R_QUEUE_NUM: u64 = 0x38;
const R_QUEUE_READY: u64 = 0x44;
const R_QUEUE_NOTIFY: u64 = 0x50;
const R_STATUS: u64 = 0x70;
const R_QUEUE_DESC: u64 = 0x80;
const R_QUEUE_DRIVER: u64 = 0x90;
const R_QUEUE_DEVICE: u64 = 0xa0;
pub const R_CONFIG: u64 = 0x100;

const S_ACK: u32 = 1;
const S_DRIVER: u32 = 2;
const S_DRIVER_OK: u32 = 4;
const S_FEATURES_OK: u32 = 8;
const S_NEEDS_RESET: u32 = 64;

const DESC_F_NEXT: u16 = 1;
const DESC_F_WRITE: u16 = 2;

/// How long to wait for the device to use a chain: 1..5 s depending on the TSC rate.
pub const USED_WAIT_TICKS: u64 = 5 * arch::TSC_SECOND;

fn rd(base: u64, off: u64) -> u32 {
    // SAFETY: base is a virtio-mmio window the VMM announced; identity-mapped MMIO.
    unsafe { read_volatile((base + off) as *const u32) }
}

fn wr(base: u64, off: u64, v: u32) {
    // SAFETY: as in rd.
    unsafe { write_volatile((base + off) as *mut u32, v) }
}

pub fn config_u32(base: u64, off: u64) -> u32 {
    rd(base, R_CONFIG + off)
}

pub fn config_u64(base: u64, off: u64) -> u64 {
    config_u32(base, off) as u64 | (config_u32(base, off + 4) as u64) << 32
}

fn parse_hex(s: &[u8]) -> Option<u64> {
    let s = s.strip_prefix(b"0x")?;
    let mut v: u64 = 0;
    for &b in s {
        let d = match b {
            b'0'..=b'9' => b - b'0',
            b'a'..=b'f' => b - b'a' + 10,
            b'A'..=b'F' => b - b'A' + 10,
            _ => return None,
        };
        v = v.checked_mul(16)?.checked_add(d as u64)?;
    }
    Some(v)
}

/// Base of the first virtio-mmio window (`virtio_mmio.device=4K@0x...:irq`) whose
/// device has ID `device_id`.
pub fn find(cmdline: &[u8], device_id: u32) -> Option<u64> {
    const KEY: &[u8] = b"virtio_mmio.device=";
    for word in cmdline.split(|&b| b == b' ') {
        let Some(spec) = word.strip_prefix(KEY) else {
            continue;
        };
        let Some(at) = spec.iter().position(|&b| b == b'@') else {
            continue;
        };
        let rest = &spec[at + 1..];
        let end = rest.iter().position(|&b| b == b':').unwrap_or(rest.len());
        let Some(base) = parse_hex(&rest[..end]) else {
            continue;
        };
        if rd(base, R_MAGIC) == MAGIC
            && rd(base, R_VERSION) == 2
            && rd(base, R_DEVICE_ID) == device_id
        {
            return Some(base);
        }
    }
    None
}

/// Reset, acknowledge, and negotiate VERSION_1 plus `want & offered` (low 32 bits).
/// Returns the device's low feature word.
pub fn init(base: u64, want: u32) -> Result<u32, &'static str> {
    wr(base, R_STATUS, 0);
    wr(base, R_STATUS, S_ACK);
    wr(base, R_STATUS, S_ACK | S_DRIVER);
    wr(base, R_DEVICE_FEATURES_SEL, 1);
    if rd(base, R_DEVICE_FEATURES) & 1 == 0 {
        return Err("device does not offer VIRTIO_F_VERSION_1");
    }
    wr(base, R_DEVICE_FEATURES_SEL, 0);
    let offered = rd(base, R_DEVICE_FEATURES);
    wr(base, R_DRIVER_FEATURES_SEL, 0);
    wr(base, R_DRIVER_FEATURES, want & offered);
    wr(base, R_DRIVER_FEATURES_SEL, 1);
    wr(base, R_DRIVER_FEATURES, 1);
    wr(base, R_STATUS, S_ACK | S_DRIVER | S_FEATURES_OK);
    if rd(base, R_STATUS) & S_FEATURES_OK == 0 {
        return Err("device refused FEATURES_OK");
    }
    Ok(offered)
}

pub fn driver_ok(base: u64) -> Result<(), &'static str> {
    wr(
        base,
        R_STATUS,
        S_ACK | S_DRIVER | S_FEATURES_OK | S_DRIVER_OK,
    );
    if rd(base, R_STATUS) & S_NEEDS_RESET != 0 {
        return Err("device needs reset after DRIVER_OK");
    }
    Ok(())
}

/// A split virtqueue in one 4 KiB page: descriptors at +0, avail ring at +0x400,
/// used ring at +0x800 (sizes up to 64).
pub struct Vq {
    base: u64,
    index: u32,
    desc: u64,
    avail: u64,
    used: u64,
    size: u16,
    avail_idx: u16,
    last_used: u16,
}

pub fn setup_queue(base: u64, index: u32, page: u64, size: u16) -> Result<Vq, &'static str> {
    // SAFETY: `page` is a 4 KiB page of the probe's virtio area (RAM, identity-mapped).
    unsafe {
        for i in 0..512u64 {
            write_volatile((page + 8 * i) as *mut u64, 0);
        }
    }
    wr(base, R_QUEUE_SEL, index);
    if rd(base, R_QUEUE_NUM_MAX) < size as u32 {
        return Err("queue smaller than needed");
    }
    let q = Vq {
        base,
        index,
        desc: page,
        avail: page + 0x400,
        used: page + 0x800,
        size,
        avail_idx: 0,
        last_used: 0,
    };
    wr(base, R_QUEUE_NUM, size as u32);
    for (reg, addr) in [
        (R_QUEUE_DESC, q.desc),
        (R_QUEUE_DRIVER, q.avail),
        (R_QUEUE_DEVICE, q.used),
    ] {
        wr(base, reg, addr as u32);
        wr(base, reg + 4, (addr >> 32) as u32);
    }
    wr(base, R_QUEUE_READY, 1);
    Ok(q)
}

impl Vq {
    /// Write a chain into descriptors `first..` and make it available (no notify).
    pub fn push(&mut self, first: u16, chain: &[(u64, u32, bool)]) {
        for (i, &(addr, len, write)) in chain.iter().enumerate() {
            let idx = first + i as u16;
            let d = self.desc + 16 * idx as u64;
            let mut flags = if write { DESC_F_WRITE } else { 0 };
            if i + 1 < chain.len() {
                flags |= DESC_F_NEXT;
            }
            // SAFETY: descriptor `idx` < size lies in the queue page.
            unsafe {
                write_volatile(d as *mut u64, addr);
                write_volatile((d + 8) as *mut u32, len);
                write_volatile((d + 12) as *mut u16, flags);
                write_volatile((d + 14) as *mut u16, idx + 1);
            }
        }
        let slot = self.avail + 4 + 2 * (self.avail_idx % self.size) as u64;
        // SAFETY: avail ring slot and index inside the queue page.
        unsafe { write_volatile(slot as *mut u16, first) };
        self.avail_idx = self.avail_idx.wrapping_add(1);
        // The device must see the ring entry before the new index (x86 keeps store
        // order; the fence stops the compiler reordering).
        compiler_fence(Ordering::SeqCst);
        // SAFETY: avail.idx inside the queue page.
        unsafe { write_volatile((self.avail + 2) as *mut u16, self.avail_idx) };
        compiler_fence(Ordering::SeqCst);
    }

    pub fn notify(&self) {
        wr(self.base, R_QUEUE_NOTIFY, self.index);
    }

    /// The next used element (head, len), waiting up to USED_WAIT_TICKS.
    pub fn wait_used(&mut self) -> Option<(u32, u32)> {
        let start = arch::rdtsc();
        loop {
            // SAFETY: used.idx inside the queue page; written by the device.
            let idx = unsafe { read_volatile((self.used + 2) as *const u16) };
            if idx != self.last_used {
                let e = self.used + 4 + 8 * (self.last_used % self.size) as u64;
                self.last_used = self.last_used.wrapping_add(1);
                // SAFETY: used ring element inside the queue page.
                return unsafe {
                    Some((
                        read_volatile(e as *const u32),
                        read_volatile((e + 4) as *const u32),
                    ))
                };
            }
            if arch::rdtsc().wrapping_sub(start) > USED_WAIT_TICKS {
                return None;
            }
        }
    }
}

/// Volatile little-endian stores and loads in probe RAM.
pub fn put<T: Copy>(addr: u64, v: T) {
    // SAFETY: callers pass addresses inside the virtio area, naturally aligned.
    unsafe { write_volatile(addr as *mut T, v) }
}

pub fn get<T: Copy>(addr: u64) -> T {
    // SAFETY: as in put.
    unsafe { read_volatile(addr as *const T) }
}
