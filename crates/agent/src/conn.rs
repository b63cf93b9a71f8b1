//! One client connection: read frames, validate them, run each request on
//! its own thread, and serialise responses onto the shared socket.
//!
//! Once the agent has a token (`auth`), a connection must open with `hello`; every
//! `hello` starts a new session: the earlier session's execs are killed, its unfinished
//! requests forgotten and anything they still send dropped. On a socket that changes
//! nothing (one connection, one session); on a virtio-serial port, whose one stream
//! carries one host connection after another, it is what keeps a new daemon connection
//! from receiving (or being blamed for) the previous one's output.

use std::collections::{HashMap, HashSet};
use std::fs::File;
use std::io::{self, Read};
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread;
use std::time::Duration;

use serde_json::Value;
use zygote_proto::frame::{self, FrameError};
use zygote_proto::{
    ErrorBody, ErrorCode, HelloRequest, Request, Response, ResponseFrame, MAX_FRAME_LEN,
};

use crate::{dispatch, log, AgentState};

/// Unfinished requests allowed per connection before `busy`.
pub const MAX_INFLIGHT: usize = 256;

/// A peer that accepts no data for this long is treated as gone, so one
/// stuck client cannot pin exec threads forever.
const SEND_TIMEOUT: Duration = Duration::from_secs(60);

#[derive(Default)]
struct State {
    inflight: HashSet<u64>,
    /// Running execs of this connection: request id → process group id.
    execs: HashMap<u64, libc::pid_t>,
    /// Open ptys of this connection (also in `execs`): request id → its terminal.
    ptys: HashMap<u64, Arc<crate::pty::Terminal>>,
    /// Running watches of this connection: request id → its stop flag.
    watches: HashMap<u64, Arc<AtomicBool>>,
    closed: bool,
    /// A `hello` with the right token opened the current session.
    authenticated: bool,
    /// The current session (bumped by each `hello`); replies of older ones are dropped.
    session: u64,
}

pub(crate) struct Conn {
    agent: Arc<AgentState>,
    name: String,
    writer: Mutex<File>,
    /// Kept to shut the socket down from any thread.
    sock: OwnedFd,
    broken: AtomicBool,
    state: Mutex<State>,
}

impl State {
    /// End every watch of the connection (its client is gone, or a new session began).
    fn stop_watches(&mut self) {
        for (_, stop) in self.watches.drain() {
            stop.store(true, Ordering::SeqCst);
        }
    }
}

