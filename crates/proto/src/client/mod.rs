//! Blocking client for the agent protocol (std only; async callers wrap it in
//! their runtime's blocking pool).
//!
//! One connection carries any number of concurrent requests. A reader thread
//! owns the receiving half of the stream and routes each response frame by id
//! to the caller waiting for it; callers share the sending half behind a mutex.
//! [`AgentClient`] is cheap to clone (all clones share the connection) and is
//! `Send + Sync`, so two threads can run execs over it at the same time.

mod exec;
mod files;
mod process;
mod pty;
mod transport;

use std::collections::HashMap;
use std::io::{self, Read, Write};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread;
use std::time::{Duration, Instant};

pub use exec::{ExecHandle, ExecOutput};
pub use pty::{PtyControl, PtyHandle};
pub use transport::ReadWrite;

use crate::frame::{self, FrameError, MAX_FRAME_LEN};
use crate::{
    ErrorBody, ErrorCode, ExecRequest, ExecResult, HealthInfo, HelloRequest, KillRequest,
    PtyOpenRequest, ReidentifyReport, ReidentifyRequest, Request, RequestFrame, Response,
    ResponseFrame, Stream,
};

/// Default limit on how long a non-exec request waits for its response.
pub const DEFAULT_REQUEST_TIMEOUT: Duration = Duration::from_secs(60);

