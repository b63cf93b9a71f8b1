//! `exec`: run a program, stream its output as it is produced, report how it
//! ended.
//!
//! One thread per exec multiplexes, with `poll(2)`, the program's stdout and
//! stderr pipes, the stdin pipe (written non-blocking so a program that never
//! reads stdin cannot wedge us) and the reaper's wake-up pipe. No thread ever
//! blocks on a pipe that a background grandchild might hold open forever.

use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use zygote_proto::{ErrorBody, ErrorCode, ExecRequest, ExecResult, Response, Stream};

use crate::conn::Reply;
use crate::reaper::{ExitWatch, Reaper};

/// Largest output chunk sent in one event.
const READ_CHUNK: usize = 64 * 1024;

/// After the program exits, how long output from processes that inherited
/// its pipes is still forwarded before the exit event is sent.
const DRAIN_AFTER_EXIT: Duration = Duration::from_millis(250);

fn bad(message: impl Into<String>) -> ErrorBody {
    ErrorBody::new(ErrorCode::BadRequest, message)
}

/// The agent blocks SIGTERM/SIGCHLD in its own threads (as PID 1 it handles them
/// synchronously); programs it starts must begin with nothing blocked, or `kill -TERM`
/// would never reach them. Set it explicitly rather than rely on the spawn path doing so.
/// Every signal also starts at its default action: an ignored signal survives exec, so
/// an agent started with SIGINT ignored (a background job of a non-interactive shell)
/// would hand that on and Ctrl-C or `kill -INT` would never stop a program.
/// They also get the descriptor limit the agent started with, not its raised one (`fds`).
pub(crate) fn start_unblocked(cmd: &mut Command) {
    // SAFETY: only async-signal-safe calls between fork and exec.
    unsafe {
        cmd.pre_exec(|| {
            let mut empty: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut empty);
            libc::pthread_sigmask(libc::SIG_SETMASK, &empty, std::ptr::null_mut());
            for sig in 1..32 {
                if sig != libc::SIGKILL && sig != libc::SIGSTOP {
                    libc::signal(sig, libc::SIG_DFL);
                }
            }
            crate::fds::restore_for_child();
            Ok(())
        });
    }
}

/// A command for `argv` with `env` on top of the agent's environment (an empty one
/// with `clear_env`) in `cwd`, after checking what the kernel would refuse or
/// misread: an empty argv, NUL bytes, variable names with `=`. Shared by `exec` and
/// `pty_open`; stdio, process group and ids are the caller's.
pub(crate) fn command(
    argv: &[String],
    env: &std::collections::BTreeMap<String, String>,
    clear_env: bool,
    cwd: Option<&String>,
) -> Result<Command, ErrorBody> {
    let Some(program) = argv.first() else {
        return Err(bad("argv must not be empty"));
    };
    let strings = argv.iter().chain(env.keys()).chain(env.values()).chain(cwd);
    for s in strings {
        if s.contains('\0') {
            return Err(bad("argv, env and cwd must not contain NUL bytes"));
        }
    }
    if let Some(key) = env.keys().find(|k| k.is_empty() || k.contains('=')) {
        return Err(bad(format!("invalid environment variable name {key:?}")));
    }
    let mut cmd = Command::new(program);
    cmd.args(&argv[1..]);
    if clear_env {
        cmd.env_clear();
    }
    cmd.envs(env);
    if let Some(cwd) = cwd {
        cmd.current_dir(cwd);
    }
    start_unblocked(&mut cmd);
    Ok(cmd)
}

/// `req` as a command in its own process group. `stdin_pipe`: give it a stdin pipe
/// even without initial `stdin` data (a background process takes more later).
fn build_command(req: &ExecRequest, stdin_pipe: bool) -> Result<Command, ErrorBody> {
    let mut cmd = command(&req.argv, &req.env, req.clear_env, req.cwd.as_ref())?;
    if let Some(uid) = req.uid {
        cmd.uid(uid);
    }
    if let Some(gid) = req.gid {
        cmd.gid(gid);
    }
    // Own process group, so timeouts, kills and disconnects reach everything
    // the program starts, not only the program itself.
    cmd.process_group(0);
    cmd.stdin(if stdin_pipe || req.stdin.is_some() {
        Stdio::piped()
    } else {
        Stdio::null()
    });
    cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
    Ok(cmd)
}

