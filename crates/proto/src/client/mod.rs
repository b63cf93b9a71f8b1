//! Blocking client for the agent protocol (std only; async callers wrap it in
//! their runtime's blocking pool).
//!
//! One connection carries any number of concurrent requests. A reader thread
//! owns the receiving half of the stream and routes each response frame by id
//! to the caller waiting for it; callers share the sending half behind a mutex.
//! [`AgentClient`] is cheap to clone (all clones share the connection) and is
//! `Send + Sync`, so two threads can run execs over it at the same time.
//!
//! Nothing the agent sends is trusted, its silence included: every wait has a deadline
//! or a liveness check (`wait`), and a reply that does not decode ends the connection
//! as [`ClientError::Malformed`] (`inbound`). Why a connection ended stays readable
//! ([`AgentClient::close_cause`]), which is how the daemon shows an agent's health.

mod error;
mod exec;
mod files;
mod inbound;
mod process;
mod pty;
mod transport;
mod wait;
mod watch;

use std::collections::HashMap;
use std::io::{Read, Write};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread;
use std::time::{Duration, Instant};

pub use error::{ClientError, CloseCause};
pub use exec::{ExecHandle, ExecOutput};
pub use inbound::{read_response, InboundError};
pub use pty::{PtyControl, PtyHandle};
pub use transport::ReadWrite;
pub use wait::{Liveness, EXEC_GRACE, LIVENESS_INTERVAL, PROBE_TIMEOUT};
pub use watch::{WatchHandle, WatchNext};

use crate::frame::{self, MAX_FRAME_LEN};
use crate::{
    ErrorCode, ExecRequest, ExecResult, HealthInfo, HelloRequest, KillRequest, PtyOpenRequest,
    ReidentifyReport, ReidentifyRequest, Request, RequestFrame, Response, Stream,
};

/// Default limit on how long a non-exec request waits for its response (a silent
/// agent is noticed earlier, by the liveness check: see `wait`).
pub const DEFAULT_REQUEST_TIMEOUT: Duration = Duration::from_secs(60);

/// Routing table shared with the reader thread.
#[derive(Default)]
struct Routes {
    waiting: HashMap<u64, Sender<Response>>,
    /// Set once the connection is dead; why.
    closed: Option<CloseCause>,
}

struct Shared {
    routes: Mutex<Routes>,
    /// When the reader last received a frame (any frame: the agent is alive).
    last_heard: Mutex<Instant>,
}

impl Shared {
    fn routes(&self) -> MutexGuard<'_, Routes> {
        // A panic while holding this lock cannot leave the map inconsistent
        // (every critical section is a single insert/remove), so poisoning is ignored.
        self.routes.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn close(&self, why: CloseCause) {
        let mut routes = self.routes();
        if routes.closed.is_none() {
            routes.closed = Some(why);
        }
        // Dropping the senders wakes every waiter with a disconnect.
        routes.waiting.clear();
    }

    fn heard(&self) {
        *self.last_heard.lock().unwrap_or_else(|p| p.into_inner()) = Instant::now();
    }

    fn heard_within(&self, d: Duration) -> bool {
        self.last_heard
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .elapsed()
            < d
    }
}

struct Conn {
    writer: Mutex<Box<dyn Write + Send>>,
    /// Handle used to shut the stream down when the last client clone drops,
    /// which also ends the reader thread.
    closer: Mutex<Option<Box<dyn ReadWrite>>>,
    shared: Arc<Shared>,
    next_id: AtomicU64,
}

impl Drop for Conn {
    fn drop(&mut self) {
        let closer = self.closer.get_mut().unwrap_or_else(|p| p.into_inner());
        if let Some(c) = closer {
            let _ = c.shutdown_rw();
        }
    }
}

/// A connection to one agent. See the module docs.
#[derive(Clone)]
pub struct AgentClient {
    conn: Arc<Conn>,
    request_timeout: Option<Duration>,
    /// How a silent agent is checked while waiting (None: not at all; see `wait`).
    liveness: Option<Liveness>,
}

impl AgentClient {
    /// Connect over TCP (e.g. QEMU user networking's `hostfwd`).
    pub fn connect_tcp(addr: &str, timeout: Duration) -> Result<Self, ClientError> {
        Self::from_stream(Box::new(transport::tcp(addr, timeout)?))
    }

