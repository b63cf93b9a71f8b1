//! Creating sandboxes: from an image or a snapshot, one or a fan-out (all or none), and
//! the preparation every new VM goes through (directory, cgroup, record, network).
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use tokio::sync::mpsc::{unbounded_channel, UnboundedSender};

use super::egress_secrets::secret_bindings;
use super::events::Events;
use super::{new_id, now, ttl, Manager, STATE_CREATING, STATE_RUNNING};
use crate::db::{SandboxRow, SnapshotRow};
use crate::error::{Error, Result};
use crate::lifecycle::Lifecycle;
use crate::model::{
    CheckedCreate, CreateEvent, CreateSandboxRequest, EventLevel, ImageRun, Origin, Sandbox,
    DEFAULT_MEM_MIB,
};
use crate::network::egress::secrets::SecretBinding;
use crate::network::NetRecord;
use crate::runtime::guest_agent::AgentAuth;
use crate::runtime::{BootSource, RuntimeError, StartSpec, VmRecord, VolumeDisk};

/// A checked create (see [`Manager::begin_create`]): the records-to-be of its
/// sandboxes and what they boot from. Nothing of it exists yet.
pub struct CreateJob {
    rows: Vec<SandboxRow>,
    source: BootSource,
    /// The volumes its (one) sandbox mounts.
    volumes: Vec<VolumeDisk>,
    boot_token: Option<String>,
    started: Instant,
}

impl CreateJob {
    /// Adds a label users cannot give (`zygote.` keys) to every sandbox of the job.
    pub(super) fn label(&mut self, key: &str, value: &str) {
        for row in &mut self.rows {
            row.metadata.insert(key.to_string(), value.to_string());
        }
    }
}

impl Manager {
    /// Creates `n` sandboxes (all or none) with the ids chosen by the caller (one per
    /// sandbox), so that it can record them before anything exists. The API's create is
    /// [`Manager::begin_create`] then [`Manager::finish_create`].
    pub(super) async fn create_with_ids(
        self: &Arc<Self>,
        req: CreateSandboxRequest,
        ids: Vec<String>,
    ) -> Result<Vec<Sandbox>> {
        let job = self.begin_create_with_ids(req, ids).await?;
        self.clone().finish_create(job, None).await
    }

    /// Checks a create and finds (or pulls) what it boots from; records nothing. Its
    /// errors are the request's answer; [`Manager::finish_create`] does the rest.
    pub async fn begin_create(self: &Arc<Self>, req: CreateSandboxRequest) -> Result<CreateJob> {
        // A volume a helper holds (to serve its files) is the create's: the helper goes.
        let named = req.volumes.iter().flatten().map(|m| m.name.clone());
        self.release_helpers(named.collect()).await?;
        let ids = (0..req.n.unwrap_or(1)).map(|_| new_id("sb")).collect();
        self.begin_create_with_ids(req, ids).await
    }

