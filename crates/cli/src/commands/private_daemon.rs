//! A private daemon for the benches (`bench linux`, `bench soak`, `bench net`): this very
//! binary's `zygote serve` (the same code as `zygoted`) on a state directory of its own,
//! listening on an ephemeral loopback port, with a client holding its token. Also the
//! /proc look-ups that find what such a daemon left running (its VMs, supervisors).
//!
//! Dropping it stops the daemon (SIGTERM, then waits) and removes its state directory if
//! it made it. What the daemon leaves behind (VMs deliberately outlive a daemon) is the
//! bench's to clean: see [`PrivateDaemon::stray_procs`].
use std::collections::BTreeSet;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use anyhow::Context;
use zygote_api::client::Client;

/// Where the private daemon keeps its state.
pub enum StateDir<'a> {
    /// A fresh temporary directory named `<prefix>XXXXXX`, removed on drop.
    Temp { prefix: &'a str },
    /// A directory the caller prepared (kept afterwards).
    Given(&'a Path),
}

/// A `zygote serve` on a private state directory, stopped on drop.
pub struct PrivateDaemon {
    child: Child,
    pub client: Client,
    /// The state directory, canonical (processes naming it are this daemon's).
    pub state: PathBuf,
    _temp: Option<tempfile::TempDir>,
}

impl PrivateDaemon {
    /// Starts `zygote serve --state-dir STATE --listen 127.0.0.1:0 EXTRA_ARGS...` (stderr
    /// inherited, `ZYGOTE_LOG` defaulting to `warn`) and waits for its
    /// `zygoted listening on URL` line. `what` names the daemon in the error if it does
    /// not start, e.g. "the daemon".
    pub fn start(
        state: StateDir<'_>,
        extra_args: &[String],
        what: &str,
    ) -> anyhow::Result<PrivateDaemon> {
        let (state, temp) = match state {
            StateDir::Temp { prefix } => {
                let t = tempfile::Builder::new().prefix(prefix).tempdir()?;
                (t.path().canonicalize()?, Some(t))
            }
            StateDir::Given(dir) => (dir.canonicalize()?, None),
        };
        let mut child = Command::new(std::env::current_exe()?)
            .arg("serve")
            .arg("--state-dir")
            .arg(&state)
            .args(["--listen", "127.0.0.1:0"])
            .args(extra_args)
            .env(
                "ZYGOTE_LOG",
                std::env::var("ZYGOTE_LOG").unwrap_or("warn".into()),
            )
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .spawn()
            .context("starting zygote serve")?;
        let mut lines = BufReader::new(child.stdout.take().expect("piped")).lines();
        let url = lines
            .by_ref()
            .map_while(Result::ok)
            .find_map(|l| l.strip_prefix("zygoted listening on ").map(str::to_string));
        let Some(url) = url else {
            let status = child.wait()?;
            anyhow::bail!("{what} did not start ({status}); its stderr above says why");
        };
        // Keep reading its stdout: a closed pipe would turn any later write of the daemon
        // into EPIPE (over a long soak, or a chatty daemon).
        std::thread::spawn(move || lines.for_each(drop));
        let token = std::fs::read_to_string(state.join("token"))?;
        let client = Client::new(&url, Some(token.trim().to_string()))?;
        Ok(PrivateDaemon {
            child,
            client,
            state,
            _temp: temp,
        })
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// None while it runs, else how it ended.
    pub fn died(&mut self) -> Option<String> {
        match self.child.try_wait() {
            Ok(None) => None,
            Ok(Some(status)) => Some(format!("the daemon exited: {status}")),
            Err(e) => Some(format!("cannot wait for the daemon: {e}")),
        }
    }

    pub fn alive(&mut self) -> bool {
        self.died().is_none()
    }

    /// SIGTERM if it still runs, then waits for it. Idempotent.
    pub fn stop(&mut self) {
        if self.child.try_wait().ok().flatten().is_none() {
            // SAFETY: signalling our own child (not reaped yet, so the pid is still ours).
            unsafe { libc::kill(self.pid() as i32, libc::SIGTERM) };
        }
        let _ = self.child.wait();
    }

    /// Processes whose command line names the state directory, other than the daemon,
    /// the bench and the bench's ancestors (a shell that started the bench with a given
    /// state directory names it too): (pid, whole command line, spaces for NULs).
    pub fn stray_procs(&self) -> Vec<(u32, String)> {
        let me = std::process::id();
        let mut skip: BTreeSet<u32> = [self.pid(), me].into();
        let mut p = me;
        while let Some(parent) = status_field(p, "PPid").filter(|&q| q > 1) {
            p = parent as u32;
            if !skip.insert(p) {
                break;
            }
        }
        let needle = self.state.display().to_string();
        let mut out = Vec::new();
        for e in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
            let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
                continue;
            };
            let Ok(raw) = std::fs::read(e.path().join("cmdline")) else {
                continue;
            };
            let cmd = String::from_utf8_lossy(&raw).replace('\0', " ");
            if !skip.contains(&pid) && cmd.contains(&needle) {
                out.push((pid, cmd.trim_end().to_string()));
            }
        }
        out
    }
}

impl Drop for PrivateDaemon {
    fn drop(&mut self) {
        self.stop();
    }
}

/// A field of /proc/PID/status, as a number (the first word after the colon).
pub fn status_field(pid: u32, key: &str) -> Option<u64> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    text.lines()
        .find_map(|l| l.strip_prefix(key)?.strip_prefix(':'))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
}