    /// Connect to an agent listening on a Unix socket.
    pub fn connect_unix(path: impl AsRef<Path>) -> Result<Self, ClientError> {
        Self::from_stream(Box::new(transport::unix(path.as_ref())?))
    }

    /// Connect through a hybrid-vsock Unix socket: `CONNECT <port>\n`, expect
    /// `OK <n>\n`, then speak the protocol. The handshake reply must arrive
    /// within 10 seconds.
    pub fn connect_vsock_uds(path: impl AsRef<Path>, port: u32) -> Result<Self, ClientError> {
        let stream = transport::vsock_uds(path.as_ref(), port, Duration::from_secs(10))?;
        Self::from_stream(Box::new(stream))
    }

    /// Run the protocol over an already-connected stream.
    pub fn from_stream(stream: Box<dyn ReadWrite>) -> Result<Self, ClientError> {
        let reader = stream.try_clone_rw()?;
        let closer = stream.try_clone_rw()?;
        // Double boxing turns `Box<dyn ReadWrite>` into the narrower trait objects.
        Ok(Self::start(
            Box::new(reader),
            Box::new(stream),
            Some(closer),
        ))
    }

    /// Run the protocol over separate read and write halves (pipes, a child's
    /// stdio, …). The reader thread ends when `reader` reaches EOF.
    pub fn from_split(reader: Box<dyn Read + Send>, writer: Box<dyn Write + Send>) -> Self {
        Self::start(reader, writer, None)
    }

    fn start(
        reader: Box<dyn Read + Send>,
        writer: Box<dyn Write + Send>,
        closer: Option<Box<dyn ReadWrite>>,
    ) -> Self {
        let shared = Arc::new(Shared {
            routes: Mutex::new(Routes::default()),
            last_heard: Mutex::new(Instant::now()),
        });
        let reader_shared = shared.clone();
        let spawned = thread::Builder::new()
            .name("zygote-client-reader".into())
            .spawn(move || read_loop(reader, &reader_shared));
        if let Err(e) = spawned {
            shared.close(CloseCause::Lost(format!("cannot start reader thread: {e}")));
        }
        AgentClient {
            conn: Arc::new(Conn {
                writer: Mutex::new(writer),
                closer: Mutex::new(closer),
                shared,
                next_id: AtomicU64::new(first_id()),
            }),
            request_timeout: Some(DEFAULT_REQUEST_TIMEOUT),
            liveness: Some(Liveness::default()),
        }
    }

    /// This handle with a different limit for non-exec requests (`None`: wait forever).
    pub fn with_request_timeout(mut self, timeout: Option<Duration>) -> Self {
        self.request_timeout = timeout;
        self
    }

    /// This handle with other timings for checking a silent agent, or without the
    /// check (None). Off while a guest boots: its agent cannot answer anything yet, and
    /// the request's own timeout is the limit then.
    pub fn with_liveness(mut self, liveness: Option<Liveness>) -> Self {
        self.liveness = liveness;
        self
    }

    /// Close the connection for every clone of this client: pending and
    /// future requests fail with [`ClientError::Closed`]; the agent kills
    /// the connection's running execs.
    pub fn close(&self) {
        self.close_with(CloseCause::Client);
    }

    /// Close the connection for every clone, recording `cause`.
    fn close_with(&self, cause: CloseCause) {
        // The cause first: the shutdown wakes the reader, whose own reason is only kept
        // if none is recorded yet.
        self.conn.shared.close(cause);
        let closer = self.conn.closer.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(c) = closer.as_ref() {
            let _ = c.shutdown_rw();
        }
    }

    /// Whether the connection is still usable.
    pub fn is_closed(&self) -> bool {
        self.conn.shared.routes().closed.is_some()
    }

    /// Why the connection ended (None while it is open).
    pub fn close_cause(&self) -> Option<CloseCause> {
        self.conn.shared.routes().closed.clone()
    }

