//! Pause to disk and resume in place.
//!
//! Pause: the runtime saves the guest's memory and device state into a park directory
//! under `snapshots/` ([`crate::runtime::Runtime::park`]) and ends the VM process, so its
//! memory returns to the host. The sandbox keeps its record, disk layer, network
//! namespace, cgroup, ports and lineage, and shows `paused` with no VM. Resume starts a
//! VM from the park directory on the same disk layer ([`BootSource::Parked`]): the same
//! guest, its processes where they were, its clock stepped.
//!
//! Crash safety follows the snapshot's intent records (`recovery`): before the runtime
//! touches the VM the row says `pausing` and names the park directory; the runtime's
//! state file appears there only once complete. A daemon restarted after a crash
//! (`settle_pause`) finds the state complete (the pause is finished: the VM, if it still
//! lives, is killed and the sandbox is paused), or not and the VM alive (the pause is
//! undone: the VM goes on), or neither (the VM died: dead, as any VM that dies). A resume is recorded as `resuming`; after a crash any VM
//! it started is killed and the sandbox is paused again, its state still on disk.
use std::time::{Duration, Instant};

use super::egress_secrets::secret_bindings;
use super::ttl::{deadline, ttl_left, ttl_on_resume};
use super::{new_id, now, random_hex, Manager, STATE_DEAD, STATE_PAUSED, STATE_RUNNING};
use crate::db::{SandboxRow, SnapshotRow};
use crate::error::{Error, Result};
use crate::fault;
use crate::lifecycle::Park;
use crate::model::{EventLevel, Sandbox, SnapshotKind};
use crate::procs::ProcId;
use crate::runtime::guest_agent::net_identity;
use crate::runtime::{BootSource, RuntimeError};

/// Stored while the runtime saves a VM's state (see the module doc).
pub const STATE_PAUSING: &str = "pausing";
/// Stored while a paused sandbox's VM starts again.
pub const STATE_RESUMING: &str = "resuming";

/// How long an exec or file call waits for another operation on a paused sandbox with
/// `auto_resume` before it gives up with `sandbox_busy`.
const AUTO_RESUME_WAIT: Duration = Duration::from_secs(300);

/// Paused to disk: no VM, the saved state recorded.
pub(crate) fn is_parked(row: &SandboxRow) -> bool {
    row.state == STATE_PAUSED && row.vm.is_none() && row.lifecycle.park.is_some()
}

impl Manager {
    /// `POST /v1/sandboxes/{id}/pause`.
    pub async fn pause(&self, id: &str) -> Result<Sandbox> {
        let _guard = self.lock(id).await;
        let mut row = self.sandbox_row(id)?;
        self.pause_locked(&mut row).await?;
        Ok(self.view(&row))
    }

    /// `POST /v1/sandboxes/{id}/resume`.
    pub async fn resume(&self, id: &str) -> Result<Sandbox> {
        let _guard = self.lock(id).await;
        let mut row = self.sandbox_row(id)?;
        self.resume_locked(&mut row).await?;
        Ok(self.view(&row))
    }

    /// [`Manager::pause`] if `condition` holds once locked (the reaper's re-check);
    /// returns whether it paused.
    pub(crate) async fn pause_if(
        &self,
        id: &str,
        condition: impl FnOnce(&SandboxRow) -> bool,
    ) -> Result<bool> {
        let Some((_guard, mut row)) = self.locked_if(id, condition).await? else {
            return Ok(false);
        };
        self.pause_locked(&mut row).await?;
        Ok(true)
    }

