//! Building blocks for VMs that outlive the process that started them and
//! are branched with QEMU's own mechanisms (used by zygoted's qemu runtime):
//! the QEMU argv with a QMP socket, a pid file and optionally `-incoming`,
//! and qcow2 overlays on arbitrary backing files (a base image or a frozen
//! overlay of a parent VM).
//!
//! Branching a running VM: QMP `stop`, `blockdev-snapshot-sync` (the VM
//! continues on a new overlay; the old one becomes a read-only backing file
//! for it and for every child), `migrate` RAM and device state to a file,
//! `cont`; each child boots with a fresh overlay on the frozen one and
//! `-incoming` from the state file, then gets `cont`.
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use crate::config::{Accel, QemuConfig};
use crate::error::QemuError;

/// Where a detached VM keeps its files and how it is reached.
#[derive(Debug, Clone)]
pub struct DetachedVm {
    /// qcow2 the VM writes to.
    pub overlay: PathBuf,
    pub serial_log: PathBuf,
    /// QMP server socket QEMU listens on.
    pub qmp_socket: PathBuf,
    /// QEMU writes its pid here once it runs.
    pub pid_file: PathBuf,
    /// Unix socket QEMU listens on for the agent's virtio-serial port.
    pub agent_socket: PathBuf,
    /// Start paused, loading RAM and device state from this file (written by
    /// an outgoing `migrate` of a VM with the same machine configuration).
    pub incoming: Option<PathBuf>,
}

/// The full QEMU argv (without the binary) for `vm`. The guest setup is
/// exactly [`QemuConfig`]'s, so VMs started here and by [`crate::QemuVm`]
/// behave alike; the block device is named `root` for QMP.
pub fn detached_args(cfg: &QemuConfig, accel: Accel, vm: &DetachedVm) -> Vec<String> {
    let mut args = cfg.qemu_args(accel, &vm.overlay, &vm.serial_log, &vm.agent_socket);
    args.extend([
        "-qmp".to_string(),
        format!("unix:{},server=on,wait=off", vm.qmp_socket.display()),
        "-pidfile".to_string(),
        vm.pid_file.display().to_string(),
    ]);
    if let Some(state) = &vm.incoming {
        // `exec:` because QEMU 7.2 has no `file:` migration transport.
        args.extend([
            "-incoming".to_string(),
            format!("exec:cat {}", shell_quote(&state.display().to_string())),
        ]);
    }
    args
}

/// Creates a qcow2 overlay at `overlay` backed by `backing`, whose format
/// (`raw` base image or `qcow2` frozen overlay) is given explicitly so QEMU
/// never probes it.
pub fn create_overlay_on(
    backing: &Path,
    backing_format: &str,
    overlay: &Path,
) -> Result<(), QemuError> {
    // qemu-img records the backing path verbatim: make it absolute.
    let backing = backing.canonicalize().map_err(|source| QemuError::Io {
        context: format!("backing image {}", backing.display()),
        source,
    })?;
    let out = Command::new("qemu-img")
        .args(["create", "-q", "-f", "qcow2", "-F", backing_format, "-b"])
        .arg(&backing)
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

/// Single-quotes `s` for `sh -c` (QEMU runs `exec:` URIs through /bin/sh).
fn shell_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn detached_argv_adds_control_and_incoming() {
        let cfg = QemuConfig::new("/k/vmlinux", "/i/base.ext4");
        let vm = DetachedVm {
            overlay: "/v/disk.qcow2".into(),
            serial_log: "/v/serial.log".into(),
            qmp_socket: "/v/qmp.sock".into(),
            pid_file: "/v/qemu.pid".into(),
            agent_socket: PathBuf::from("/w/agent.sock"),
            incoming: Some("/s/it's.state".into()),
        };
        let joined = detached_args(&cfg, Accel::Tcg, &vm).join(" ");
        assert!(joined.contains("-qmp unix:/v/qmp.sock,server=on,wait=off"));
        assert!(joined.contains("-pidfile /v/qemu.pid"));
        assert!(joined.contains(r"-incoming exec:cat '/s/it'\''s.state'"));
        assert!(joined.contains("file=/v/disk.qcow2,format=qcow2"));
        assert!(joined.contains("path=/w/agent.sock,server=on"));
    }
}
