//! zygote's QEMU runtime: boots a zygote guest (kernel + content-addressed
//! ext4 image) in `qemu-system-x86_64 -M microvm`, waits for the in-guest
//! agent and hands out its client.
//!
//! Each VM gets a scratch directory holding a qcow2 overlay backed by the
//! read-only base image (the base is never written), the serial console log
//! and QEMU's stderr. [`QemuVm::shutdown`] or dropping the VM kills QEMU and
//! deletes the directory; QEMU is also killed if this process dies.
//!
//! ```no_run
//! # fn main() -> Result<(), zygote_qemu::QemuError> {
//! let cfg = zygote_qemu::QemuConfig::for_image("minimal", &mut |l| eprintln!("{l}"))?;
//! let vm = zygote_qemu::QemuVm::boot(&cfg)?;
//! let out = vm.client().exec_output(zygote_proto::ExecRequest::shell("uname -r"))?;
//! print!("{}", String::from_utf8_lossy(&out.stdout));
//! vm.shutdown()?;
//! # Ok(()) }
//! ```
mod config;
mod error;
pub mod migrate;
mod process;

use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use zygote_proto::client::{AgentClient, ClientError};

pub use config::{detect_accel, kvm_unavailable_reason, Accel, ExtraDisk, NetBackend, QemuConfig};
pub use error::QemuError;

/// Serial console lines included in boot errors.
const SERIAL_TAIL_LINES: usize = 40;
/// The agent channel's socket in the VM's directory (see [`QemuVm::agent_socket`]).
const AGENT_SOCKET: &str = "agent.sock";

/// A running QEMU guest with a healthy agent.
pub struct QemuVm {
    child: Option<Child>,
    workdir: PathBuf,
    accel: Accel,
    client: AgentClient,
    boot_duration: Duration,
}

impl QemuVm {
    /// Starts QEMU and waits until the agent answers `health`.
    pub fn boot(cfg: &QemuConfig) -> Result<QemuVm, QemuError> {
        let accel = match cfg.accel {
            Some(Accel::Kvm) => match kvm_unavailable_reason() {
                Some(why) if std::env::var("ZYGOTE_QEMU_ACCEL").as_deref() != Ok("kvm") => {
                    return Err(QemuError::KvmUnavailable(why))
                }
                _ => Accel::Kvm,
            },
            Some(a) => a,
            None => detect_accel(),
        };
        Self::boot_once(cfg, accel)
    }

    fn boot_once(cfg: &QemuConfig, accel: Accel) -> Result<QemuVm, QemuError> {
        let started = Instant::now();
        let workdir = process::make_workdir().map_err(|source| QemuError::Io {
            context: "creating the VM directory".into(),
            source,
        })?;
        // From here on, `guard` removes the directory (and kills QEMU) on error.
        let mut guard = Cleanup {
            child: None,
            workdir: Some(workdir.clone()),
        };
        let overlay = workdir.join("overlay.qcow2");
        create_overlay(&cfg.image, &overlay)?;
        let serial = workdir.join("serial.log");
        let stderr_path = workdir.join("qemu.stderr");
        let agent_socket = workdir.join(AGENT_SOCKET);
        let stderr_file = std::fs::File::create(&stderr_path).map_err(|source| QemuError::Io {
            context: format!("creating {}", stderr_path.display()),
            source,
        })?;
        let mut cmd = Command::new(&cfg.qemu_binary);
        cmd.args(cfg.qemu_args(accel, &overlay, &serial, &agent_socket))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(stderr_file);
        tracing::debug!("starting {:?}", cmd);
        let child = process::spawn_supervised(cmd).map_err(|source| QemuError::Spawn {
            program: cfg.qemu_binary.display().to_string(),
            source,
        })?;
        guard.child = Some(child);
        let client = wait_for_agent(
            &mut guard,
            cfg.boot_timeout,
            &agent_socket,
            &serial,
            &stderr_path,
        )?;
        let child = guard.child.take();
        guard.workdir = None;
        Ok(QemuVm {
            child,
            workdir,
            accel,
            client,
            boot_duration: started.elapsed(),
        })
    }

    /// The agent connection (cheap to clone; requests may run concurrently). It is
    /// the only one: the agent's channel is a virtio-serial port, whose host end
    /// (a Unix socket in the VM's directory) serves one connection at a time.
    pub fn client(&self) -> &AgentClient {
        &self.client
    }

    /// The Unix socket QEMU serves the agent's virtio-serial port on (in the VM's
    /// private directory; no TCP port leads to the agent).
    pub fn agent_socket(&self) -> PathBuf {
        self.workdir.join(AGENT_SOCKET)
    }

    pub fn accel(&self) -> Accel {
        self.accel
    }

    /// From starting QEMU to the agent's first health answer.
    pub fn boot_duration(&self) -> Duration {
        self.boot_duration
    }

    /// QEMU's pid (e.g. for a signal handler that must kill it).
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// The VM's scratch directory (overlay, serial log); gone after shutdown.
    pub fn workdir(&self) -> &Path {
        &self.workdir
    }

    /// Everything the guest wrote to its serial console so far.
    pub fn serial_log(&self) -> String {
        std::fs::read_to_string(self.workdir.join("serial.log")).unwrap_or_default()
    }