    /// Before an exec or file call: a paused sandbox is resumed if it was created with
    /// `auto_resume`, else the call gets [`Error::Paused`].
    pub(crate) async fn wake(&self, id: &str) -> Result<()> {
        let row = self.sandbox_row(id)?;
        // Being paused or resumed by another call: with auto_resume, wait for it (a
        // second guest call during an auto-resume must not fail).
        let moving = matches!(row.state.as_str(), STATE_PAUSING | STATE_RESUMING);
        let waits = moving && row.lifecycle.auto_resume;
        if !(is_parked(&row) || waits) {
            return Ok(());
        }
        if !row.lifecycle.auto_resume {
            return Err(Error::Paused(id.to_string()));
        }
        // Bounded: a caller that holds this sandbox's lock (a merge into it that raced
        // with its pause) must not wait for itself forever.
        let lock = self.lock_for(id);
        let _guard = tokio::time::timeout(AUTO_RESUME_WAIT, lock.lock_owned())
            .await
            .map_err(|_| Error::Busy(id.to_string()))?;
        let mut row = self.sandbox_row(id)?;
        if is_parked(&row) {
            tracing::info!(sandbox = %id, "auto-resuming for a guest call");
            self.resume_locked(&mut row).await?;
        }
        Ok(())
    }

    async fn pause_locked(&self, row: &mut SandboxRow) -> Result<()> {
        if is_parked(row) {
            return Err(wrong_state(row, "pause", "running"));
        }
        let vm = self.running_vm(row)?;
        if row.state != STATE_RUNNING {
            return Err(wrong_state(row, "pause", "running"));
        }
        self.check_space(SnapshotKind::Full, row.mem_mib)?;
        // What the guest wrote to its volumes reaches them before its VM ends.
        self.flush_volumes(row).await;
        let started = Instant::now();
        let previous = row.lifecycle.park.take();
        let dir = self
            .dirs
            .snapshots
            .join(format!("{}.park-{}", row.id, random_hex(4)));
        std::fs::create_dir_all(&dir).map_err(Error::io(format!("creating {}", dir.display())))?;
        let at = now();
        let park = Park {
            data: self.runtime.park_data(&vm, &dir),
            disk: vm.disk.clone(),
            paused_at: at,
            ttl_left_secs: ttl_left(row.expires_at, at),
        };
        row.lifecycle.park = Some(park.clone());
        row.state = STATE_PAUSING.into();
        self.db.put_sandbox(row)?;
        fault::point("pause.recorded");
        let rt = self.runtime.clone();
        let (v, d) = (vm.clone(), dir.clone());
        let result = self.blocking(move || rt.park(&v, &d)).await?;
        match result {
            Ok(data) => {
                fault::point("pause.stopped");
                self.forget_agent(&row.id);
                row.lifecycle.park = Some(Park { data, ..park });
                row.vm = None;
                row.state = STATE_PAUSED.into();
                row.expires_at = None;
                // The state it was resumed from is no longer read by any VM of its own.
                let resumed_from = row.lifecycle.resumed_from.take();
                if let Some(snap) = &resumed_from {
                    row.depends_on.retain(|d| d != snap);
                }
                self.db.put_sandbox(row)?;
                if let Some(p) = previous {
                    remove_park_files(&p, false);
                }
                if resumed_from.is_some() {
                    self.collect_garbage()?;
                }
                self.metrics.pause.observe(started.elapsed());
                let ms = started.elapsed().as_millis() as u64;
                tracing::info!(sandbox = %row.id, ms, "paused to disk");
                self.event_log.record(
                    &row.id,
                    EventLevel::Info,
                    "paused",
                    &[("ms", ms.to_string())],
                );
                Ok(())
            }
            Err(e) => {
                let _ = std::fs::remove_dir_all(&dir);
                row.lifecycle.park = previous;
                row.state = STATE_RUNNING.into();
                self.db.put_sandbox(row)?;
                Err(e.into())
            }
        }
    }

