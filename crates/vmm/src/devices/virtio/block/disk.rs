//! Disk backends for virtio-blk.
//!
//! * [`CowImage`]: a read-only base image mapped `MAP_PRIVATE` with PROT_WRITE. Guest
//!   reads come from the shared page cache; the first guest write to a page makes the
//!   kernel copy it into anonymous memory private to this process. The base file never
//!   changes, and `fork(2)` shares those private pages copy-on-write with a child VM at
//!   no cost. Which pages diverged is tracked in a bitmap (see [`CowImage::private_bytes`]).
//! * [`FileDisk`]: a persistent disk: `pread`/`pwrite` on a file, flush = `fdatasync`.
//! * `Memory`: a plain buffer, for tests and fuzzing.
use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

pub const PAGE: u64 = 4096;

#[derive(Debug, thiserror::Error)]
pub enum DiskError {
    #[error("opening disk {path}: {source}")]
    Open { path: PathBuf, source: io::Error },
    #[error("disk {0} is empty")]
    Empty(PathBuf),
    #[error("mapping disk {path}: {source}")]
    Map { path: PathBuf, source: io::Error },
    #[error("disk {path} changed size: {expected} bytes expected, {actual} found")]
    SizeChanged {
        path: PathBuf,
        expected: u64,
        actual: u64,
    },
}

/// A base image mapped copy-on-write into this process.
pub struct CowImage {
    path: PathBuf,
    ptr: *mut u8,
    size: u64,
    map_len: usize,
    /// One bit per 4 KiB page the guest has written (diverged from the base).
    dirty: Vec<u64>,
    /// Pages written since the last [`CowImage::take_recent`] (same layout), for a
    /// copy of this disk that must be brought up to date (a warm spawner's).
    recent: Vec<u64>,
    /// Whether `recent` has a bit set (saves scanning it on every read).
    recent_any: bool,
    // Kept open so the mapping's file identity stays pinned for the VM's lifetime.
    file: File,
}

// SAFETY: the mapping is owned by this value; all access goes through &mut self.
unsafe impl Send for CowImage {}

