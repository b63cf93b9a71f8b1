//! Branching a running sandbox into copy-on-write children, recorded as it happens.
//!
//! Two phases. [`Manager::begin_branch`] checks the request and changes nothing: its
//! errors are the request's 4xx. [`Manager::finish_branch`] then runs in a task of its
//! own, which a client going away does not cancel. It records the intent in one
//! transaction (the parent `paused` with its pending capture, every child `creating`),
//! then the runtime reports the branch point, recorded at once (the parent shows
//! `running` again), and each child as soon as it runs or fails, recorded `running` (or
//! discarded): `GET /v1/sandboxes` shows a fan-out's progress, and a streaming client
//! hears of every child as it comes. Children that finish together are recorded in one
//! transaction, and every write and clean-up runs on the blocking pool, so a fan-out of
//! hundreds keeps the async workers free to answer other requests.
//!
//! After a crash the recovery (`recovery`, `startup`) settles whatever is left: a
//! capture not yet recorded is finished or undone, children not yet `running` are
//! killed and reported dead, children recorded `running` are re-attached.
use std::sync::Arc;
use std::time::Instant;

use tokio::sync::mpsc::{unbounded_channel, UnboundedSender};
use tokio::sync::OwnedMutexGuard;

use super::capacity::check_capacity;
use super::egress_secrets::secret_bindings;
use super::events::Events;
use super::{new_id, now, Manager, STATE_CREATING};
use crate::db::{SandboxRow, SnapshotRow};
use crate::error::{Error, Result};
use crate::fault;
use crate::model::{
    BranchEvent, BranchFailure, BranchPhases, BranchRequest, BranchResponse, ChildPhases, Origin,
    ReidentifyParts, SandboxEnv, SnapshotKind, Validate,
};
use crate::network::egress::secrets::SecretBinding;
use crate::network::{NetRecord, Network};
use crate::runtime::{
    BranchProgress, ChildPhases as RuntimePhases, RuntimeError, SnapshotData, StartSpec, VmRecord,
};

/// A branch checked by [`Manager::begin_branch`], for [`Manager::finish_branch`].
pub struct BranchJob {
    pub(super) parent: SandboxRow,
    pub(super) vm: VmRecord,
    /// Not recorded yet: [`Manager::finish_branch`] does it.
    pub(super) children: Vec<SandboxRow>,
    pub(super) point_id: String,
    keep_point: bool,
    started: Instant,
    /// The parent's lock, held to the end; each child's, until it is recorded.
    _parent_guard: OwnedMutexGuard<()>,
    pub(super) child_guards: Vec<Option<OwnedMutexGuard<()>>>,
}

/// What the runtime's threads report, in order (see [`BranchProgress`]).
enum Progress {
    /// Every child's network record once the namespaces are made (also when making one
    /// failed: the clean-up removes what was made), and how long that took.
    Networks(Vec<NetRecord>, std::time::Duration),
    Phases(usize, RuntimePhases),
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

    fn child_phases(&self, index: usize, phases: RuntimePhases) {
        let _ = self.0.send(Progress::Phases(index, phases));
    }
}

/// A child that did not come up: its index, why, and its VM if one runs.
pub(super) type Gone = (usize, String, Option<VmRecord>);

