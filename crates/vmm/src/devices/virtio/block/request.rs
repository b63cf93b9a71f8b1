//! virtio-blk request parsing and execution (virtio 1.x §5.2.6).
//!
//! A request is `struct virtio_blk_req { le32 type; le32 reserved; le64 sector; u8
//! data[]; u8 status; }` spread over any descriptors: device-readable header (and data
//! for writes) first, then device-writable data (for reads) and the status byte, which
//! is the last byte of the chain. Everything is checked; the only outcome a lying guest
//! can cause is an error status, or a dropped chain when there is no usable status byte.
use crate::memory::GuestMemoryMmap;
use vm_memory::{Bytes, GuestAddress};

use super::disk::Disk;
use crate::devices::virtio::common::{Cursor, Segment, Segments};

pub const T_IN: u32 = 0;
pub const T_OUT: u32 = 1;
pub const T_FLUSH: u32 = 4;
pub const T_GET_ID: u32 = 8;

pub const S_OK: u8 = 0;
pub const S_IOERR: u8 = 1;
pub const S_UNSUPP: u8 = 2;

pub const SECTOR: u64 = 512;
const HEADER_LEN: usize = 16;
/// Length of the GET_ID answer (VIRTIO_BLK_ID_BYTES).
pub const ID_BYTES: usize = 20;
/// Bounce-buffer size: requests are copied through it in pieces, so a request of any
/// size costs no more than this in host memory.
pub const CHUNK: usize = 128 * 1024;

/// What executing a chain produced.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Status written; `used_len` bytes of the chain were written by the device.
    Done { status: u8, used_len: u32 },
    /// No writable status byte: return the chain with length 0 and nothing else.
    Dropped,
}

/// Per-device execution settings.
pub struct Exec<'a> {
    pub disk: &'a mut Disk,
    pub read_only: bool,
    /// The driver did not negotiate VIRTIO_BLK_F_FLUSH: writes must be write-through.
    pub write_through: bool,
    pub id: &'a [u8; ID_BYTES],
    pub bounce: &'a mut Vec<u8>,
}

/// Execute one chain given as raw descriptors.
pub fn execute(mem: &GuestMemoryMmap, raw: &[Segment], ex: &mut Exec) -> Outcome {
    let Some(&last) = raw.last() else {
        return Outcome::Dropped;
    };
    if !last.writable || last.len == 0 {
        return Outcome::Dropped;
    }
    let Some(status_addr) = last.addr.checked_add(u64::from(last.len) - 1) else {
        return Outcome::Dropped;
    };
    // The body is the chain minus the status byte.
    let mut body: Vec<Segment> = raw[..raw.len() - 1].to_vec();
    if last.len > 1 {
        body.push(Segment {
            len: last.len - 1,
            ..last
        });
    }
    let (status, data_written) = match run(mem, &body, ex) {
        Ok(r) => r,
        Err(status) => (status, 0),
    };
    if mem.write_obj(status, GuestAddress(status_addr)).is_err() {
        return Outcome::Dropped;
    }
    Outcome::Done {
        status,
        // data_written <= chain length, which the queue capped below 4 GiB.
        used_len: data_written.saturating_add(1),
    }
}

/// Returns (status, bytes of data written into the chain) or an error status.
fn run(mem: &GuestMemoryMmap, body: &[Segment], ex: &mut Exec) -> Result<(u8, u32), u8> {
    let segs = Segments::split(body).map_err(|_| S_IOERR)?;
    let mut rd = Cursor::new(&segs.readable);
    let mut hdr = [0u8; HEADER_LEN];
    rd.read(mem, &mut hdr).map_err(|_| S_IOERR)?;
    let kind = u32::from_le_bytes(hdr[0..4].try_into().unwrap());
    let sector = u64::from_le_bytes(hdr[8..16].try_into().unwrap());
    match kind {
        T_IN => {
            let len = segs.writable_len();
            let off = check_range(sector, len, ex.disk.size())?;
            let mut wr = Cursor::new(&segs.writable);
            copy_chunks(len, ex.bounce, |done, chunk| {
                ex.disk.read_at(off + done, chunk).map_err(|_| S_IOERR)?;
                wr.write(mem, chunk).map_err(|_| S_IOERR)
            })?;
            Ok((S_OK, len as u32))
        }
        T_OUT => {
            if ex.read_only {
                return Err(S_IOERR);
            }
            let len = rd.remaining();
            let off = check_range(sector, len, ex.disk.size())?;
            copy_chunks(len, ex.bounce, |done, chunk| {
                rd.read(mem, chunk).map_err(|_| S_IOERR)?;
                ex.disk.write_at(off + done, chunk).map_err(|_| S_IOERR)
            })?;
            if ex.write_through {
                ex.disk.flush().map_err(|_| S_IOERR)?;
            }
            Ok((S_OK, 0))
        }
        T_FLUSH => {
            ex.disk.flush().map_err(|_| S_IOERR)?;
            Ok((S_OK, 0))
        }
        T_GET_ID => {
            let n = (segs.writable_len() as usize).min(ID_BYTES);
            Cursor::new(&segs.writable)
                .write(mem, &ex.id[..n])
                .map_err(|_| S_IOERR)?;
            Ok((S_OK, n as u32))
        }
        _ => Err(S_UNSUPP),
    }
}

/// Byte offset of `sector` if `len` bytes from there are whole sectors inside the disk.
fn check_range(sector: u64, len: u64, disk_size: u64) -> Result<u64, u8> {
    if !len.is_multiple_of(SECTOR) {
        return Err(S_IOERR);
    }
    let off = sector.checked_mul(SECTOR).ok_or(S_IOERR)?;
    match off.checked_add(len) {
        Some(end) if end <= disk_size => Ok(off),
        _ => Err(S_IOERR),
    }
}

/// Call `f(offset, chunk)` over `len` bytes in bounce-buffer-sized pieces.
fn copy_chunks(
    len: u64,
    bounce: &mut Vec<u8>,
    mut f: impl FnMut(u64, &mut [u8]) -> Result<(), u8>,
) -> Result<(), u8> {
    if bounce.len() < CHUNK {
        bounce.resize(CHUNK, 0);
    }
    let mut done = 0u64;
    while done < len {
        let n = (len - done).min(CHUNK as u64) as usize;
        f(done, &mut bounce[..n])?;
        done += n as u64;
    }
    Ok(())
}