    async fn begin_create_with_ids(
        &self,
        req: CreateSandboxRequest,
        ids: Vec<String>,
    ) -> Result<CreateJob> {
        let started = Instant::now();
        let CheckedCreate { policy, mut env } = req.check()?;
        let n = req.n.unwrap_or(1);
        if ids.len() != n as usize {
            return Err(Error::Internal(format!(
                "{} ids for {n} sandboxes",
                ids.len()
            )));
        }
        self.network
            .check(&policy)
            .map_err(|e| Error::Unsupported(e.to_string()))?;
        self.check_bound_secrets(&env, policy.mode)?;
        let volumes = self.volume_disks(req.volumes.as_deref().unwrap_or_default())?;
        if let Some(name) = &req.name {
            let taken = self.db.sandboxes()?.into_iter().any(|s| {
                s.name
                    .as_deref()
                    .is_some_and(|x| x == name || x.starts_with(&format!("{name}-")))
            });
            if taken {
                return Err(Error::Conflict(format!("a sandbox named {name:?} exists")));
            }
        }
        let (source, boot_token, origin, depends_on, mem_mib, vcpus) =
            if let Some(image) = &req.image {
                let info = self.find_or_pull(image).await?;
                env.image = ImageRun::of(&info);
                self.db
                    .note_image(&info.name, &info.sha256, &info.path, now())?;
                (
                    BootSource::Image(info.path.clone()),
                    None,
                    Origin::Image {
                        name: info.name.clone(),
                        sha256: info.sha256.clone(),
                    },
                    Vec::new(),
                    req.mem_mib.unwrap_or(DEFAULT_MEM_MIB),
                    req.vcpus.unwrap_or(1),
                )
            } else {
                let id = req.snapshot.as_deref().unwrap_or_default();
                let snap = self.find_or_pull_snapshot(id).await?;
                self.check_runtime(&snap)?;
                env.image = snap.run.clone();
                let mut deps = snap.depends_on.clone();
                deps.push(snap.id.clone());
                (
                    BootSource::Snapshot(snap.data.clone()),
                    Some(self.boot_token(&snap)),
                    Origin::Snapshot {
                        id: snap.id.clone(),
                    },
                    deps,
                    snap.mem_mib,
                    snap.vcpus,
                )
            };
        // Where a branch child copies its parent's memory (qemu), every VM of the runtime
        // is a process holding its own guest RAM: a fan-out is bounded the same way.
        if let Some(per_vm_mib) = self.runtime.branch_child_copy_mib(mem_mib) {
            super::capacity::check_capacity("sandboxes", n, per_vm_mib)?;
        }
        let mut rows = Vec::new();
        for (i, id) in ids.into_iter().enumerate() {
            let name = req.name.as_ref().map(|base| match n {
                1 => base.clone(),
                _ => format!("{base}-{i}"),
            });
            let row = SandboxRow {
                hostname: name.clone().unwrap_or_else(|| id.clone()),
                id,
                name,
                state: STATE_CREATING.into(),
                runtime: self.runtime.name().into(),
                origin: origin.clone(),
                mem_mib,
                vcpus,
                created_at: now(),
                limits: req.limits.clone(),
                cgroup: Default::default(),
                vm: None,
                depends_on: depends_on.clone(),
                exit_reason: None,
                exited_at: None,
                ttl_secs: req.ttl_secs,
                // Set once running, so a slow boot does not eat into the TTL.
                expires_at: None,
                pending: None,
                network: NetRecord {
                    policy: policy.clone(),
                    attachment: None,
                },
                env: env.clone(),
                metadata: req.metadata.clone().unwrap_or_default(),
                lifecycle: Lifecycle {
                    auto_resume: req.auto_resume.unwrap_or(false),
                    ttl_action: req.ttl_action.unwrap_or_default(),
                    park: None,
                    resumed_from: None,
                },
            };
            rows.push(row);
        }
        Ok(CreateJob {
            rows,
            source,
            volumes,
            boot_token,
            started,
        })
    }

    /// Boots a checked create's sandboxes, all at once, telling `events` (a streaming
    /// client) as it goes; the last event is the outcome. All or none: when one fails,
    /// the others are deleted once every boot has ended.
    pub async fn finish_create(
        self: Arc<Self>,
        job: CreateJob,
        events: Option<UnboundedSender<CreateEvent>>,
    ) -> Result<Vec<Sandbox>> {
        let events = Events {
            tx: events,
            started: job.started,
        };
        let result = self.run_create(job, &events).await;
        events.emit(match &result {
            Ok(sandboxes) => CreateEvent::Done {
                sandboxes: sandboxes.clone(),
            },
            Err(e) => {
                let body = e.body();
                CreateEvent::Error {
                    code: body.error.code,
                    message: body.error.message,
                }
            }
        });
        result
    }

