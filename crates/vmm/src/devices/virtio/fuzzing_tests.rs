//! A bounded, seeded stand-in for the cargo-fuzz targets: many random but
//! structure-aware inputs (descriptor tables with plausible and absurd lengths, flags,
//! next indices; request headers of every type), checked against the invariant that
//! every chain with a valid head goes back to the guest. `ZYGOTE_FUZZ_ITERS` raises the
//! iteration count; `ZYGOTE_FUZZ_SEED` picks another seed.
use super::*;

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        // xorshift64*: tiny, deterministic, good enough to spread inputs.
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
    fn pick<T: Copy>(&mut self, xs: &[T]) -> T {
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
fn fill_queue(r: &mut Rng, data: &mut [u8], base: u64, header: impl Fn(&mut Rng) -> Vec<u8>) {
    for i in 0..QUEUE_SIZE as u64 {
        let addr = match r.below(8) {
            0 => r.next(),                      // anywhere, mostly unmapped
            1 => MEM_SIZE as u64 - r.below(64), // straddling the end of RAM
            _ => BUF_START + r.below(0xe000),   // buffer space
        };
        let len: u32 = match r.below(8) {
            0 => r.next() as u32,
            1 => r.pick(&[0, 1, 15, 16, 17, 43, 44, 45, 511, 512, 513, u32::MAX]),
            _ => r.below(2048) as u32,
        };
        let mut flags = r.pick(&[0u16, 1, 2, 3, 3, 1, 2]);
        if r.below(32) == 0 {
            flags |= 4; // indirect
        }
        let next = if r.below(8) == 0 {
            r.next() as u16
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
        r.next() as u16
    } else {
        r.below(QUEUE_SIZE as u64 + 1) as u16
    };
    put(data, base + 0x102, &avail_idx.to_le_bytes());
    for i in 0..QUEUE_SIZE as u64 {
        let head = if r.below(16) == 0 {
            r.next() as u16
        } else {
            r.below(QUEUE_SIZE as u64) as u16
        };
        put(data, base + 0x104 + 2 * i, &head.to_le_bytes());
    }
}

fn blk_header(r: &mut Rng) -> Vec<u8> {
    let kind: u32 = r.pick(&[0, 1, 4, 8, 0, 1, 99, u32::MAX]);
    let sector: u64 = match r.below(4) {
        0 => r.next(),
        1 => 128 - r.below(3),
        _ => r.below(128),
    };
    let mut h = kind.to_le_bytes().to_vec();
    h.extend_from_slice(&0u32.to_le_bytes());
    h.extend_from_slice(&sector.to_le_bytes());
    h
}

fn vsock_header(r: &mut Rng) -> Vec<u8> {
    use crate::devices::virtio::vsock::packet::Header;
    Header {
        src_cid: if r.below(8) == 0 { r.next() } else { 3 },
        dst_cid: if r.below(8) == 0 { r.next() } else { 2 },
        src_port: r.below(4) as u32,
        dst_port: r.below(4) as u32 + 1000,
        len: if r.below(4) == 0 {
            r.next() as u32
        } else {
            r.below(256) as u32
        },
        kind: if r.below(8) == 0 { r.next() as u16 } else { 1 },
        op: r.below(9) as u16,
        flags: r.below(4) as u32,
        buf_alloc: r.next() as u32,
        fwd_cnt: r.next() as u32,
    }
    .to_bytes()
    .to_vec()
}

fn iterations() -> u64 {
    std::env::var("ZYGOTE_FUZZ_ITERS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(3000)
}

fn seed() -> u64 {
    std::env::var("ZYGOTE_FUZZ_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0x5a59_474f_5445_0001)
}

#[test]
fn random_blk_chains_never_crash_and_are_all_returned() {
    let mut r = Rng(seed());
    for i in 0..iterations() {
        let mut data = vec![0u8; MAX_INPUT];
        data[0] = r.below(2) as u8;
        fill_queue(&mut r, &mut data, 0, blk_header);
        // Raw noise in some inputs, so nothing is only ever "plausible".
        if i % 7 == 0 {
            for _ in 0..32 {
                let at = r.below(0x200) as usize;
                data[at] = r.next() as u8;
            }
        }
        let rep = fuzz_blk(&data).expect("setup");
        assert_eq!(rep.returned[0], rep.valid_heads[0], "iteration {i}");
    }
}

#[test]
fn random_vsock_chains_never_crash_and_tx_is_all_returned() {
    let mut r = Rng(seed() ^ 0xdead_beef);
    for i in 0..iterations() {
        let mut data = vec![0u8; MAX_INPUT];
        fill_queue(&mut r, &mut data, 0x0, vsock_header);
        fill_queue(&mut r, &mut data, 0x400, |_| Vec::new());
        fill_queue(&mut r, &mut data, 0x800, |_| Vec::new());
        let rep = fuzz_vsock(&data).expect("setup");
        assert_eq!(rep.returned[0], rep.valid_heads[0], "TX, iteration {i}");
        assert!(rep.returned[1] <= rep.valid_heads[1], "RX, iteration {i}");
        assert!(
            rep.returned[2] <= rep.valid_heads[2].min(1),
            "events, iteration {i}"
        );
    }
}

#[test]
fn empty_and_tiny_inputs_are_harmless() {
    for len in [0usize, 1, 3, 0x101, 0x204] {
        let data = vec![0xffu8; len];
        assert!(fuzz_blk(&data).is_some());
        assert!(fuzz_vsock(&data).is_some());
    }
}
