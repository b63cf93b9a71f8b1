//! `zygote-agent`: the process inside every zygote guest that the host talks
//! to (protocol: `zygote-proto`, see its `PROTOCOL.md`).
//!
//! The binary (`src/main.rs`) handles flags and PID-1 duties; this library is
//! the server, so tests can also run it in-process:
//!
//! ```no_run
//! use zygote_agent::{Agent, AgentOptions, Listener};
//! let agent = Agent::new(AgentOptions::embedded()).unwrap();
//! agent.serve(Listener::bind_unix("/tmp/agent.sock".as_ref()).unwrap()).unwrap();
//! ```
//!
//! Threads, not async: one accept thread per listener, one reader thread per
//! connection, one thread per non-trivial request (an exec's thread lives as
//! long as the program). That keeps the static binary small and the code
//! synchronous; the agent serves a handful of host connections, not thousands.

use std::io;
use std::net::{SocketAddr, TcpListener};
use std::os::fd::OwnedFd;
use std::os::unix::net::UnixListener;
use std::path::Path;
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

mod apply;
mod auth;
pub mod config;
mod conn;
mod dispatch;
mod exec;
pub mod fds;
mod files;
mod forked;
mod inotify;
mod netconf;
mod port;
mod procs;
mod pty;
mod pty_session;
pub mod reaper;
mod stats;
pub mod system;
mod vsock;
mod walk;
mod watch;

pub use reaper::ReapMode;
pub use vsock::VsockListener;

/// Log one line to stderr (the console when PID 1).
#[macro_export]
macro_rules! log {
    ($($arg:tt)*) => {
        eprintln!("zygote-agent: {}", format_args!($($arg)*))
    };
}

/// What a `shutdown` request does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ShutdownAction {
    /// sync + reboot(RB_AUTOBOOT): PID 1 in a VM (QEMU `-no-reboot` exits).
    Reboot,
    /// Exit the agent process: the binary when not PID 1.
    ExitProcess,
    /// Answer `unsupported`: dry-run mode and in-process tests.
    Refuse,
}

#[derive(Debug, Clone)]
pub struct AgentOptions {
    /// `--no-system-changes`: reidentify validates and reports only.
    pub dry_run: bool,
    pub reap: ReapMode,
    pub shutdown: ShutdownAction,
    /// Reported in `health`.
    pub pid1: bool,
}

impl AgentOptions {
    /// For running inside another program (tests): no system changes, no
    /// shutdown, and no `waitpid(-1)` that could steal the host program's
    /// children.
    pub fn embedded() -> Self {
        AgentOptions {
            dry_run: true,
            reap: ReapMode::PerChild,
            shutdown: ShutdownAction::Refuse,
            pid1: false,
        }
    }
}

pub(crate) struct AgentState {
    pub(crate) options: AgentOptions,
    pub(crate) started: Instant,
    pub(crate) reaper: Arc<reaper::Reaper>,
    pub(crate) token: auth::Token,
    /// Background processes (`spawn`), shared by every connection.
    pub(crate) processes: procs::ProcessTable,
    /// Open ptys, over every connection.
    pub(crate) ptys: pty::PtyCount,
    /// Directory watchers and their watches, over every connection.
    pub(crate) watches: watch::WatchCounts,
}

/// A socket the agent accepts connections on.
pub enum Listener {
    Tcp(TcpListener),
    Unix(UnixListener),
    Vsock(VsockListener),
}

impl Listener {
    pub fn bind_tcp(addr: SocketAddr) -> io::Result<Self> {
        Ok(Listener::Tcp(TcpListener::bind(addr)?))
    }

    /// Bind a Unix socket, replacing a stale socket file left by an earlier run.
    pub fn bind_unix(path: &Path) -> io::Result<Self> {
        if system::is_socket(path) {
            std::fs::remove_file(path)?;
        }
        Ok(Listener::Unix(UnixListener::bind(path)?))
    }

    pub fn bind_vsock(port: u32) -> io::Result<Self> {
        Ok(Listener::Vsock(VsockListener::bind(port)?))
    }