    async fn run_create(
        self: &Arc<Self>,
        job: CreateJob,
        events: &Events<CreateEvent>,
    ) -> Result<Vec<Sandbox>> {
        let n = job.rows.len();
        let ids: Vec<String> = job.rows.iter().map(|r| r.id.clone()).collect();
        // Each boot is a task of its own (detached: a caller that goes away does not cut
        // a fan-out short between its records); `recorded` hears when its record is
        // written (or its preparation failed), `ended` how it ended.
        let (recorded_tx, mut recorded) = unbounded_channel::<()>();
        let (ended_tx, mut ended) = unbounded_channel::<(usize, Result<Sandbox>)>();
        for (i, row) in job.rows.into_iter().enumerate() {
            let (this, source, volumes) = (self.clone(), job.source.clone(), job.volumes.clone());
            let (boot_token, recorded_tx, ended_tx) = (
                job.boot_token.clone(),
                recorded_tx.clone(),
                ended_tx.clone(),
            );
            tokio::spawn(async move {
                let result = this
                    .create_one(row, source, volumes, boot_token, recorded_tx)
                    .await;
                let _ = ended_tx.send((i, result));
            });
        }
        drop((recorded_tx, ended_tx));
        if events.streaming() {
            // Told once every record exists, so each id can be looked up at once.
            let mut seen = 0;
            while seen < n && recorded.recv().await.is_some() {
                seen += 1;
            }
            events.emit(CreateEvent::Accepted {
                ids: ids.clone(),
                ms: events.ms(),
            });
        }
        let mut made: Vec<Option<Sandbox>> = vec![None; n];
        let mut failure = None;
        let mut reported = 0;
        while let Some((i, result)) = ended.recv().await {
            reported += 1;
            match result {
                Ok(s) => {
                    events.emit(CreateEvent::Sandbox {
                        index: i as u32,
                        id: s.id.clone(),
                        ms: events.ms(),
                    });
                    made[i] = Some(s);
                }
                Err(e) => {
                    events.emit(CreateEvent::SandboxFailed {
                        index: i as u32,
                        id: ids[i].clone(),
                        error: e.to_string(),
                        ms: events.ms(),
                    });
                    failure = failure.or(Some(e));
                }
            }
        }
        if reported < n {
            failure = failure.or(Some(Error::Internal(format!(
                "{} of {n} sandbox boots ended without an answer",
                n - reported
            ))));
        }
        let made: Vec<Sandbox> = made.into_iter().flatten().collect();
        if let Some(e) = failure {
            for s in &made {
                let _ = self.delete(&s.id).await;
            }
            return Err(e);
        }
        Ok(made)
    }

    pub(crate) fn check_runtime(&self, snap: &SnapshotRow) -> Result<()> {
        if snap.runtime != self.runtime.name() {
            return Err(Error::Unsupported(format!(
                "snapshot {} was taken with the {} runtime; this daemon runs {}",
                snap.id,
                snap.runtime,
                self.runtime.name()
            )));
        }
        Ok(())
    }

    /// Prepares directory and cgroup for a new VM of `row` (recorded as creating).
    /// `boot_token`: the agent token the source guest holds (None for a fresh boot).
    pub(super) fn prepare(
        &self,
        row: &mut SandboxRow,
        source: BootSource,
        boot_token: Option<String>,
    ) -> Result<StartSpec> {
        let spec = self.prepare_unrecorded(row, source, boot_token)?;
        self.db.put_sandbox(row)?;
        self.announce_creating(row);
        Ok(spec)
    }

    /// [`Manager::prepare`] without the record, for callers that record many rows in
    /// one transaction (a branch's children).
    pub(super) fn prepare_unrecorded(
        &self,
        row: &mut SandboxRow,
        source: BootSource,
        boot_token: Option<String>,
    ) -> Result<StartSpec> {
        let dir = self.dirs.vms.join(&row.id);
        std::fs::create_dir_all(&dir).map_err(Error::io(format!("creating {}", dir.display())))?;
        if row.cgroup.path.is_none() {
            row.cgroup = self.cgroups.create(&row.id, &row.limits);
            for (limit, why) in &row.cgroup.not_applied {
                tracing::info!("sandbox {}: {limit} not applied: {why}", row.id);
            }
        }
        Ok(StartSpec {
            dir,
            disk: self.dirs.new_layer(&row.id),
            mem_mib: row.mem_mib,
            vcpus: row.vcpus,
            source,
            cgroup: row.cgroup.path.as_ref().map(PathBuf::from),
            hostname: row.hostname.clone(),
            auth: AgentAuth {
                token: self.dirs.agent_key.token(&row.id),
                boot_token,
            },
            snapshot_root: Some(self.dirs.snapshots.clone()),
            net: self.network.guest_net(&row.network),
            identity: identity_of(row),
            volumes: Vec::new(),
        })
    }

