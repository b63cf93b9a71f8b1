//! AF_VSOCK listening socket. std has no vsock support, so this is a thin
//! libc wrapper.

use std::io;
use std::mem::{size_of, zeroed};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

pub struct VsockListener {
    fd: OwnedFd,
    port: u32,
}

fn cvt(r: libc::c_int) -> io::Result<libc::c_int> {
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r)
    }
}

impl VsockListener {
    /// Listen on `port` for connections to any of this machine's CIDs.
    pub fn bind(port: u32) -> io::Result<Self> {
        let raw = cvt(unsafe {
            libc::socket(libc::AF_VSOCK, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0)
        })?;
        // SAFETY: `raw` is a fresh descriptor we own.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        let mut addr: libc::sockaddr_vm = unsafe { zeroed() };
        addr.svm_family = libc::AF_VSOCK as libc::sa_family_t;
        addr.svm_port = port;
        addr.svm_cid = libc::VMADDR_CID_ANY;
        cvt(unsafe {
            libc::bind(
                fd.as_raw_fd(),
                (&addr as *const libc::sockaddr_vm).cast(),
                size_of::<libc::sockaddr_vm>() as libc::socklen_t,
            )
        })?;
        cvt(unsafe { libc::listen(fd.as_raw_fd(), 128) })?;
        Ok(VsockListener { fd, port })
    }

    pub fn port(&self) -> u32 {
        self.port
    }

    /// Accept one connection: (stream, peer CID, peer port).
    pub fn accept(&self) -> io::Result<(OwnedFd, u32, u32)> {
        let mut addr: libc::sockaddr_vm = unsafe { zeroed() };
        let mut len = size_of::<libc::sockaddr_vm>() as libc::socklen_t;
        let raw = loop {
            let r = unsafe {
                libc::accept4(
                    self.fd.as_raw_fd(),
                    (&mut addr as *mut libc::sockaddr_vm).cast(),
                    &mut len,
                    libc::SOCK_CLOEXEC,
                )
            };
            match cvt(r) {
                Ok(fd) => break fd,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            }
        };
        // SAFETY: accept4 returned a fresh descriptor.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        Ok((fd, addr.svm_cid, addr.svm_port))
    }
}
