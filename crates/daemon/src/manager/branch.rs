//! Branching a running sandbox into copy-on-write children, recorded as it happens.
//!
//! Two phases. [`Manager::begin_branch`] checks the request (its 4xx change nothing) and
//! records the intent: the parent `paused` with its pending capture, every child
//! `creating`. It has no await point after its first write, so a client that goes away
//! cannot leave it half-recorded. [`Manager::finish_branch`] then runs in a task of its
//! own, which a client going away does not cancel: the runtime reports the branch point,
//! recorded at once (the parent shows `running` again), then each child as soon as it
//! runs or fails, recorded `running` (or discarded) one by one. `GET /v1/sandboxes`
//! shows a fan-out's progress, and a streaming client hears of every child as it comes.
//!
//! After a crash the recovery (`recovery`, `startup`) settles whatever is left: a
//! capture not yet recorded is finished or undone, children not yet `running` are
//! killed and reported dead, children recorded `running` are re-attached.
use std::sync::Arc;
use std::time::Instant;

use tokio::sync::mpsc::{unbounded_channel, UnboundedSender};
use tokio::sync::OwnedMutexGuard;

use super::{new_id, now, Manager, STATE_CREATING, STATE_RUNNING};
use crate::db::{PendingCapture, SandboxRow, SnapshotRow};
use crate::error::{Error, Result};
use crate::fault;
use crate::model::{
    BranchEvent, BranchFailure, BranchRequest, BranchResponse, Origin, SnapshotKind, Validate,
};
use crate::network::{NetRecord, Network};
use crate::runtime::{BootSource, BranchProgress, RuntimeError, SnapshotData, StartSpec, VmRecord};

/// A branch recorded by [`Manager::begin_branch`], for [`Manager::finish_branch`].
pub struct BranchJob {
    parent: SandboxRow,
    vm: VmRecord,
    children: Vec<SandboxRow>,
    specs: Vec<StartSpec>,
    point_id: String,
    next_disk: std::path::PathBuf,
    keep_point: bool,
    started: Instant,
    /// The parent's lock, held to the end; each child's, until it is recorded.
    _parent_guard: OwnedMutexGuard<()>,
    child_guards: Vec<Option<OwnedMutexGuard<()>>>,
}

/// What the runtime's threads report, in order (see [`BranchProgress`]).
enum Progress {
    /// Every child's network record once the namespaces are made (also when making one
    /// failed: the clean-up removes what was made).
    Networks(Vec<NetRecord>),
    Point(VmRecord, SnapshotData),
    Child(usize, std::result::Result<VmRecord, RuntimeError>),
}

struct Forward(UnboundedSender<Progress>);

impl BranchProgress for Forward {
    fn point_taken(&self, parent: &VmRecord, point: &SnapshotData) {
        let _ = self.0.send(Progress::Point(parent.clone(), point.clone()));
    }

    fn child_done(&self, index: usize, result: std::result::Result<VmRecord, RuntimeError>) {
        let _ = self.0.send(Progress::Child(index, result));
    }
}

impl Manager {
    /// Checks a branch of `parent_id` and records it (see the module doc). Errors here
    /// are the request's (400, 404, 409, 422, 507) and leave everything as it was.
    pub async fn begin_branch(
        self: &Arc<Self>,
        parent_id: &str,
        req: BranchRequest,
    ) -> Result<BranchJob> {
        req.validate()?;
        let count = req.count.unwrap_or(1);
        let keep_point = req.mergeable.unwrap_or(false);
        let started = Instant::now();
        let parent_guard = self.lock(parent_id).await;
        // No await from here on: the branch is recorded whole, or nothing is.
        let mut parent = self.sandbox_row(parent_id)?;
        let vm = self.running_vm(&parent)?;
        // A kept point is a full capture of the parent's memory.
        let kind = if keep_point {
            SnapshotKind::Full
        } else {
            SnapshotKind::Branch
        };
        self.check_space(kind, parent.mem_mib)?;
        if let Some(per_child_mib) = self.runtime.branch_child_copy_mib(parent.mem_mib) {
            check_capacity("children", count, per_child_mib)?;
        }
        let point_id = new_id("snap");
        let mut deps = parent.depends_on.clone();
        deps.push(point_id.clone());
        let mut children = Vec::new();
        for i in 0..count as usize {
            let env = parent
                .env
                .for_child(req.env.as_ref().and_then(|e| e.get(i)))?;
            children.push(child_row(&parent, &point_id, &deps, env, req.ttl_secs));
        }
        // Fresh ids: nobody else can hold their locks yet.
        let child_guards = children
            .iter()
            .map(|c| self.lock_for(&c.id).try_lock_owned().ok())
            .collect();
        let point_dir = self.dirs.snapshots.join(&point_id);
        let next_disk = self.dirs.new_layer(&parent.id);
        let recorded = self.record_branch(&mut parent, &mut children, &point_id, &next_disk);
        let specs = match recorded {
            Ok(specs) => specs,
            Err(e) => {
                for c in &children {
                    self.discard(c);
                }
                let _ = std::fs::remove_dir_all(&point_dir);
                return Err(e);
            }
        };
        fault::point("branch.recorded");
        Ok(BranchJob {
            parent,
            vm,
            children,
            specs,
            point_id,
            next_disk,
            keep_point,
            started,
            _parent_guard: parent_guard,
            child_guards,
        })
    }