    /// Starts `spec`'s VM (blocking) after making the sandbox's network namespace (or
    /// finding the one it has), whose egress proxy gets `secrets`; `rec` comes back with the namespace recorded either way,
    /// so a failed start's clean-up removes it.
    pub(super) fn start_with_network(
        &self,
        id: &str,
        mut rec: NetRecord,
        secrets: Vec<SecretBinding>,
        mut spec: StartSpec,
    ) -> impl FnOnce() -> (NetRecord, std::result::Result<VmRecord, RuntimeError>) {
        let (net, rt, id) = (self.network.clone(), self.runtime.clone(), id.to_string());
        move || {
            let started = net
                .ensure(&id, &mut rec, &secrets)
                .map_err(RuntimeError::from);
            let result = started.and_then(|guest| {
                spec.net = guest;
                rt.start(&spec)
            });
            (rec, result)
        }
    }

    async fn create_one(
        self: Arc<Self>,
        row: SandboxRow,
        source: BootSource,
        volumes: Vec<VolumeDisk>,
        boot_token: Option<String>,
        recorded: UnboundedSender<()>,
    ) -> Result<Sandbox> {
        let _guard = self.lock(&row.id).await;
        // Records and clean-ups on the blocking pool: a fan-out of hundreds writes as
        // many records without holding up the async workers.
        let this = self.clone();
        let disks = volumes.clone();
        let (mut row, spec) = self
            .blocking(move || {
                let mut row = row;
                // Claimed right before the record: a crash in between leaves a claim of
                // no recorded sandbox, which the next start releases.
                let spec = this.claim_volumes(&row.id, &disks).and_then(|()| {
                    if !disks.is_empty() {
                        crate::fault::point("create.volumes-claimed");
                    }
                    let mut spec = this.prepare(&mut row, source, boot_token)?;
                    spec.volumes = disks;
                    Ok(spec)
                });
                if spec.is_err() {
                    this.discard(&row);
                }
                (row, spec)
            })
            .await?;
        let _ = recorded.send(());
        let spec = spec?;
        let started = Instant::now();
        let secrets = secret_bindings(&row.env);
        let start = self.start_with_network(&row.id, row.network.clone(), secrets, spec);
        let (net, result) = self.blocking(start).await?;
        row.network = net;
        let result = match result {
            Ok(vm) if !volumes.is_empty() => self.mount_volumes(&row.id, vm, volumes).await,
            other => other.map_err(Error::from),
        };
        // The guest learns the egress CA (a snapshot's may have it already, or not: its
        // sandbox may have had no bound secret).
        let result = match result {
            Ok(vm) => self.install_egress_ca(&row.id, &row.env, vm).await,
            other => other,
        };
        let this = self.clone();
        match result {
            Ok(vm) => {
                self.metrics.boot.observe(started.elapsed());
                row.vm = Some(vm);
                row.state = STATE_RUNNING.into();
                row.expires_at = ttl::deadline(row.ttl_secs, None);
                let row = self
                    .blocking(move || this.db.put_sandbox(&row).map(|()| row))
                    .await??;
                tracing::info!(
                    "sandbox {} running ({:.1}s)",
                    row.id,
                    started.elapsed().as_secs_f64()
                );
                let boot_ms = started.elapsed().as_millis().to_string();
                let (from, what) = match &row.origin {
                    Origin::Image { name, .. } => ("image", name.clone()),
                    Origin::Snapshot { id } => ("snapshot", id.clone()),
                    Origin::Branch { parent, .. } => ("parent", parent.clone()),
                };
                self.event_log.record(
                    &row.id,
                    EventLevel::Info,
                    "sandbox started",
                    &[(from, what), ("boot_ms", boot_ms)],
                );
                Ok(self.view(&row))
            }
            Err(e) => {
                self.blocking(move || this.discard(&row)).await?;
                Err(e)
            }
        }
    }
}

/// The ids a guest's `forked.d` hooks see: the sandbox's own, and where it came from.
fn identity_of(row: &SandboxRow) -> zygote_proto::SandboxIdentity {
    let (parent_id, snapshot_id) = match &row.origin {
        Origin::Branch { parent, .. } => (Some(parent.clone()), None),
        Origin::Snapshot { id } => (None, Some(id.clone())),
        Origin::Image { .. } => (None, None),
    };
    zygote_proto::SandboxIdentity {
        sandbox_id: row.id.clone(),
        parent_id,
        snapshot_id,
    }
}