impl Conn {
    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Send one frame for a request of `session`. False when the peer is gone (and then
    /// the connection is shut down, which also ends its reader loop) or the session is
    /// over (its client is gone: the frame is dropped).
    fn write(&self, session: u64, id: u64, response: Response) -> bool {
        if self.broken.load(Ordering::Relaxed) || self.state().session != session {
            return false;
        }
        let mut bytes = serde_json::to_vec(&ResponseFrame { id, response }).unwrap_or_else(|e| {
            let body = ErrorBody::new(ErrorCode::Internal, format!("cannot encode response: {e}"));
            error_bytes(id, body)
        });
        if bytes.len() > MAX_FRAME_LEN {
            let body = ErrorBody::new(
                ErrorCode::ResponseTooLarge,
                format!("response of {} bytes exceeds the frame limit", bytes.len()),
            );
            bytes = error_bytes(id, body);
        }
        let result = {
            let mut w = self.writer.lock().unwrap_or_else(|p| p.into_inner());
            frame::write_frame(&mut *w, &bytes)
        };
        if result.is_err() {
            self.broken.store(true, Ordering::Relaxed);
            unsafe { libc::shutdown(self.sock.as_raw_fd(), libc::SHUT_RDWR) };
            return false;
        }
        true
    }

    /// An error frame in the current session.
    fn error(&self, id: u64, code: ErrorCode, message: impl Into<String>) {
        let session = self.state().session;
        self.write(session, id, Response::Error(ErrorBody::new(code, message)));
    }

    /// `hello`: on the right token, end the current session (kill its execs, forget its
    /// requests) and start an authenticated one.
    fn hello(&self, id: u64, req: &HelloRequest) {
        if let Err(e) = self.agent.token.hello(req) {
            log!("connection {}: hello refused: {}", self.name, e.message);
            return self.error(id, e.code, e.message);
        }
        let session = {
            let mut st = self.state();
            for &pgid in st.execs.values() {
                // SAFETY: kill(2) has no memory-safety preconditions.
                unsafe { libc::kill(-pgid, libc::SIGKILL) };
            }
            st.execs.clear();
            st.ptys.clear();
            st.stop_watches();
            st.inflight.clear();
            st.session += 1;
            st.authenticated = true;
            st.session
        };
        self.write(session, id, Response::Ok);
    }

    /// The reader is done: kill this connection's running execs (their output
    /// has nowhere to go) and refuse new ones.
    fn hang_up(&self) {
        let mut st = self.state();
        st.closed = true;
        st.stop_watches();
        for &pgid in st.execs.values() {
            unsafe { libc::kill(-pgid, libc::SIGKILL) };
        }
    }
}

fn error_bytes(id: u64, body: ErrorBody) -> Vec<u8> {
    serde_json::to_vec(&ResponseFrame {
        id,
        response: Response::Error(body),
    })
    .expect("error frames always encode")
}

/// Where a request handler sends its events and its single terminal response.
/// Dropping a `Reply` without finishing it (a handler bug or panic) answers
/// with an `internal` error, so the client is never left waiting.
pub(crate) struct Reply {
    conn: Arc<Conn>,
    /// The session the request came in.
    session: u64,
    id: u64,
    done: bool,
}

impl Reply {
    pub(crate) fn agent(&self) -> &AgentState {
        &self.conn.agent
    }

    /// A non-terminal event; false if the client is gone.
    pub(crate) fn event(&self, r: Response) -> bool {
        self.conn.write(self.session, self.id, r)
    }

    /// Forget this request's id, if its session is still the current one.
    fn release(&self) {
        let mut st = self.conn.state();
        if st.session == self.session {
            st.inflight.remove(&self.id);
        }
    }

    /// The terminal response.
    pub(crate) fn finish(mut self, r: Response) {
        self.done = true;
        // Free the id first: once the client sees this frame it may reuse it.
        self.release();
        self.conn.write(self.session, self.id, r);
    }

    pub(crate) fn register_exec(&self, pgid: libc::pid_t) {
        let mut st = self.conn.state();
        if st.closed || st.session != self.session {
            // The client left (or a new session began) while we were spawning.
            // SAFETY: kill(2) has no memory-safety preconditions.
            unsafe { libc::kill(-pgid, libc::SIGKILL) };
            return;
        }
        st.execs.insert(self.id, pgid);
    }

    pub(crate) fn unregister_exec(&self) {
        let mut st = self.conn.state();
        if st.session == self.session {
            st.execs.remove(&self.id);
        }
    }

    /// Make this request's pty reachable by `pty_input` and `pty_resize`.
    pub(crate) fn register_pty(&self, terminal: Arc<crate::pty::Terminal>) {
        let mut st = self.conn.state();
        if !st.closed && st.session == self.session {
            st.ptys.insert(self.id, terminal);
        }
    }

    pub(crate) fn unregister_pty(&self) {
        let mut st = self.conn.state();
        if st.session == self.session {
            st.ptys.remove(&self.id);
        }
    }

    /// The open pty `pty_id` of this connection.
    pub(crate) fn pty(&self, pty_id: u64) -> Result<Arc<crate::pty::Terminal>, ErrorBody> {
        self.conn.state().ptys.get(&pty_id).cloned().ok_or_else(|| {
            ErrorBody::new(
                ErrorCode::NotFound,
                format!("no open pty with id {pty_id} on this connection"),
            )
        })
    }

    /// Make this request's watch reachable by `unwatch`; a client already gone stops it.
    pub(crate) fn register_watch(&self, stop: Arc<AtomicBool>) {
        let mut st = self.conn.state();
        if st.closed || st.session != self.session {
            stop.store(true, Ordering::SeqCst);
            return;
        }
        st.watches.insert(self.id, stop);
    }

