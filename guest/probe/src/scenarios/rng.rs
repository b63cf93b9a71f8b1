//! `rng`: read `RNG_READ_BYTES` twice from the first virtio-rng device; each read must
//! be complete and not all zero, and the two must differ.

use crate::checks::{fail, fail_with, BootInfo, Fail};
use crate::say;
use crate::virtio::{self, get, put};
use zygote_probe_abi::{RNG_READ_BYTES, VIRTIO_AREA_GPA};

const C: &str = "rng";
const BUF_A: u64 = VIRTIO_AREA_GPA + 0x1000;
const BUF_B: u64 = VIRTIO_AREA_GPA + 0x1100;

pub fn run(info: &BootInfo) -> Result<(), Fail> {
    let Some(base) = virtio::find(info.cmdline, 4) else {
        return Err(fail(C, "no virtio-rng device on the command line"));
    };
    virtio::init(base, 0).map_err(|w| fail(C, w))?;
    let mut q = virtio::setup_queue(base, 0, VIRTIO_AREA_GPA, 8).map_err(|w| fail(C, w))?;
    virtio::driver_ok(base).map_err(|w| fail(C, w))?;
    let words = RNG_READ_BYTES as u64 / 8;
    for (slot, buf) in [(0u16, BUF_A), (1, BUF_B)] {
        for i in 0..words {
            put::<u64>(buf + 8 * i, 0);
        }
        q.push(slot, &[(buf, RNG_READ_BYTES, true)]);
        q.notify();
        match q.wait_used() {
            Some((_, len)) if len == RNG_READ_BYTES => {}
            Some((_, len)) => return Err(fail_with(C, "short read", len as u64)),
            None => return Err(fail(C, "read not completed")),
        }
    }
    let (mut nonzero, mut differ) = (false, false);
    for i in 0..words {
        let (a, b) = (get::<u64>(BUF_A + 8 * i), get::<u64>(BUF_B + 8 * i));
        nonzero |= a != 0 && b != 0;
        differ |= a != b;
    }
    if !nonzero {
        return Err(fail(C, "all-zero entropy"));
    }
    if !differ {
        return Err(fail(C, "two reads returned the same bytes"));
    }
    say!("check rng ok bytes=", RNG_READ_BYTES, " reads=2");
    Ok(())
}