    pub fn describe(&self) -> String {
        match self {
            Listener::Tcp(l) => format!(
                "tcp {}",
                l.local_addr().map_or("?".into(), |a| a.to_string())
            ),
            Listener::Unix(l) => format!(
                "unix {}",
                l.local_addr()
                    .ok()
                    .and_then(|a| a.as_pathname().map(|p| p.display().to_string()))
                    .unwrap_or_else(|| "?".into())
            ),
            Listener::Vsock(l) => format!("vsock port {}", l.port()),
        }
    }

    fn accept(&self) -> io::Result<(OwnedFd, String)> {
        match self {
            Listener::Tcp(l) => {
                let (s, peer) = l.accept()?;
                let _ = s.set_nodelay(true);
                Ok((s.into(), format!("tcp:{peer}")))
            }
            Listener::Unix(l) => Ok((l.accept()?.0.into(), "unix".into())),
            Listener::Vsock(l) => loop {
                let (fd, cid, port) = l.accept()?;
                // Only the host may drive the agent over vsock; programs in
                // the guest (CID 1 loopback or the guest's own CID) are refused.
                if cid == libc::VMADDR_CID_HOST {
                    return Ok((fd, format!("vsock:{cid}:{port}")));
                }
                log!("refused vsock connection from cid {cid} port {port}");
            },
        }
    }
}

/// The agent: cheap to clone; all clones share the reaper and options.
#[derive(Clone)]
pub struct Agent(Arc<AgentState>);

impl Agent {
    pub fn new(options: AgentOptions) -> io::Result<Self> {
        let reaper = reaper::Reaper::new(options.reap)?;
        Ok(Agent(Arc::new(AgentState {
            options,
            started: Instant::now(),
            reaper,
            token: auth::Token::default(),
            processes: procs::ProcessTable::default(),
            ptys: pty::PtyCount::default(),
            watches: watch::WatchCounts::default(),
        })))
    }

    /// Accept connections on `listener` in a background thread, forever.
    pub fn serve(&self, listener: Listener) -> io::Result<()> {
        let agent = self.clone();
        thread::Builder::new()
            .name("accept".into())
            .spawn(move || loop {
                match listener.accept() {
                    Ok((stream, name)) => agent.serve_connection(stream, name),
                    Err(e) => {
                        // EMFILE and friends: back off instead of spinning.
                        log!("accept on {}: {e}", listener.describe());
                        thread::sleep(Duration::from_millis(100));
                    }
                }
            })?;
        Ok(())
    }

    /// Serve the virtio-serial port `name` in a background thread, forever: each time
    /// the host side connects, its stream is served as one connection (see `port`).
    pub fn serve_port(&self, name: &str) -> io::Result<()> {
        let state = self.0.clone();
        let name = name.to_string();
        thread::Builder::new().name("port".into()).spawn(move || {
            let port = port::open_when_present(&name);
            loop {
                port::wait_for_host(&port);
                let stream = match port::dup(&port) {
                    Ok(s) => s,
                    Err(e) => {
                        log!("port {name}: {e}");
                        thread::sleep(Duration::from_millis(100));
                        continue;
                    }
                };
                let reader = match port.try_clone() {
                    Ok(port) => port::PortReader { port },
                    Err(e) => {
                        log!("port {name}: {e}");
                        thread::sleep(Duration::from_millis(100));
                        continue;
                    }
                };
                let conn_name = format!("port:{name}");
                match conn::serve_from(
                    state.clone(),
                    stream,
                    reader,
                    conn_name,
                    conn::Channel::Port,
                ) {
                    Ok(conn::Ended::Clean) => {}
                    // The rest of that connection's bytes are no frames: skip them, so
                    // the next host connection starts at a frame boundary.
                    Ok(conn::Ended::Desynced) => port::drain_until_host_leaves(&port),
                    Err(e) => log!("port {name}: {e}"),
                }
            }
        })?;
        Ok(())
    }

    /// Serve one already-connected stream (socket, socketpair end) in a
    /// background thread until the peer closes it.
    pub fn serve_connection(&self, stream: OwnedFd, name: String) {
        let state = self.0.clone();
        let spawned = thread::Builder::new().name("conn".into()).spawn(move || {
            if let Err(e) = conn::serve(state, stream, name.clone()) {
                log!("connection {name}: {e}");
            }
        });
        if let Err(e) = spawned {
            log!("cannot start a connection thread: {e}");
        }
    }
}
