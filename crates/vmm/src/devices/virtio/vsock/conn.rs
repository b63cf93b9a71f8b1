//! One vsock stream connection bridged to a host Unix stream, with virtio-vsock's
//! credit-based flow control in both directions.
//!
//! Guest → host: we advertise `TX_BUF_SIZE` bytes of buffer (`buf_alloc`) and count
//! bytes written to the host socket (`fwd_cnt`); the guest never has more than
//! `buf_alloc - (its tx_cnt - fwd_cnt)` bytes in flight, so what the host socket cannot
//! take yet fits in `tx_buf`. A guest that overruns its credit gets reset.
//! Host → guest: we only read from the host socket what the guest has room for
//! (`peer_buf_alloc - (rx_cnt - peer_fwd_cnt)`), so host data waits in the host
//! socket's own buffer, and epoll interest in it is dropped while we cannot deliver.
use std::io::{self, ErrorKind, Read, Write};
use std::os::fd::{AsRawFd, FromRawFd};
use std::os::unix::net::UnixStream;
use std::path::Path;

use vmm_sys_util::epoll::EventSet;

/// Bytes of guest→host data we buffer per connection (our `buf_alloc`).
pub const TX_BUF_SIZE: u32 = 256 * 1024;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConnState {
    /// Host-initiated: REQUEST sent to the guest, waiting for RESPONSE.
    Connecting,
    Established,
}

pub struct Conn {
    pub stream: UnixStream,
    pub token: Option<u64>,
    pub state: ConnState,
    /// Guest→host bytes the host socket has not taken yet.
    pub tx_buf: Vec<u8>,
    pub fwd_cnt: u32,
    /// fwd_cnt as last reported to the guest.
    pub fwd_cnt_sent: u32,
    pub peer_buf_alloc: u32,
    pub peer_fwd_cnt: u32,
    /// Host→guest bytes delivered.
    pub rx_cnt: u32,
    /// The host socket may have data (or EOF) we have not read; EPOLLIN is off.
    pub rx_ready: bool,
    pub credit_requested: bool,
    /// Host bytes read before the connection was established (after the CONNECT line).
    pub rx_prefix: Vec<u8>,
    /// The guest will send no more (SHUTDOWN_SEND seen): half-close once drained.
    pub guest_done_sending: bool,
    /// The guest will receive no more, or we already told it the host hung up.
    pub rx_closed: bool,
}

impl Conn {
    pub fn new(stream: UnixStream, state: ConnState) -> Self {
        Self {
            stream,
            token: None,
            state,
            tx_buf: Vec::new(),
            fwd_cnt: 0,
            fwd_cnt_sent: 0,
            peer_buf_alloc: 0,
            peer_fwd_cnt: 0,
            rx_cnt: 0,
            rx_ready: false,
            credit_requested: false,
            rx_prefix: Vec::new(),
            guest_done_sending: false,
            rx_closed: false,
        }
    }

    /// Bytes the guest can still take.
    pub fn peer_credit(&self) -> u32 {
        let in_flight = self.rx_cnt.wrapping_sub(self.peer_fwd_cnt);
        self.peer_buf_alloc.saturating_sub(in_flight)
    }

    /// The epoll interest this connection needs now.
    pub fn interest(&self) -> EventSet {
        let mut ev = EventSet::empty();
        if self.state == ConnState::Established && !self.rx_ready && !self.rx_closed {
            ev |= EventSet::IN;
        }
        if !self.tx_buf.is_empty() {
            ev |= EventSet::OUT;
        }
        ev
    }

    /// Write as much buffered guest data as the host socket takes. Err: the host side
    /// is gone.
    pub fn flush(&mut self) -> io::Result<()> {
        let mut done = 0;
        while done < self.tx_buf.len() {
            match self.stream.write(&self.tx_buf[done..]) {
                Ok(0) => return Err(ErrorKind::WriteZero.into()),
                Ok(n) => done += n,
                Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        self.tx_buf.drain(..done);
        // Only guest payload counts toward fwd_cnt; the "OK" line is ours.
        self.fwd_cnt = self.fwd_cnt.wrapping_add(done as u32);
        if self.tx_buf.is_empty() && self.guest_done_sending {
            let _ = self.stream.shutdown(std::net::Shutdown::Write);
        }
        Ok(())
    }

    /// Read up to `max` host bytes (prefix first). Ok(empty) = EOF; WouldBlock passes
    /// through.
    pub fn read_host(&mut self, max: usize) -> io::Result<Vec<u8>> {
        if !self.rx_prefix.is_empty() {
            let n = self.rx_prefix.len().min(max);
            return Ok(self.rx_prefix.drain(..n).collect());
        }
        let mut buf = vec![0u8; max];
        loop {
            match self.stream.read(&mut buf) {
                Ok(n) => {
                    buf.truncate(n);
                    return Ok(buf);
                }
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
    }
}

/// Connect to a Unix stream socket without blocking the event thread: a listener with a
/// full backlog fails at once (EAGAIN) instead of stalling every other device.
pub fn connect_nonblocking(path: &Path) -> io::Result<UnixStream> {
    use std::os::unix::ffi::OsStrExt;
    let bytes = path.as_os_str().as_bytes();
    // SAFETY: sockaddr_un is plain data; zeroed is a valid value.
    let mut addr: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    if bytes.len() >= addr.sun_path.len() {
        return Err(io::Error::new(
            ErrorKind::InvalidInput,
            "socket path too long",
        ));
    }
    addr.sun_family = libc::AF_UNIX as libc::sa_family_t;
    for (d, s) in addr.sun_path.iter_mut().zip(bytes) {
        *d = *s as libc::c_char;
    }
    // SAFETY: plain socket creation; the fd is owned by the UnixStream below.
    let fd = unsafe {
        libc::socket(
            libc::AF_UNIX,
            libc::SOCK_STREAM | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
            0,
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: fd is a fresh socket we own.
    let stream = unsafe { UnixStream::from_raw_fd(fd) };
    let len = std::mem::size_of::<libc::sa_family_t>() + bytes.len() + 1;
    // SAFETY: addr is a valid sockaddr_un of at least `len` bytes.
    let rc = unsafe {
        libc::connect(
            stream.as_raw_fd(),
            &addr as *const libc::sockaddr_un as *const libc::sockaddr,
            len as libc::socklen_t,
        )
    };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(stream)
}