    pub(crate) fn unregister_watch(&self) {
        let mut st = self.conn.state();
        if st.session == self.session {
            st.watches.remove(&self.id);
        }
    }

    /// End the watch `watch_id` of this connection (it answers `ok` when it has).
    pub(crate) fn stop_watch(&self, watch_id: u64) -> Result<(), ErrorBody> {
        let st = self.conn.state();
        let Some(stop) = st.watches.get(&watch_id) else {
            return Err(ErrorBody::new(
                ErrorCode::NotFound,
                format!("no running watch with id {watch_id} on this connection"),
            ));
        };
        stop.store(true, Ordering::SeqCst);
        Ok(())
    }

    /// Signal another exec of the same connection.
    pub(crate) fn signal_exec(&self, exec_id: u64, sig: i32) -> Result<(), ErrorBody> {
        let st = self.conn.state();
        let Some(&pgid) = st.execs.get(&exec_id) else {
            return Err(ErrorBody::new(
                ErrorCode::NotFound,
                format!("no running exec with id {exec_id} on this connection"),
            ));
        };
        if unsafe { libc::kill(-pgid, sig) } != 0 {
            let e = io::Error::last_os_error();
            return Err(ErrorBody::from_io(&format!("kill exec {exec_id}"), &e));
        }
        Ok(())
    }
}

impl Drop for Reply {
    fn drop(&mut self) {
        if !self.done {
            self.release();
            let body = ErrorBody::new(
                ErrorCode::Internal,
                "request handler ended without answering",
            );
            self.conn
                .write(self.session, self.id, Response::Error(body));
        }
    }
}

fn set_send_timeout(fd: &OwnedFd, t: Duration) {
    let tv = libc::timeval {
        tv_sec: t.as_secs() as _,
        tv_usec: 0,
    };
    // Fails harmlessly on non-sockets (e.g. pipes in tests).
    unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_SNDTIMEO,
            (&tv as *const libc::timeval).cast(),
            std::mem::size_of::<libc::timeval>() as libc::socklen_t,
        )
    };
}

/// How a served stream ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Ended {
    /// At a frame boundary (end of file, or a transport error).
    Clean,
    /// Inside a frame (oversize or truncated): what follows on the same byte stream is
    /// not at a frame boundary. A socket is simply closed; a virtio-serial port, whose
    /// stream the next host connection continues, must be drained first (`port`).
    Desynced,
}

/// What carries the connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Channel {
    /// A socket: one connection, closed when it ends.
    Socket,
    /// A virtio-serial port: the next host connection writes and reads the same device,
    /// so nothing of this one may reach it once it has ended.
    Port,
}

/// Serve one connection until the peer closes it. Runs on the caller's thread.
pub(crate) fn serve(agent: Arc<AgentState>, stream: OwnedFd, name: String) -> io::Result<()> {
    let reader = File::from(stream.try_clone()?);
    serve_from(agent, stream, reader, name, Channel::Socket).map(|_| ())
}