/// A program just started, its pipes not yet read.
pub(crate) struct Started {
    pub pid: libc::pid_t,
    pub at: Instant,
    pub stdin: Option<OwnedFd>,
    pub outputs: [Option<(Stream, OwnedFd)>; 2],
    pub watch: ExitWatch,
}

/// Start `req` (see [`build_command`] for `stdin_pipe`); the reaper will collect it.
pub(crate) fn start(
    reaper: &Reaper,
    req: &ExecRequest,
    stdin_pipe: bool,
) -> Result<Started, ErrorBody> {
    let mut cmd = build_command(req, stdin_pipe)?;
    let at = Instant::now();
    let (mut child, watch) = reaper.spawn(&mut cmd).map_err(|e| {
        let mut body = ErrorBody::from_io(&format!("cannot start {:?}", req.argv[0]), &e);
        body.code = ErrorCode::SpawnFailed;
        body
    })?;
    let started = Started {
        pid: child.id() as libc::pid_t,
        at,
        stdin: child.stdin.take().map(OwnedFd::from),
        outputs: [
            child
                .stdout
                .take()
                .map(|o| (Stream::Stdout, OwnedFd::from(o))),
            child
                .stderr
                .take()
                .map(|e| (Stream::Stderr, OwnedFd::from(e))),
        ],
        watch,
    };
    // `Child` neither kills nor waits on drop; the reaper owns the wait.
    drop(child);
    Ok(started)
}

/// Run `req` to completion, sending every event through `reply`.
pub(crate) fn run(reply: Reply, req: ExecRequest) {
    let Started {
        pid,
        at: start,
        stdin,
        outputs,
        watch,
    } = match self::start(&reply.agent().reaper, &req, false) {
        Ok(s) => s,
        Err(e) => return reply.finish(Response::Error(e)),
    };
    reply.register_exec(pid);
    let mut client_gone = !reply.event(Response::ExecStarted { pid: pid as u32 });
    if client_gone {
        kill_group(pid);
    }
    // Nobody will read the output any more: stop the program rather than let it run
    // unobserved (documented protocol behaviour).
    let mut sink = |stream: Stream, data: &[u8]| {
        if client_gone {
            return;
        }
        let event = Response::Output {
            stream,
            data: data.to_vec(),
        };
        if !reply.event(event) {
            client_gone = true;
            kill_group(pid);
        }
    };
    let stdin = stdin.map(|fd| (fd, req.stdin.unwrap_or_default(), 0usize));
    let deadline = req
        .timeout_ms
        .and_then(|ms| start.checked_add(Duration::from_millis(ms)));
    let (status, timed_out) = pump(pid, outputs, stdin, watch, deadline, &mut sink);
    reply.unregister_exec();

    reply.finish(Response::Exit(exec_result(status, timed_out, start)));
}

/// How a program ended, from its wait status.
pub(crate) fn exec_result(status: libc::c_int, timed_out: bool, start: Instant) -> ExecResult {
    let mut result = ExecResult {
        exit_code: None,
        signal: None,
        timed_out,
        duration_ms: start.elapsed().as_millis() as u64,
    };
    if libc::WIFEXITED(status) {
        result.exit_code = Some(libc::WEXITSTATUS(status));
    } else if libc::WIFSIGNALED(status) {
        result.signal = Some(libc::WTERMSIG(status));
    }
    result
}

/// SIGKILL to a program's whole process group.
pub(crate) fn kill_group(pgid: libc::pid_t) {
    // SAFETY: kill(2) has no memory-safety preconditions.
    unsafe { libc::kill(-pgid, libc::SIGKILL) };
}

pub(crate) type StdinState = (OwnedFd, Vec<u8>, usize);

