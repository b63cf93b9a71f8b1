//! The VMM process's control loop. It runs on the process's main thread, which is also
//! the thread that forks for branch and live snapshots: the vCPU and event threads are
//! parked by then and this loop holds no locks across the fork. Connections are
//! multiplexed on this thread (`conn`), so a slow or stuck client holds only its own
//! connection; requests are handled one at a time.
use std::os::fd::{AsRawFd, FromRawFd, RawFd};
use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use vm_memory::{Bytes, GuestAddress};

pub use super::checks::{bind, BindError};
use super::checks::{check_branch, SnapshotConfinement};
use super::conn::{ConnId, Connections, Line};
pub use super::conn::{IDLE_TIMEOUT, MAX_CONNECTIONS, MAX_REQUEST_LINE};
use super::protocol::*;
use crate::devices::serial::{CallbackWriter, SerialOut};
use crate::devices::virtio::persist::DeviceHostConfig;
use crate::vmm::branch::{BranchRequest, ChildContext};
use crate::vmm::snapshot::{SnapshotError, SnapshotMode};
use crate::Vmm;

/// How often the loop looks at the guest (ended?) and reaps children while no client
/// asks anything.
const GUEST_CHECK_INTERVAL: Duration = Duration::from_millis(100);
/// How long the reply to `stop` may take to leave before the process goes anyway.
const LAST_REPLY_LIMIT: Duration = Duration::from_secs(1);

/// How a VMM process serves its socket beyond the defaults. Branch children inherit it.
#[derive(Debug, Clone, Default)]
pub struct ServeOptions {
    /// Where `snapshot` may write (see `CONTROL.md`).
    pub snapshots: SnapshotConfinement,
    /// Warm spawners to keep ready for single-child branches (0: every branch forks).
    pub warm_spawners: usize,
}

/// Where a VMM process writes why its VM ended: `<socket>.exit`.
pub fn exit_file(socket: &Path) -> PathBuf {
    let mut p = socket.as_os_str().to_owned();
    p.push(".exit");
    PathBuf::from(p)
}

/// A console sink appending to `path`, bounded ([`crate::console_log`]), or discarding
/// output when None.
pub fn console_sink(path: Option<&Path>) -> SerialOut {
    match path.and_then(|p| crate::console_log::BoundedLog::append(p).ok()) {
        Some(log) => Box::new(log),
        None => Box::new(CallbackWriter(|_: &[u8]| {})),
    }
}

/// Serve `vmm` on `socket` until it is stopped or the guest ends. Returns the process
/// exit code: 0 after a clean end or `stop`, 2 when the guest ended with an error, 1
/// when the socket cannot be bound (another process serves it, say).
pub fn serve(vmm: Vmm, socket: &Path) -> i32 {
    match bind(socket) {
        Ok(listener) => serve_listener(vmm, listener, socket, ServeOptions::default()),
        Err(e) => {
            eprintln!("zygote: {e}");
            1
        }
    }
}

/// [`serve`] on a listener already bound to `socket` (by [`bind`]); `socket` is
/// removed when serving ends.
pub fn serve_listener(vmm: Vmm, listener: UnixListener, socket: &Path, opts: ServeOptions) -> i32 {
    let mut server = Server {
        vmm: Some(vmm),
        socket: socket.to_path_buf(),
        opts,
        upkeep: super::warm::Upkeep::new(),
    };
    let code = server.run(&listener);
    let _ = std::fs::remove_file(socket);
    code
}

struct Server {
    vmm: Option<Vmm>,
    socket: PathBuf,
    opts: ServeOptions,
    /// When warm spawners were last looked after, and may next be forked.
    upkeep: super::warm::Upkeep,
}

enum Flow {
    Continue,
    Stop,
}

impl Server {
    fn run(&mut self, listener: &UnixListener) -> i32 {
        let mut conns = match Connections::new(listener) {
            Ok(c) => c,
            Err(e) => {
                eprintln!("zygote: control socket {}: {e}", self.socket.display());
                return 1;
            }
        };
        loop {
            if let Some(code) = self.check_guest_ended() {
                return code;
            }
            if let Some(vmm) = self.vmm.as_mut() {
                super::warm::maintain(vmm, &self.opts, &mut self.upkeep);
            }
            conns.poll(listener, GUEST_CHECK_INTERVAL);
            for id in conns.ready() {
                let Some(line) = conns.take_line(id) else {
                    continue;
                };
                let started = Instant::now();
                let flow = self.answer(&mut conns, id, line);
                conns.credit(started.elapsed());
                if let Flow::Stop = flow {
                    conns.finish_reply(id, LAST_REPLY_LIMIT);
                    if let Some(vmm) = self.vmm.take() {
                        vmm.shutdown();
                    }
                    return 0;
                }
            }
            conns.reap();
        }
    }

