//! Test harness: run the real `zygote-agent` binary on the host, in dry-run
//! mode, and talk to it over a Unix socket or TCP.

#![allow(dead_code)] // each test file uses a different subset

use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use zygote_proto::client::AgentClient;
use zygote_proto::frame;

pub struct TestAgent {
    pub child: Child,
    pub dir: tempfile::TempDir,
    pub socket: PathBuf,
    /// The "ready" log line, which names every listener.
    pub ready_line: String,
}

impl TestAgent {
    /// Start the agent on a fresh Unix socket, plus `extra` flags.
    pub fn start(extra: &[&str]) -> TestAgent {
        Self::start_with_fd_limit(extra, None)
    }

    /// [`TestAgent::start`] with RLIMIT_NOFILE set to `(soft, hard)` for the agent.
    pub fn start_with_fd_limit(extra: &[&str], fd_limit: Option<(u64, u64)>) -> TestAgent {
        use std::os::unix::process::CommandExt;
        let dir = tempfile::tempdir().unwrap();
        let socket = dir.path().join("agent.sock");
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_zygote-agent"));
        cmd.arg("--unix")
            .arg(&socket)
            .arg("--no-system-changes")
            .args(extra)
            .stdin(Stdio::null())
            .stderr(Stdio::piped());
        // The agent starts with SIGINT and SIGQUIT ignored, as every background job of a
        // non-interactive shell does (CI runs tests like that): what it starts must get
        // them back at their default, or Ctrl-C and `kill -INT` reach no program.
        // SAFETY: signal() is async-signal-safe.
        unsafe {
            cmd.pre_exec(|| {
                libc::signal(libc::SIGINT, libc::SIG_IGN);
                libc::signal(libc::SIGQUIT, libc::SIG_IGN);
                Ok(())
            });
        }
        if let Some((soft, hard)) = fd_limit {
            // SAFETY: setrlimit is async-signal-safe.
            unsafe {
                cmd.pre_exec(move || {
                    let lim = libc::rlimit {
                        rlim_cur: soft,
                        rlim_max: hard,
                    };
                    if libc::setrlimit(libc::RLIMIT_NOFILE, &lim) != 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                    Ok(())
                });
            }
        }
        let mut child = cmd.spawn().expect("start zygote-agent");
        let stderr = child.stderr.take().unwrap();
        let (tx, rx) = mpsc::channel();
        // Forward the agent's log to the test output and hand over the ready line.
        thread::spawn(move || {
            for line in BufReader::new(stderr).lines() {
                let Ok(line) = line else { break };
                eprintln!("[agent] {line}");
                if line.contains(" ready ") {
                    let _ = tx.send(line);
                }
            }
        });
        let ready_line = rx
            .recv_timeout(Duration::from_secs(20))
            .expect("agent did not report ready");
        TestAgent {
            child,
            dir,
            socket,
            ready_line,
        }
    }

    pub fn client(&self) -> AgentClient {
        AgentClient::connect_unix(&self.socket).expect("connect to agent")
    }

    pub fn raw(&self) -> RawConn {
        RawConn::new(UnixStream::connect(&self.socket).unwrap())
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// A path inside this test's scratch directory, as a string.
    pub fn path(&self, name: &str) -> String {
        self.dir.path().join(name).to_str().unwrap().to_string()
    }

    /// The agent process is still alive (not crashed).
    pub fn assert_alive(&mut self) {
        assert!(
            self.child.try_wait().unwrap().is_none(),
            "agent process exited"
        );
    }
}

impl Drop for TestAgent {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A hand-driven connection for sending malformed input.
pub struct RawConn {
    pub stream: UnixStream,
}

impl RawConn {
    pub fn new(stream: UnixStream) -> Self {
        stream
            .set_read_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        RawConn { stream }
    }

    pub fn send_bytes(&mut self, payload: &[u8]) {
        frame::write_frame(&mut self.stream, payload).unwrap();
    }

    pub fn send(&mut self, v: &Value) {
        self.send_bytes(&serde_json::to_vec(v).unwrap());
    }

    /// Next frame as JSON, or None at EOF.
    pub fn recv(&mut self) -> Option<Value> {
        let bytes = frame::read_frame(&mut self.stream, zygote_proto::MAX_FRAME_LEN).unwrap()?;
        Some(serde_json::from_slice(&bytes).unwrap())
    }

    pub fn recv_some(&mut self) -> Value {
        self.recv().expect("agent closed the connection")
    }

    /// The connection stays usable: a health request is answered.
    pub fn assert_healthy(&mut self, id: u64) {
        self.send(&json!({"id": id, "type": "health"}));
        let r = self.recv_some();
        assert_eq!(r["id"], json!(id), "{r}");
        assert_eq!(r["type"], "health", "{r}");
    }

    /// The agent closed the connection (EOF, or reset).
    pub fn assert_closed(&mut self) {
        let mut buf = [0u8; 1];
        match self.stream.read(&mut buf) {
            Ok(0) => {}
            Ok(_) => panic!("unexpected data after close"),
            Err(e) => assert_ne!(e.kind(), std::io::ErrorKind::WouldBlock, "not closed"),
        }
    }

    pub fn write_raw(&mut self, bytes: &[u8]) {
        self.stream.write_all(bytes).unwrap();
    }
}

/// Poll `f` until it returns true or `limit` passes.
pub fn eventually(limit: Duration, mut f: impl FnMut() -> bool) -> bool {
    let end = Instant::now() + limit;
    loop {
        if f() {
            return true;
        }
        if Instant::now() >= end {
            return false;
        }
        thread::sleep(Duration::from_millis(20));
    }
}

/// State letter of a process (`R`, `S`, `Z`, …), None if it is gone.
pub fn proc_state(pid: u32) -> Option<char> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name is parenthesised and may contain spaces.
    let after = &stat[stat.rfind(')')? + 2..];
    after.chars().next()
}

/// Gone or a zombie (its parent may not have reaped it yet): no longer running.
pub fn is_dead(pid: u32) -> bool {
    matches!(proc_state(pid), None | Some('Z'))
}

/// Zombie children of `parent`.
pub fn zombie_children(parent: u32) -> Vec<u32> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
            continue;
        };
        let Some(close) = stat.rfind(')') else {
            continue;
        };
        let fields: Vec<&str> = stat[close + 2..].split(' ').collect();
        if fields.first() == Some(&"Z") && fields.get(1) == Some(&parent.to_string().as_str()) {
            out.push(pid);
        }
    }
    out
}

pub fn exists(p: &Path) -> bool {
    p.exists()
}
