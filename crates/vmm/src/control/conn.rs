//! The control socket's connections, multiplexed on the VMM's main thread with poll(2)
//! over non-blocking sockets. A client that connects and sends nothing, sends half a
//! line, or never reads its replies only holds its own connection: the loop never waits
//! on one client, so every other client's requests are still answered at once. No
//! thread is added to the VMM for this: the main thread forks for branch and live
//! snapshots, and an extra thread running at fork time could hold a lock the child
//! inherits (see `vmm::branch`).
//!
//! Memory is bounded: a request line may be at most [`MAX_REQUEST_LINE`] bytes (longer
//! ones get an error reply and the connection is closed), a connection reads no further
//! request while its reply is unsent, and at most [`MAX_CONNECTIONS`] are open at once.
use std::io::{self, Read};
use std::os::fd::AsRawFd;
use std::os::unix::net::{UnixListener, UnixStream};
use std::time::{Duration, Instant};

/// Longest request line, newline excluded. This is the bound on what parsing one
/// request may cost, whatever it holds: a `branch` request's child count in particular
/// is bounded by it alone here (how many children to ask for is the daemon's limit, and
/// only the daemon reaches this socket). The largest legitimate requests:
/// `write_memory` of its 1 MiB limit is 2 MiB of hex plus a few dozen bytes, and a
/// `branch` of the daemon's 256 children whose cgroup and netns paths are each PATH_MAX
/// (4096) long, with their sockets and console in a directory as long as the 108-byte
/// `sun_path` allows, is about 2.1 MiB (the daemon's kvm runtime tests check it fits).
pub const MAX_REQUEST_LINE: usize = 4 << 20;
/// Most connections open at once. When all are taken, a new connection replaces the
/// one that has been idle longest (a stuck client cannot keep a slot from a new one).
pub const MAX_CONNECTIONS: usize = 16;
/// A connection on which nothing moved (no byte read or written) for this long is
/// closed, whether it is between requests, in the middle of one, or has a reply the
/// client does not read. Time the server spends on other clients' requests is not
/// counted against it.
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(10);

const READ_CHUNK: usize = 64 << 10;
/// A drained buffer that grew beyond this is shrunk back, so one large request does not
/// pin its memory for the connection's life.
const KEEP_CAPACITY: usize = 64 << 10;

/// What a connection has ready for the server.
pub enum Line {
    /// One request line, newline excluded.
    Request(Vec<u8>),
    /// The client sent more than [`MAX_REQUEST_LINE`] bytes without a newline.
    TooLong,
}

struct Conn {
    stream: UnixStream,
    input: Vec<u8>,
    /// Prefix of `input` known to hold no newline.
    scanned: usize,
    output: Vec<u8>,
    written: usize,
    last_progress: Instant,
    /// The client shut its sending side.
    eof: bool,
    /// Close once `output` is sent (after a too-long line).
    close_after_reply: bool,
    /// The socket failed; drop it.
    broken: bool,
}

impl Conn {
    fn new(stream: UnixStream, now: Instant) -> io::Result<Self> {
        stream.set_nonblocking(true)?;
        Ok(Self {
            stream,
            input: Vec::new(),
            scanned: 0,
            output: Vec::new(),
            written: 0,
            last_progress: now,
            eof: false,
            close_after_reply: false,
            broken: false,
        })
    }

    fn newline(&mut self) -> Option<usize> {
        match self.input[self.scanned..].iter().position(|&b| b == b'\n') {
            Some(i) => Some(self.scanned + i),
            None => {
                self.scanned = self.input.len();
                None
            }
        }
    }

    fn replying(&self) -> bool {
        self.written < self.output.len()
    }

    /// Whether the server has something to act on here (and must not wait in poll).
    fn line_ready(&mut self) -> bool {
        if self.replying() || self.close_after_reply || self.broken {
            return false;
        }
        self.newline().is_some()
            || self.input.len() > MAX_REQUEST_LINE
            || (self.eof && !self.input.is_empty())
    }

    fn interest(&mut self) -> libc::c_short {
        if self.replying() {
            libc::POLLOUT
        } else if self.eof || self.close_after_reply || self.broken || self.line_ready() {
            0
        } else {
            libc::POLLIN
        }
    }