    /// Handle one line from `id` and queue its reply there.
    fn answer(&mut self, conns: &mut Connections, id: ConnId, line: Line) -> Flow {
        let (reply, flow) = match line {
            Line::TooLong => (
                Reply::err(
                    "bad_request",
                    format!(
                        "request line exceeds {MAX_REQUEST_LINE} bytes without a newline; \
                         closing the connection"
                    ),
                ),
                Flow::Continue,
            ),
            // Blank lines (keep-alives, a trailing CRLF) get no reply.
            Line::Request(bytes) if bytes.trim_ascii().is_empty() => return Flow::Continue,
            Line::Request(bytes) => match serde_json::from_slice::<Request>(&bytes) {
                Ok(req) => self.handle(req),
                Err(e) => (
                    Reply::err("bad_request", format!("invalid request: {e}")),
                    Flow::Continue,
                ),
            },
        };
        let mut out = serde_json::to_vec(&reply).unwrap_or_default();
        out.push(b'\n');
        conns.reply(id, out);
        flow
    }

    /// Reap children; when the guest has ended, record why and give the exit code.
    fn check_guest_ended(&mut self) -> Option<i32> {
        let vmm = self.vmm.as_mut()?;
        vmm.reap_children(false);
        let exit = vmm.wait(Some(Duration::ZERO))?.clone();
        let body = serde_json::json!({ "exit": exit.to_string(), "clean": exit.is_clean() });
        let _ = std::fs::write(exit_file(&self.socket), body.to_string());
        eprintln!("zygote: VM ended: {exit}");
        Some(if exit.is_clean() { 0 } else { 2 })
    }

    fn handle(&mut self, req: Request) -> (Reply, Flow) {
        let Some(vmm) = self.vmm.as_mut() else {
            return (Reply::err("stopped", "the VM has stopped"), Flow::Continue);
        };
        let reply = match req {
            Request::Status => Reply::ok(status(vmm)),
            Request::Pause => vmm
                .pause()
                .map_or_else(|e| Reply::err("stopped", e), |_| Reply::ok(status(vmm))),
            Request::Resume => vmm
                .resume()
                .map_or_else(|e| Reply::err("stopped", e), |_| Reply::ok(status(vmm))),
            Request::Branch {
                children,
                point_snapshot,
                ready_timeout_ms,
            } => {
                self.upkeep.branched();
                branch(
                    vmm,
                    &children,
                    point_snapshot.as_deref(),
                    ready_timeout_ms,
                    &self.opts,
                )
            }
            Request::Snapshot { mode, path } => snapshot(vmm, mode, &path, &self.opts),
            Request::ReadMemory { gpa, len } => {
                if len > MAX_MEMORY_IO {
                    Reply::err("bad_request", format!("len {len} exceeds {MAX_MEMORY_IO}"))
                } else {
                    let mut buf = vec![0u8; len as usize];
                    match vmm
                        .guest_ram()
                        .memory()
                        .read_slice(&mut buf, GuestAddress(gpa))
                    {
                        Ok(()) => Reply::ok(to_hex(&buf)),
                        Err(e) => Reply::err("memory", e),
                    }
                }
            }
            Request::WriteMemory { gpa, hex } => match from_hex(&hex) {
                Ok(bytes) if bytes.len() as u64 <= MAX_MEMORY_IO => {
                    match vmm
                        .guest_ram()
                        .memory()
                        .write_slice(&bytes, GuestAddress(gpa))
                    {
                        Ok(()) => Reply::ok(bytes.len()),
                        Err(e) => Reply::err("memory", e),
                    }
                }
                Ok(_) => Reply::err(
                    "bad_request",
                    format!("write exceeds {MAX_MEMORY_IO} bytes"),
                ),
                Err(e) => Reply::err("bad_request", e),
            },
            Request::Diagnose => vmm
                .diagnose()
                .map_or_else(|e| Reply::err("stopped", e), Reply::ok),
            Request::Stop => return (Reply::ok(status(vmm)), Flow::Stop),
        };
        (reply, Flow::Continue)
    }
}

fn status(vmm: &mut Vmm) -> StatusInfo {
    let exit = vmm.wait(Some(Duration::ZERO)).map(|e| e.to_string());
    StatusInfo {
        // SAFETY: getpid cannot fail.
        pid: unsafe { libc::getpid() },
        state: if exit.is_some() {
            VmRunState::Stopped
        } else if vmm.is_paused() {
            VmRunState::Paused
        } else {
            VmRunState::Running
        },
        vcpus: vmm.vcpu_count(),
        mem_mib: vmm.guest_ram().layout().mem_mib,
        exit,
        children: vmm.children().to_vec(),
        last_snapshot: vmm.last_snapshot().map(Path::to_path_buf),
        spawners: vmm.spawners_as_last_read(),
    }
}