impl CowImage {
    /// Map `path` (opened read-only: the base is content-addressed and never modified).
    /// Bytes past the last whole 512-byte sector are not exposed to the guest.
    pub fn open(path: &Path) -> Result<Self, DiskError> {
        let file = File::open(path).map_err(|source| DiskError::Open {
            path: path.into(),
            source,
        })?;
        let size = file
            .metadata()
            .map_err(|source| DiskError::Open {
                path: path.into(),
                source,
            })?
            .len();
        if size < 512 {
            return Err(DiskError::Empty(path.into()));
        }
        let map_len = size.next_multiple_of(PAGE) as usize;
        // SAFETY: a fresh private file mapping of the whole file; checked below. Writes
        // through it never reach the file (MAP_PRIVATE), so read-only open is enough.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                map_len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_NORESERVE,
                file.as_raw_fd(),
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(DiskError::Map {
                path: path.into(),
                source: io::Error::last_os_error(),
            });
        }
        let pages = map_len as u64 / PAGE;
        Ok(Self {
            path: path.into(),
            ptr: ptr as *mut u8,
            size: size - size % 512,
            map_len,
            dirty: vec![0; pages.div_ceil(64) as usize],
            recent: vec![0; pages.div_ceil(64) as usize],
            recent_any: false,
            file,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Host address of the mapping (for /proc/self/smaps cross-checks, and for a warm
    /// spawner's source, which writes into its copy at the same address).
    pub fn host_addr(&self) -> u64 {
        self.ptr as u64
    }

    /// 4 KiB pages mapped (the disk's size rounded up).
    pub fn page_count(&self) -> u64 {
        self.map_len as u64 / PAGE
    }

    fn mark_dirty(&mut self, off: u64, len: u64) {
        if len == 0 {
            return;
        }
        for page in off / PAGE..=(off + len - 1) / PAGE {
            self.dirty[(page / 64) as usize] |= 1 << (page % 64);
            self.recent[(page / 64) as usize] |= 1 << (page % 64);
        }
        self.recent_any = true;
    }

    /// Pages written since the last call (one bit per page, `u64` words), clearing
    /// the record; None if there were none.
    pub fn take_recent(&mut self) -> Option<Vec<u64>> {
        if !self.recent_any {
            return None;
        }
        self.recent_any = false;
        let words = self.recent.len();
        Some(std::mem::replace(&mut self.recent, vec![0; words]))
    }

    /// Record `pages` as written without writing them: their contents were put in
    /// this process's mapping from outside (a warm spawner's source writes them with
    /// process_vm_writev). False if one lies outside the disk (nothing is recorded).
    pub fn mark_written(&mut self, pages: &[u64]) -> bool {
        if pages.iter().any(|&p| p >= self.page_count()) {
            return false;
        }
        for &p in pages {
            self.dirty[(p / 64) as usize] |= 1 << (p % 64);
        }
        true
    }

    /// This process is a fork(2) copy of the VMM whose descriptors were all closed:
    /// the mapping is intact (and this process's own, copy-on-write), but the file
    /// handle's number is stale and may name something else by now. Open the file
    /// again, so that dropping this image closes its own descriptor, not a stranger's.
    pub fn reopen_after_fork(&mut self) -> Result<(), DiskError> {
        let file = File::open(&self.path).map_err(|source| DiskError::Open {
            path: self.path.clone(),
            source,
        })?;
        std::mem::forget(std::mem::replace(&mut self.file, file));
        Ok(())
    }

    /// Bytes of this VM's disk that differ from the base image: whole 4 KiB pages the
    /// guest wrote. This is device-side bookkeeping rather than a /proc/self/smaps
    /// Private_Dirty reading because it stays exact across fork(2) (a child's inherited
    /// pages are shared copy-on-write and smaps reports them as shared, though they are
    /// still this VM's divergence from the base), is not inflated by the kernel copying
    /// whole large folios on a write fault (64 KiB per 4 KiB write seen on Linux 6.18),
    /// and costs no syscalls.
    pub fn private_bytes(&self) -> u64 {
        self.dirty
            .iter()
            .map(|w| u64::from(w.count_ones()))
            .sum::<u64>()
            * PAGE
    }

    /// Indices of written pages, ascending.
    pub fn dirty_pages(&self) -> Vec<u64> {
        let mut out = Vec::new();
        for (i, &w) in self.dirty.iter().enumerate() {
            let mut w = w;
            while w != 0 {
                let bit = w.trailing_zeros() as u64;
                out.push(i as u64 * 64 + bit);
                w &= w - 1;
            }
        }
        out
    }

    fn page_range(&self, page: u64) -> Option<(usize, usize)> {
        let start = page.checked_mul(PAGE)?;
        (start < self.map_len as u64).then_some((start as usize, PAGE as usize))
    }

    /// Contents of a page (as the guest sees it).
    pub fn page(&self, page: u64) -> Option<&[u8]> {
        let (start, len) = self.page_range(page)?;
        // SAFETY: in-bounds slice of our mapping; no &mut alias exists while &self lives.
        Some(unsafe { std::slice::from_raw_parts(self.ptr.add(start), len) })
    }

    /// Overwrite a page (restoring a snapshot's overlay) and mark it dirty.
    pub fn set_page(&mut self, page: u64, data: &[u8]) -> bool {
        let Some((start, len)) = self.page_range(page) else {
            return false;
        };
        if data.len() != len {
            return false;
        }
        // SAFETY: in-bounds, exclusive access through &mut self.
        unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), self.ptr.add(start), len) };
        self.mark_dirty(start as u64, len as u64);
        true
    }
}

impl Drop for CowImage {
    fn drop(&mut self) {
        // SAFETY: unmapping exactly what open() mapped.
        unsafe { libc::munmap(self.ptr as *mut libc::c_void, self.map_len) };
    }
}

/// A persistent disk file.
pub struct FileDisk {
    path: PathBuf,
    file: File,
    size: u64,
}

