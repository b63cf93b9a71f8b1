//! What passes between a VMM and its warm spawner: the pages (written straight into
//! the spawner's memory), the "go" message over their socket, and, when verifying, a
//! witness copy of the parent's RAM.
use std::io::{self, Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;

use serde::{Deserialize, Serialize};
use vmm_sys_util::sock_ctrl_msg::ScmSocket;

use crate::memory::GuestRam;
use crate::persist::VmState;
use crate::vmm::dirty::{self, PAGE_SIZE};
use crate::vmm::inherit::DiskPages;

/// The spawner's one-byte report that its VM is built and it waits for a branch.
pub const BUILT: u8 = b'B';

const MAGIC: u32 = 0x7a79_6f67; // "zygo"
const HEADER_LEN: usize = 16;
/// File descriptors one go message may carry (the caller's, plus the witness).
pub const MAX_FDS: usize = 16;
/// A go message is the VM state and device data: far below this.
const MAX_BODY: u64 = 1 << 32;

/// Everything the spawner needs to become the child, but the memory.
#[derive(Serialize, Deserialize)]
pub struct Go {
    pub state: VmState,
    /// Copy-on-write disk pages written since the spawner's fork (their contents are
    /// already in its memory): the spawner records them in its own copy of each disk
    /// and adopts it (the devices' private data is nothing else, so it is not sent).
    pub disk_pages: Vec<DiskPages>,
    /// Verifying: every device's private data at the branch instant, whole, and the
    /// last fd carried is a witness of the parent's RAM, to compare against.
    pub witness_device_data: Option<Vec<Vec<u8>>>,
    /// The caller's own description of the child (see `SpawnerSetup::child`).
    pub payload: Vec<u8>,
    /// CLOCK_MONOTONIC of the branch request, for the child's "ready after".
    pub start_ns: u64,
}

/// Send `go` with `fds` attached to its header. Blocks until the spawner has read it.
/// Returns the bytes sent.
pub fn send_go(sock: &UnixStream, go: &Go, fds: &[RawFd]) -> io::Result<u64> {
    if fds.len() > MAX_FDS {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{} fds for a warm branch; at most {MAX_FDS}", fds.len()),
        ));
    }
    let body = bincode::serialize(go).map_err(io::Error::other)?;
    let mut header = [0u8; HEADER_LEN];
    header[..4].copy_from_slice(&MAGIC.to_le_bytes());
    header[4..8].copy_from_slice(&(fds.len() as u32).to_le_bytes());
    header[8..].copy_from_slice(&(body.len() as u64).to_le_bytes());
    let sent = sock
        .send_with_fds(&[&header[..]], fds)
        .map_err(|e| io::Error::from_raw_os_error(e.errno()))?;
    (&*sock).write_all(&header[sent..])?;
    (&*sock).write_all(&body)?;
    Ok((HEADER_LEN + body.len()) as u64)
}

/// Receive a go message and the fds that came with it. Ok(None): the parent closed
/// the socket (it dropped this spawner).
pub fn recv_go(sock: &UnixStream) -> io::Result<Option<(Go, Vec<OwnedFd>)>> {
    let mut header = [0u8; HEADER_LEN];
    let mut raw = [-1 as RawFd; MAX_FDS];
    let mut iov = [libc::iovec {
        iov_base: header.as_mut_ptr().cast(),
        iov_len: header.len(),
    }];
    // SAFETY: the iovec points into `header`, which any bytes may fill.
    let (got, nfds) = unsafe { sock.recv_with_fds(&mut iov, &mut raw) }
        .map_err(|e| io::Error::from_raw_os_error(e.errno()))?;
    // SAFETY: the kernel installed these `nfds` descriptors for us.
    let fds: Vec<OwnedFd> = raw[..nfds]
        .iter()
        .map(|&fd| unsafe { OwnedFd::from_raw_fd(fd) })
        .collect();
    if got == 0 {
        return Ok(None);
    }
    (&*sock).read_exact(&mut header[got..])?;
    let magic = u32::from_le_bytes(header[..4].try_into().unwrap());
    let sent_fds = u32::from_le_bytes(header[4..8].try_into().unwrap()) as usize;
    let len = u64::from_le_bytes(header[8..].try_into().unwrap());
    if magic != MAGIC || sent_fds != fds.len() || len > MAX_BODY {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!(
                "bad go header (magic {magic:#x}, {sent_fds} fds sent, {nfds} got, {len} bytes)"
            ),
        ));
    }
    let mut body = vec![0u8; len as usize];
    (&*sock).read_exact(&mut body)?;
    let go = bincode::deserialize(&body).map_err(io::Error::other)?;
    Ok(Some((go, fds)))
}

