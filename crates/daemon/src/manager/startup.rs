//! Start-up: re-attachment, and finishing or undoing what a crash interrupted.
use std::path::Path;
use std::sync::Arc;

use super::egress_secrets::secret_bindings;
use super::recovery::kill_unrecorded;
use super::{
    now, pause, Manager, STATE_CREATING, STATE_DEAD, STATE_DELETING, STATE_PAUSED, STATE_RUNNING,
};
use crate::cgroup;
use crate::db::SandboxRow;
use crate::error::Result;
use crate::model::EventLevel;
use crate::procs::ProcId;

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
                    self.finish_delete(&row, "deleted").await?;
                }
                (pause::STATE_PAUSING, _) => self.settle_pause(&mut row).await?,
                (pause::STATE_RESUMING, _) => {
                    let others = other_vms(&rows, &row.id);
                    self.settle_resume(&mut row, others).await;
                }
                // Paused to disk: nothing runs, nothing to re-attach.
                (STATE_PAUSED, None) if pause::is_parked(&row) => {
                    tracing::info!("sandbox {} is paused", row.id);
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
                    let others = other_vms(&rows, &row.id);
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
        self.reattach_networks().await?;
        self.finish_interrupted_operations().await?;
        self.remove_orphans()?;
        self.remove_stale_helpers().await?;
        self.remove_volume_orphans()?;
        self.collect_garbage()
    }

    /// Every recorded namespace gets its rules again (a host that rebooted lost them,
    /// and the namespaces; a sandbox whose namespace is gone is reported), and this
    /// daemon's namespaces that no sandbox records (a crash mid-create) go.
    async fn reattach_networks(self: &Arc<Self>) -> Result<()> {
        let rows = self.db.sandboxes()?;
        let net = self.network.clone();
        let problems = self
            .blocking(move || {
                let keep = rows
                    .iter()
                    .filter_map(|r| r.network.attachment.as_ref())
                    .map(|a| a.netns.clone())
                    .collect();
                net.sweep(&keep);
                // Paused ones too: a policy change while paused loaded rules into the
                // namespace a resume reuses (one gone is remade with the policy then).
                rows.iter()
                    .filter(|r| {
                        r.state == STATE_RUNNING
                            || (r.state == STATE_PAUSED
                                && r.network.attachment.as_ref().is_some_and(|a| {
                                    crate::network::host::netns_path(&a.netns).exists()
                                }))
                    })
                    .filter_map(|r| {
                        net.reattach(&r.id, &r.network, &secret_bindings(&r.env))
                            .err()
                            .map(|e| (r.id.clone(), e))
                    })
                    .collect::<Vec<_>>()
            })
            .await?;
        for (id, e) in problems {
            tracing::warn!("sandbox {id}: network: {e}");
        }
        Ok(())
    }

    pub(crate) fn mark_dead(&self, row: &mut SandboxRow, reason: String) -> Result<()> {
        tracing::warn!("sandbox {} died: {reason}", row.id);
        self.event_log.record(
            &row.id,
            EventLevel::Error,
            "sandbox died",
            &[("reason", reason.clone())],
        );
        row.state = STATE_DEAD.into();
        row.exit_reason = Some(reason);
        row.exited_at = Some(now());
        // Its network namespace goes with it (a restore makes a new one); anything the VM
        // left in its cgroup goes now; the directory with the console log stays until
        // the sandbox is deleted.
        if let Some(att) = row.network.attachment.take() {
            self.network.detach(&att);
        }
        if let Some(cg) = &row.cgroup.path {
            if let Err(e) = cgroup::destroy(Path::new(cg)) {
                tracing::warn!("sandbox {}: {e}", row.id);
            }
        }
        self.db.put_sandbox(row)
    }
}

/// The VM processes (and supervisors) of every record but `id`'s.
fn other_vms(rows: &[SandboxRow], id: &str) -> Vec<ProcId> {
    rows.iter()
        .filter(|r| r.id != id)
        .filter_map(|r| r.vm.as_ref())
        .flat_map(|vm| [Some(vm.process), vm.supervisor])
        .flatten()
        .collect()
}
