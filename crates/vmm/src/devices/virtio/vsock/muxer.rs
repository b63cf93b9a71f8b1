//! The host side of virtio-vsock: guest stream connections multiplexed onto Unix
//! sockets ("hybrid vsock").
//!
//! * Host → guest: a host process connects to the VM's socket `uds_path` and writes
//!   `CONNECT <port>\n`; once the guest accepts, it reads `OK <host port>\n` and the
//!   socket carries the stream's raw bytes.
//! * Guest → host: a guest connection to port P is bridged to the Unix socket
//!   `<uds_path>_<P>`, which a host process listens on.
//!
//! The muxer speaks packets ([`Header`] + payload); the device worker moves them on and
//! off the virtqueues. Connection state lives only in this process: it is not part of
//! saved device state, and after a restore or branch every connection is gone (the
//! guest learns through a transport-reset event).
use std::collections::{HashMap, VecDeque};
use std::io::{ErrorKind, Read};
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::PathBuf;
use std::sync::{Mutex, Weak};

use vmm_sys_util::epoll::EventSet;

use super::conn::{connect_nonblocking, Conn, ConnState, TX_BUF_SIZE};
use super::packet::{op, Header, HOST_CID, SHUTDOWN_RCV, SHUTDOWN_SEND, TYPE_STREAM};
use crate::event_loop::{EventHandler, EventRegistrar};

/// Most simultaneous connections per VM; the excess is reset (guest-initiated) or closed
/// (host-initiated) at once.
pub const MAX_CONNECTIONS: usize = 1024;
/// Host sockets still sending their CONNECT line.
const MAX_PENDING: usize = 64;
/// Longest accepted `CONNECT <port>\n` line.
const MAX_CONNECT_LINE: usize = 32;
/// First local port for host-initiated connections (above the usual guest range).
const FIRST_LOCAL_PORT: u32 = 1 << 30;
/// Largest payload we put in one RX packet.
pub const MAX_PAYLOAD: usize = 64 * 1024;

/// (host-side port, guest-side port)
pub type ConnKey = (u32, u32);

/// Where the muxer registers its fds; absent in tests that poke it directly.
pub struct Poller {
    pub registrar: EventRegistrar,
    pub handler: Weak<Mutex<dyn EventHandler>>,
}

enum FdOwner {
    Listener,
    Pending,
    Conn(ConnKey),
}

struct Pending {
    stream: UnixStream,
    token: Option<u64>,
    line: Vec<u8>,
}

pub struct Muxer {
    guest_cid: u64,
    uds_path: PathBuf,
    listener: Option<(UnixListener, Option<u64>)>,
    poller: Option<Poller>,
    conns: HashMap<ConnKey, Conn>,
    pending: HashMap<RawFd, Pending>,
    fds: HashMap<RawFd, FdOwner>,
    /// Packets without payload waiting for an RX buffer: (key, op, flags).
    control: VecDeque<(ConnKey, u16, u32)>,
    /// Connections whose host socket may have data for the guest.
    rx_queue: VecDeque<ConnKey>,
    next_local_port: u32,
    /// While the guest has not handled a transport reset: host connections whose
    /// REQUEST waits (sent earlier, the reset would drop them too).
    held: Option<Vec<ConnKey>>,
    /// Connection limit ([`MAX_CONNECTIONS`]; lowered by tests).
    pub max_connections: usize,
}

impl Muxer {
    pub fn new(guest_cid: u64, uds_path: PathBuf, poller: Option<Poller>) -> Self {
        Self {
            guest_cid,
            uds_path,
            listener: None,
            poller,
            conns: HashMap::new(),
            pending: HashMap::new(),
            fds: HashMap::new(),
            control: VecDeque::new(),
            rx_queue: VecDeque::new(),
            next_local_port: FIRST_LOCAL_PORT,
            held: None,
            max_connections: MAX_CONNECTIONS,
        }
    }

    /// Hold new host connections (until [`Muxer::release_host_connections`]).
    pub fn hold_host_connections(&mut self) {
        self.held.get_or_insert_with(Vec::new);
    }

    /// Send the held connections' REQUESTs and stop holding.
    pub fn release_host_connections(&mut self) {
        for key in self.held.take().unwrap_or_default() {
            if self.conns.contains_key(&key) {
                self.control.push_back((key, op::REQUEST, 0));
            }
        }
    }