impl FileDisk {
    pub fn open(path: &Path, read_only: bool) -> Result<Self, DiskError> {
        let file = OpenOptions::new()
            .read(true)
            .write(!read_only)
            .open(path)
            .map_err(|source| DiskError::Open {
                path: path.into(),
                source,
            })?;
        let size = file
            .metadata()
            .map_err(|source| DiskError::Open {
                path: path.into(),
                source,
            })?
            .len();
        if size < 512 {
            return Err(DiskError::Empty(path.into()));
        }
        Ok(Self {
            path: path.into(),
            file,
            size: size - size % 512,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
}

/// The storage behind one virtio-blk device.
pub enum Disk {
    Cow(CowImage),
    File(FileDisk),
    Memory(Vec<u8>),
}

impl Disk {
    /// Usable size in bytes (a multiple of 512).
    pub fn size(&self) -> u64 {
        match self {
            Disk::Cow(c) => c.size,
            Disk::File(f) => f.size,
            Disk::Memory(m) => m.len() as u64 & !511,
        }
    }

    /// Callers check `off + buf.len() <= size()`; out-of-range is an error, not UB.
    pub fn read_at(&mut self, off: u64, buf: &mut [u8]) -> io::Result<()> {
        check_range(off, buf.len(), self.size())?;
        match self {
            // SAFETY: range checked against the mapped size above.
            Disk::Cow(c) => unsafe {
                std::ptr::copy_nonoverlapping(c.ptr.add(off as usize), buf.as_mut_ptr(), buf.len())
            },
            Disk::File(f) => f.file.read_exact_at(buf, off)?,
            Disk::Memory(m) => buf.copy_from_slice(&m[off as usize..off as usize + buf.len()]),
        }
        Ok(())
    }

    pub fn write_at(&mut self, off: u64, data: &[u8]) -> io::Result<()> {
        check_range(off, data.len(), self.size())?;
        match self {
            Disk::Cow(c) => {
                // SAFETY: range checked; the private mapping is writable and ours alone.
                unsafe {
                    std::ptr::copy_nonoverlapping(
                        data.as_ptr(),
                        c.ptr.add(off as usize),
                        data.len(),
                    )
                };
                c.mark_dirty(off, data.len() as u64);
            }
            Disk::File(f) => f.file.write_all_at(data, off)?,
            Disk::Memory(m) => m[off as usize..off as usize + data.len()].copy_from_slice(data),
        }
        Ok(())
    }

    /// Make completed writes durable. The CoW overlay lives in process memory and is
    /// only as durable as the VM (snapshots save it explicitly).
    pub fn flush(&mut self) -> io::Result<()> {
        match self {
            Disk::File(f) => f.file.sync_data(),
            Disk::Cow(_) | Disk::Memory(_) => Ok(()),
        }
    }

    /// Bytes held privately by this VM (0 for disks whose writes go to a file).
    pub fn private_bytes(&self) -> u64 {
        match self {
            Disk::Cow(c) => c.private_bytes(),
            Disk::File(_) | Disk::Memory(_) => 0,
        }
    }
}

fn check_range(off: u64, len: usize, size: u64) -> io::Result<()> {
    match off.checked_add(len as u64) {
        Some(end) if end <= size => Ok(()),
        _ => Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "access beyond the end of the disk",
        )),
    }
}

/// Private_Dirty (bytes) of the mapping starting at `addr`, from /proc/self/smaps. A
/// cross-check of [`CowImage::private_bytes`] in a process that has not forked.
pub fn smaps_private_dirty(addr: u64) -> Option<u64> {
    let smaps = std::fs::read_to_string("/proc/self/smaps").ok()?;
    let head = format!("{addr:x}-");
    let mut in_mapping = false;
    for line in smaps.lines() {
        if line.starts_with(|c: char| c.is_ascii_hexdigit()) && line.contains('-') {
            in_mapping = line.starts_with(&head);
        } else if in_mapping {
            if let Some(rest) = line.strip_prefix("Private_Dirty:") {
                let kib: u64 = rest.trim().trim_end_matches("kB").trim().parse().ok()?;
                return Some(kib * 1024);
            }
        }
    }
    None
}

/// Check a file still has the size a saved state recorded (content-addressed bases are
/// immutable; a different size means the wrong file).
pub fn check_size(path: &Path, expected: u64, actual: u64) -> Result<(), DiskError> {
    if expected == actual {
        Ok(())
    } else {
        Err(DiskError::SizeChanged {
            path: path.into(),
            expected,
            actual,
        })
    }
}