    async fn resume_locked(&self, row: &mut SandboxRow) -> Result<()> {
        let park = match &row.lifecycle.park {
            Some(p) if is_parked(row) => p.clone(),
            _ => return Err(wrong_state(row, "resume", "paused")),
        };
        let what = format!("the saved state of {}", row.id);
        self.check_restorable_nic(&what, row.network.attachment.is_some())?;
        let started = Instant::now();
        row.state = STATE_RESUMING.into();
        self.db.put_sandbox(row)?;
        fault::point("resume.recorded");
        // Its own directory, cgroup and agent token; the layer it had.
        let mut spec = self.prepare(row, BootSource::Parked(park.data.clone()), None)?;
        spec.disk = park.disk.clone();
        self.forget_agent(&row.id);
        let net_before = row.network.attachment.clone();
        let start = self.start_with_network(
            &row.id,
            row.network.clone(),
            secret_bindings(&row.env),
            spec,
        );
        let (net, result) = self.blocking(start).await?;
        row.network = net;
        match result {
            Ok(vm) => {
                fault::point("resume.started");
                row.vm = Some(vm);
                if net_before.is_some() && row.network.attachment != net_before {
                    self.readdress(row).await;
                }
                row.state = STATE_RUNNING.into();
                row.expires_at = deadline(row.ttl_secs, park.ttl_left_secs);
                row.lifecycle.park = None;
                if self.runtime.resumed_needs_park() {
                    // The VM reads its memory from the saved state: it becomes an implicit
                    // snapshot the sandbox depends on, so that a diff snapshot naming it as
                    // its parent keeps it, and nothing else does once the sandbox pauses
                    // again or goes (see `collect_garbage`).
                    let snap = SnapshotRow::captured(
                        row,
                        new_id("snap"),
                        None,
                        SnapshotKind::Full,
                        park.data.clone(),
                        park.paused_at,
                    );
                    let snap = SnapshotRow {
                        implicit: true,
                        ..snap
                    };
                    row.depends_on.push(snap.id.clone());
                    row.lifecycle.resumed_from = Some(snap.id.clone());
                    self.db.commit(&[&*row], &[&snap])?;
                } else {
                    self.db.put_sandbox(row)?;
                    remove_park_files(&park, false);
                }
                self.metrics.resume.observe(started.elapsed());
                let ms = started.elapsed().as_millis() as u64;
                tracing::info!(sandbox = %row.id, ms, "resumed");
                self.event_log.record(
                    &row.id,
                    EventLevel::Info,
                    "resumed",
                    &[("ms", ms.to_string())],
                );
                Ok(())
            }
            Err(e) => {
                // Nothing is lost: the state and the layer are as they were.
                row.state = STATE_PAUSED.into();
                self.db.put_sandbox(row)?;
                Err(e.into())
            }
        }
    }

    /// A resumed guest whose namespace had to be made anew (gone while it was paused:
    /// the host rebooted) still has its old address: it gets the new one.
    async fn readdress(&self, row: &SandboxRow) {
        let Some(vm) = row.vm.clone() else { return };
        let Some(ident) = net_identity(&self.network.guest_net(&row.network)) else {
            return;
        };
        let rt = self.runtime.clone();
        let token = self.dirs.agent_key.token(&row.id);
        let req = zygote_proto::ReidentifyRequest {
            net: Some(ident),
            ..Default::default()
        };
        let done = self
            .blocking(move || {
                let client = rt.connect(&vm, &token)?;
                client.reidentify(req).map_err(RuntimeError::from)
            })
            .await;
        match done {
            Ok(Ok(_)) => {
                tracing::info!(sandbox = %row.id, "resumed on a new network namespace: readdressed")
            }
            Ok(Err(e)) => tracing::warn!(sandbox = %row.id, "readdressing after resume: {e}"),
            Err(e) => tracing::warn!(sandbox = %row.id, "readdressing after resume: {e}"),
        }
    }