/// Everything that can go wrong talking to the agent.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("cannot connect to {target}: {source}")]
    Connect { target: String, source: io::Error },
    #[error("vsock handshake failed: {0}")]
    Handshake(String),
    #[error("i/o error: {0}")]
    Io(#[from] io::Error),
    #[error("connection closed: {0}")]
    Closed(String),
    #[error("no response to {what} within {after:?}")]
    Timeout { what: &'static str, after: Duration },
    #[error("agent error {0}")]
    Agent(ErrorBody),
    #[error("protocol violation: {0}")]
    Protocol(String),
    #[error("request of {len} bytes exceeds the {max}-byte frame limit")]
    RequestTooLarge { len: usize, max: usize },
    #[error("cannot encode request: {0}")]
    Encode(#[from] serde_json::Error),
}

impl ClientError {
    /// The agent's error code, when the agent answered with an error.
    pub fn code(&self) -> Option<ErrorCode> {
        match self {
            ClientError::Agent(body) => Some(body.code),
            _ => None,
        }
    }

    /// The transport failed before the agent answered (not listening yet, connection
    /// dropped or closed before any reply): trying again on a new connection may work.
    /// An answer the agent gave (an error, a protocol violation) is final.
    pub fn is_transient(&self) -> bool {
        matches!(
            self,
            ClientError::Connect { .. }
                | ClientError::Handshake(_)
                | ClientError::Io(_)
                | ClientError::Closed(_)
        )
    }
}

/// Routing table shared with the reader thread.
#[derive(Default)]
struct Routes {
    waiting: HashMap<u64, Sender<Response>>,
    /// Set once the connection is dead; why.
    closed: Option<String>,
}

struct Shared {
    routes: Mutex<Routes>,
}

impl Shared {
    fn routes(&self) -> MutexGuard<'_, Routes> {
        // A panic while holding this lock cannot leave the map inconsistent
        // (every critical section is a single insert/remove), so poisoning is ignored.
        self.routes.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn close(&self, why: String) {
        let mut routes = self.routes();
        if routes.closed.is_none() {
            routes.closed = Some(why);
        }
        // Dropping the senders wakes every waiter with a disconnect.
        routes.waiting.clear();
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
        });
        let reader_shared = shared.clone();
        let spawned = thread::Builder::new()
            .name("zygote-client-reader".into())
            .spawn(move || read_loop(reader, &reader_shared));
        if let Err(e) = spawned {
            shared.close(format!("cannot start reader thread: {e}"));
        }
        AgentClient {
            conn: Arc::new(Conn {
                writer: Mutex::new(writer),
                closer: Mutex::new(closer),
                shared,
                next_id: AtomicU64::new(1),
            }),
            request_timeout: Some(DEFAULT_REQUEST_TIMEOUT),
        }
    }

    /// This handle with a different limit for non-exec requests (`None`: wait forever).
    pub fn with_request_timeout(mut self, timeout: Option<Duration>) -> Self {
        self.request_timeout = timeout;
        self
    }

    /// Close the connection for every clone of this client: pending and
    /// future requests fail with [`ClientError::Closed`]; the agent kills
    /// the connection's running execs.
    pub fn close(&self) {
        let closer = self.conn.closer.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(c) = closer.as_ref() {
            let _ = c.shutdown_rw();
        }
        self.conn.shared.close("closed by the client".into());
    }

    /// Whether the connection is still usable.
    pub fn is_closed(&self) -> bool {
        self.conn.shared.routes().closed.is_some()
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
                return Err(ClientError::Closed(why.clone()));
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
        let why = self.conn.shared.routes().closed.clone();
        ClientError::Closed(why.unwrap_or_else(|| "reader stopped".into()))
    }

    /// Wait for the next response on `rx`, up to `timeout`.
    fn recv(
        &self,
        id: u64,
        rx: &Receiver<Response>,
        timeout: Option<Duration>,
        what: &'static str,
    ) -> Result<Response, ClientError> {
        let got = match timeout {
            Some(t) => rx.recv_timeout(t),
            None => rx.recv().map_err(|_| RecvTimeoutError::Disconnected),
        };
        match got {
            Ok(Response::Error(body)) => Err(ClientError::Agent(body)),
            Ok(r) => Ok(r),
            Err(RecvTimeoutError::Timeout) => {
                self.forget(id);
                Err(ClientError::Timeout {
                    what,
                    after: timeout.unwrap_or_default(),
                })
            }
            Err(RecvTimeoutError::Disconnected) => Err(self.closed_error()),
        }
    }

    /// One request, one response.
    fn call(&self, request: Request, what: &'static str) -> Result<Response, ClientError> {
        let (id, rx) = self.send(request)?;
        self.recv(id, &rx, self.request_timeout, what)
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
        let (hello_id, hello_rx) = self.send(Request::Hello(hello))?;
        let (re_id, re_rx) = self.send(Request::Reidentify(req))?;
        let said_hello = self.recv(hello_id, &hello_rx, self.request_timeout, "hello");
        let reidentified = self.recv(re_id, &re_rx, self.request_timeout, "reidentify");
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

    /// Start a program; returns once the agent reports it running (or why it
    /// could not start). Drive it with [`ExecHandle::wait`].
    pub fn spawn_exec(&self, req: ExecRequest) -> Result<ExecHandle, ClientError> {
        let exec_timeout = req.timeout_ms.map(Duration::from_millis);
        let (id, rx) = self.send(Request::Exec(req))?;
        match self.recv(id, &rx, self.request_timeout, "exec") {
            Ok(Response::ExecStarted { pid }) => {
                Ok(ExecHandle::new(self.clone(), id, pid, rx, exec_timeout))
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
        match self.recv(id, &rx, self.request_timeout, "pty_open") {
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
    ClientError::Protocol(format!("unexpected response to {what}: {got:?}"))
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
        let bytes = match frame::read_frame(&mut reader, MAX_FRAME_LEN) {
            Ok(Some(b)) => b,
            Ok(None) => break "agent closed the connection".to_string(),
            Err(FrameError::Io(e)) => break format!("read failed: {e}"),
            Err(e) => break format!("bad frame from agent: {e}"),
        };
        let frame: ResponseFrame = match serde_json::from_slice(&bytes) {
            Ok(f) => f,
            Err(e) => break format!("undecodable response from agent: {e}"),
        };
        if frame.id == 0 {
            if let Response::Error(body) = frame.response {
                complaint = Some(format!("agent reported {body}"));
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
    shared.close(match complaint {
        Some(c) => format!("{why} ({c})"),
        None => why,
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