fn branch(
    vmm: &mut Vmm,
    children: &[ChildSpec],
    point: Option<&Path>,
    timeout_ms: u64,
    opts: &ServeOptions,
) -> Reply {
    if let Err(e) = check_branch(children) {
        return Reply::err("bad_request", e);
    }
    if let Some(Err(e)) = point.map(|p| opts.snapshots.check(p)) {
        return Reply::err("bad_request", e);
    }
    // Every child's control socket is bound before the fork: it accepts connections
    // (queued until the child serves them) from the moment the branch reply names it.
    let mut listeners = Vec::with_capacity(children.len());
    for c in children {
        match bind(&c.socket) {
            Ok(l) => listeners.push(l),
            Err(e) => {
                remove_sockets(&children[..listeners.len()]);
                return Reply::err("branch_failed", e);
            }
        }
    }
    let listener_fds: Vec<RawFd> = listeners.iter().map(AsRawFd::as_raw_fd).collect();
    if let ([spec], None) = (children, point) {
        match super::warm::branch(vmm, spec, listener_fds[0], timeout_ms, opts) {
            None => {} // no spawner could take it: fork
            Some(Ok(info)) => return Reply::ok(info),
            Some(Err(e)) => {
                remove_sockets(children);
                return match e {
                    crate::vmm::warm::WarmError::Vmm(e) => Reply::err("stopped", e),
                    e => Reply::err("branch_failed", e),
                };
            }
        }
    }
    let serial = |i: usize| console_sink(children[i].console.as_deref());
    let devices = |i: usize| DeviceHostConfig {
        vsock_uds: children[i].vsock.clone(),
        net_tap: children[i].tap.clone(),
        disk_files: children[i].disk_files.clone(),
    };
    let cgroup = |i: usize| children[i].cgroup.clone();
    let netns = |i: usize| children[i].netns.clone();
    let child_main = |ctx: ChildContext| -> i32 {
        for (i, &fd) in listener_fds.iter().enumerate() {
            if i != ctx.index {
                // SAFETY: a sibling's listener, inherited; nothing in this child uses it.
                unsafe { libc::close(fd) };
            }
        }
        // SAFETY: this child's own listener fd, kept open across the fork; the parent's
        // `UnixListener` objects are never dropped in this process (it never returns).
        let listener = unsafe { UnixListener::from_raw_fd(listener_fds[ctx.index]) };
        serve_listener(ctx.vmm, listener, &children[ctx.index].socket, opts.clone())
    };
    let req = BranchRequest {
        count: children.len(),
        child_serial: &serial,
        child_devices: &devices,
        child_cgroup: &cgroup,
        child_netns: &netns,
        child_main: &child_main,
        keep_fds: listener_fds.clone(),
        ready_timeout: Duration::from_millis(timeout_ms),
    };
    let result = vmm.branch_saving_point(&req, point);
    drop(listeners);
    match result {
        Ok(r) => Reply::ok(BranchInfo {
            children: r
                .children
                .iter()
                .map(|c| ChildInfo {
                    index: c.index,
                    pid: c.pid,
                    socket: children[c.index].socket.clone(),
                    ready_ms: c.ready_after.as_secs_f64() * 1e3,
                    restore_ms: c.restore.as_secs_f64() * 1e3,
                    catch_up_ms: None,
                    state_ms: None,
                    state_bytes: None,
                })
                .collect(),
            pause_ms: r.pause.as_secs_f64() * 1e3,
            spawner: r.spawner,
            warm: false,
        }),
        Err(e) => {
            remove_sockets(children);
            match e {
                crate::vmm::branch::BranchError::Vmm(e) => Reply::err("stopped", e),
                e => Reply::err("branch_failed", e),
            }
        }
    }
}

fn snapshot(vmm: &mut Vmm, mode: SnapshotMode, path: &Path, opts: &ServeOptions) -> Reply {
    if let Err(e) = opts.snapshots.check(path) {
        return Reply::err("bad_request", e);
    }
    match vmm.snapshot(mode, path) {
        Ok(r) => Reply::ok(SnapshotInfo {
            path: r.path,
            mode: r.mode,
            pause_ms: r.pause.as_secs_f64() * 1e3,
            total_ms: r.total.as_secs_f64() * 1e3,
            pages_written: r.pages_written,
        }),
        Err(e @ SnapshotError::NoBase) => Reply::err("bad_request", e),
        // The destination appeared after the check.
        Err(SnapshotError::Persist(e)) if e.to_string().contains("already exists") => {
            Reply::err("bad_request", e)
        }
        Err(e) => Reply::err("snapshot_failed", e),
    }
}

fn remove_sockets(children: &[ChildSpec]) {
    for c in children {
        let _ = std::fs::remove_file(&c.socket);
    }
}