impl Manager {
    /// Checks a branch of `parent_id` (see the module doc). Its errors are the
    /// request's (400, 404, 409, 422, 507); nothing is changed.
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
        let parent = self.sandbox_row(parent_id)?;
        let vm = self.running_vm(&parent)?;
        let what = format!("{} (branching it)", parent.id);
        self.check_restorable_nic(&what, parent.network.attachment.is_some())?;
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
        // The children's metadata (refused before anything is made if it has too many keys).
        let metadata =
            crate::model::metadata::for_child(&parent.id, &parent.metadata, req.metadata.as_ref())?;
        let point_id = new_id("snap");
        let mut deps = parent.depends_on.clone();
        deps.push(point_id.clone());
        let mut children = Vec::new();
        for i in 0..count as usize {
            let env = parent
                .env
                .for_child(req.env.as_ref().and_then(|e| e.get(i)))?;
            children.push(child_row(
                &parent,
                &point_id,
                &deps,
                env,
                metadata.clone(),
                req.ttl_secs,
            ));
        }
        // Fresh ids: nobody else can hold their locks yet.
        let child_guards = children
            .iter()
            .map(|c| self.lock_for(&c.id).try_lock_owned().ok())
            .collect();
        Ok(BranchJob {
            parent,
            vm,
            children,
            point_id,
            keep_point,
            started,
            _parent_guard: parent_guard,
            child_guards,
        })
    }

    /// Runs a checked branch to its end (see the module doc), telling `events` (a
    /// streaming client) as it goes; the last event is the outcome. Fails when nothing
    /// could be recorded, the point could not be taken, or no child runs.
    pub async fn finish_branch(
        self: Arc<Self>,
        mut job: BranchJob,
        events: Option<UnboundedSender<BranchEvent>>,
    ) -> Result<BranchResponse> {
        let events = Events {
            tx: events,
            started: job.started,
        };
        let result = self.run_branch(&mut job, &events).await;
        events.emit(match &result {
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

    async fn run_branch(
        self: &Arc<Self>,
        job: &mut BranchJob,
        events: &Events<BranchEvent>,
    ) -> Result<BranchResponse> {
        let next_disk = self.dirs.new_layer(&job.parent.id);
        let specs = self.record_branch(job, &next_disk).await?;
        fault::point("branch.recorded");
        let mut phases = BranchPhases {
            record_ms: ms_since(job.started),
            ..Default::default()
        };
        let mut runtime_phases: Vec<Option<RuntimePhases>> = vec![None; job.children.len()];
        let mut networks_done = Instant::now();
        let (tx, mut rx) = unbounded_channel();
        let runtime = {
            let (rt, net) = (self.runtime.clone(), self.network.clone());
            let ids: Vec<String> = job.children.iter().map(|c| c.id.clone()).collect();
            let mut nets: Vec<NetRecord> = job.children.iter().map(|c| c.network.clone()).collect();
            let secrets: Vec<Vec<SecretBinding>> = job
                .children
                .iter()
                .map(|c| secret_bindings(&c.env))
                .collect();
            let (mut vm, mut specs) = (job.vm.clone(), specs);
            let point_dir = self.dirs.snapshots.join(&job.point_id);
            let keep_point = job.keep_point;
            tokio::task::spawn_blocking(move || {
                let t = Instant::now();
                let attached = attach_all(&net, &ids, &secrets, &mut nets, &mut specs);
                let _ = tx.send(Progress::Networks(nets, t.elapsed()));
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
        let mut point_error: Option<Error> = None;
        while let Some(first) = rx.recv().await {
            // What has come meanwhile goes with it: one transaction for the lot.
            let mut batch = vec![first];
            while let Ok(more) = rx.try_recv() {
                batch.push(more);
            }
            let (mut ready, mut gone): (Vec<(usize, VmRecord)>, Vec<Gone>) = (vec![], vec![]);
            for progress in batch {
                match progress {
                    Progress::Networks(nets, took) => {
                        for (child, net) in job.children.iter_mut().zip(nets) {
                            child.network = net;
                        }
                        phases.network_ms = took.as_secs_f64() * 1e3;
                        networks_done = Instant::now();
                    }
                    Progress::Phases(i, p) => {
                        if let Some(slot) = runtime_phases.get_mut(i) {
                            *slot = Some(p);
                        }
                    }
                    Progress::Point(vm, data) => match self.record_point(job, vm, data).await {
                        Ok(p) => {
                            phases.point_ms = ms_since(networks_done);
                            events.emit(BranchEvent::Point {
                                parent: job.parent.id.clone(),
                                branch_point: p.id.clone(),
                                pause_ms: p.data.pause_ms,
                                children: job.children.iter().map(|c| c.id.clone()).collect(),
                                ms: events.ms(),
                            });
                            point = Some(p);
                        }
                        Err(e) => point_error = Some(e),
                    },
                    // Recorded only under a recorded point; else it goes (a restart
                    // settles the parent's capture).
                    Progress::Child(i, Ok(vm)) if point.is_some() => ready.push((i, vm)),
                    Progress::Child(i, Ok(vm)) => {
                        gone.push((i, "the branch point could not be recorded".into(), Some(vm)))
                    }
                    Progress::Child(i, Err(e)) => gone.push((i, e.to_string(), None)),
                }
            }
            if let Err(e) = self.record_children(job, &ready).await {
                let why = format!("recording it: {e}");
                gone.extend(ready.drain(..).map(|(i, vm)| (i, why.clone(), Some(vm))));
            }
            for (i, _) in ready {
                job.child_guards[i] = None;
                let rt = runtime_phases.get(i).copied().flatten();
                phases.children.push(ChildPhases {
                    index: i as u32,
                    vm_ms: rt.map(|p| p.vm_ms),
                    vm_build_ms: rt.and_then(|p| p.vm_build_ms),
                    warm_catch_up_ms: rt.and_then(|p| p.warm_catch_up_ms),
                    warm_state_ms: rt.and_then(|p| p.warm_state_ms),
                    agent_ms: rt.map(|p| p.agent_ms),
                    agent_connect_ms: rt.and_then(|p| p.agent).map(|a| a.connect_ms),
                    reidentify_ms: rt.and_then(|p| p.agent).map(|a| a.reidentify_ms),
                    reidentify_parts: rt
                        .and_then(|p| p.agent)
                        .and_then(|a| a.guest)
                        .map(reidentify_parts),
                    recorded_ms: ms_since(job.started),
                });
                let id = job.children[i].id.clone();
                events.emit(BranchEvent::Child {
                    index: i as u32,
                    id: id.clone(),
                    ms: events.ms(),
                });
                running[i] = Some(id);
            }
            self.drop_children(job, &gone).await;
            for (i, error, _) in gone {
                job.child_guards[i] = None;
                tracing::warn!(
                    "branch of {}: child {i} ({}) failed: {error}",
                    job.parent.id,
                    job.children[i].id
                );
                events.emit(BranchEvent::ChildFailed {
                    index: i as u32,
                    id: job.children[i].id.clone(),
                    error: error.clone(),
                    ms: events.ms(),
                });
                failed.push(BranchFailure {
                    index: i as u32,
                    error,
                });
            }
        }
        let outcome = runtime
            .await
            .map_err(|e| Error::Internal(format!("branch task failed: {e}")))?;
        self.metrics
            .branch_children_failed
            .fetch_add(failed.len() as u64, std::sync::atomic::Ordering::Relaxed);
        match (outcome, point, point_error) {
            (Err(e), None, _) => Err(self.undo_branch(job, e).await),
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
                    return Err(Error::Runtime(RuntimeError::Boot(format!(
                        "no child of the branch came up: {}",
                        causes.join("; ")
                    ))));
                }
                self.metrics.branch.observe(job.started.elapsed());
                failed.sort_by_key(|f| f.index);
                self.record_branch_events(job, &point.id, &children, &failed);
                Ok(BranchResponse {
                    parent: job.parent.id.clone(),
                    branch_point: point.id,
                    children,
                    failed,
                    duration_ms: events.ms(),
                    pause_ms: point.data.pause_ms,
                    phases: Some(BranchPhases {
                        children: {
                            let mut c = std::mem::take(&mut phases.children);
                            c.sort_by_key(|c| c.index);
                            c
                        },
                        ..phases
                    }),
                })
            }
        }
    }
}

fn ms_since(t: Instant) -> f64 {
    t.elapsed().as_secs_f64() * 1e3
}

/// A branch child of `parent` as first recorded (`creating`).
fn child_row(
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

impl Manager {
    /// A child restores its parent's NIC as it was: a tap's state cannot be loaded into
    /// user networking (QEMU refuses it; the kvm runtime would have no NIC to give). A
    /// daemon that could not isolate at this start says so instead of starting children
    /// that die loading their state.
    /// Refuses to start a state that holds an isolated network interface (a branch
    /// point, a snapshot, a pack, a paused sandbox's saved state) under a daemon that
    /// started without isolated networking: the VM would die loading that interface's
    /// state (QEMU: "error while loading state ... virtio-net", vnet_hdr missing), so
    /// the caller gets a 409 that says why and what to do, and nothing is started.
    pub(crate) fn check_restorable_nic(&self, what: &str, isolated_nic: bool) -> Result<()> {
        if !isolated_nic || self.network.isolated() {
            return Ok(());
        }
        let why = self.network.info().reason.unwrap_or_default();
        Err(Error::Conflict(format!(
            "{what} holds an isolated network interface, but this daemon started without \
             isolated networking ({why}): that interface's state cannot be restored; \
             restart zygoted where it can isolate (see `zygote doctor`)"
        )))
    }
}

/// Makes every branch child's namespace, at once (each is a few `ip`/`nft` runs that
/// mostly wait on the kernel), and points its spec at it. On error the namespaces made
/// stay recorded in `nets`, for the children's clean-up to remove.
fn attach_all(
    net: &Network,
    ids: &[String],
    secrets: &[Vec<SecretBinding>],
    nets: &mut [NetRecord],
    specs: &mut [StartSpec],
) -> std::result::Result<(), RuntimeError> {
    let results: Vec<_> = std::thread::scope(|s| {
        let handles: Vec<_> = ids
            .iter()
            .zip(secrets)
            .zip(nets.iter_mut())
            .map(|((id, secrets), rec)| s.spawn(move || net.ensure(id, rec, secrets)))
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

/// The guest's microseconds per reidentify part, as the API's milliseconds.
fn reidentify_parts(t: zygote_proto::ReidentifyTimes) -> ReidentifyParts {
    let ms = |us: u64| us as f64 / 1e3;
    ReidentifyParts {
        entropy_ms: ms(t.entropy),
        hostname_ms: ms(t.hostname),
        clock_ms: ms(t.clock),
        net_ms: ms(t.net),
        identity_ms: ms(t.identity),
    }
}