/// Host address of each page of `ram` as dirty bitmaps number them, by run.
fn page_address(ram: &GuestRam, page: u64) -> Option<(u64, u64)> {
    let mut first = 0u64;
    for r in ram.ranges() {
        let pages = r.size / PAGE_SIZE;
        if page < first + pages {
            // (address, pages left in this range)
            return Some((
                r.host_addr + (page - first) * PAGE_SIZE,
                first + pages - page,
            ));
        }
        first += pages;
    }
    None
}

/// Write the pages set in `bitmap` from this process's guest RAM into the same
/// addresses of process `pid` (a child of ours: allowed without ptrace rights beyond
/// what a parent has). Returns the pages written. Uses process_vm_writev(2), batching
/// runs of pages; on a kernel built without it (CONFIG_CROSS_MEMORY_ATTACH, e.g. the
/// nested lane's L1), one pwrite(2) per run to `/proc/<pid>/mem`.
pub fn copy_pages(pid: libc::pid_t, ram: &GuestRam, bitmap: &[u64]) -> io::Result<u64> {
    let mut runs: Vec<libc::iovec> = Vec::new();
    let mut pages = 0u64;
    for (first, count) in dirty::runs(bitmap) {
        let mut page = first;
        let end = first + count;
        while page < end {
            let Some((addr, in_range)) = page_address(ram, page) else {
                break; // past the end of RAM: bitmap padding
            };
            let n = in_range.min(end - page);
            runs.push(libc::iovec {
                iov_base: addr as *mut libc::c_void,
                iov_len: (n * PAGE_SIZE) as usize,
            });
            pages += n;
            page += n;
        }
    }
    write_runs(pid, &runs)?;
    Ok(pages)
}

/// Like [`copy_pages`], for a mapping other than guest RAM that the spawner inherited
/// at the same address: the pages set in `bitmap` (numbered from `base`, 4 KiB each,
/// all inside the mapping) are written from this process's copy into the spawner's.
pub fn copy_mapped_pages(pid: libc::pid_t, base: u64, bitmap: &[u64]) -> io::Result<u64> {
    let runs: Vec<libc::iovec> = dirty::runs(bitmap)
        .map(|(first, n)| libc::iovec {
            iov_base: (base + first * PAGE_SIZE) as *mut libc::c_void,
            iov_len: (n * PAGE_SIZE) as usize,
        })
        .collect();
    write_runs(pid, &runs)?;
    Ok(dirty::count(bitmap))
}

/// Write `runs` of this process's memory to the same addresses in `pid`.
fn write_runs(pid: libc::pid_t, runs: &[libc::iovec]) -> io::Result<()> {
    match write_vectored(pid, runs) {
        Err(e) if e.raw_os_error() == Some(libc::ENOSYS) => write_proc_mem(pid, runs),
        other => other,
    }
}

/// process_vm_writev over `runs`, IOV_MAX at a time, resuming after partial writes.
fn write_vectored(pid: libc::pid_t, runs: &[libc::iovec]) -> io::Result<()> {
    const BATCH: usize = 1024; // IOV_MAX
    let mut start = 0usize;
    let mut skip = 0usize; // bytes of runs[start] already written
    while start < runs.len() {
        let mut batch = runs[start..runs.len().min(start + BATCH)].to_vec();
        batch[0].iov_base = (batch[0].iov_base as usize + skip) as *mut libc::c_void;
        batch[0].iov_len -= skip;
        // SAFETY: local and remote iovecs are the same ranges of a mapping (guest RAM, a
        // disk) at the same address in both processes (the spawner is our fork).
        let n = unsafe {
            libc::process_vm_writev(
                pid,
                batch.as_ptr(),
                batch.len() as libc::c_ulong,
                batch.as_ptr(),
                batch.len() as libc::c_ulong,
                0,
            )
        };
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        if n == 0 {
            return Err(io::Error::new(
                io::ErrorKind::WriteZero,
                "process_vm_writev wrote nothing",
            ));
        }
        // Advance past what was written (a partial write stops at an iovec edge or
        // inside one).
        let mut n = n as usize;
        while n > 0 {
            let left = runs[start].iov_len - skip;
            if n >= left {
                n -= left;
                start += 1;
                skip = 0;
            } else {
                skip += n;
                n = 0;
            }
        }
    }
    Ok(())
}