    /// Number host-side ports from a random point of their range: a restored guest may
    /// still hold connections of its former self, numbered from the start.
    pub fn randomize_local_ports(&mut self) {
        let mut r = [0u8; 4];
        // SAFETY: getrandom writes into our buffer.
        unsafe { libc::getrandom(r.as_mut_ptr().cast(), r.len(), 0) };
        self.next_local_port = FIRST_LOCAL_PORT + (u32::from_le_bytes(r) % (1 << 29));
    }

    /// Start accepting host connections on `l` (non-blocking).
    pub fn attach_listener(&mut self, l: UnixListener) {
        let fd = l.as_raw_fd();
        let token = self.register(fd, EventSet::IN);
        self.fds.insert(fd, FdOwner::Listener);
        self.listener = Some((l, token));
    }

    pub fn connection_count(&self) -> usize {
        self.conns.len()
    }

    fn register(&self, fd: RawFd, ev: EventSet) -> Option<u64> {
        let p = self.poller.as_ref()?;
        let handler = p.handler.upgrade()?;
        match p.registrar.add(fd, ev, handler) {
            Ok(t) => Some(t),
            Err(e) => {
                tracing::warn!("vsock: registering fd {fd}: {e}");
                None
            }
        }
    }

    fn unregister(&self, token: Option<u64>) {
        if let (Some(p), Some(t)) = (&self.poller, token) {
            p.registrar.remove(t);
        }
    }

    fn update_interest(&self, key: ConnKey) {
        if let (Some(p), Some(c)) = (&self.poller, self.conns.get(&key)) {
            if let Some(t) = c.token {
                let _ = p.registrar.modify(t, c.interest());
            }
        }
    }

    /// Build the header of a packet to the guest for connection `key`.
    fn header(&self, key: ConnKey, op: u16, flags: u32, len: u32) -> Header {
        let fwd_cnt = self.conns.get(&key).map_or(0, |c| c.fwd_cnt);
        Header {
            src_cid: HOST_CID,
            dst_cid: self.guest_cid,
            src_port: key.0,
            dst_port: key.1,
            len,
            kind: TYPE_STREAM,
            op,
            flags,
            buf_alloc: TX_BUF_SIZE,
            fwd_cnt,
        }
    }

    fn remove(&mut self, key: ConnKey) {
        if let Some(c) = self.conns.remove(&key) {
            self.fds.remove(&c.stream.as_raw_fd());
            self.unregister(c.token);
        }
    }

    /// Drop the connection and tell the guest.
    fn reset(&mut self, key: ConnKey) {
        self.remove(key);
        self.control.push_back((key, op::RST, 0));
    }

    /// Forget every connection (transport reset / device reset); host sockets close.
    pub fn reset_all(&mut self) {
        let keys: Vec<ConnKey> = self.conns.keys().copied().collect();
        for k in keys {
            self.remove(k);
        }
        for (fd, p) in std::mem::take(&mut self.pending) {
            self.fds.remove(&fd);
            self.unregister(p.token);
        }
        self.control.clear();
        self.rx_queue.clear();
        if let Some(held) = &mut self.held {
            held.clear();
        }
    }

    /// A packet the guest put on the TX queue.
    pub fn on_guest_packet(&mut self, h: &Header, payload: &[u8]) {
        if h.src_cid != self.guest_cid || h.dst_cid != HOST_CID {
            tracing::debug!("vsock: dropping packet {}->{}", h.src_cid, h.dst_cid);
            return;
        }
        let key = (h.dst_port, h.src_port);
        if h.kind != TYPE_STREAM {
            if h.op != op::RST {
                self.control.push_back((key, op::RST, 0));
            }
            return;
        }
        if let Some(c) = self.conns.get_mut(&key) {
            c.peer_buf_alloc = h.buf_alloc;
            c.peer_fwd_cnt = h.fwd_cnt;
        }
        match h.op {
            op::REQUEST => self.guest_connect(key, h),
            op::RESPONSE => self.guest_accepted(key),
            op::RW => self.guest_data(key, payload),
            op::CREDIT_UPDATE => self.credit_changed(key),
            op::CREDIT_REQUEST => {
                if self.conns.contains_key(&key) {
                    self.control.push_back((key, op::CREDIT_UPDATE, 0));
                } else {
                    self.control.push_back((key, op::RST, 0));
                }
            }
            op::SHUTDOWN => self.guest_shutdown(key, h.flags),
            op::RST => self.remove(key),
            _ => self.reset(key),
        }
    }

