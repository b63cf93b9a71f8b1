//! `pty_open`, `pty_input`, `pty_resize`: a program on a pseudo-terminal, for
//! interactive shells.
//!
//! `pty_open` runs like `exec` (`pty_started`, `output` events, one `exit`) on a
//! thread of its own, which multiplexes with `poll(2)` the pty master (output out,
//! queued keystrokes in), a wake-up pipe for new keystrokes and the reaper's exit
//! pipe. `pty_input` and `pty_resize` are answered on the connection's reader thread
//! and must never block it: input is appended to a bounded queue that the pty thread
//! writes to the master when the terminal takes it (a program that stops reading
//! fills the queue and further input is answered `busy`), and a resize is one ioctl.
//!
//! When the program ends, or the host goes away, whatever is left of its session is
//! killed: every process group of it, not only the program's (see `pty_session`).

use std::io;
use std::os::fd::OwnedFd;
use std::os::unix::process::CommandExt;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use zygote_proto::{
    ErrorBody, ErrorCode, ExecResult, PtyInputRequest, PtyOpenRequest, PtyResizeRequest, Response,
    Stream, MAX_PTYS, MAX_PTY_DIM, MAX_PTY_INPUT,
};

use crate::conn::Reply;
use crate::exec::{pollfd, read_some, retryable, set_nonblocking, write_some};
use crate::pty_session;
use crate::reaper::{self, ExitWatch};

/// Largest output chunk sent in one event.
const READ_CHUNK: usize = 64 * 1024;

/// After the program exits, how long output from processes still holding the
/// terminal is forwarded before the exit event is sent (as for `exec`).
const DRAIN_AFTER_EXIT: Duration = Duration::from_millis(250);

/// What `TERM` is when the request does not set it: what common terminal
/// emulators (and the `zygote shell` user's terminal, most likely) understand.
const DEFAULT_TERM: &str = "xterm-256color";

/// An open pty as `pty_input` and `pty_resize` reach it.
pub(crate) struct Terminal {
    master: Arc<OwnedFd>,
    /// Keystrokes the pty thread has not written to the master yet.
    pending: Mutex<Vec<u8>>,
    /// Written to (one byte) when `pending` grows; the pty thread polls the read end.
    wake: OwnedFd,
}

impl Terminal {
    fn pending(&self) -> MutexGuard<'_, Vec<u8>> {
        self.pending.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// Ptys open in the guest, over every connection, against [`MAX_PTYS`].
#[derive(Default)]
pub(crate) struct PtyCount(Arc<AtomicUsize>);

/// One open pty's place in the [`PtyCount`]; given back when dropped.
struct PtySlot(Arc<AtomicUsize>);

impl PtyCount {
    /// A place for one more pty, if the count and the agent's descriptors allow it.
    fn take(&self) -> Result<PtySlot, ErrorBody> {
        let taken = self
            .0
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| {
                (n < MAX_PTYS).then_some(n + 1)
            });
        if taken.is_err() {
            return Err(ErrorBody::new(
                ErrorCode::LimitReached,
                format!("{MAX_PTYS} terminals are open, the most the agent runs: close one first"),
            ));
        }
        let slot = PtySlot(self.0.clone());
        crate::fds::admit("pty")?;
        Ok(slot)
    }
}