    /// Read what the client sent, until a newline or the line limit.
    fn read(&mut self, now: Instant) {
        let mut chunk = [0u8; READ_CHUNK];
        while self.input.len() <= MAX_REQUEST_LINE {
            match self.stream.read(&mut chunk) {
                Ok(0) => {
                    self.eof = true;
                    return;
                }
                Ok(n) => {
                    self.last_progress = now;
                    self.input.extend_from_slice(&chunk[..n]);
                    if chunk[..n].contains(&b'\n') {
                        return;
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(_) => {
                    self.broken = true;
                    return;
                }
            }
        }
    }

    /// Send as much of the reply as the socket takes.
    fn flush(&mut self, now: Instant) {
        while self.replying() {
            match send(&self.stream, &self.output[self.written..]) {
                Ok(0) => {
                    self.broken = true;
                    return;
                }
                Ok(n) => {
                    self.written += n;
                    self.last_progress = now;
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(_) => {
                    self.broken = true;
                    return;
                }
            }
        }
        self.output.clear();
        self.written = 0;
        shrink(&mut self.output);
    }

    fn take_line(&mut self) -> Option<Line> {
        if !self.line_ready() {
            return None;
        }
        let end = match self.newline() {
            Some(i) if i <= MAX_REQUEST_LINE => i,
            None if self.input.len() <= MAX_REQUEST_LINE => self.input.len(),
            _ => {
                self.input = Vec::new();
                self.scanned = 0;
                self.close_after_reply = true;
                return Some(Line::TooLong);
            }
        };
        let rest = self.input.split_off((end + 1).min(self.input.len()));
        let mut line = std::mem::replace(&mut self.input, rest);
        line.truncate(end);
        self.scanned = 0;
        shrink(&mut self.input);
        Some(Line::Request(line))
    }

    fn done(&self, now: Instant) -> bool {
        self.broken
            || now.duration_since(self.last_progress) >= IDLE_TIMEOUT
            || (!self.replying() && (self.close_after_reply || (self.eof && self.input.is_empty())))
    }
}

/// write(2) on a socket whose peer has gone raises SIGPIPE, which kills a process that
/// left it at its default; send(2) with MSG_NOSIGNAL reports EPIPE instead.
fn send(stream: &UnixStream, buf: &[u8]) -> io::Result<usize> {
    // SAFETY: `buf` is valid for `buf.len()` bytes; the descriptor is ours.
    let n = unsafe {
        libc::send(
            stream.as_raw_fd(),
            buf.as_ptr().cast(),
            buf.len(),
            libc::MSG_NOSIGNAL | libc::MSG_DONTWAIT,
        )
    };
    if n < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(n as usize)
    }
}

fn shrink(buf: &mut Vec<u8>) {
    if buf.capacity() > KEEP_CAPACITY {
        buf.shrink_to(KEEP_CAPACITY.max(buf.len()));
    }
}

/// Handle of a connection within one round of [`Connections::lines`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnId(usize);

pub struct Connections {
    conns: Vec<Conn>,
}

impl Connections {
    /// Serve connections from `listener`, which is made non-blocking.
    pub fn new(listener: &UnixListener) -> io::Result<Self> {
        listener.set_nonblocking(true)?;
        Ok(Self { conns: Vec::new() })
    }

    pub fn len(&self) -> usize {
        self.conns.len()
    }

    pub fn is_empty(&self) -> bool {
        self.conns.is_empty()
    }

    /// Wait up to `timeout` for something to do (returning at once when a line is
    /// already waiting), then accept new connections and move bytes both ways.
    pub fn poll(&mut self, listener: &UnixListener, timeout: Duration) {
        let mut ready_now = false;
        let mut fds = vec![libc::pollfd {
            fd: listener.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        }];
        let mut owners = Vec::new();
        for (i, c) in self.conns.iter_mut().enumerate() {
            ready_now |= c.line_ready();
            let events = c.interest();
            if events != 0 {
                fds.push(libc::pollfd {
                    fd: c.stream.as_raw_fd(),
                    events,
                    revents: 0,
                });
                owners.push(i);
            }
        }
        let timeout_ms = if ready_now {
            0
        } else {
            timeout.as_millis().min(i32::MAX as u128) as i32
        };
        // SAFETY: `fds` is a valid array of pollfd for descriptors we own.
        let n = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, timeout_ms) };
        if n <= 0 {
            return;
        }
        let now = Instant::now();
        for (pfd, &i) in fds[1..].iter().zip(&owners) {
            if pfd.revents == 0 {
                continue;
            }
            let c = &mut self.conns[i];
            if c.replying() {
                c.flush(now);
            } else {
                c.read(now);
            }
        }
        if fds[0].revents != 0 {
            self.accept(listener, now);
        }
    }

    fn accept(&mut self, listener: &UnixListener, now: Instant) {
        loop {
            let stream = match listener.accept() {
                Ok((s, _)) => s,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(_) => {
                    // Out of descriptors or similar: back off instead of spinning on a
                    // listener that stays readable.
                    std::thread::sleep(Duration::from_millis(10));
                    return;
                }
            };
            if self.conns.len() >= MAX_CONNECTIONS && !self.evict_idlest() {
                refuse_busy(stream);
                continue;
            }
            if let Ok(c) = Conn::new(stream, now) {
                self.conns.push(c);
            }
        }
    }

    /// Close the connection idle longest that has no request waiting to be handled.
    fn evict_idlest(&mut self) -> bool {
        let victim = self
            .conns
            .iter_mut()
            .enumerate()
            .filter_map(|(i, c)| (!c.line_ready()).then_some((i, c.last_progress)))
            .min_by_key(|&(_, t)| t)
            .map(|(i, _)| i);
        victim.map(|i| self.conns.swap_remove(i)).is_some()
    }