    fn guest_connect(&mut self, key: ConnKey, h: &Header) {
        if self.conns.contains_key(&key) {
            // A second REQUEST on a live connection: the guest lost track; start over.
            self.reset(key);
            return;
        }
        if self.conns.len() >= self.max_connections {
            tracing::debug!("vsock: connection limit reached; resetting {key:?}");
            self.control.push_back((key, op::RST, 0));
            return;
        }
        let path = PathBuf::from(format!("{}_{}", self.uds_path.display(), key.0));
        let stream = match connect_nonblocking(&path) {
            Ok(s) => s,
            Err(e) => {
                tracing::debug!("vsock: guest connect to {} failed: {e}", path.display());
                self.control.push_back((key, op::RST, 0));
                return;
            }
        };
        self.add_conn(key, stream, ConnState::Established);
        if let Some(c) = self.conns.get_mut(&key) {
            c.peer_buf_alloc = h.buf_alloc;
            c.peer_fwd_cnt = h.fwd_cnt;
        }
        self.control.push_back((key, op::RESPONSE, 0));
    }

    fn add_conn(&mut self, key: ConnKey, stream: UnixStream, state: ConnState) {
        let fd = stream.as_raw_fd();
        let mut c = Conn::new(stream, state);
        // Connecting: no interest until the guest answers (hang-ups still wake us).
        c.token = self.register(fd, c.interest());
        self.fds.insert(fd, FdOwner::Conn(key));
        self.conns.insert(key, c);
    }

    fn guest_accepted(&mut self, key: ConnKey) {
        let Some(c) = self.conns.get_mut(&key) else {
            self.control.push_back((key, op::RST, 0));
            return;
        };
        if c.state != ConnState::Connecting {
            self.reset(key);
            return;
        }
        c.state = ConnState::Established;
        // The reply line goes out ahead of any guest data; it is not guest payload, so
        // it must not count toward fwd_cnt: account for it up front.
        let line = format!("OK {}\n", key.0);
        c.fwd_cnt = c.fwd_cnt.wrapping_sub(line.len() as u32);
        c.tx_buf.extend_from_slice(line.as_bytes());
        if !c.rx_prefix.is_empty() {
            c.rx_ready = true;
            self.rx_queue.push_back(key);
        }
        self.flush(key);
    }

    fn guest_data(&mut self, key: ConnKey, payload: &[u8]) {
        let Some(c) = self.conns.get_mut(&key) else {
            self.control.push_back((key, op::RST, 0));
            return;
        };
        if c.state != ConnState::Established || c.guest_done_sending {
            self.reset(key);
            return;
        }
        if c.tx_buf.len() + payload.len() > TX_BUF_SIZE as usize + 64 {
            tracing::debug!("vsock: guest overran its credit on {key:?}");
            self.reset(key);
            return;
        }
        c.tx_buf.extend_from_slice(payload);
        self.flush(key);
    }

    /// Push buffered guest data to the host; report credit when half the buffer freed.
    fn flush(&mut self, key: ConnKey) {
        let Some(c) = self.conns.get_mut(&key) else {
            return;
        };
        if c.flush().is_err() {
            self.reset(key);
            return;
        }
        if c.fwd_cnt.wrapping_sub(c.fwd_cnt_sent) >= TX_BUF_SIZE / 2 {
            c.fwd_cnt_sent = c.fwd_cnt;
            self.control.push_back((key, op::CREDIT_UPDATE, 0));
        }
        self.update_interest(key);
    }

    fn credit_changed(&mut self, key: ConnKey) {
        if let Some(c) = self.conns.get_mut(&key) {
            if c.peer_credit() > 0 {
                c.credit_requested = false;
                if c.rx_ready && !self.rx_queue.contains(&key) {
                    self.rx_queue.push_back(key);
                }
            }
        }
    }