    /// Send `request` and return its id and the channel its responses arrive on.
    fn send(&self, request: Request) -> Result<(u64, Receiver<Response>), ClientError> {
        let id = self.conn.next_id.fetch_add(1, Ordering::Relaxed);
        let payload = serde_json::to_vec(&RequestFrame { id, request })?;
        if payload.len() > MAX_FRAME_LEN {
            return Err(ClientError::RequestTooLarge {
                len: payload.len(),
                max: MAX_FRAME_LEN,
            });
        }
        let (tx, rx) = mpsc::channel();
        {
            let mut routes = self.conn.shared.routes();
            if let Some(why) = &routes.closed {
                return Err(why.error());
            }
            routes.waiting.insert(id, tx);
        }
        let written = {
            let mut w = self.conn.writer.lock().unwrap_or_else(|p| p.into_inner());
            frame::write_frame(&mut *w, &payload)
        };
        if let Err(e) = written {
            self.forget(id);
            return Err(ClientError::Io(e));
        }
        Ok((id, rx))
    }

    /// Stop routing responses for `id` (the caller gave up on it).
    fn forget(&self, id: u64) {
        self.conn.shared.routes().waiting.remove(&id);
    }

    /// Stop waiting for a running exec or pty `id` and kill its process group, fire
    /// and forget (a drop must not block on the agent's answer).
    fn abandon(&self, id: u64) {
        self.forget(id);
        let kill = Request::Kill(KillRequest {
            exec_id: id,
            signal: libc::SIGKILL,
        });
        if let Ok((kill_id, _rx)) = self.send(kill) {
            self.forget(kill_id);
        }
    }

    fn closed_error(&self) -> ClientError {
        match &self.conn.shared.routes().closed {
            Some(cause) => cause.error(),
            None => ClientError::Closed("reader stopped".into()),
        }
    }

    /// One request, one response.
    fn call(&self, request: Request, what: &'static str) -> Result<Response, ClientError> {
        let (id, rx) = self.send(request)?;
        self.recv(id, &rx, self.request_deadline(), what)
    }

    /// When a request sent now stops being waited for.
    fn request_deadline(&self) -> Option<Instant> {
        self.request_timeout.map(|t| Instant::now() + t)
    }

    /// Authenticate this connection with `token` (and replace the agent's token with
    /// `new_token`); see [`crate::HelloRequest`]. An agent older than `hello` (a
    /// snapshot taken before it existed) answers `unknown_request` and needs none: Ok.
    pub fn hello(&self, token: &str, new_token: Option<&str>) -> Result<(), ClientError> {
        let req = hello_request(token, new_token);
        hello_answer(self.call(Request::Hello(req), "hello"))
    }

    /// [`AgentClient::hello`] and [`AgentClient::reidentify`] in one round trip: both
    /// frames go out before either answer is awaited (the agent handles `hello` before
    /// it reads the next frame, so the second request is already authenticated).
    pub fn hello_and_reidentify(
        &self,
        token: &str,
        new_token: Option<&str>,
        req: ReidentifyRequest,
    ) -> Result<ReidentifyReport, ClientError> {
        let hello = hello_request(token, new_token);
        let deadline = self.request_deadline();
        let (hello_id, hello_rx) = self.send(Request::Hello(hello))?;
        let (re_id, re_rx) = self.send(Request::Reidentify(req))?;
        let said_hello = self.recv(hello_id, &hello_rx, deadline, "hello");
        let reidentified = self.recv(re_id, &re_rx, deadline, "reidentify");
        hello_answer(said_hello)?;
        match reidentified? {
            Response::Reidentified(r) => Ok(r),
            other => Err(unexpected("reidentify", &other)),
        }
    }

    pub fn health(&self) -> Result<HealthInfo, ClientError> {
        match self.call(Request::Health, "health")? {
            Response::Health(h) => Ok(h),
            other => Err(unexpected("health", &other)),
        }
    }

    /// The guest's resource counters now (see [`crate::stats`]); the guest's word only.
    pub fn stats(&self) -> Result<crate::stats::GuestStats, ClientError> {
        match self.call(Request::Stats, "stats")? {
            Response::Stats(s) => Ok(s),
            other => Err(unexpected("stats", &other)),
        }
    }

