//! Branch, snapshot, restore and snapshot deletion.
use std::sync::Arc;

use super::egress_secrets::secret_bindings;
use super::{new_id, now, Manager, STATE_CREATING, STATE_DEAD, STATE_PAUSED, STATE_RUNNING};
use crate::db::{PendingCapture, SandboxRow, SnapshotRow};
use crate::error::{Error, Result};
use crate::fault;
use crate::model::{EventLevel, Sandbox, Snapshot, SnapshotKind, SnapshotRequest, Validate};
use crate::runtime::BootSource;

impl Manager {
    fn check_kind(&self, kind: SnapshotKind) -> Result<()> {
        if kind != SnapshotKind::Branch && !self.runtime.snapshot_kinds().contains(&kind) {
            return Err(Error::Unsupported(format!(
                "the {} runtime does not take {} snapshots (it supports: {})",
                self.runtime.name(),
                kind.as_str(),
                self.runtime
                    .snapshot_kinds()
                    .iter()
                    .map(|k| k.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            )));
        }
        Ok(())
    }

    /// Refuses a capture the snapshot directory's filesystem has no room for.
    pub(super) fn check_space(&self, kind: SnapshotKind, mem_mib: u32) -> Result<()> {
        let Some(needed) = self.runtime.capture_bytes(kind, mem_mib) else {
            return Ok(());
        };
        match zygote_images::space::free_bytes(&self.dirs.snapshots) {
            Some(free) if free < needed => Err(super::space::no_space(
                "the snapshot directory's filesystem",
                free,
                needed,
            )),
            _ => Ok(()),
        }
    }

    /// Records a capture (snapshot or branch) about to start: the sandbox shows `paused`
    /// while its vCPUs may be stopped, and the intent record tells a daemon restarted
    /// after a crash to finish or undo it (`recovery`).
    fn begin_capture(&self, row: &mut SandboxRow, pending: PendingCapture) -> Result<()> {
        row.state = STATE_PAUSED.into();
        row.pending = Some(pending);
        self.db.put_sandbox(row)
    }

    pub async fn snapshot(self: &Arc<Self>, req: SnapshotRequest) -> Result<Snapshot> {
        req.validate()?;
        let kind = req.kind.unwrap_or(SnapshotKind::Full);
        let _guard = self.lock(&req.sandbox).await;
        let mut row = self.sandbox_row(&req.sandbox)?;
        let mut vm = self.running_vm(&row)?;
        self.check_kind(kind)?;
        self.check_space(kind, row.mem_mib)?;
        let id = new_id("snap");
        let dir = self.dirs.snapshots.join(&id);
        std::fs::create_dir_all(&dir).map_err(Error::io(format!("creating {}", dir.display())))?;
        let next_disk = self.dirs.new_layer(&row.id);
        let pending = PendingCapture {
            snapshot: id.clone(),
            kind,
            name: req.name.clone(),
            dir: dir.clone(),
            next_disk: next_disk.clone(),
        };
        self.begin_capture(&mut row, pending)?;
        fault::point("snapshot.recorded");
        let rt = self.runtime.clone();
        let (result, vm) = self
            .blocking(move || {
                let r = rt.snapshot(&mut vm, kind, &dir, &next_disk);
                (r, vm)
            })
            .await?;
        row.state = STATE_RUNNING.into();
        row.pending = None;
        let data = match result {
            Ok(d) => d,
            Err(e) => {
                self.db.put_sandbox(&row)?;
                let _ = std::fs::remove_dir_all(self.dirs.snapshots.join(&id));
                return Err(e.into());
            }
        };
        let snap = SnapshotRow::captured(&row, id.clone(), req.name, kind, data, now());
        fault::point("snapshot.captured");
        // The sandbox's disk now reads the snapshot's frozen layer.
        row.depends_on.push(id);
        row.vm = Some(vm);
        self.db.commit(&[&row], &[&snap])?;
        let mut fields = vec![("snapshot", snap.id.clone())];
        fields.extend(snap.name.clone().map(|n| ("name", n)));
        self.event_log
            .record(&row.id, EventLevel::Info, "snapshot taken", &fields);
        self.snapshot_view(&snap)
    }

    /// Replaces a sandbox's VM with one started from `snapshot_id`; the
    /// sandbox keeps its id, name, hostname and limits.
    pub async fn restore(self: &Arc<Self>, id: &str, snapshot_id: &str) -> Result<Sandbox> {
        if snapshot_id.is_empty() {
            return Err(Error::invalid("snapshot must name a snapshot"));
        }
        let _guard = self.lock(id).await;
        let mut row = self.sandbox_row(id)?;
        let snap = self.snapshot_row(snapshot_id)?;
        self.check_runtime(&snap)?;
        let was_parked = super::pause::is_parked(&row);
        // Recorded first: a daemon killed from here on finds the sandbox "creating" at
        // start-up, kills whatever VM its directory names and reports it dead with the
        // reason (restoring again then works as on any dead sandbox).
        row.state = STATE_CREATING.into();
        self.db.put_sandbox(&row)?;
        fault::point("restore.recorded");
        if let Some(vm) = row.vm.take() {
            let rt = self.runtime.clone();
            self.blocking(move || rt.destroy(&vm)).await?;
        }
        // A paused sandbox's saved state and layer give way to the snapshot's; its TTL
        // runs again from now, with what it had left.
        if let Some(park) = row.lifecycle.park.take() {
            if was_parked {
                row.expires_at = super::ttl::deadline(row.ttl_secs, park.ttl_left_secs);
            }
            super::pause::remove_park_files(&park, was_parked);
        }
        row.mem_mib = snap.mem_mib;
        row.vcpus = snap.vcpus;
        row.depends_on = snap.depends_on.clone();
        row.depends_on.push(snap.id.clone());
        // No VM of its own reads a resumed-from state any more (collected below).
        row.lifecycle.resumed_from = None;
        row.exit_reason = None;
        row.exited_at = None;
        let boot_token = Some(self.boot_token(&snap));
        let spec = self.prepare(
            &mut row,
            BootSource::Snapshot(snap.data.clone()),
            boot_token,
        )?;
        self.forget_agent(id);
        let start = self.start_with_network(
            &row.id,
            row.network.clone(),
            secret_bindings(&row.env),
            spec,
        );
        let (net, result) = self.blocking(start).await?;
        row.network = net;
        fault::point("restore.started");
        match result {
            Ok(vm) => {
                row.vm = Some(vm);
                row.state = STATE_RUNNING.into();
                self.db.put_sandbox(&row)?;
                self.collect_garbage()?;
                self.event_log.record(
                    &row.id,
                    EventLevel::Info,
                    "restored",
                    &[("snapshot", snapshot_id.to_string())],
                );
                Ok(self.view(&row))
            }
            Err(e) => {
                row.state = STATE_DEAD.into();
                row.exit_reason = Some(format!("restore from {snapshot_id} failed: {e}"));
                row.exited_at = Some(now());
                self.db.put_sandbox(&row)?;
                Err(e.into())
            }
        }
    }

    pub fn snapshots(&self) -> Result<Vec<Snapshot>> {
        self.db
            .snapshots()?
            .iter()
            .map(|s| self.snapshot_view(s))
            .collect()
    }

    pub fn snapshot_get(&self, id: &str) -> Result<Snapshot> {
        self.snapshot_view(&self.snapshot_row(id)?)
    }

    /// Deletes a snapshot nothing depends on.
    pub fn delete_snapshot(&self, id: &str) -> Result<()> {
        let snap = self.snapshot_row(id)?;
        let dependents = self.db.dependents(id)?;
        if !dependents.is_empty() {
            return Err(Error::SnapshotInUse {
                id: id.to_string(),
                dependents: dependents.join(", "),
            });
        }
        // Forgotten first, then removed: a crash in between leaves orphan files, which
        // start-up removes, never a record whose files are gone.
        self.db.delete_snapshot(id)?;
        fault::point("snapshot-delete.forgotten");
        self.remove_snapshot_files(&snap);
        tracing::info!("snapshot {id} deleted");
        self.collect_garbage()
    }
}
