//! Start-up re-attachment and the watch on VM processes.
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use super::recovery::kill_unrecorded;
use super::{
    now, Manager, STATE_CREATING, STATE_DEAD, STATE_DELETING, STATE_PAUSED, STATE_RUNNING,
};
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
        let rows = self.db.sandboxes()?;
        for mut row in rows.clone() {
            match (row.state.as_str(), row.vm.clone()) {
                (STATE_DELETING, _) => {
                    tracing::warn!(
                        "sandbox {}: finishing a deletion a crash interrupted",
                        row.id
                    );
                    self.finish_delete(&row).await?;
                }
                (STATE_RUNNING | STATE_PAUSED, Some(vm)) => {
                    let rt = self.runtime.clone();
                    let (exit, resumed) = self
                        .blocking(move || match rt.exit_status(&vm) {
                            Some(e) => (Some(e), Ok(())),
                            None => (None, rt.reattach(&vm)),
                        })
                        .await?;
                    if let Some(exit) = exit {
                        // Whatever it was capturing died with it; its files are orphans.
                        row.pending = None;
                        self.mark_dead(
                            &mut row,
                            format!("while the daemon was down: {}", exit.reason),
                        )?;
                    } else if let Err(e) = resumed {
                        tracing::warn!("sandbox {}: re-attach: {e}", row.id);
                    } else {
                        self.finish_capture(&mut row).await?;
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
                    // Never a VM that another sandbox's record names (a branch child's
                    // parent VMM may hold files of the child's directory open).
                    let others: Vec<ProcId> = rows
                        .iter()
                        .filter(|r| r.id != row.id)
                        .filter_map(|r| r.vm.as_ref())
                        .flat_map(|vm| [Some(vm.process), vm.supervisor])
                        .flatten()
                        .collect();
                    self.blocking(move || kill_unrecorded(&dir, &others))
                        .await?;
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