    fn guest_shutdown(&mut self, key: ConnKey, flags: u32) {
        let Some(c) = self.conns.get_mut(&key) else {
            self.control.push_back((key, op::RST, 0));
            return;
        };
        if flags & SHUTDOWN_SEND != 0 {
            c.guest_done_sending = true;
        }
        if flags & SHUTDOWN_RCV != 0 {
            c.rx_closed = true;
        }
        if c.guest_done_sending && c.rx_closed {
            // Full close: hand the host what we still hold, then confirm with RST.
            let _ = c.flush();
            self.reset(key);
        } else {
            self.flush(key);
        }
    }

    /// Readiness of one of our fds (listener, pending handshake, connection).
    pub fn on_fd_event(&mut self, fd: RawFd, ev: EventSet) {
        match self.fds.get(&fd) {
            Some(FdOwner::Listener) => self.accept_all(),
            Some(FdOwner::Pending) => self.read_connect_line(fd),
            Some(FdOwner::Conn(key)) => {
                let key = *key;
                self.conn_event(key, ev)
            }
            None => {}
        }
    }

    fn conn_event(&mut self, key: ConnKey, ev: EventSet) {
        let Some(c) = self.conns.get_mut(&key) else {
            return;
        };
        let hangup = ev.intersects(EventSet::HANG_UP | EventSet::ERROR);
        if c.state == ConnState::Connecting {
            if hangup {
                self.reset(key);
            }
            return;
        }
        if ev.contains(EventSet::OUT) {
            self.flush(key);
        }
        let Some(c) = self.conns.get_mut(&key) else {
            return;
        };
        if ev.contains(EventSet::IN) || hangup {
            c.rx_ready = true;
            if !self.rx_queue.contains(&key) {
                self.rx_queue.push_back(key);
            }
        }
        if hangup {
            // Level-triggered hang-ups cannot be masked: leave epoll for good and let
            // the RX path read what is left, then EOF.
            let token = c.token.take();
            self.unregister(token);
        } else {
            self.update_interest(key);
        }
    }

    fn accept_all(&mut self) {
        loop {
            let Some((l, _)) = &self.listener else { return };
            let stream = match l.accept() {
                Ok((s, _)) => s,
                Err(e) if e.kind() == ErrorKind::WouldBlock => return,
                Err(e) => {
                    tracing::warn!("vsock: accept failed: {e}");
                    return;
                }
            };
            if self.pending.len() >= MAX_PENDING || self.conns.len() >= self.max_connections {
                // Closing the socket is the refusal the hybrid protocol has.
                continue;
            }
            if stream.set_nonblocking(true).is_err() {
                continue;
            }
            let fd = stream.as_raw_fd();
            let token = self.register(fd, EventSet::IN);
            self.fds.insert(fd, FdOwner::Pending);
            self.pending.insert(
                fd,
                Pending {
                    stream,
                    token,
                    line: Vec::new(),
                },
            );
        }
    }

    fn read_connect_line(&mut self, fd: RawFd) {
        let Some(p) = self.pending.get_mut(&fd) else {
            return;
        };
        let mut buf = [0u8; 256];
        let n = match p.stream.read(&mut buf) {
            Ok(0) => return self.drop_pending(fd),
            Ok(n) => n,
            Err(e) if e.kind() == ErrorKind::WouldBlock || e.kind() == ErrorKind::Interrupted => {
                return
            }
            Err(_) => return self.drop_pending(fd),
        };
        p.line.extend_from_slice(&buf[..n]);
        let Some(nl) = p.line.iter().position(|&b| b == b'\n') else {
            if p.line.len() > MAX_CONNECT_LINE {
                self.drop_pending(fd);
            }
            return;
        };
        let port = std::str::from_utf8(&p.line[..nl])
            .ok()
            .and_then(|l| l.trim_end_matches('\r').strip_prefix("CONNECT "))
            .and_then(|p| p.trim().parse::<u32>().ok());
        let Some(port) = port.filter(|_| nl <= MAX_CONNECT_LINE) else {
            return self.drop_pending(fd);
        };
        if self.conns.len() >= self.max_connections {
            return self.drop_pending(fd);
        }
        let p = self.pending.remove(&fd).expect("checked above");
        self.fds.remove(&fd);
        self.unregister(p.token);
        let local = self.alloc_local_port(port);
        let key = (local, port);
        self.add_conn(key, p.stream, ConnState::Connecting);
        if let Some(c) = self.conns.get_mut(&key) {
            c.rx_prefix = p.line[nl + 1..].to_vec();
        }
        match &mut self.held {
            Some(held) => held.push(key),
            None => self.control.push_back((key, op::REQUEST, 0)),
        }
    }