    /// Connections with a line ready: at most one line per connection per round, so
    /// a client that pipelines many requests cannot starve the others.
    pub fn ready(&mut self) -> Vec<ConnId> {
        (0..self.conns.len())
            .filter(|&i| self.conns[i].line_ready())
            .map(ConnId)
            .collect()
    }

    pub fn take_line(&mut self, id: ConnId) -> Option<Line> {
        self.conns.get_mut(id.0)?.take_line()
    }

    /// Queue `reply` on the connection and send what the socket takes now.
    pub fn reply(&mut self, id: ConnId, reply: Vec<u8>) {
        let Some(c) = self.conns.get_mut(id.0) else {
            return;
        };
        c.output = reply;
        c.written = 0;
        c.flush(Instant::now());
    }

    /// Wait up to `limit` for the reply on `id` to be sent (the last reply before the
    /// process exits).
    pub fn finish_reply(&mut self, id: ConnId, limit: Duration) {
        let deadline = Instant::now() + limit;
        let Some(c) = self.conns.get_mut(id.0) else {
            return;
        };
        while c.replying() && !c.broken {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return;
            }
            let mut pfd = libc::pollfd {
                fd: c.stream.as_raw_fd(),
                events: libc::POLLOUT,
                revents: 0,
            };
            // SAFETY: polling one descriptor we own.
            unsafe { libc::poll(&mut pfd, 1, left.as_millis().max(1) as i32) };
            c.flush(Instant::now());
        }
    }

    /// Don't count `busy` (the server handling a request) against anyone's idle time.
    pub fn credit(&mut self, busy: Duration) {
        let now = Instant::now();
        for c in &mut self.conns {
            c.last_progress = (c.last_progress + busy).min(now);
        }
    }

    /// Close connections that are finished, broken or idle too long. Call after the
    /// round's lines are handled: it renumbers connections.
    pub fn reap(&mut self) {
        let now = Instant::now();
        self.conns.retain(|c| !c.done(now));
    }
}

/// Tell a client over the connection limit why it is turned away (best effort: the
/// socket is fresh, so the short line fits its buffer) and close.
fn refuse_busy(stream: UnixStream) {
    let reply = super::protocol::Reply::err(
        "busy",
        format!("the VMM already serves {MAX_CONNECTIONS} control connections"),
    );
    let mut line = serde_json::to_vec(&reply).unwrap_or_default();
    line.push(b'\n');
    let _ = send(&stream, &line);
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    fn pair() -> (Conn, UnixStream) {
        let (a, b) = UnixStream::pair().unwrap();
        (Conn::new(a, Instant::now()).unwrap(), b)
    }

    fn request(l: Option<Line>) -> Vec<u8> {
        match l {
            Some(Line::Request(v)) => v,
            Some(Line::TooLong) => panic!("too long"),
            None => panic!("no line"),
        }
    }

    #[test]
    fn lines_are_split_and_a_half_line_waits() {
        let (mut c, mut peer) = pair();
        peer.write_all(b"{\"op\":\"status\"}\n{\"op\":").unwrap();
        c.read(Instant::now());
        assert_eq!(request(c.take_line()), b"{\"op\":\"status\"}");
        assert!(c.take_line().is_none(), "half a line is not a request");
        assert!(!c.done(Instant::now()));
        peer.write_all(b"\"pause\"}").unwrap();
        peer.shutdown(std::net::Shutdown::Write).unwrap();
        c.read(Instant::now());
        // At end of input the last line needs no newline.
        assert_eq!(request(c.take_line()), b"{\"op\":\"pause\"}");
        assert!(c.done(Instant::now()));
    }

    #[test]
    fn an_endless_line_is_cut_off_at_the_limit() {
        let (mut c, peer) = pair();
        let writer = std::thread::spawn(move || {
            let mut peer = peer;
            let junk = vec![b'x'; 1 << 20];
            let mut sent = 0usize;
            while peer.write_all(&junk).is_ok() {
                sent += junk.len();
                if sent > 64 << 20 {
                    break;
                }
            }
            sent
        });
        let mut taken = None;
        for _ in 0..100_000 {
            c.read(Instant::now());
            if let Some(l) = c.take_line() {
                taken = Some(l);
                break;
            }
            std::thread::sleep(Duration::from_micros(100));
        }
        assert!(matches!(taken, Some(Line::TooLong)));
        assert!(c.input.capacity() == 0, "the partial line is dropped");
        drop(c);
        let sent = writer.join().unwrap();
        assert!(sent <= 2 * MAX_REQUEST_LINE, "sent {sent} bytes");
    }

    #[test]
    fn a_reply_the_client_does_not_read_stays_queued_without_blocking() {
        let (mut c, _peer) = pair();
        let big = vec![b'y'; 8 << 20];
        let t = Instant::now();
        c.output = big;
        c.flush(Instant::now());
        assert!(t.elapsed() < Duration::from_secs(1));
        assert!(c.replying(), "the socket cannot take 8 MiB");
        assert_eq!(c.interest(), libc::POLLOUT);
        assert!(c.done(Instant::now() + IDLE_TIMEOUT), "closed once idle");
    }
}
