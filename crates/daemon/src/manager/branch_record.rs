//! A branch's records and clean-ups (see `branch`): each runs on the blocking pool (the
//! database writes synchronously, clean-ups run `ip` and remove files), so a fan-out of
//! hundreds of children never holds up an async worker.
use std::path::Path;
use std::sync::Arc;

use super::branch::{BranchJob, Gone};
use super::{new_id, now, Manager, STATE_CREATING, STATE_PAUSED, STATE_RUNNING};
use crate::db::{PendingCapture, SandboxRow, SnapshotRow};
use crate::error::{Error, Result};
use crate::fault;
use crate::model::{Origin, SandboxEnv, SnapshotKind};
use crate::network::{NetRecord, Network};
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

/// A branch child of `parent` as first recorded (`creating`).
pub(super) fn child_row(
    parent: &SandboxRow,
    point_id: &str,
    deps: &[String],
    env: SandboxEnv,
    metadata: crate::model::metadata::Metadata,
    ttl_secs: Option<u64>,
) -> SandboxRow {
    let id = new_id("sb");
    SandboxRow {
        hostname: id.clone(),
        id,
        name: None,
        state: STATE_CREATING.into(),
        runtime: parent.runtime.clone(),
        origin: Origin::Branch {
            parent: parent.id.clone(),
            branch_point: point_id.to_string(),
        },
        mem_mib: parent.mem_mib,
        vcpus: parent.vcpus,
        created_at: now(),
        limits: parent.limits.clone(),
        cgroup: Default::default(),
        vm: None,
        depends_on: deps.to_vec(),
        exit_reason: None,
        exited_at: None,
        // Children of an expiring sandbox expire too (each counted from its own
        // start), so a fan-out cannot leak.
        ttl_secs: ttl_secs.or(parent.ttl_secs),
        expires_at: None,
        pending: None,
        // Each child: the parent's policy, a namespace and address of its own.
        network: NetRecord {
            policy: parent.network.policy.clone(),
            attachment: None,
        },
        env,
        metadata,
        // The pause settings, never the parent's saved state (a resumed parent's is in
        // the child's `depends_on`: its VM forks one that reads it).
        lifecycle: crate::lifecycle::Lifecycle {
            park: None,
            resumed_from: None,
            ..parent.lifecycle.clone()
        },
    }
}

/// Refuses `count` new VMs of `per_vm_mib` each (`what`: children, sandboxes) that the
/// host's available memory cannot hold.
pub(super) fn check_capacity(what: &'static str, count: u32, per_vm_mib: u32) -> Result<()> {
    let available_mib =
        zygote_vmm::host::meminfo_kib("MemAvailable").map_or(u64::MAX, |kib| kib / 1024);
    let fit = vms_that_fit(available_mib, per_vm_mib);
    if count > fit {
        return Err(Error::InsufficientMemory {
            what,
            requested: count,
            fit,
            per_vm_mib,
            available_mib,
        });
    }
    Ok(())
}

/// How many VMs of `per_vm_mib` each the host's `available_mib` holds, keeping a tenth
/// of it (at least 256 MiB) for the host and the VMs already running.
fn vms_that_fit(available_mib: u64, per_vm_mib: u32) -> u32 {
    let reserve = (available_mib / 10).max(256);
    let usable = available_mib.saturating_sub(reserve);
    u32::try_from(usable / u64::from(per_vm_mib.max(1))).unwrap_or(u32::MAX)
}

/// Makes every branch child's namespace, at once (each is a few `ip`/`nft` runs that
/// mostly wait on the kernel), and points its spec at it. On error the namespaces made
/// stay recorded in `nets`, for the children's clean-up to remove.
pub(super) fn attach_all(
    net: &Network,
    ids: &[String],
    nets: &mut [NetRecord],
    specs: &mut [StartSpec],
) -> std::result::Result<(), RuntimeError> {
    let results: Vec<_> = std::thread::scope(|s| {
        let handles: Vec<_> = ids
            .iter()
            .zip(nets.iter_mut())
            .map(|(id, rec)| s.spawn(move || net.ensure(id, rec)))
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("network set-up does not panic"))
            .collect()
    });
    for (spec, r) in specs.iter_mut().zip(results) {
        spec.net = r?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::vms_that_fit;

    #[test]
    fn vms_fit_in_what_the_host_has_less_a_reserve() {
        // 20 GiB available: 2 GiB kept, 18 GiB for 256 MiB VMs.
        assert_eq!(vms_that_fit(20 * 1024, 256), 72);
        // Little memory: the 256 MiB reserve is kept.
        assert_eq!(vms_that_fit(1024, 256), 3);
        assert_eq!(vms_that_fit(200, 64), 0);
        assert_eq!(vms_that_fit(u64::MAX, 256), u32::MAX);
    }
}