impl Drop for PtySlot {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

fn bad(message: impl Into<String>) -> ErrorBody {
    ErrorBody::new(ErrorCode::BadRequest, message)
}

fn check_size(cols: u16, rows: u16) -> Result<(), ErrorBody> {
    let ok = |n: u16| (1..=MAX_PTY_DIM).contains(&n);
    if !ok(cols) || !ok(rows) {
        return Err(bad(format!(
            "terminal size {cols}x{rows}: cols and rows must be 1..={MAX_PTY_DIM}"
        )));
    }
    Ok(())
}

/// `pty_input`: queue keystrokes for the pty thread.
pub(crate) fn input(reply: &Reply, req: &PtyInputRequest) -> Result<(), ErrorBody> {
    if req.data.len() > MAX_PTY_INPUT {
        return Err(bad(format!(
            "pty_input of {} bytes: at most {MAX_PTY_INPUT} per request",
            req.data.len()
        )));
    }
    let terminal = reply.pty(req.pty_id)?;
    {
        let mut pending = terminal.pending();
        if pending.len() + req.data.len() > MAX_PTY_INPUT {
            return Err(ErrorBody::new(
                ErrorCode::Busy,
                format!(
                    "the program has not read {} bytes of earlier input yet",
                    pending.len()
                ),
            ));
        }
        pending.extend_from_slice(&req.data);
    }
    // A full pipe already holds a wake-up: EAGAIN is fine.
    let _ = write_some(&terminal.wake, &[1]);
    Ok(())
}

/// `pty_resize`: new window size, at once.
pub(crate) fn resize(reply: &Reply, req: &PtyResizeRequest) -> Result<(), ErrorBody> {
    check_size(req.cols, req.rows)?;
    let terminal = reply.pty(req.pty_id)?;
    pty_session::set_size(&terminal.master, req.cols, req.rows)
        .map_err(|e| ErrorBody::from_io("resize the pty", &e))
}

/// `pty_open`: run the program until it ends, sending every event through `reply`.
pub(crate) fn run(reply: Reply, req: PtyOpenRequest) {
    if let Err(e) = check_size(req.cols, req.rows) {
        return reply.finish(Response::Error(e));
    }
    // Held until the program's end has been answered.
    let _slot = match reply.agent().ptys.take() {
        Ok(slot) => slot,
        Err(e) => return reply.finish(Response::Error(e)),
    };
    let mut env = req.env.clone();
    env.entry("TERM".into())
        .or_insert_with(|| DEFAULT_TERM.into());
    let (argv, cwd) = if req.argv.is_empty() {
        let (shell, home) = pty_session::login_shell();
        (vec![shell, "-l".into()], req.cwd.clone().or(home))
    } else {
        (req.argv.clone(), req.cwd.clone())
    };
    let mut cmd = match crate::exec::command(&argv, &env, false, cwd.as_ref()) {
        Ok(c) => c,
        Err(e) => return reply.finish(Response::Error(e)),
    };
    if let Some(uid) = req.uid {
        cmd.uid(uid);
    }
    if let Some(gid) = req.gid {
        cmd.gid(gid);
    }
    let started = match start(&reply, &mut cmd, &req) {
        Ok(s) => s,
        Err(e) => {
            let mut body = ErrorBody::from_io(&format!("cannot start {:?} on a pty", argv[0]), &e);
            body.code = ErrorCode::SpawnFailed;
            return reply.finish(Response::Error(body));
        }
    };
    // The command holds the parent's copies of the slave: without them, the
    // master reads EIO once every process of the session has closed the terminal.
    drop(cmd);
    let Started {
        pid,
        watch,
        terminal,
        wake,
    } = started;
    let start = Instant::now();
    reply.register_exec(pid);
    reply.register_pty(terminal.clone());
    let mut session = Session {
        reply: &reply,
        pid,
        client_gone: false,
    };
    if !reply.event(Response::PtyStarted { pid: pid as u32 }) {
        session.client_gone();
    }
    let status = session.pump(&terminal, wake, watch);
    reply.unregister_pty();
    reply.unregister_exec();
    // The terminal is gone: nothing of its session stays behind (a program meant to
    // outlive it must start a session of its own, `setsid`).
    pty_session::kill_session(pid);
    let mut result = ExecResult {
        duration_ms: start.elapsed().as_millis() as u64,
        ..Default::default()
    };
    if libc::WIFEXITED(status) {
        result.exit_code = Some(libc::WEXITSTATUS(status));
    } else if libc::WIFSIGNALED(status) {
        result.signal = Some(libc::WTERMSIG(status));
    }
    reply.finish(Response::Exit(result));
}

struct Started {
    pid: libc::pid_t,
    watch: ExitWatch,
    terminal: Arc<Terminal>,
    /// Read end of the terminal's input wake-up pipe.
    wake: OwnedFd,
}

fn start(
    reply: &Reply,
    cmd: &mut std::process::Command,
    req: &PtyOpenRequest,
) -> io::Result<Started> {
    let (master, slave) = pty_session::open_pair(req.cols, req.rows)?;
    pty_session::attach(cmd, &slave)?;
    let (wake_r, wake_w) = reaper::pipe()?;
    set_nonblocking(&wake_r);
    set_nonblocking(&wake_w);
    set_nonblocking(&master);
    let (child, watch) = reply.agent().reaper.spawn(cmd)?;
    let pid = child.id() as libc::pid_t;
    // `Child` neither kills nor waits on drop; the reaper owns the wait.
    drop(child);
    let terminal = Arc::new(Terminal {
        master: Arc::new(master),
        pending: Mutex::new(Vec::new()),
        wake: wake_w,
    });
    Ok(Started {
        pid,
        watch,
        terminal,
        wake: wake_r,
    })
}

struct Session<'a> {
    reply: &'a Reply,
    pid: libc::pid_t,
    client_gone: bool,
}