    fn drop_pending(&mut self, fd: RawFd) {
        if let Some(p) = self.pending.remove(&fd) {
            self.fds.remove(&fd);
            self.unregister(p.token);
        }
    }

    pub(crate) fn alloc_local_port(&mut self, guest_port: u32) -> u32 {
        loop {
            let p = self.next_local_port;
            self.next_local_port = self
                .next_local_port
                .checked_add(1)
                .unwrap_or(FIRST_LOCAL_PORT);
            if !self.conns.contains_key(&(p, guest_port)) {
                return p;
            }
        }
    }

    /// Treat every fd as readable and writable (tests drive the muxer without epoll;
    /// handlers cope with spurious readiness).
    #[cfg(test)]
    pub fn poll_all(&mut self) {
        let fds: Vec<RawFd> = self.fds.keys().copied().collect();
        for fd in fds {
            self.on_fd_event(fd, EventSet::IN | EventSet::OUT);
        }
    }

    /// Whether a packet is waiting for an RX buffer.
    pub fn has_rx(&self) -> bool {
        !self.control.is_empty() || !self.rx_queue.is_empty()
    }

    /// The next packet for the guest, with at most `max_payload` bytes of data.
    pub fn next_rx(&mut self, max_payload: usize) -> Option<(Header, Vec<u8>)> {
        if let Some((key, op, flags)) = self.control.pop_front() {
            if let Some(c) = self.conns.get_mut(&key) {
                c.fwd_cnt_sent = c.fwd_cnt;
            }
            return Some((self.header(key, op, flags, 0), Vec::new()));
        }
        let max_payload = max_payload.min(MAX_PAYLOAD);
        for _ in 0..self.rx_queue.len() {
            let key = self.rx_queue.pop_front()?;
            if let Some(pkt) = self.read_for_guest(key, max_payload) {
                return Some(pkt);
            }
        }
        None
    }

    /// One RX packet from connection `key`'s host socket, if it can make one.
    fn read_for_guest(&mut self, key: ConnKey, max_payload: usize) -> Option<(Header, Vec<u8>)> {
        let c = self.conns.get_mut(&key)?;
        if !c.rx_ready || c.rx_closed || c.state != ConnState::Established {
            return None;
        }
        let credit = c.peer_credit() as usize;
        if credit == 0 {
            if c.credit_requested {
                return None; // stays out of rx_queue until a credit update
            }
            c.credit_requested = true;
            return Some((self.header(key, op::CREDIT_REQUEST, 0, 0), Vec::new()));
        }
        match c.read_host(credit.min(max_payload).max(1)) {
            Ok(data) if data.is_empty() => {
                // Host EOF: the host will neither send nor receive any more.
                c.rx_closed = true;
                c.rx_ready = false;
                self.update_interest(key);
                Some((
                    self.header(key, op::SHUTDOWN, SHUTDOWN_RCV | SHUTDOWN_SEND, 0),
                    Vec::new(),
                ))
            }
            Ok(data) => {
                c.rx_cnt = c.rx_cnt.wrapping_add(data.len() as u32);
                c.fwd_cnt_sent = c.fwd_cnt;
                self.rx_queue.push_back(key);
                Some((self.header(key, op::RW, 0, data.len() as u32), data))
            }
            Err(e) if e.kind() == ErrorKind::WouldBlock => {
                c.rx_ready = false;
                self.update_interest(key);
                None
            }
            Err(_) => {
                self.reset(key);
                self.control
                    .pop_back()
                    .map(|(k, o, f)| (self.header(k, o, f, 0), Vec::new()))
            }
        }
    }
}

impl Drop for Muxer {
    fn drop(&mut self) {
        self.reset_all();
        if let Some((_, token)) = self.listener.take() {
            self.unregister(token);
        }
    }
}
