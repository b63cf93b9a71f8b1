//! Start-up re-attachment and the watch on VM processes.
use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use super::{now, Manager, STATE_CREATING, STATE_DEAD, STATE_PAUSED, STATE_RUNNING};
use crate::cgroup;
use crate::db::SandboxRow;
use crate::error::Result;
use crate::procs::ProcId;

/// How often VM processes are checked for unexpected exits.
const WATCH_INTERVAL: Duration = Duration::from_millis(500);

impl Manager {
    /// Brings the database and the host back in agreement after a (re)start:
    /// live VMs are re-attached (and resumed if an interrupted operation
    /// left them paused), dead ones are reported with the reason, creations
    /// the previous daemon did not finish are killed, and files nothing
    /// refers to are removed.
    pub async fn reattach_all(self: &Arc<Self>) -> Result<()> {
        for mut row in self.db.sandboxes()? {
            match (row.state.as_str(), row.vm.clone()) {
                (STATE_RUNNING | STATE_PAUSED, Some(vm)) => {
                    let rt = self.runtime.clone();
                    let (exit, resumed) = self
                        .blocking(move || match rt.exit_status(&vm) {
                            Some(e) => (Some(e), Ok(())),
                            None => (None, rt.reattach(&vm)),
                        })
                        .await?;
                    if let Some(exit) = exit {
                        self.mark_dead(
                            &mut row,
                            format!("while the daemon was down: {}", exit.reason),
                        )?;
                    } else if let Err(e) = resumed {
                        tracing::warn!("sandbox {}: re-attach: {e}", row.id);
                    } else {
                        row.state = STATE_RUNNING.into();
                        self.db.put_sandbox(&row)?;
                        tracing::info!(
                            "re-attached sandbox {} (pid {})",
                            row.id,
                            row.vm.as_ref().map_or(0, |v| v.process.pid)
                        );
                    }
                }
                (STATE_CREATING, _) | (STATE_RUNNING | STATE_PAUSED, None) => {
                    let dir = self.dirs.vms.join(&row.id);
                    self.blocking(move || kill_unrecorded(&dir)).await?;
                    self.cleanup_files(&row);
                    self.mark_dead(
                        &mut row,
                        "the daemon stopped before the VM was ready".into(),
                    )?;
                }
                _ => {}
            }
        }
        self.remove_orphans()?;
        self.collect_garbage()
    }

    pub(crate) fn mark_dead(&self, row: &mut SandboxRow, reason: String) -> Result<()> {
        tracing::warn!("sandbox {} died: {reason}", row.id);
        row.state = STATE_DEAD.into();
        row.exit_reason = Some(reason);
        row.exited_at = Some(now());
        // Anything the VM left in its cgroup goes now; the directory with the
        // console log stays until the sandbox is deleted.
        if let Some(cg) = &row.cgroup.path {
            if let Err(e) = cgroup::destroy(Path::new(cg)) {
                tracing::warn!("sandbox {}: {e}", row.id);
            }
        }
        self.db.put_sandbox(row)
    }

    /// Layer files and snapshot directories no record mentions (left by a
    /// daemon killed in the middle of an operation).
    fn remove_orphans(&self) -> Result<()> {
        let mut keep: HashSet<PathBuf> = HashSet::new();
        for s in self.db.sandboxes()? {
            if let Some(vm) = s.vm {
                keep.insert(vm.disk);
            }
            keep.insert(self.dirs.vms.join(&s.id));
        }
        for s in self.db.snapshots()? {
            keep.insert(s.data.disk_layer);
            keep.insert(s.data.dir);
        }
        for dir in [&self.dirs.layers, &self.dirs.snapshots, &self.dirs.vms] {
            let Ok(entries) = std::fs::read_dir(dir) else {
                continue;
            };
            for e in entries.flatten() {
                let path = e.path();
                if keep.contains(&path) {
                    continue;
                }
                tracing::info!("removing orphan {}", path.display());
                let res = if path.is_dir() {
                    std::fs::remove_dir_all(&path)
                } else {
                    std::fs::remove_file(&path)
                };
                if let Err(e) = res {
                    tracing::warn!("removing {}: {e}", path.display());
                }
            }
        }
        Ok(())
    }

    /// Watches running VMs; a VM that exits without being asked to is
    /// recorded as dead with the reason.
    pub async fn watch(self: Arc<Self>) {
        let mut tick = tokio::time::interval(WATCH_INTERVAL);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            if let Err(e) = self.check_all().await {
                tracing::warn!("watching VMs: {e}");
            }
        }
    }

    async fn check_all(self: &Arc<Self>) -> Result<()> {
        for row in self.db.sandboxes()? {
            if row.state != STATE_RUNNING || row.vm.is_none() {
                continue;
            }
            // Busy sandboxes are being changed on purpose; look next time.
            let Ok(_guard) = self.lock_for(&row.id).try_lock_owned() else {
                continue;
            };
            // Re-read under the lock: a delete may have just finished.
            let Some(mut row) = self.db.sandbox(&row.id)? else {
                continue;
            };
            let Some(vm) = row.vm.clone() else { continue };
            if vm.process.is_alive() || row.state != STATE_RUNNING {
                continue;
            }
            let rt = self.runtime.clone();
            if let Some(exit) = self.blocking(move || rt.exit_status(&vm)).await? {
                self.mark_dead(&mut row, exit.reason)?;
                self.forget_agent(&row.id);
            }
        }
        Ok(())
    }
}

/// Kills a VM whose pid was never recorded (the daemon died while it
/// booted): the pid file in its directory names it, and its command line
/// must mention that directory, so a recycled pid is never hit.
fn kill_unrecorded(dir: &Path) {
    for name in ["qemu.pid", "vmm.pid"] {
        let Some(pid) = std::fs::read_to_string(dir.join(name))
            .ok()
            .and_then(|s| s.trim().parse::<u32>().ok())
        else {
            continue;
        };
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
        let ours = String::from_utf8_lossy(&cmdline).contains(&*dir.to_string_lossy());
        if let (true, Some(id)) = (ours, ProcId::of(pid)) {
            tracing::info!("killing VM process {pid} of an unfinished creation");
            id.signal(libc::SIGKILL);
        }
    }
}
