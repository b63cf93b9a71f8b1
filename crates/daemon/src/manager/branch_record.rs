//! A branch's records and clean-ups (see `branch`, whose [`BranchJob`] they update;
//! that module only calls these, it imports nothing from here): each runs on the
//! blocking pool (the database writes synchronously, clean-ups run `ip` and remove
//! files), so a fan-out of hundreds of children never holds up an async worker.
use std::path::Path;
use std::sync::Arc;

use super::branch::{BranchJob, Gone};
use super::{now, Manager, STATE_PAUSED, STATE_RUNNING};
use crate::db::{PendingCapture, SandboxRow, SnapshotRow};
use crate::error::{Error, Result};
use crate::fault;
use crate::model::{BranchFailure, EventLevel, SnapshotKind};
use crate::runtime::{BootSource, RuntimeError, SnapshotData, StartSpec, VmRecord};

impl Manager {
    /// The intent, in one transaction: the branch point's directory made, every child
    /// `creating` (with its directory and cgroup), the parent's pending capture. On an
    /// error nothing of it is left.
    pub(super) async fn record_branch(
        self: &Arc<Self>,
        job: &mut BranchJob,
        next_disk: &Path,
    ) -> Result<Vec<StartSpec>> {
        let this = self.clone();
        let (mut parent, mut children) = (job.parent.clone(), std::mem::take(&mut job.children));
        let (point_id, next_disk) = (job.point_id.clone(), next_disk.to_path_buf());
        let (parent, children, recorded) = self
            .blocking(move || {
                let r = this.record_intent(&mut parent, &mut children, &point_id, &next_disk);
                if r.is_err() {
                    for c in &children {
                        this.discard(c);
                    }
                    let _ = std::fs::remove_dir_all(this.dirs.snapshots.join(&point_id));
                }
                (parent, children, r)
            })
            .await?;
        job.children = children;
        if recorded.is_ok() {
            job.parent = parent;
        }
        recorded
    }

    fn record_intent(
        &self,
        parent: &mut SandboxRow,
        children: &mut [SandboxRow],
        point_id: &str,
        next_disk: &Path,
    ) -> Result<Vec<StartSpec>> {
        let point_dir = self.dirs.snapshots.join(point_id);
        std::fs::create_dir_all(&point_dir)
            .map_err(Error::io(format!("creating {}", point_dir.display())))?;
        // Placeholder source: the runtime substitutes the branch point. The children
        // wake up with their parent's agent token.
        let boot_token = self.dirs.agent_key.token(&parent.id);
        let specs = children
            .iter_mut()
            .map(|c| {
                let source = BootSource::Image(Default::default());
                self.prepare_unrecorded(c, source, Some(boot_token.clone()))
            })
            .collect::<Result<Vec<_>>>()?;
        // Shown `paused` while its vCPUs may be stopped; the intent tells a restarted
        // daemon to finish or undo the capture (`recovery`).
        parent.state = STATE_PAUSED.into();
        parent.pending = Some(PendingCapture {
            snapshot: point_id.to_string(),
            kind: SnapshotKind::Branch,
            name: None,
            dir: point_dir,
            next_disk: next_disk.to_path_buf(),
        });
        let rows: Vec<&SandboxRow> = std::iter::once(&*parent).chain(children.iter()).collect();
        self.db.commit(&rows, &[])?;
        for c in children.iter() {
            self.announce_creating(c);
        }
        Ok(specs)
    }

    /// The point is taken: it is recorded with the parent running on (on its new layer).
    pub(super) async fn record_point(
        self: &Arc<Self>,
        job: &mut BranchJob,
        vm: VmRecord,
        data: SnapshotData,
    ) -> Result<SnapshotRow> {
        fault::point("branch.captured");
        let mut parent = job.parent.clone();
        parent.state = STATE_RUNNING.into();
        parent.pending = None;
        let point = SnapshotRow::captured(
            &parent,
            job.point_id.clone(),
            None,
            SnapshotKind::Branch,
            data,
            now(),
        );
        parent.depends_on.push(job.point_id.clone());
        parent.vm = Some(vm);
        let this = self.clone();
        let (row, snap) = (parent.clone(), point.clone());
        self.blocking(move || this.db.commit(&[&row], &[&snap]))
            .await??;
        job.parent = parent;
        fault::point("branch.point-recorded");
        Ok(point)
    }

    /// Children that run, recorded `running` in one transaction (on an error none is).
    pub(super) async fn record_children(
        self: &Arc<Self>,
        job: &mut BranchJob,
        ready: &[(usize, VmRecord)],
    ) -> Result<()> {
        if ready.is_empty() {
            return Ok(());
        }
        let rows: Vec<SandboxRow> = ready
            .iter()
            .map(|(i, vm)| {
                let mut child = job.children[*i].clone();
                child.vm = Some(vm.clone());
                child.state = STATE_RUNNING.into();
                child.expires_at = super::ttl::deadline(child.ttl_secs, None);
                child
            })
            .collect();
        let this = self.clone();
        let written = rows.clone();
        self.blocking(move || this.db.commit(&written.iter().collect::<Vec<_>>(), &[]))
            .await??;
        for ((i, _), row) in ready.iter().zip(rows) {
            job.children[*i] = row;
        }
        fault::point("branch.child-recorded");
        Ok(())
    }

    /// Children that did not come up go: their VM if one runs, files, cgroup, network
    /// namespace, record.
    pub(super) async fn drop_children(self: &Arc<Self>, job: &BranchJob, gone: &[Gone]) {
        if gone.is_empty() {
            return;
        }
        let this = self.clone();
        let doomed: Vec<(SandboxRow, Option<VmRecord>)> = gone
            .iter()
            .map(|(i, _, vm)| (job.children[*i].clone(), vm.clone()))
            .collect();
        let _ = self
            .blocking(move || {
                for (row, vm) in doomed {
                    if let Some(vm) = vm {
                        this.runtime.destroy(&vm);
                    }
                    this.discard(&row);
                }
            })
            .await;
    }

    /// The point was never taken: the parent runs on as it was, the children and the
    /// point's directory go.
    pub(super) async fn undo_branch(
        self: &Arc<Self>,
        job: &mut BranchJob,
        e: RuntimeError,
    ) -> Error {
        let this = self.clone();
        let mut parent = job.parent.clone();
        let children = job.children.clone();
        let point_dir = self.dirs.snapshots.join(&job.point_id);
        let _ = self
            .blocking(move || {
                parent.state = STATE_RUNNING.into();
                parent.pending = None;
                if let Err(db) = this.db.put_sandbox(&parent) {
                    tracing::warn!("branch of {}: {db}", parent.id);
                }
                for c in &children {
                    this.discard(c);
                }
                let _ = std::fs::remove_dir_all(point_dir);
            })
            .await;
        e.into()
    }
}

impl Manager {
    /// The event logs of a branch that made `children`: the parent's names them, each
    /// child's starts with where it came from.
    pub(super) fn record_branch_events(
        &self,
        job: &BranchJob,
        point: &str,
        children: &[String],
        failed: &[BranchFailure],
    ) {
        let parent = &job.parent.id;
        let mut fields = vec![
            ("branch_point", point.to_string()),
            ("children", children.join(",")),
        ];
        if !failed.is_empty() {
            fields.push(("failed", failed.len().to_string()));
        }
        self.event_log
            .record(parent, EventLevel::Info, "branched", &fields);
        for child in children {
            self.event_log.record(
                child,
                EventLevel::Info,
                "sandbox started",
                &[
                    ("parent", parent.clone()),
                    ("branch_point", point.to_string()),
                ],
            );
        }
    }
}