    /// Kills QEMU and removes the overlay and logs.
    pub fn shutdown(mut self) -> Result<(), QemuError> {
        self.teardown()
    }

    fn teardown(&mut self) -> Result<(), QemuError> {
        if let Some(mut child) = self.child.take() {
            // The overlay is discarded, so there is nothing to flush: kill.
            let _ = child.kill();
            let _ = child.wait();
        }
        if self.workdir.as_os_str().is_empty() {
            return Ok(());
        }
        let dir = std::mem::take(&mut self.workdir);
        match std::fs::remove_dir_all(&dir) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(QemuError::Io {
                context: format!("removing {}", dir.display()),
                source: e,
            }),
            _ => Ok(()),
        }
    }
}

impl Drop for QemuVm {
    fn drop(&mut self) {
        if let Err(e) = self.teardown() {
            tracing::warn!("VM teardown: {e}");
        }
    }
}

/// Kills the child and removes the directory unless disarmed.
struct Cleanup {
    child: Option<Child>,
    workdir: Option<PathBuf>,
}

impl Drop for Cleanup {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        if let Some(dir) = self.workdir.take() {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}

fn create_overlay(base: &Path, overlay: &Path) -> Result<(), QemuError> {
    // qemu-img records the backing path verbatim: make it absolute.
    let base = base.canonicalize().map_err(|source| QemuError::Io {
        context: format!("base image {}", base.display()),
        source,
    })?;
    let out = Command::new("qemu-img")
        .args(["create", "-q", "-f", "qcow2", "-F", "raw", "-b"])
        .arg(&base)
        .arg(overlay)
        .stdin(Stdio::null())
        .output()
        .map_err(|source| QemuError::Spawn {
            program: "qemu-img".into(),
            source,
        })?;
    if !out.status.success() {
        return Err(QemuError::Overlay(
            String::from_utf8_lossy(&out.stderr).trim().to_string(),
        ));
    }
    Ok(())
}

/// Waits until the agent answers `health`, failing early if QEMU exits.
///
/// QEMU accepts the channel's connection long before the guest serves the port;
/// what the host writes meanwhile waits in the channel, so one connection and
/// repeated `health` requests on it (no reconnects) see the agent as soon as it runs.
fn wait_for_agent(
    guard: &mut Cleanup,
    timeout: Duration,
    socket: &Path,
    serial: &Path,
    stderr: &Path,
) -> Result<AgentClient, QemuError> {
    let deadline = Instant::now() + timeout;
    let mut last_error = String::from("none yet");
    let mut client: Option<AgentClient> = None;
    loop {
        let child = guard.child.as_mut().expect("child is set");
        if let Ok(Some(status)) = child.try_wait() {
            return Err(QemuError::Exited {
                status: status.to_string(),
                stderr: std::fs::read_to_string(stderr)
                    .unwrap_or_default()
                    .trim()
                    .to_string(),
                serial_tail: tail(serial, SERIAL_TAIL_LINES),
            });
        }
        let now = Instant::now();
        if now >= deadline {
            return Err(QemuError::BootTimeout {
                after: timeout,
                last_error,
                serial_tail: tail(serial, SERIAL_TAIL_LINES),
            });
        }
        if client.as_ref().is_none_or(AgentClient::is_closed) {
            match AgentClient::connect_unix(socket) {
                Ok(c) => client = Some(c),
                Err(e) => {
                    // QEMU has not created the socket yet.
                    last_error = e.to_string();
                    std::thread::sleep(Duration::from_millis(20));
                    continue;
                }
            }
        }
        let c = client.clone().expect("connected above");
        // Short slices so a dead QEMU is noticed quickly.
        let slice = (deadline - now).min(Duration::from_secs(2));
        match c.clone().with_request_timeout(Some(slice)).health() {
            Ok(_) => return Ok(c),
            Err(e @ ClientError::Timeout { .. }) => last_error = e.to_string(),
            Err(e) => {
                last_error = e.to_string();
                client = None;
                std::thread::sleep(Duration::from_millis(100));
            }
        }
    }
}

/// The last `lines` lines of a (possibly large) log file.
fn tail(path: &Path, lines: usize) -> String {
    let Ok(mut file) = std::fs::File::open(path) else {
        return format!("(no {})", path.display());
    };
    let len = file.metadata().map(|m| m.len()).unwrap_or(0);
    let start = len.saturating_sub(64 * 1024);
    let mut buf = Vec::new();
    if file.seek(SeekFrom::Start(start)).is_err() || file.read_to_end(&mut buf).is_err() {
        return String::new();
    }
    let text = String::from_utf8_lossy(&buf);
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tail_returns_last_lines() {
        let dir = std::env::temp_dir().join(format!("zygote-test-tail-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let f = dir.join("log");
        let text: String = (1..=100).map(|i| format!("line {i}\n")).collect();
        std::fs::write(&f, text).unwrap();
        assert_eq!(tail(&f, 2), "line 99\nline 100");
        assert!(tail(&dir.join("missing"), 2).contains("no "));
        std::fs::remove_dir_all(dir).unwrap();
    }
}