impl Session<'_> {
    fn send(&mut self, r: Response) {
        if !self.client_gone && !self.reply.event(r) {
            self.client_gone();
        }
    }

    /// Nobody reads the terminal any more: end the program and its session.
    fn client_gone(&mut self) {
        if !self.client_gone {
            self.client_gone = true;
            pty_session::kill_session(self.pid);
        }
    }

    /// The poll loop; returns the program's raw wait status.
    fn pump(&mut self, terminal: &Terminal, wake: OwnedFd, watch: ExitWatch) -> libc::c_int {
        let master = terminal.master.clone();
        let mut exit_pipe = Some(watch.wake);
        let mut master_open = true;
        let mut status = None;
        let mut drain_until: Option<Instant> = None;
        let mut buf = vec![0u8; READ_CHUNK];
        loop {
            let now = Instant::now();
            if let Some(st) = status {
                if !master_open || drain_until.is_some_and(|d| now >= d) {
                    return st;
                }
            }
            let timeout_ms = match drain_until {
                Some(t) => t.saturating_duration_since(now).as_millis() as i32 + 1,
                None => -1,
            };
            let has_input = !terminal.pending().is_empty();
            let mut pfds: Vec<libc::pollfd> = Vec::with_capacity(3);
            if master_open {
                let mut events = libc::POLLIN;
                if has_input {
                    events |= libc::POLLOUT;
                }
                pfds.push(pollfd(&master, events));
            }
            pfds.push(pollfd(&wake, libc::POLLIN));
            if let Some(fd) = &exit_pipe {
                pfds.push(pollfd(fd, libc::POLLIN));
            }
            // SAFETY: `pfds` is a valid array of `pfds.len()` pollfds.
            let n =
                unsafe { libc::poll(pfds.as_mut_ptr(), pfds.len() as libc::nfds_t, timeout_ms) };
            if n <= 0 {
                continue; // timeout or EINTR: deadlines are re-checked above
            }
            let mut revents = pfds.iter().map(|p| p.revents);
            if master_open {
                let ev = revents.next().unwrap_or(0);
                if ev & libc::POLLOUT != 0 {
                    self.write_input(terminal, &master);
                }
                if ev & (libc::POLLIN | libc::POLLHUP | libc::POLLERR) != 0 {
                    match read_some(&master, &mut buf) {
                        Ok(0) => master_open = false,
                        Ok(len) => self.send(Response::Output {
                            stream: Stream::Stdout,
                            data: buf[..len].to_vec(),
                        }),
                        Err(e) if retryable(&e) => {}
                        // EIO: every process of the session closed the terminal.
                        Err(_) => master_open = false,
                    }
                }
            }
            if revents.next().unwrap_or(0) != 0 {
                // Drain the wake-ups; the queue is looked at on the next round.
                while matches!(read_some(&wake, &mut buf[..64]), Ok(n) if n > 0) {}
            }
            if exit_pipe.is_some() && revents.next().unwrap_or(0) != 0 {
                // The reaper puts the status in the channel before it closes the wake
                // pipe; a closed pipe without one (a reaper bug) counts as SIGKILL.
                status = Some(watch.status.try_recv().unwrap_or(libc::SIGKILL));
                exit_pipe = None;
                drain_until = Some(Instant::now() + DRAIN_AFTER_EXIT);
            }
        }
    }

    /// Write as much queued input as the terminal takes now.
    fn write_input(&mut self, terminal: &Terminal, master: &OwnedFd) {
        let mut pending = terminal.pending();
        match write_some(master, &pending) {
            Ok(n) => {
                pending.drain(..n);
            }
            Err(e) if retryable(&e) => {}
            // The terminal is gone (EIO): the input has nowhere to go.
            Err(_) => pending.clear(),
        }
    }
}
