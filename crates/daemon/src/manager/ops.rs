//! Branch, snapshot, restore and snapshot deletion.
use std::sync::Arc;
use std::time::Instant;

use super::{new_id, now, Manager, STATE_CREATING, STATE_DEAD, STATE_PAUSED, STATE_RUNNING};
use crate::db::{PendingCapture, SandboxRow, SnapshotRow};
use crate::error::{Error, Result};
use crate::fault;
use crate::model::pause::deadline_on_resume;
use crate::model::{
    BranchFailure, BranchRequest, BranchResponse, Origin, Sandbox, Snapshot, SnapshotKind,
    SnapshotRequest, Validate,
};
use crate::network::{NetRecord, Network};
use crate::runtime::{BootSource, RuntimeError, StartSpec};

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
        let dir = &self.dirs.snapshots;
        match super::watch::free_bytes(dir) {
            Some(free) if free < needed => Err(Error::NoSpace {
                dir: dir.display().to_string(),
                free_mib: free >> 20,
                needed_mib: needed.div_ceil(1 << 20),
            }),
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
        self.snapshot_view(&snap)
    }

    pub async fn branch(
        self: &Arc<Self>,
        parent_id: &str,
        req: BranchRequest,
    ) -> Result<BranchResponse> {
        req.validate()?;
        let count = req.count.unwrap_or(1);
        let keep_point = req.mergeable.unwrap_or(false);
        let started = Instant::now();
        let _guard = self.lock(parent_id).await;
        let mut parent = self.sandbox_row(parent_id)?;
        let mut vm = self.running_vm(&parent)?;
        // A kept point is a full capture of the parent's memory.
        let kind = if keep_point {
            SnapshotKind::Full
        } else {
            SnapshotKind::Branch
        };
        self.check_space(kind, parent.mem_mib)?;
        if let Some(per_child_mib) = self.runtime.branch_child_copy_mib(parent.mem_mib) {
            let available_mib =
                zygote_vmm::host::meminfo_kib("MemAvailable").map_or(u64::MAX, |kib| kib / 1024);
            let fit = children_that_fit(available_mib, per_child_mib);
            if count > fit {
                return Err(Error::InsufficientMemory {
                    requested: count,
                    fit,
                    per_child_mib,
                    available_mib,
                });
            }
        }
        // The children's metadata (refused before anything is made if it has too many keys).
        let child_metadata =
            crate::model::metadata::for_child(&parent.id, &parent.metadata, req.metadata.as_ref())?;
        let point_id = new_id("snap");
        let point_dir = self.dirs.snapshots.join(&point_id);
        std::fs::create_dir_all(&point_dir)
            .map_err(Error::io(format!("creating {}", point_dir.display())))?;
        let mut children = Vec::new();
        let mut specs = Vec::new();
        let mut deps = parent.depends_on.clone();
        deps.push(point_id.clone());
        for i in 0..count as usize {
            let id = new_id("sb");
            let env = parent
                .env
                .for_child(req.env.as_ref().and_then(|e| e.get(i)))?;
            let mut child = SandboxRow {
                hostname: id.clone(),
                id,
                name: None,
                state: STATE_CREATING.into(),
                runtime: parent.runtime.clone(),
                origin: Origin::Branch {
                    parent: parent.id.clone(),
                    branch_point: point_id.clone(),
                },
                mem_mib: parent.mem_mib,
                vcpus: parent.vcpus,
                created_at: now(),
                limits: parent.limits.clone(),
                cgroup: Default::default(),
                vm: None,
                depends_on: deps.clone(),
                exit_reason: None,
                exited_at: None,
                // Children of an expiring sandbox expire too (each counted
                // from its own start), so a fan-out cannot leak.
                ttl_secs: req.ttl_secs.or(parent.ttl_secs),
                expires_at: None,
                pending: None,
                // Each child: the parent's policy, a namespace and address of its own.
                network: NetRecord {
                    policy: parent.network.policy.clone(),
                    attachment: None,
                },
                env,
                metadata: child_metadata.clone(),
                // The pause settings, never the parent's saved state (a resumed parent's
                // is in the child's `depends_on`: its VM forks one that reads it).
                lifecycle: crate::model::pause::Lifecycle {
                    park: None,
                    resumed_from: None,
                    ..parent.lifecycle.clone()
                },
            };
            // Placeholder source: the runtime substitutes the branch point. The child
            // wakes up with its parent's agent token.
            let boot_token = Some(self.dirs.agent_key.token(&parent.id));
            let spec = self.prepare(
                &mut child,
                BootSource::Image(Default::default()),
                boot_token,
            )?;
            specs.push(spec);
            children.push(child);
        }
        let next_disk = self.dirs.new_layer(&parent.id);
        let pending = PendingCapture {
            snapshot: point_id.clone(),
            kind: SnapshotKind::Branch,
            name: None,
            dir: point_dir.clone(),
            next_disk: next_disk.clone(),
        };
        self.begin_capture(&mut parent, pending)?;
        fault::point("branch.recorded");
        let rt = self.runtime.clone();
        let net = self.network.clone();
        let child_ids: Vec<String> = children.iter().map(|c| c.id.clone()).collect();
        let mut nets: Vec<NetRecord> = children.iter().map(|c| c.network.clone()).collect();
        let (result, vm, nets) = self
            .blocking(move || {
                let r = attach_all(&net, &child_ids, &mut nets, &mut specs)
                    .and_then(|()| rt.branch(&mut vm, &point_dir, &next_disk, &specs, keep_point));
                (r, vm, nets)
            })
            .await?;
        for (child, net) in children.iter_mut().zip(nets) {
            child.network = net;
        }
        parent.state = STATE_RUNNING.into();
        parent.pending = None;
        let (data, results) = match result {
            Ok(r) => r,
            Err(e) => {
                self.db.put_sandbox(&parent)?;
                for c in &children {
                    self.discard(c);
                }
                let _ = std::fs::remove_dir_all(self.dirs.snapshots.join(&point_id));
                return Err(e.into());
            }
        };
        let point = SnapshotRow::captured(
            &parent,
            point_id.clone(),
            None,
            SnapshotKind::Branch,
            data,
            now(),
        );
        fault::point("branch.started");
        parent.depends_on.push(point_id.clone());
        parent.vm = Some(vm);
        // Per child: it runs, or it goes (the runtime left nothing of it running) and the
        // reply says why. One child failing does not take its siblings down.
        let mut running = Vec::new();
        let mut failed = Vec::new();
        let mut first_error = None;
        for (index, (mut child, res)) in children.into_iter().zip(results).enumerate() {
            match res {
                Ok(vm) => {
                    child.vm = Some(vm);
                    child.state = STATE_RUNNING.into();
                    child.expires_at = child.ttl_secs.map(super::ttl::deadline_after);
                    running.push(child);
                }
                Err(e) => {
                    tracing::warn!(
                        "branch of {}: child {index} ({}) failed: {e}",
                        parent.id,
                        child.id
                    );
                    self.discard(&child);
                    failed.push(BranchFailure {
                        index: index as u32,
                        error: e.to_string(),
                    });
                    first_error.get_or_insert(e);
                }
            }
        }
        self.metrics
            .branch_children_failed
            .fetch_add(failed.len() as u64, std::sync::atomic::Ordering::Relaxed);
        let mut rows: Vec<&SandboxRow> = vec![&parent];
        rows.extend(running.iter());
        // The parent's new layer is recorded with the branch point either way.
        self.db.commit(&rows, &[&point])?;
        if running.is_empty() {
            return Err(first_error.expect("no child ran, so one failed").into());
        }
        self.metrics.branch.observe(started.elapsed());
        Ok(BranchResponse {
            parent: parent.id.clone(),
            branch_point: point_id,
            children: running.iter().map(|c| c.id.clone()).collect(),
            failed,
            duration_ms: started.elapsed().as_millis() as u64,
            pause_ms: point.data.pause_ms,
        })
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
                row.expires_at = deadline_on_resume(row.ttl_secs, park.ttl_left_secs, now());
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
        let boot_token = Some(self.dirs.agent_key.token(&snap.source_sandbox));
        let spec = self.prepare(
            &mut row,
            BootSource::Snapshot(snap.data.clone()),
            boot_token,
        )?;
        self.forget_agent(id);
        let start = self.start_with_network(&row.id, row.network.clone(), spec);
        let (net, result) = self.blocking(start).await?;
        row.network = net;
        fault::point("restore.started");
        match result {
            Ok(vm) => {
                row.vm = Some(vm);
                row.state = STATE_RUNNING.into();
                self.db.put_sandbox(&row)?;
                self.collect_garbage()?;
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

/// How many children of `per_child_mib` each the host's `available_mib` holds, keeping
/// a tenth of it (at least 256 MiB) for the host and the parent going on.
fn children_that_fit(available_mib: u64, per_child_mib: u32) -> u32 {
    let reserve = (available_mib / 10).max(256);
    let usable = available_mib.saturating_sub(reserve);
    u32::try_from(usable / u64::from(per_child_mib.max(1))).unwrap_or(u32::MAX)
}

/// Makes every branch child's namespace, at once (each is a few `ip`/`nft` runs that
/// mostly wait on the kernel), and points its spec at it. On error the namespaces made
/// stay recorded in `nets`, for the children's clean-up to remove.
fn attach_all(
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
    use super::children_that_fit;

    #[test]
    fn children_fit_in_what_the_host_has_less_a_reserve() {
        // 20 GiB available: 2 GiB kept, 18 GiB for 256 MiB children.
        assert_eq!(children_that_fit(20 * 1024, 256), 72);
        // Little memory: the 256 MiB reserve is kept.
        assert_eq!(children_that_fit(1024, 256), 3);
        assert_eq!(children_that_fit(200, 64), 0);
        assert_eq!(children_that_fit(u64::MAX, 256), u32::MAX);
    }
}