/// The same through `/proc/<pid>/mem`, whose offsets are the process's addresses.
fn write_proc_mem(pid: libc::pid_t, runs: &[libc::iovec]) -> io::Result<()> {
    use std::os::unix::fs::FileExt;
    let mem = std::fs::OpenOptions::new()
        .write(true)
        .open(format!("/proc/{pid}/mem"))?;
    for r in runs {
        // SAFETY: the run lies in one of this process's mappings (guest RAM, a disk),
        // readable for its whole length.
        let bytes = unsafe { std::slice::from_raw_parts(r.iov_base as *const u8, r.iov_len) };
        mem.write_all_at(bytes, r.iov_base as u64)?;
    }
    Ok(())
}

/// A memfd holding all of `ram`, range after range: the parent's memory at the branch
/// instant, for the spawner to compare its own against. Call while paused.
pub fn witness(ram: &GuestRam) -> io::Result<OwnedFd> {
    // SAFETY: memfd_create with a static name; the fd is ours.
    let fd = unsafe { libc::memfd_create(c"zygote-warm-witness".as_ptr(), libc::MFD_CLOEXEC) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a fresh fd we own.
    let mut file = std::fs::File::from(unsafe { OwnedFd::from_raw_fd(fd) });
    for r in ram.ranges() {
        // SAFETY: the VM is paused; this range of the mapping is readable.
        let bytes =
            unsafe { std::slice::from_raw_parts(r.host_addr as *const u8, r.size as usize) };
        file.write_all(bytes)?;
    }
    Ok(file.into())
}

/// Pages of this process's `ram` that differ from the witness.
pub fn count_mismatches(ram: &GuestRam, witness: &OwnedFd) -> io::Result<u64> {
    let total: u64 = ram.ranges().iter().map(|r| r.size).sum();
    // SAFETY: a read-only shared mapping of the whole memfd, unmapped below.
    let map = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            total as usize,
            libc::PROT_READ,
            libc::MAP_SHARED,
            witness.as_raw_fd(),
            0,
        )
    };
    if map == libc::MAP_FAILED {
        return Err(io::Error::last_os_error());
    }
    let mut mismatches = 0u64;
    let mut offset = 0usize;
    for r in ram.ranges() {
        // SAFETY: both ranges are mapped and readable for their whole size; nothing
        // writes this process's guest RAM yet (its vCPUs have not run).
        let (ours, theirs) = unsafe {
            (
                std::slice::from_raw_parts(r.host_addr as *const u8, r.size as usize),
                std::slice::from_raw_parts((map as *const u8).add(offset), r.size as usize),
            )
        };
        mismatches += ours
            .chunks(PAGE_SIZE as usize)
            .zip(theirs.chunks(PAGE_SIZE as usize))
            .filter(|(a, b)| a != b)
            .count() as u64;
        offset += r.size as usize;
    }
    // SAFETY: unmapping what we mapped.
    unsafe { libc::munmap(map, total as usize) };
    Ok(mismatches)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Fork a child holding a copy of `buf`, write the middle page of ours into it with
    /// `write`, and have the child check it got exactly that page.
    fn child_gets_the_page(write: fn(libc::pid_t, &[libc::iovec]) -> io::Result<()>) {
        let mut buf = vec![0u8; 3 * 4096];
        let mut fds = [0; 2];
        // SAFETY: plain pipe creation.
        assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
        // SAFETY: the child only reads a pipe, compares memory and _exits.
        let pid = unsafe { libc::fork() };
        if pid == 0 {
            let mut b = 0u8;
            // SAFETY: blocking one-byte read, then plain memory checks.
            unsafe { libc::read(fds[0], (&mut b as *mut u8).cast(), 1) };
            let ok = buf[..4096].iter().all(|&x| x == 0)
                && buf[4096..8192].iter().all(|&x| x == 0xab)
                && buf[8192..].iter().all(|&x| x == 0);
            // SAFETY: leave the forked test process at once.
            unsafe { libc::_exit(if ok { 0 } else { 1 }) };
        }
        assert!(pid > 0);
        buf[4096..8192].fill(0xab);
        let run = libc::iovec {
            iov_base: buf[4096..].as_mut_ptr().cast(),
            iov_len: 4096,
        };
        let wrote = write(pid, &[run]);
        // SAFETY: waking and reaping our child.
        let status = unsafe {
            libc::write(fds[1], [1u8].as_ptr().cast(), 1);
            let mut status = 0;
            libc::waitpid(pid, &mut status, 0);
            libc::close(fds[0]);
            libc::close(fds[1]);
            status
        };
        wrote.unwrap();
        assert_eq!(status, 0, "the child did not get exactly the page written");
    }

    #[test]
    fn pages_reach_a_child_through_process_vm_writev() {
        child_gets_the_page(write_vectored);
    }

    #[test]
    fn pages_reach_a_child_through_proc_mem() {
        child_gets_the_page(write_proc_mem);
    }
}
