//! `blk`: drive the first virtio-blk device by polling. Reads sector 0 of the root
//! image and compares it with the host's pattern (`blk_base_word`); on a writable
//! disk writes `BLK_WRITE_SECTORS` sectors, reads them back and flushes; on a
//! read-only disk checks that a write fails with IOERR. Also checks GET_ID and that a
//! read past the end fails.

use crate::checks::{fail, fail_with, BootInfo, Fail};
use crate::say;
use crate::virtio::{self, get, put, Vq};
use zygote_probe_abi::{
    blk_base_word, blk_write_word, BLK_WRITE_FIRST, BLK_WRITE_SECTORS, VIRTIO_AREA_GPA,
};

const C: &str = "blk";
const F_RO: u32 = 1 << 5;
const F_FLUSH: u32 = 1 << 9;
const T_IN: u32 = 0;
const T_OUT: u32 = 1;
const T_FLUSH: u32 = 4;
const T_GET_ID: u32 = 8;
const S_OK: u8 = 0;
const S_IOERR: u8 = 1;

const QPAGE: u64 = VIRTIO_AREA_GPA;
const HDR: u64 = VIRTIO_AREA_GPA + 0x1000;
const STATUS: u64 = HDR + 0x100;
const DATA: u64 = VIRTIO_AREA_GPA + 0x2000;

/// One request: header, optional data, status. Returns the status byte.
fn request(q: &mut Vq, kind: u32, sector: u64, data_len: u32, write: bool) -> Result<u8, Fail> {
    put::<u32>(HDR, kind);
    put::<u32>(HDR + 4, 0);
    put::<u64>(HDR + 8, sector);
    put::<u8>(STATUS, 0xff);
    if data_len == 0 {
        q.push(0, &[(HDR, 16, false), (STATUS, 1, true)]);
    } else {
        q.push(
            0,
            &[(HDR, 16, false), (DATA, data_len, write), (STATUS, 1, true)],
        );
    }
    q.notify();
    let Some((head, _len)) = q.wait_used() else {
        return Err(fail_with(C, "request not completed, type", kind as u64));
    };
    if head != 0 {
        return Err(fail_with(C, "unexpected used head", head as u64));
    }
    Ok(get::<u8>(STATUS))
}

fn expect(status: u8, want: u8, what: &'static str) -> Result<(), Fail> {
    if status == want {
        Ok(())
    } else {
        Err(fail_with(C, what, status as u64))
    }
}

pub fn run(info: &BootInfo) -> Result<(), Fail> {
    checks(info).map(|_| ())
}

/// Read the `BLK_WRITE_SECTORS` sectors the checks wrote and compare them.
pub fn verify_written(q: &mut Vq) -> Result<(), Fail> {
    let bytes = (BLK_WRITE_SECTORS * 512) as u32;
    for i in 0..BLK_WRITE_SECTORS * 64 {
        put::<u64>(DATA + 8 * i, 0);
    }
    expect(
        request(q, T_IN, BLK_WRITE_FIRST, bytes, true)?,
        S_OK,
        "read-back failed",
    )?;
    for i in 0..BLK_WRITE_SECTORS * 64 {
        if get::<u64>(DATA + 8 * i) != blk_write_word(BLK_WRITE_FIRST + i / 64, i % 64) {
            return Err(fail_with(C, "read-back differs at word", i));
        }
    }
    Ok(())
}

/// Write one sector of `word(i)` at `sector`, read it back and compare.
pub fn write_and_check(q: &mut Vq, sector: u64, word: impl Fn(u64) -> u64) -> Result<(), Fail> {
    for i in 0..64 {
        put::<u64>(DATA + 8 * i, word(i));
    }
    expect(request(q, T_OUT, sector, 512, false)?, S_OK, "write failed")?;
    for i in 0..64 {
        put::<u64>(DATA + 8 * i, 0);
    }
    expect(request(q, T_IN, sector, 512, true)?, S_OK, "read failed")?;
    for i in 0..64 {
        if get::<u64>(DATA + 8 * i) != word(i) {
            return Err(fail_with(C, "sector differs at word", i));
        }
    }
    Ok(())
}

/// All checks; returns the live queue so a scenario can keep using the device.
pub fn checks(info: &BootInfo) -> Result<Vq, Fail> {
    let Some(base) = virtio::find(info.cmdline, 2) else {
        return Err(fail(C, "no virtio-blk device on the command line"));
    };
    let offered = virtio::init(base, F_RO | F_FLUSH).map_err(|w| fail(C, w))?;
    let ro = offered & F_RO != 0;
    let capacity = virtio::config_u64(base, 0);
    let mut q = virtio::setup_queue(base, 0, QPAGE, 8).map_err(|w| fail(C, w))?;
    virtio::driver_ok(base).map_err(|w| fail(C, w))?;

    expect(
        request(&mut q, T_IN, 0, 512, true)?,
        S_OK,
        "reading sector 0",
    )?;
    for w in 0..64 {
        if get::<u64>(DATA + 8 * w) != blk_base_word(w) {
            return Err(fail_with(
                C,
                "sector 0 differs from the host pattern at word",
                w,
            ));
        }
    }
    let bytes = (BLK_WRITE_SECTORS * 512) as u32;
    let words = BLK_WRITE_SECTORS * 64;
    for i in 0..words {
        put::<u64>(
            DATA + 8 * i,
            blk_write_word(BLK_WRITE_FIRST + i / 64, i % 64),
        );
    }
    let status = request(&mut q, T_OUT, BLK_WRITE_FIRST, bytes, false)?;
    if ro {
        expect(status, S_IOERR, "write to a read-only disk did not fail")?;
    } else {
        expect(status, S_OK, "write failed")?;
        verify_written(&mut q)?;
        expect(request(&mut q, T_FLUSH, 0, 0, false)?, S_OK, "flush failed")?;
    }
    expect(
        request(&mut q, T_GET_ID, 0, 20, true)?,
        S_OK,
        "GET_ID failed",
    )?;
    if get::<u8>(DATA) == 0 {
        return Err(fail(C, "GET_ID returned an empty id"));
    }
    expect(
        request(&mut q, T_IN, capacity, 512, true)?,
        S_IOERR,
        "read past the end did not fail",
    )?;
    say!(
        "check blk ok capacity=",
        capacity,
        " ro=",
        ro as u64,
        " wrote=",
        if ro { 0 } else { BLK_WRITE_SECTORS }
    );
    Ok(q)
}