    /// Start a program; returns once the agent reports it running (or why it
    /// could not start). Drive it with [`ExecHandle::wait`].
    pub fn spawn_exec(&self, req: ExecRequest) -> Result<ExecHandle, ClientError> {
        // The exec's own limit, counted from now, plus slack for the agent to enforce it.
        let grace = self.liveness.map_or(EXEC_GRACE, |l| l.exec_grace);
        let deadline = req
            .timeout_ms
            .map(|ms| Instant::now() + Duration::from_millis(ms) + grace);
        let start_deadline = match (self.request_deadline(), deadline) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        let (id, rx) = self.send(Request::Exec(req))?;
        match self.recv(id, &rx, start_deadline, "exec") {
            Ok(Response::ExecStarted { pid }) => {
                Ok(ExecHandle::new(self.clone(), id, pid, rx, deadline))
            }
            Ok(other) => {
                self.forget(id);
                Err(unexpected("exec", &other))
            }
            Err(e) => Err(e),
        }
    }

    /// Start a program on a new pty; returns once the agent reports it running (or
    /// why it could not start). Drive it with [`PtyHandle::wait`] and a [`PtyControl`].
    pub fn open_pty(&self, req: PtyOpenRequest) -> Result<PtyHandle, ClientError> {
        let (id, rx) = self.send(Request::PtyOpen(req))?;
        match self.recv(id, &rx, self.request_deadline(), "pty_open") {
            Ok(Response::PtyStarted { pid }) => Ok(PtyHandle::new(self.clone(), id, pid, rx)),
            Ok(other) => {
                self.forget(id);
                Err(unexpected("pty_open", &other))
            }
            Err(e) => Err(e),
        }
    }

    /// Run a program to completion, handing each output chunk to `on_output`
    /// as it arrives.
    pub fn exec(
        &self,
        req: ExecRequest,
        on_output: impl FnMut(Stream, &[u8]),
    ) -> Result<ExecResult, ClientError> {
        self.spawn_exec(req)?.wait(on_output)
    }

    /// Run a program to completion and collect its output.
    pub fn exec_output(&self, req: ExecRequest) -> Result<ExecOutput, ClientError> {
        let mut out = ExecOutput::default();
        out.result = self.exec(req, |stream, data| match stream {
            Stream::Stdout => out.stdout.extend_from_slice(data),
            Stream::Stderr => out.stderr.extend_from_slice(data),
        })?;
        Ok(out)
    }

    /// Signal the process group of exec `exec_id` (an id from [`ExecHandle::id`]).
    pub fn kill(&self, exec_id: u64, signal: i32) -> Result<(), ClientError> {
        expect_ok(
            "kill",
            self.call(Request::Kill(KillRequest { exec_id, signal }), "kill")?,
        )
    }

    /// New entropy, hostname and clock after a branch/restore.
    pub fn reidentify(&self, req: ReidentifyRequest) -> Result<ReidentifyReport, ClientError> {
        match self.call(Request::Reidentify(req), "reidentify")? {
            Response::Reidentified(r) => Ok(r),
            other => Err(unexpected("reidentify", &other)),
        }
    }

    /// Ask a PID-1 agent to sync and reboot (QEMU with `-no-reboot` exits).
    /// The agent answers before acting, so `Ok` means "accepted".
    pub fn shutdown(&self) -> Result<(), ClientError> {
        expect_ok("shutdown", self.call(Request::Shutdown, "shutdown")?)
    }
}

/// Retry connecting to `addr` over TCP and asking for `health` until it
/// answers or `deadline` passes (used while a VM boots: with QEMU's user
/// networking the forwarded port accepts connections before the guest
/// listens, so a connect alone proves nothing).
pub fn wait_healthy(addr: &str, deadline: Instant) -> Result<AgentClient, ClientError> {
    wait_healthy_with(deadline, |timeout| AgentClient::connect_tcp(addr, timeout))
}