/// The poll loop of one program (process group `pid`): hands its output to `sink` as it
/// is read, feeds `stdin`, kills the group at `deadline`. Returns the raw wait status
/// and whether the timeout fired.
pub(crate) fn pump(
    pid: libc::pid_t,
    mut outputs: [Option<(Stream, OwnedFd)>; 2],
    mut stdin: Option<StdinState>,
    watch: ExitWatch,
    deadline: Option<Instant>,
    sink: &mut dyn FnMut(Stream, &[u8]),
) -> (libc::c_int, bool) {
    if let Some((fd, _, _)) = &stdin {
        set_nonblocking(fd);
    }
    let mut wake = Some(watch.wake);
    let mut status = None;
    let mut drain_until = None;
    let mut timed_out = false;
    let mut buf = vec![0u8; READ_CHUNK];
    loop {
        let now = Instant::now();
        if let Some(st) = status {
            if outputs.iter().all(Option::is_none) || drain_until.is_some_and(|d| now >= d) {
                return (st, timed_out);
            }
        } else if !timed_out && deadline.is_some_and(|d| now >= d) {
            kill_group(pid);
            timed_out = true;
        }
        let wait_until = if status.is_some() {
            drain_until
        } else if timed_out {
            None
        } else {
            deadline
        };
        let timeout_ms = match wait_until {
            Some(t) => t.saturating_duration_since(now).as_millis().min(60_000) as i32 + 1,
            None => -1,
        };

        let mut pfds: Vec<libc::pollfd> = Vec::with_capacity(4);
        for (_, fd) in outputs.iter().flatten() {
            pfds.push(pollfd(fd, libc::POLLIN));
        }
        if let Some((fd, _, _)) = &stdin {
            pfds.push(pollfd(fd, libc::POLLOUT));
        }
        if let Some(fd) = &wake {
            pfds.push(pollfd(fd, libc::POLLIN));
        }
        let n = unsafe { libc::poll(pfds.as_mut_ptr(), pfds.len() as libc::nfds_t, timeout_ms) };
        if n <= 0 {
            continue; // timeout or EINTR: deadlines are re-checked above
        }
        let mut ready = pfds.iter().map(|p| p.revents != 0);

        for slot in outputs.iter_mut() {
            let Some((stream, fd)) = slot else { continue };
            if !ready.next().unwrap_or(false) {
                continue;
            }
            match read_some(fd, &mut buf) {
                Ok(0) => *slot = None,
                Ok(len) => sink(*stream, &buf[..len]),
                Err(e) if retryable(&e) => {}
                Err(_) => *slot = None,
            }
        }
        if let Some((fd, data, written)) = &mut stdin {
            if ready.next().unwrap_or(false) {
                match write_some(fd, &data[*written..]) {
                    Ok(len) => *written += len,
                    Err(e) if retryable(&e) => {}
                    Err(_) => *written = data.len(), // EPIPE: the program closed stdin
                }
                if *written >= data.len() {
                    stdin = None; // closing the pipe delivers EOF
                }
            }
        }
        if wake.is_some() && ready.next().unwrap_or(false) {
            // The reaper puts the status in the channel before it closes
            // the wake pipe, so it is there now.
            // A closed pipe without a status (a reaper bug) is reported
            // as SIGKILL instead of spinning on POLLHUP forever.
            status = Some(watch.status.try_recv().unwrap_or(libc::SIGKILL));
            wake = None;
            stdin = None;
            drain_until = Some(Instant::now() + DRAIN_AFTER_EXIT);
        }
    }
}

pub(crate) fn pollfd(fd: &OwnedFd, events: libc::c_short) -> libc::pollfd {
    libc::pollfd {
        fd: fd.as_raw_fd(),
        events,
        revents: 0,
    }
}

pub(crate) fn retryable(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted
    )
}

pub(crate) fn read_some(fd: &OwnedFd, buf: &mut [u8]) -> io::Result<usize> {
    let n = unsafe { libc::read(fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(n as usize)
}

pub(crate) fn write_some(fd: &OwnedFd, data: &[u8]) -> io::Result<usize> {
    if data.is_empty() {
        return Ok(0);
    }
    let n = unsafe { libc::write(fd.as_raw_fd(), data.as_ptr().cast(), data.len()) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(n as usize)
}

pub(crate) fn set_nonblocking(fd: &OwnedFd) {
    unsafe {
        let flags = libc::fcntl(fd.as_raw_fd(), libc::F_GETFL);
        if flags >= 0 {
            libc::fcntl(fd.as_raw_fd(), libc::F_SETFL, flags | libc::O_NONBLOCK);
        }
    }
}
