//! Extent maps via the FIEMAP ioctl, used to *prove* that a reflinked clone
//! shares storage with its source instead of trusting the method we asked for.
//! Tests and the bench use it; nothing on the materialization path does.
use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::path::Path;

// Layouts and constants from linux/fiemap.h and linux/fs.h.
const FS_IOC_FIEMAP: libc::c_ulong = 0xC020_660B;
const FIEMAP_FLAG_SYNC: u32 = 0x1;
/// Last extent of the file.
pub const FIEMAP_EXTENT_LAST: u32 = 0x1;
/// The extent's blocks are also referenced by another file (reflink/dedupe).
pub const FIEMAP_EXTENT_SHARED: u32 = 0x2000;

#[repr(C)]
#[derive(Clone, Copy, Default)]
struct RawExtent {
    logical: u64,
    physical: u64,
    length: u64,
    reserved64: [u64; 2],
    flags: u32,
    reserved: [u32; 3],
}

#[repr(C)]
struct RawHeader {
    start: u64,
    length: u64,
    flags: u32,
    mapped_extents: u32,
    extent_count: u32,
    reserved: u32,
}

/// Extents are fetched in batches of this many per ioctl.
const BATCH: usize = 64;

#[repr(C)]
struct Request {
    header: RawHeader,
    extents: [RawExtent; BATCH],
}

/// One mapped extent of a file.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct Extent {
    pub logical: u64,
    pub physical: u64,
    pub length: u64,
    pub flags: u32,
}

impl Extent {
    pub fn is_shared(&self) -> bool {
        self.flags & FIEMAP_EXTENT_SHARED != 0
    }
}

/// All extents of the file at `path` (after syncing it, so delayed
/// allocation does not hide extents).
pub fn extents(path: &Path) -> io::Result<Vec<Extent>> {
    let f = File::open(path)?;
    let mut out = Vec::new();
    let mut start = 0u64;
    loop {
        let mut req = Request {
            header: RawHeader {
                start,
                length: u64::MAX - start,
                flags: FIEMAP_FLAG_SYNC,
                mapped_extents: 0,
                extent_count: BATCH as u32,
                reserved: 0,
            },
            extents: [RawExtent::default(); BATCH],
        };
        // SAFETY: req is a properly laid out fiemap header followed by room
        // for extent_count extents, as the ioctl expects.
        let rc = unsafe { libc::ioctl(f.as_raw_fd(), FS_IOC_FIEMAP, &mut req) };
        if rc != 0 {
            return Err(io::Error::last_os_error());
        }
        let n = req.header.mapped_extents as usize;
        if n == 0 {
            return Ok(out);
        }
        let mut last = false;
        for e in &req.extents[..n] {
            out.push(Extent {
                logical: e.logical,
                physical: e.physical,
                length: e.length,
                flags: e.flags,
            });
            last |= e.flags & FIEMAP_EXTENT_LAST != 0;
        }
        let tail = &req.extents[n - 1];
        if last {
            return Ok(out);
        }
        start = tail.logical + tail.length;
    }
}

/// True when the file has data and every extent is marked shared.
pub fn fully_shared(path: &Path) -> io::Result<bool> {
    let ex = extents(path)?;
    Ok(!ex.is_empty() && ex.iter().all(Extent::is_shared))
}
