//! The VMM process's control loop. It runs on the process's main thread, which is also
//! the thread that forks for branch and live snapshots: the vCPU and event threads are
//! parked by then and this loop holds no locks across the fork.
use std::collections::HashSet;
use std::io::{BufRead, BufReader, Write};
use std::os::fd::{AsRawFd, FromRawFd, RawFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::time::Duration;

use vm_memory::{Bytes, GuestAddress};

use super::protocol::*;
use crate::devices::serial::{CallbackWriter, SerialOut};
use crate::devices::virtio::persist::DeviceHostConfig;
use crate::vmm::branch::{BranchRequest, ChildContext};
use crate::vmm::snapshot::SnapshotError;
use crate::Vmm;

/// Most children one branch request may ask for.
pub const MAX_BRANCH_COUNT: usize = 1024;
const IDLE_CONNECTION_TIMEOUT: Duration = Duration::from_secs(10);

/// Where a VMM process writes why its VM ended: `<socket>.exit`.
pub fn exit_file(socket: &Path) -> PathBuf {
    let mut p = socket.as_os_str().to_owned();
    p.push(".exit");
    PathBuf::from(p)
}

/// A console sink writing to `path` (appending), or discarding output when None.
pub fn console_sink(path: Option<&Path>) -> SerialOut {
    match path.and_then(|p| {
        std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(p)
            .ok()
    }) {
        Some(f) => Box::new(f),
        None => Box::new(CallbackWriter(|_: &[u8]| {})),
    }
}

fn bind(socket: &Path) -> std::io::Result<UnixListener> {
    match UnixListener::bind(socket) {
        Ok(l) => Ok(l),
        Err(e) if e.kind() == std::io::ErrorKind::AddrInUse => {
            // A stale socket file (nobody listening) from a crashed VMM may be replaced;
            // a live one may not.
            if UnixStream::connect(socket).is_ok() {
                return Err(e);
            }
            std::fs::remove_file(socket)?;
            UnixListener::bind(socket)
        }
        Err(e) => Err(e),
    }
}

/// Serve `vmm` on `socket` until it is stopped or the guest ends. Returns the process
/// exit code: 0 after a clean end or `stop`, 2 when the guest ended with an error.
pub fn serve(vmm: Vmm, socket: &Path) -> i32 {
    match bind(socket) {
        Ok(listener) => serve_on(vmm, listener, socket),
        Err(e) => {
            eprintln!("zygote: cannot listen on {}: {e}", socket.display());
            1
        }
    }
}

/// [`serve`] on a listener already bound to `socket`.
fn serve_on(vmm: Vmm, listener: UnixListener, socket: &Path) -> i32 {
    let mut server = Server {
        vmm: Some(vmm),
        socket: socket.to_path_buf(),
    };
    let code = server.run(&listener);
    let _ = std::fs::remove_file(socket);
    code
}

struct Server {
    vmm: Option<Vmm>,
    socket: PathBuf,
}

enum Flow {
    Continue,
    Stop,
}

impl Server {
    fn run(&mut self, listener: &UnixListener) -> i32 {
        loop {
            if let Some(code) = self.check_guest_ended() {
                return code;
            }
            let mut pfd = libc::pollfd {
                fd: listener.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            };
            // SAFETY: polling one fd we own.
            if unsafe { libc::poll(&mut pfd, 1, 100) } <= 0 {
                continue;
            }
            let Ok((stream, _)) = listener.accept() else {
                continue;
            };
            if let Flow::Stop = self.handle_connection(stream) {
                if let Some(vmm) = self.vmm.take() {
                    vmm.shutdown();
                }
                return 0;
            }
        }
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

    fn handle_connection(&mut self, stream: UnixStream) -> Flow {
        let _ = stream.set_read_timeout(Some(IDLE_CONNECTION_TIMEOUT));
        let mut writer = match stream.try_clone() {
            Ok(w) => w,
            Err(_) => return Flow::Continue,
        };
        for line in BufReader::new(stream).lines() {
            let Ok(line) = line else { break };
            if line.trim().is_empty() {
                continue;
            }
            let (reply, flow) = match serde_json::from_str::<Request>(&line) {
                Ok(req) => self.handle(req),
                Err(e) => (
                    Reply::err("bad_request", format!("invalid request: {e}")),
                    Flow::Continue,
                ),
            };
            let mut out = serde_json::to_vec(&reply).unwrap_or_default();
            out.push(b'\n');
            if writer.write_all(&out).is_err() {
                break;
            }
            if let Flow::Stop = flow {
                return Flow::Stop;
            }
        }
        Flow::Continue
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
                child_sockets,
                child_consoles,
                child_vsock,
                child_taps,
                child_cgroups,
                ready_timeout_ms,
            } => branch(
                vmm,
                BranchPaths {
                    sockets: child_sockets,
                    consoles: child_consoles,
                    vsock: child_vsock,
                    taps: child_taps,
                    cgroups: child_cgroups,
                },
                ready_timeout_ms,
            ),
            Request::Snapshot { mode, path } => match vmm.snapshot(mode, &path) {
                Ok(r) => Reply::ok(SnapshotInfo {
                    path: r.path,
                    mode: r.mode,
                    pause_ms: r.pause.as_secs_f64() * 1e3,
                    total_ms: r.total.as_secs_f64() * 1e3,
                    pages_written: r.pages_written,
                }),
                Err(e @ SnapshotError::NoBase) => Reply::err("bad_request", e),
                Err(SnapshotError::Persist(e)) if e.to_string().contains("already exists") => {
                    Reply::err("bad_request", e)
                }
                Err(e) => Reply::err("snapshot_failed", e),
            },
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
    }
}

/// Per-child host paths of one branch request.
struct BranchPaths {
    sockets: Vec<PathBuf>,
    consoles: Vec<PathBuf>,
    vsock: Vec<PathBuf>,
    taps: Vec<String>,
    cgroups: Vec<Option<PathBuf>>,
}

fn validate_branch(p: &BranchPaths) -> Result<(), String> {
    let sockets = &p.sockets;
    if sockets.is_empty() || sockets.len() > MAX_BRANCH_COUNT {
        return Err(format!(
            "child_sockets must name 1..={MAX_BRANCH_COUNT} sockets"
        ));
    }
    for (name, len) in [
        ("child_consoles", p.consoles.len()),
        ("child_vsock", p.vsock.len()),
        ("child_taps", p.taps.len()),
        ("child_cgroups", p.cgroups.len()),
    ] {
        if len != 0 && len != sockets.len() {
            return Err(format!("{name} must be empty or match child_sockets"));
        }
    }
    for cg in p.cgroups.iter().flatten() {
        if !cg.join("cgroup.procs").is_file() {
            return Err(format!("{} is not a cgroup directory", cg.display()));
        }
    }
    let mut seen = HashSet::new();
    for s in sockets {
        if !seen.insert(s) {
            return Err(format!("duplicate child socket {}", s.display()));
        }
        if s.exists() {
            return Err(format!("child socket {} already exists", s.display()));
        }
        match s.parent() {
            Some(dir) if dir.as_os_str().is_empty() || dir.is_dir() => {}
            _ => return Err(format!("directory of {} does not exist", s.display())),
        }
    }
    Ok(())
}

fn branch(vmm: &mut Vmm, paths: BranchPaths, timeout_ms: u64) -> Reply {
    if let Err(e) = validate_branch(&paths) {
        return Reply::err("bad_request", e);
    }
    let sockets = &paths.sockets;
    // Every child's control socket is bound before the fork: it accepts connections
    // (queued until the child serves them) from the moment the branch reply names it.
    let mut listeners = Vec::with_capacity(sockets.len());
    for s in sockets {
        match bind(s) {
            Ok(l) => listeners.push(l),
            Err(e) => {
                remove_sockets(&sockets[..listeners.len()]);
                return Reply::err("branch_failed", format!("binding {}: {e}", s.display()));
            }
        }
    }
    let listener_fds: Vec<RawFd> = listeners.iter().map(AsRawFd::as_raw_fd).collect();
    let serial = |i: usize| console_sink(paths.consoles.get(i).map(PathBuf::as_path));
    let devices = |i: usize| DeviceHostConfig {
        vsock_uds: paths.vsock.get(i).cloned(),
        net_tap: paths.taps.get(i).cloned(),
    };
    let cgroup = |i: usize| paths.cgroups.get(i).cloned().flatten();
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
        serve_on(ctx.vmm, listener, &sockets[ctx.index])
    };
    let req = BranchRequest {
        count: sockets.len(),
        child_serial: &serial,
        child_devices: &devices,
        child_cgroup: &cgroup,
        child_main: &child_main,
        keep_fds: listener_fds.clone(),
        ready_timeout: Duration::from_millis(timeout_ms),
    };
    let result = vmm.branch(&req);
    drop(listeners);
    match result {
        Ok(r) => Reply::ok(BranchInfo {
            children: r
                .children
                .iter()
                .map(|c| ChildInfo {
                    index: c.index,
                    pid: c.pid,
                    socket: sockets[c.index].clone(),
                    ready_ms: c.ready_after.as_secs_f64() * 1e3,
                })
                .collect(),
            pause_ms: r.pause.as_secs_f64() * 1e3,
            spawner: r.spawner,
        }),
        Err(e) => {
            remove_sockets(sockets);
            match e {
                crate::vmm::branch::BranchError::Vmm(e) => Reply::err("stopped", e),
                e => Reply::err("branch_failed", e),
            }
        }
    }
}

fn remove_sockets(sockets: &[PathBuf]) {
    for s in sockets {
        let _ = std::fs::remove_file(s);
    }
}