/// [`serve`], reading frames from `reader` (which decides when the stream has ended).
pub(crate) fn serve_from(
    agent: Arc<AgentState>,
    stream: OwnedFd,
    mut reader: impl Read,
    name: String,
    channel: Channel,
) -> io::Result<Ended> {
    set_send_timeout(&stream, SEND_TIMEOUT);
    let writer = File::from(stream.try_clone()?);
    let conn = Arc::new(Conn {
        agent,
        name,
        writer: Mutex::new(writer),
        sock: stream,
        broken: AtomicBool::new(false),
        state: Mutex::new(State::default()),
    });
    // None: the peer closed cleanly at a frame boundary.
    let failure = loop {
        match frame::read_frame(&mut reader, MAX_FRAME_LEN) {
            Ok(Some(bytes)) => handle_frame(&conn, &bytes),
            Ok(None) => break None,
            Err(e @ FrameError::TooLarge { .. }) => {
                conn.error(0, ErrorCode::FrameTooLarge, e.to_string());
                break Some((e.to_string(), Ended::Desynced));
            }
            Err(e @ FrameError::Truncated { .. }) => {
                conn.error(0, ErrorCode::TruncatedFrame, e.to_string());
                break Some((e.to_string(), Ended::Desynced));
            }
            Err(FrameError::Io(e)) => break Some((format!("read error: {e}"), Ended::Clean)),
        }
    };
    conn.hang_up();
    let ended = match failure {
        Some((why, ended)) => {
            log!("connection {}: {why}", conn.name);
            // Stop reading and writing: the stream is out of sync.
            unsafe { libc::shutdown(conn.sock.as_raw_fd(), libc::SHUT_RDWR) };
            ended
        }
        None => Ended::Clean,
    };
    if channel == Channel::Port {
        // Answers of requests still running would reach the next host connection:
        // drop them, and wait for a frame being written now to be out in full, so that
        // the next connection's frames never interleave with it.
        conn.broken.store(true, Ordering::Relaxed);
        drop(conn.writer.lock().unwrap_or_else(|p| p.into_inner()));
    }
    Ok(ended)
}

/// Validate one frame and start its request. Every problem is answered with
/// an error frame; none ends the connection (framing is still intact).
fn handle_frame(conn: &Arc<Conn>, bytes: &[u8]) {
    let value: Value = match serde_json::from_slice(bytes) {
        Ok(v) => v,
        Err(e) => return conn.error(0, ErrorCode::MalformedFrame, format!("invalid JSON: {e}")),
    };
    let Some(obj) = value.as_object() else {
        return conn.error(0, ErrorCode::MalformedFrame, "frame is not a JSON object");
    };
    let Some(id) = obj.get("id").and_then(Value::as_u64) else {
        return conn.error(
            0,
            ErrorCode::MalformedFrame,
            "frame has no unsigned integer \"id\"",
        );
    };
    let Some(kind) = obj.get("type").and_then(Value::as_str) else {
        return conn.error(
            id,
            ErrorCode::MalformedFrame,
            "frame has no string \"type\"",
        );
    };
    if !Request::TYPES.contains(&kind) {
        return conn.error(
            id,
            ErrorCode::UnknownRequest,
            format!("unknown request type {kind:?}"),
        );
    }
    let kind = kind.to_string();
    let request: Request = match serde_json::from_value(value) {
        Ok(r) => r,
        Err(e) => return conn.error(id, ErrorCode::BadRequest, format!("{kind}: {e}")),
    };
    if id == 0 {
        return conn.error(0, ErrorCode::BadRequest, "id 0 is reserved");
    }
    if let Request::Hello(hello) = &request {
        return conn.hello(id, hello);
    }
    let session = {
        let mut st = conn.state();
        if !st.authenticated && conn.agent.token.is_set() {
            drop(st);
            return conn.error(
                id,
                ErrorCode::Unauthorized,
                "this connection has not said hello with the sandbox's token",
            );
        }
        if st.inflight.contains(&id) {
            drop(st);
            return conn.error(
                id,
                ErrorCode::DuplicateId,
                format!("id {id} is already in use"),
            );
        }
        if st.inflight.len() >= MAX_INFLIGHT {
            drop(st);
            return conn.error(
                id,
                ErrorCode::Busy,
                format!("more than {MAX_INFLIGHT} unfinished requests"),
            );
        }
        st.inflight.insert(id);
        st.session
    };
    let reply = Reply {
        conn: conn.clone(),
        session,
        id,
        done: false,
    };
    if dispatch::is_quick(&request) {
        dispatch::handle(reply, request);
        return;
    }
    // If the thread cannot be created the closure (and the Reply in it) is
    // dropped, which answers with an `internal` error.
    let spawned = thread::Builder::new()
        .name(format!("req-{kind}"))
        .spawn(move || dispatch::handle(reply, request));
    if let Err(e) = spawned {
        log!("connection {}: cannot start a thread: {e}", conn.name);
    }
}