    /// Start-up, for a sandbox a crash left `pausing` (see the module doc).
    pub(super) async fn settle_pause(&self, row: &mut SandboxRow) -> Result<()> {
        let (Some(vm), Some(park)) = (row.vm.clone(), row.lifecycle.park.clone()) else {
            return self.mark_dead(row, "the daemon stopped while pausing it".into());
        };
        // A whole saved state rolls the pause forward, whatever the VM does now (stopped
        // after the save, or quitting): it is killed, the sandbox is paused.
        if park.data.state_file.exists() {
            let rt = self.runtime.clone();
            self.blocking(move || {
                if rt.exit_status(&vm).is_none() {
                    crate::runtime::supervisor::kill_and_wait(&vm.process, vm.supervisor.as_ref());
                }
            })
            .await?;
            row.vm = None;
            row.state = STATE_PAUSED.into();
            row.expires_at = None;
            self.db.put_sandbox(row)?;
            tracing::warn!(
                "sandbox {}: a pause a crash interrupted had saved its state: paused",
                row.id
            );
            return Ok(());
        }
        // Otherwise it is undone: the VM goes on (resumed if the save had stopped it).
        let rt = self.runtime.clone();
        let (exit, resumed) = self
            .blocking(move || match rt.exit_status(&vm) {
                Some(e) => (Some(e), Ok(())),
                None => (None, rt.reattach(&vm)),
            })
            .await?;
        remove_park_files(&park, false);
        row.lifecycle.park = None;
        match exit {
            None => {
                if let Err(e) = resumed {
                    tracing::warn!("sandbox {}: re-attach after a pause: {e}", row.id);
                }
                row.state = STATE_RUNNING.into();
                self.db.put_sandbox(row)?;
                tracing::warn!(
                    "sandbox {}: a pause a crash interrupted was undone: it runs on",
                    row.id
                );
            }
            Some(exit) => self.mark_dead(
                row,
                format!(
                    "ended while being paused, its state unsaved: {}",
                    exit.reason
                ),
            )?,
        }
        Ok(())
    }

    /// Start-up, for a sandbox a crash left `resuming`: whatever VM the resume started is
    /// killed (`others`: VMs other records name, never touched) and it is paused again.
    pub(super) async fn settle_resume(&self, row: &mut SandboxRow, others: Vec<ProcId>) {
        let dir = self.dirs.vms.join(&row.id);
        let _ = self
            .blocking(move || super::recovery::kill_unrecorded(&dir, &others))
            .await;
        row.vm = None;
        row.state = if row.lifecycle.park.is_some() {
            STATE_PAUSED.into()
        } else {
            STATE_DEAD.into()
        };
        if let Err(e) = self.db.put_sandbox(row) {
            tracing::warn!("sandbox {}: {e}", row.id);
        }
        tracing::warn!(
            "sandbox {}: a resume a crash interrupted was undone: {}",
            row.id,
            row.state
        );
    }
}

/// Removes a park directory, and with `with_disk` the disk layer it was paused on.
pub(crate) fn remove_park_files(park: &Park, with_disk: bool) {
    if with_disk {
        let _ = std::fs::remove_file(&park.disk);
        let _ = std::fs::remove_file(&park.data.disk_layer);
    }
    if let Err(e) = std::fs::remove_dir_all(&park.data.dir) {
        if e.kind() != std::io::ErrorKind::NotFound {
            tracing::warn!("removing {}: {e}", park.data.dir.display());
        }
    }
}

fn wrong_state(row: &SandboxRow, action: &'static str, needs: &'static str) -> Error {
    Error::WrongState {
        id: row.id.clone(),
        state: row.state.clone(),
        action,
        needs,
    }
}

impl Manager {
    /// A parked sandbox's view fields: when it was paused and the TTL it will have.
    pub(super) fn park_view(row: &SandboxRow) -> (Option<u64>, Option<u64>) {
        match &row.lifecycle.park {
            Some(p) if is_parked(row) => (
                Some(p.paused_at),
                ttl_on_resume(row.ttl_secs, p.ttl_left_secs),
            ),
            _ => (None, None),
        }
    }
}
