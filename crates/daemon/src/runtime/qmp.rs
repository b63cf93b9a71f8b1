//! A minimal blocking QMP (QEMU Machine Protocol) client over a Unix socket,
//! enough to pause/resume a VM, snapshot its disk and migrate its state to a
//! file (what zygoted's branch and snapshot use).
//!
//! QMP is line-delimited JSON: after the greeting the client must send
//! `qmp_capabilities`; every command gets one `return` or `error` reply, and
//! asynchronous `event` objects may arrive in between (they are skipped).
use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

#[derive(Debug, thiserror::Error)]
pub enum QmpError {
    #[error("QMP socket {path}: {source}")]
    Connect {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("QMP i/o: {0}")]
    Io(#[from] std::io::Error),
    #[error("QMP connection closed by QEMU")]
    Closed,
    #[error("QMP sent something that is not JSON: {0}")]
    Json(#[from] serde_json::Error),
    #[error("QMP command {command} failed: {class}: {desc}")]
    Command {
        command: String,
        class: String,
        desc: String,
    },
    #[error("migration {0}")]
    Migration(String),
    #[error("timed out after {after:?} waiting for {what}")]
    Timeout { what: String, after: Duration },
}

/// Whether a `query-migrate` status is a migration QEMU is still carrying out (every
/// state of QAPI's `MigrationStatus` but `none`, `completed`, `failed` and `cancelled`).
pub fn migration_in_progress(status: &str) -> bool {
    !matches!(status, "none" | "completed" | "failed" | "cancelled")
}

/// One QMP session.
pub struct Qmp {
    reader: BufReader<UnixStream>,
    writer: UnixStream,
}

impl Qmp {
    /// Connects, reads the greeting and negotiates capabilities. Retries the
    /// connect until `timeout` (QEMU creates the socket a moment after start).
    pub fn connect(path: &Path, timeout: Duration) -> Result<Qmp, QmpError> {
        let deadline = Instant::now() + timeout;
        let stream = loop {
            match UnixStream::connect(path) {
                Ok(s) => break s,
                Err(e) if Instant::now() < deadline => {
                    tracing::trace!("QMP connect {}: {e}", path.display());
                    std::thread::sleep(Duration::from_millis(20));
                }
                Err(source) => {
                    return Err(QmpError::Connect {
                        path: path.display().to_string(),
                        source,
                    })
                }
            }
        };
        // A wedged QEMU must not hang the caller forever.
        stream.set_read_timeout(Some(Duration::from_secs(30)))?;
        let writer = stream.try_clone()?;
        let mut qmp = Qmp {
            reader: BufReader::new(stream),
            writer,
        };
        // An event can come first: QEMU loading an incoming migration (a resume) reports
        // its status on the monitor as soon as a client is there.
        let mut greeting = qmp.read_message()?;
        while greeting.get("event").is_some() {
            tracing::debug!("QMP event before the greeting: {greeting}");
            greeting = qmp.read_message()?;
        }
        if greeting.get("QMP").is_none() {
            return Err(QmpError::Command {
                command: "greeting".into(),
                class: "Protocol".into(),
                desc: format!("unexpected greeting {greeting}"),
            });
        }
        qmp.execute("qmp_capabilities", json!({}))?;
        Ok(qmp)
    }

    fn read_message(&mut self) -> Result<Value, QmpError> {
        let mut line = String::new();
        if self.reader.read_line(&mut line)? == 0 {
            return Err(QmpError::Closed);
        }
        Ok(serde_json::from_str(&line)?)
    }

    /// Runs one command and returns its `return` value.
    pub fn execute(&mut self, command: &str, arguments: Value) -> Result<Value, QmpError> {
        let mut msg = serde_json::to_vec(&json!({"execute": command, "arguments": arguments}))?;
        msg.push(b'\n');
        self.writer.write_all(&msg)?;
        loop {
            let reply = self.read_message()?;
            if let Some(ret) = reply.get("return") {
                return Ok(ret.clone());
            }
            if let Some(err) = reply.get("error") {
                let field = |k: &str| err.get(k).and_then(Value::as_str).unwrap_or("").to_string();
                return Err(QmpError::Command {
                    command: command.to_string(),
                    class: field("class"),
                    desc: field("desc"),
                });
            }
            // An asynchronous event (STOP, RESUME, MIGRATION, ...): not ours.
        }
    }

    /// `stop`: pause the vCPUs (QEMU drains and flushes block I/O first).
    pub fn stop(&mut self) -> Result<(), QmpError> {
        self.execute("stop", json!({})).map(drop)
    }

    /// `cont`: resume (also re-activates block devices after an outgoing migration).
    pub fn cont(&mut self) -> Result<(), QmpError> {
        self.execute("cont", json!({})).map(drop)
    }

    /// The run state (`running`, `paused`, `inmigrate`, `postmigrate`, ...).
    pub fn status(&mut self) -> Result<String, QmpError> {
        let st = self.execute("query-status", json!({}))?;
        Ok(st
            .get("status")
            .and_then(Value::as_str)
            .unwrap_or("unknown")
            .to_string())
    }

    /// Switches `device` to a new qcow2 overlay at `overlay` whose backing
    /// file is the image the device was writing to, which becomes read-only.
    pub fn snapshot_disk(&mut self, device: &str, overlay: &Path) -> Result<(), QmpError> {
        self.execute(
            "blockdev-snapshot-sync",
            json!({"device": device, "snapshot-file": overlay.display().to_string(), "format": "qcow2"}),
        )
        .map(drop)
    }

    /// The I/O status of a block device (`ok`, `failed`, `nospace`), if it reports one.
    pub fn io_status(&mut self, device: &str) -> Result<Option<String>, QmpError> {
        let devices = self.execute("query-block", json!({}))?;
        Ok(devices.as_array().into_iter().flatten().find_map(|d| {
            (d["device"] == device)
                .then(|| d["io-status"].as_str().map(str::to_string))
                .flatten()
        }))
    }

    /// The file at the top of a block device's chain (the layer the guest writes).
    pub fn active_image(&mut self, device: &str) -> Result<Option<PathBuf>, QmpError> {
        let devices = self.execute("query-block", json!({}))?;
        let top = devices.as_array().into_iter().flatten().find_map(|d| {
            if d["device"] != device {
                return None;
            }
            let inserted = &d["inserted"];
            inserted["image"]["filename"]
                .as_str()
                .or(inserted["file"].as_str())
                .map(PathBuf::from)
        });
        Ok(top)
    }

    /// Starts an outgoing migration to `uri` ([`Qmp::wait_migration`] waits for its end).
    pub fn start_migration(&mut self, uri: &str) -> Result<(), QmpError> {
        self.execute("migrate", json!({"uri": uri})).map(drop)
    }

    /// The state of the VM's last migration (`active`, `completed`, ...), None if it
    /// never migrated.
    pub fn migration_status(&mut self) -> Result<Option<String>, QmpError> {
        let info = self.execute("query-migrate", json!({}))?;
        Ok(info
            .get("status")
            .and_then(Value::as_str)
            .map(str::to_string))
    }

    /// Stops an outgoing migration nobody waits for any more (its caller failed, or
    /// was a daemon that died) and waits until QEMU has let go of it. Returns the state
    /// it ended in (`cancelled`, or `completed`/`failed` if it ended first), None if
    /// none was in progress.
    ///
    /// Why it matters: a migration outlives the QMP client that started it, and `cont`
    /// on a VM whose migration is still running turns it into a live migration, which
    /// stops the guest again when it completes (`postmigrate`) with nobody there to
    /// resume it: the guest's agent goes silent and every later migration is refused.
    pub fn cancel_migration(&mut self, timeout: Duration) -> Result<Option<String>, QmpError> {
        match self.migration_status()? {
            Some(s) if migration_in_progress(&s) => {
                if s != "cancelling" {
                    self.execute("migrate_cancel", json!({}))?;
                }
            }
            _ => return Ok(None),
        }
        let deadline = Instant::now() + timeout;
        loop {
            match self.migration_status()? {
                Some(s) if migration_in_progress(&s) => {}
                ended => return Ok(ended),
            }
            if Instant::now() >= deadline {
                return Err(QmpError::Timeout {
                    what: "the migration to be cancelled".into(),
                    after: timeout,
                });
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Polls `query-migrate` until the migration (outgoing or incoming)
    /// completes; returns the final statistics.
    pub fn wait_migration(&mut self, timeout: Duration) -> Result<Value, QmpError> {
        let deadline = Instant::now() + timeout;
        loop {
            let info = self.execute("query-migrate", json!({}))?;
            match info.get("status").and_then(Value::as_str) {
                Some("completed") => return Ok(info),
                Some(s @ ("failed" | "cancelled")) => {
                    let why = info
                        .get("error-desc")
                        .and_then(Value::as_str)
                        .unwrap_or("no reason given");
                    return Err(QmpError::Migration(format!("{s}: {why}")));
                }
                _ => {}
            }
            if Instant::now() >= deadline {
                return Err(QmpError::Timeout {
                    what: "migration".into(),
                    after: timeout,
                });
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}