/// [`wait_healthy`] over any transport: `connect` is called with the time
/// left (capped at 5 s) for each attempt.
pub fn wait_healthy_with(
    deadline: Instant,
    mut connect: impl FnMut(Duration) -> Result<AgentClient, ClientError>,
) -> Result<AgentClient, ClientError> {
    const ATTEMPT: Duration = Duration::from_secs(5);
    const PAUSE: Duration = Duration::from_millis(100);
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let attempt = left.min(ATTEMPT).max(Duration::from_millis(50));
        let err = match connect(attempt) {
            Ok(client) => {
                let probe = client.clone().with_request_timeout(Some(attempt));
                match probe.health() {
                    Ok(_) => return Ok(client),
                    Err(e) => e,
                }
            }
            Err(e) => e,
        };
        if Instant::now() + PAUSE >= deadline {
            return Err(err);
        }
        thread::sleep(PAUSE);
    }
}

fn hello_request(token: &str, new_token: Option<&str>) -> HelloRequest {
    HelloRequest {
        token: token.to_string(),
        new_token: new_token.map(str::to_string),
    }
}

fn hello_answer(got: Result<Response, ClientError>) -> Result<(), ClientError> {
    match got {
        Ok(Response::Ok) => Ok(()),
        // An agent from before `hello` authenticates nobody: nothing to present.
        Err(e) if e.code() == Some(ErrorCode::UnknownRequest) => Ok(()),
        Ok(other) => Err(unexpected("hello", &other)),
        Err(e) => Err(e),
    }
}

fn unexpected(what: &str, got: &Response) -> ClientError {
    // Bounded: a response can hold megabytes (file data, listings).
    let mut shown = format!("{got:?}");
    if shown.len() > 200 {
        let mut cut = 200;
        while !shown.is_char_boundary(cut) {
            cut -= 1;
        }
        shown.truncate(cut);
        shown.push('…');
    }
    ClientError::Malformed(format!("unexpected response to {what}: {shown}"))
}

/// The first request id of a connection: random (below 2^40, well inside JavaScript's
/// safe integers), so a frame a previous connection's request left in a shared channel
/// (a virtio-serial port carries one connection after another) cannot pass as the
/// answer to this one's.
fn first_id() -> u64 {
    let mut bytes = [0u8; 8];
    // SAFETY: getrandom writes at most bytes.len() bytes into bytes.
    let got = unsafe { libc::getrandom(bytes.as_mut_ptr().cast(), bytes.len(), 0) };
    if got != bytes.len() as isize {
        return 1;
    }
    (u64::from_le_bytes(bytes) >> 24).max(1)
}

fn expect_ok(what: &str, got: Response) -> Result<(), ClientError> {
    match got {
        Response::Ok => Ok(()),
        other => Err(unexpected(what, &other)),
    }
}

/// The reader thread: route frames until the stream ends.
fn read_loop(mut reader: Box<dyn Read + Send>, shared: &Shared) {
    // Connection-level complaints (id 0) about something we sent; the latest
    // becomes the close reason if the agent then hangs up.
    let mut complaint: Option<String> = None;
    let why = loop {
        let frame = match read_response(&mut reader) {
            Ok(Some(f)) => f,
            Ok(None) => break CloseCause::Lost("agent closed the connection".into()),
            Err(e) if e.is_transport() => break CloseCause::Lost(format!("read failed: {e}")),
            Err(e) => break CloseCause::Malformed(e.to_string()),
        };
        shared.heard();
        if frame.id == 0 {
            if let Response::Error(body) = frame.response {
                let hangs_up = matches!(
                    body.code,
                    ErrorCode::FrameTooLarge | ErrorCode::TruncatedFrame
                );
                complaint = Some(format!("agent reported {body}"));
                if hangs_up {
                    // The agent no longer trusts the stream and drops it: so do we,
                    // rather than wait for answers that will not come.
                    break CloseCause::Lost("the agent dropped the connection".into());
                }
            }
            continue;
        }
        let mut routes = shared.routes();
        let terminal = frame.response.is_terminal();
        let delivered = match routes.waiting.get(&frame.id) {
            Some(tx) => tx.send(frame.response).is_ok(),
            None => true, // nobody waits (timed out / dropped): discard
        };
        if terminal || !delivered {
            routes.waiting.remove(&frame.id);
        }
    };
    shared.close(match (why, complaint) {
        (CloseCause::Lost(why), Some(c)) => CloseCause::Lost(format!("{why} ({c})")),
        (why, _) => why,
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn client_is_shareable_across_threads() {
        fn check<T: Send + Sync + Clone>() {}
        check::<AgentClient>();
    }
}