    /// The branch point's directory, every child `creating` (with its directory and
    /// cgroup) and the parent's pending capture.
    fn record_branch(
        &self,
        parent: &mut SandboxRow,
        children: &mut [SandboxRow],
        point_id: &str,
        next_disk: &std::path::Path,
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
                self.prepare(
                    c,
                    BootSource::Image(Default::default()),
                    Some(boot_token.clone()),
                )
            })
            .collect::<Result<Vec<_>>>()?;
        let pending = PendingCapture {
            snapshot: point_id.to_string(),
            kind: SnapshotKind::Branch,
            name: None,
            dir: point_dir,
            next_disk: next_disk.to_path_buf(),
        };
        self.begin_capture(parent, pending)?;
        Ok(specs)
    }

    /// Runs a recorded branch to its end, recording the point and each child as the
    /// runtime reports them and telling `events` (a streaming client; sends to one that
    /// went away are dropped). Fails when the point could not be taken or no child runs.
    pub async fn finish_branch(
        self: Arc<Self>,
        mut job: BranchJob,
        events: Option<UnboundedSender<BranchEvent>>,
    ) -> Result<BranchResponse> {
        let emit = |ev: BranchEvent| {
            if let Some(tx) = &events {
                let _ = tx.send(ev);
            }
        };
        let ms = |started: Instant| started.elapsed().as_millis() as u64;
        let (tx, mut rx) = unbounded_channel();
        let runtime = {
            let (rt, net) = (self.runtime.clone(), self.network.clone());
            let ids: Vec<String> = job.children.iter().map(|c| c.id.clone()).collect();
            let mut nets: Vec<NetRecord> = job.children.iter().map(|c| c.network.clone()).collect();
            let (mut vm, mut specs) = (job.vm.clone(), std::mem::take(&mut job.specs));
            let point_dir = self.dirs.snapshots.join(&job.point_id);
            let (next_disk, keep_point) = (job.next_disk.clone(), job.keep_point);
            tokio::task::spawn_blocking(move || {
                let attached = attach_all(&net, &ids, &mut nets, &mut specs);
                let _ = tx.send(Progress::Networks(nets));
                attached?;
                let progress = Forward(tx);
                rt.branch_with_progress(
                    &mut vm, &point_dir, &next_disk, &specs, keep_point, &progress,
                )
                .map(drop)
            })
        };
        let mut point: Option<SnapshotRow> = None;
        let mut running: Vec<Option<String>> = vec![None; job.children.len()];
        let mut failed = Vec::new();
        let mut first_error: Option<Error> = None;
        while let Some(progress) = rx.recv().await {
            match progress {
                Progress::Networks(nets) => {
                    for (child, net) in job.children.iter_mut().zip(nets) {
                        child.network = net;
                    }
                }
                Progress::Point(vm, data) => match self.record_point(&mut job, vm, data) {
                    Ok(p) => {
                        emit(BranchEvent::Point {
                            parent: job.parent.id.clone(),
                            branch_point: p.id.clone(),
                            pause_ms: p.data.pause_ms,
                            children: job.children.iter().map(|c| c.id.clone()).collect(),
                            ms: ms(job.started),
                        });
                        point = Some(p);
                    }
                    Err(e) => first_error = Some(e),
                },
                Progress::Child(index, result) => {
                    // Recorded only under a recorded point; else it goes (a restart
                    // settles the parent's capture).
                    let recorded = match (&point, result) {
                        (Some(_), Ok(vm)) => self.record_child(&mut job, index, vm).await,
                        (None, Ok(vm)) => {
                            self.destroy_vm(vm).await;
                            Err(first_error.as_ref().map_or_else(
                                || "the branch point was not recorded".to_string(),
                                |e| e.to_string(),
                            ))
                        }
                        (_, Err(e)) => Err(e.to_string()),
                    };
                    job.child_guards[index] = None;
                    let id = job.children[index].id.clone();
                    match recorded {
                        Ok(()) => {
                            emit(BranchEvent::Child {
                                index: index as u32,
                                id: id.clone(),
                                ms: ms(job.started),
                            });
                            running[index] = Some(id);
                        }
                        Err(error) => {
                            tracing::warn!(
                                "branch of {}: child {index} ({id}) failed: {error}",
                                job.parent.id
                            );
                            self.discard(&job.children[index]);
                            emit(BranchEvent::ChildFailed {
                                index: index as u32,
                                id,
                                error: error.clone(),
                                ms: ms(job.started),
                            });
                            failed.push(BranchFailure {
                                index: index as u32,
                                error,
                            });
                        }
                    }
                }
            }
        }
        let outcome = runtime
            .await
            .map_err(|e| Error::Internal(format!("branch task failed: {e}")))?;
        self.metrics
            .branch_children_failed
            .fetch_add(failed.len() as u64, std::sync::atomic::Ordering::Relaxed);
        let result = match (outcome, point, first_error) {
            (Err(e), None, _) => Err(self.undo_branch(&mut job, e)),
            // Not a runtime's way (an error means no point), but then the point stays.
            (Err(e), Some(_), _) => Err(e.into()),
            (Ok(()), _, Some(e)) => Err(e),
            (Ok(()), None, None) => Err(Error::Internal(
                "the runtime reported no branch point".into(),
            )),
            (Ok(()), Some(point), None) => {
                let children: Vec<String> = running.into_iter().flatten().collect();
                if children.is_empty() {
                    let causes: Vec<String> = failed.iter().map(|f| f.error.clone()).collect();
                    Err(Error::Runtime(RuntimeError::Boot(format!(
                        "no child of the branch came up: {}",
                        causes.join("; ")
                    ))))
                } else {
                    self.metrics.branch.observe(job.started.elapsed());
                    Ok(BranchResponse {
                        parent: job.parent.id.clone(),
                        branch_point: point.id,
                        children,
                        failed,
                        duration_ms: ms(job.started),
                        pause_ms: point.data.pause_ms,
                    })
                }
            }
        };
        emit(match &result {
            Ok(r) => BranchEvent::Done(r.clone()),
            Err(e) => {
                let body = e.body();
                BranchEvent::Error {
                    code: body.error.code,
                    message: body.error.message,
                }
            }
        });
        result
    }

    /// The point is taken: it is recorded with the parent running on (on its new layer).
    fn record_point(
        &self,
        job: &mut BranchJob,
        vm: VmRecord,
        data: SnapshotData,
    ) -> Result<SnapshotRow> {
        fault::point("branch.captured");
        let parent = &mut job.parent;
        parent.state = STATE_RUNNING.into();
        parent.pending = None;
        let point = SnapshotRow::captured(
            parent,
            job.point_id.clone(),
            None,
            SnapshotKind::Branch,
            data,
            now(),
        );
        parent.depends_on.push(job.point_id.clone());
        parent.vm = Some(vm);
        self.db.commit(&[parent], &[&point])?;
        fault::point("branch.point-recorded");
        Ok(point)
    }

    /// Child `index` runs: recorded `running` (its VM goes if that fails).
    async fn record_child(
        &self,
        job: &mut BranchJob,
        index: usize,
        vm: VmRecord,
    ) -> std::result::Result<(), String> {
        let child = &mut job.children[index];
        child.vm = Some(vm.clone());
        child.state = STATE_RUNNING.into();
        child.expires_at = child.ttl_secs.map(super::ttl::deadline_after);
        if let Err(e) = self.db.put_sandbox(child) {
            child.vm = None;
            self.destroy_vm(vm).await;
            return Err(format!("recording it: {e}"));
        }
        fault::point("branch.child-recorded");
        Ok(())
    }

    async fn destroy_vm(&self, vm: VmRecord) {
        let rt = self.runtime.clone();
        let _ = self.blocking(move || rt.destroy(&vm)).await;
    }

    /// The point was never taken: the parent runs on as it was, the children and the
    /// point's directory go.
    fn undo_branch(&self, job: &mut BranchJob, e: RuntimeError) -> Error {
        job.parent.state = STATE_RUNNING.into();
        job.parent.pending = None;
        if let Err(db) = self.db.put_sandbox(&job.parent) {
            tracing::warn!("branch of {}: {db}", job.parent.id);
        }
        for c in &job.children {
            self.discard(c);
        }
        let _ = std::fs::remove_dir_all(self.dirs.snapshots.join(&job.point_id));
        e.into()
    }
}

/// A branch child of `parent` as first recorded (`creating`).
fn child_row(
    parent: &SandboxRow,
    point_id: &str,
    deps: &[String],
    env: crate::model::SandboxEnv,
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
        metadata: crate::model::metadata::for_child(&parent.id, &parent.metadata),
        // The pause settings, never the parent's saved state (a resumed parent's is in
        // the child's `depends_on`: its VM forks one that reads it).
        lifecycle: crate::model::pause::Lifecycle {
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
