//! Sandbox lifecycle: the database, the runtime and cgroups tied together.
//!
//! Every state change is written to the database before the API answers.
//! Runtime calls block (QMP, agent, process control), so they run on
//! tokio's blocking pool. Operations that change a sandbox's VM (delete,
//! branch, snapshot, restore) hold that sandbox's lock; exec and file
//! access do not, so a long exec never delays a delete.
mod agent_link;
mod branch;
mod branch_record;
mod capacity;
mod code;
mod code_wire;
mod create;
mod diff;
mod egress_secrets;
mod event_notes;
mod events;
mod exec_cancel;
mod file_watch;
mod guest;
mod guest_fs;
mod images;
mod intent;
mod merge;
mod merge_apply;
mod merge_intent;
mod merge_plan;
mod metrics_sampler;
pub use metrics_sampler::DEFAULT_INTERVAL as DEFAULT_METRICS_INTERVAL;
mod network_policy;
mod template_intent;
mod upload;
pub use code::{CodeError, ContextOp};
pub use guest::FileBody;
mod ops;
mod pack_import;
mod packs;
mod pause;
mod ports;
mod processes;
mod pty;
pub use pty::{PtyInput, PtyOutput, PtySession, PtySignaller};
mod recovery;
mod space;
mod startup;
mod tree;
mod ttl;
mod volume_guest;
pub use volume_guest::{VolumeGuest, HELPER_LABEL as VOLUME_HELPER_LABEL};
mod volumes;
mod watch;

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use tokio::sync::{Mutex as AsyncMutex, OwnedMutexGuard};
use zygote_proto::client::AgentClient;

use crate::agent_key::AgentKey;
use crate::cgroup::{self, Cgroups};
use crate::db::{Db, SandboxRow, SnapshotRow};
use crate::error::{Error, Result};
use crate::event_log::EventLog;
use crate::fault;
use crate::metrics::Metrics;
use crate::model::{
    EventLevel, EventList, EventsQuery, ForkHook, Origin, PackOrigin, RuntimeInfo, Sandbox,
    Snapshot,
};
use crate::network::Network;
use crate::runtime::{console, Runtime, VmRecord};
// Re-exported for the manager's modules (`super::now`, `super::new_id`).
pub(crate) use crate::ids::{new_id, random_hex};
pub use zygote_api::time::now;

pub const STATE_CREATING: &str = "creating";
pub const STATE_RUNNING: &str = "running";
pub const STATE_PAUSED: &str = "paused";
pub const STATE_DEAD: &str = "dead";
/// Shown (never stored) while a running sandbox's VM lives but has stopped running its
/// guest (`exit_reason` says why, e.g. a full host disk): see `watch`.
pub const STATE_ERROR: &str = "error";
/// Being deleted: a daemon restarted after a crash finishes the deletion.
pub const STATE_DELETING: &str = "deleting";

/// Where the daemon keeps VM files.
#[derive(Debug, Clone)]
pub struct Dirs {
    pub state: PathBuf,
    /// `vms/<sandbox>/`: control socket, console log, exit status.
    pub vms: PathBuf,
    /// `layers/*.qcow2`: writable and frozen disk layers.
    pub layers: PathBuf,
    /// `snapshots/<snapshot>/`: memory and device state.
    pub snapshots: PathBuf,
    /// `intents/<operation>-<id>.json`: operations in progress (`intent`).
    pub intents: PathBuf,
    /// `agent.key`: derives each sandbox's agent token.
    pub agent_key: AgentKey,
}

impl Dirs {
    pub fn new(state: PathBuf) -> Result<Dirs> {
        // Absolute: paths under it go into VM command lines and records, and the VMM
        // refuses relative snapshot paths.
        std::fs::create_dir_all(&state)
            .map_err(Error::io(format!("creating {}", state.display())))?;
        let state = state
            .canonicalize()
            .map_err(Error::io(format!("resolving {}", state.display())))?;
        let d = Dirs {
            vms: state.join("vms"),
            layers: state.join("layers"),
            snapshots: state.join("snapshots"),
            intents: state.join("intents"),
            agent_key: AgentKey::load_or_create(&state)?,
            state,
        };
        for dir in [&d.vms, &d.layers, &d.snapshots, &d.intents] {
            std::fs::create_dir_all(dir)
                .map_err(Error::io(format!("creating {}", dir.display())))?;
        }
        Ok(d)
    }

    fn new_layer(&self, owner: &str) -> PathBuf {
        self.layers.join(format!("{owner}-{}.qcow2", random_hex(4)))
    }
}

pub struct Manager {
    pub(crate) db: Db,
    pub(crate) runtime: Arc<dyn Runtime>,
    pub(crate) runtime_info: RuntimeInfo,
    pub(crate) cgroups: Cgroups,
    pub(crate) dirs: Dirs,
    pub(crate) network: Arc<Network>,
    pub metrics: Metrics,
    locks: Mutex<HashMap<String, Arc<AsyncMutex<()>>>>,
    agents: Mutex<HashMap<String, AgentClient>>,
    /// Held while a sandbox's agent connection is made: an agent channel may take one
    /// connection at a time (the qemu runtime's virtio-serial port), so two requests
    /// must never both connect; the second waits and takes the first one's client.
    connecting: Mutex<HashMap<String, Arc<AsyncMutex<()>>>>,
    /// What is known about each sandbox's agent beyond its cached client (`agent_link`).
    agent_health: Mutex<HashMap<String, agent_link::HealthRecord>>,
    /// Running sandboxes whose VM stopped on its own, with the reason (`watch`). Kept in
    /// memory, not in the database: the fault is often a full disk, the database's too,
    /// and the watcher finds it again within seconds of a restart.
    faults: Mutex<HashMap<String, String>>,
    /// Each sandbox's metrics time series, in memory only (`metrics_sampler`).
    metric_rings: Arc<metrics_sampler::MetricRings>,
    /// How OCI registries are reached (which ones over plain HTTP).
    pub(crate) registries: zygote_oci::Transport,
    /// What happened to each sandbox (`GET /v1/sandboxes/{id}/events`).
    pub(crate) event_log: Arc<EventLog>,
    pub(crate) egress_log: Arc<crate::egress_log::EgressLog>,
    /// When each volume's helper sandbox was last used (`volume_guest`).
    helpers_used: Mutex<HashMap<String, std::time::Instant>>,
}

impl Manager {
    pub fn new(
        db: Db,
        runtime: Arc<dyn Runtime>,
        runtime_info: RuntimeInfo,
        cgroups: Cgroups,
        dirs: Dirs,
        network: Network,
    ) -> Manager {
        let event_log = Arc::new(EventLog::new(dirs.state.join("events")));
        // Every DNS question of a sandbox goes to its event log, at debug level.
        let log = event_log.clone();
        network.observe_dns(Arc::new(move |q: &crate::network::dns::DnsLogEntry<'_>| {
            log.record(
                q.sandbox,
                crate::model::EventLevel::Debug,
                "dns query",
                &[
                    ("name", q.name.to_string()),
                    ("type", q.qtype.to_string()),
                    ("verdict", q.verdict.to_string()),
                    ("detail", q.detail.to_string()),
                ],
            );
        }));
        let egress_log = Arc::new(crate::egress_log::EgressLog::new(dirs.state.join("egress")));
        let record = egress_log.clone();
        network.observe_egress(Arc::new(move |e: &crate::model::EgressEntry| {
            record.record(e)
        }));
        Manager {
            db,
            runtime,
            runtime_info,
            cgroups,
            network: Arc::new(network),
            metrics: Metrics::default(),
            locks: Mutex::new(HashMap::new()),
            agents: Mutex::new(HashMap::new()),
            connecting: Mutex::new(HashMap::new()),
            agent_health: Mutex::new(HashMap::new()),
            faults: Mutex::new(HashMap::new()),
            metric_rings: Arc::default(),
            registries: zygote_oci::Transport::from_env(),
            event_log,
            egress_log,
            dirs,
            helpers_used: Mutex::new(HashMap::new()),
        }
    }

    /// Registries reached over plain HTTP although not on loopback (`--insecure-registry`).
    pub fn with_insecure_registries(mut self, registries: Vec<String>) -> Manager {
        self.registries.insecure.extend(registries);
        self
    }

    fn lock_for(&self, id: &str) -> Arc<AsyncMutex<()>> {
        let mut locks = self.locks.lock().unwrap_or_else(|p| p.into_inner());
        locks.entry(id.to_string()).or_default().clone()
    }

    /// Exclusive right to change sandbox `id`'s VM.
    async fn lock(&self, id: &str) -> OwnedMutexGuard<()> {
        self.lock_for(id).lock_owned().await
    }

    /// Sandbox `id` locked and as it is then, if `condition` holds for it (the reaper
    /// re-checks a deadline there: the TTL may have changed since it looked).
    async fn locked_if(
        &self,
        id: &str,
        condition: impl FnOnce(&SandboxRow) -> bool,
    ) -> Result<Option<(OwnedMutexGuard<()>, SandboxRow)>> {
        let guard = self.lock(id).await;
        let row = self.sandbox_row(id)?;
        Ok(condition(&row).then_some((guard, row)))
    }

    fn forget(&self, id: &str) {
        self.locks
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(id);
        self.connecting
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(id);
        self.set_fault(id, None);
        self.forget_agent(id);
        self.forget_agent_health(id);
        self.event_log.remove(id);
        self.egress_log.remove(id);
        self.metric_rings.forget(id);
    }

    /// The daemon-wide event stream (`GET /v1/events`).
    pub fn event_hub(&self) -> &crate::event_stream::EventHub {
        self.event_log.hub()
    }

    /// Records (Some) or clears (None) why a running sandbox's VM stopped on its own.
    pub(crate) fn set_fault(&self, id: &str, reason: Option<String>) {
        let mut faults = self.faults.lock().unwrap_or_else(|p| p.into_inner());
        match reason {
            Some(r) => faults.insert(id.to_string(), r),
            None => faults.remove(id),
        };
    }

    pub(crate) fn sandbox_row(&self, id: &str) -> Result<SandboxRow> {
        self.db
            .sandbox(id)?
            .ok_or_else(|| Error::not_found("sandbox", id))
    }

    pub(crate) fn snapshot_row(&self, id: &str) -> Result<SnapshotRow> {
        self.db
            .snapshot(id)?
            .ok_or_else(|| Error::not_found("snapshot", id))
    }

    pub fn get(&self, id: &str) -> Result<Sandbox> {
        Ok(self.view(&self.sandbox_row(id)?))
    }

    /// Every sandbox whose metadata has each `(key, value)` of `filters`.
    pub fn list(&self, filters: &[(String, String)]) -> Result<Vec<Sandbox>> {
        Ok(self
            .db
            .sandboxes()?
            .iter()
            .filter(|r| crate::model::metadata::matches(&r.metadata, filters))
            .map(|r| self.view(r))
            .collect())
    }

    /// Why a running sandbox's VM stopped on its own, if it did.
    pub(crate) fn fault(&self, id: &str) -> Option<String> {
        self.faults
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(id)
            .cloned()
    }

    fn view(&self, r: &SandboxRow) -> Sandbox {
        let (paused_at, ttl_left_secs) = Self::park_view(r);
        let fault = (r.state == STATE_RUNNING)
            .then(|| self.fault(&r.id))
            .flatten();
        Sandbox {
            id: r.id.clone(),
            name: r.name.clone(),
            state: match fault {
                Some(_) => STATE_ERROR.into(),
                None => r.state.clone(),
            },
            runtime: r.runtime.clone(),
            origin: r.origin.clone(),
            metadata: r.metadata.clone(),
            hostname: r.hostname.clone(),
            mem_mib: r.mem_mib,
            vcpus: r.vcpus,
            created_at: r.created_at,
            pid: r.vm.as_ref().map(|v| v.process.pid),
            limits: r.limits.clone(),
            cgroup: r.cgroup.clone(),
            depends_on: r.depends_on.clone(),
            exit_reason: fault.or_else(|| r.exit_reason.clone()),
            exited_at: r.exited_at,
            ttl_secs: r.ttl_secs,
            expires_at: r.expires_at,
            ttl_action: r.lifecycle.ttl_action,
            auto_resume: r.lifecycle.auto_resume,
            paused_at,
            ttl_left_secs,
            network: self.network.view(&r.network),
            fork_hooks: r
                .vm
                .as_ref()
                .map(|v| v.fork_hooks.iter().map(ForkHook::from).collect())
                .unwrap_or_default(),
            envs: r.env.vars.clone(),
            secrets: r.env.secret_names(),
            agent: (r.vm.is_some() && r.state == STATE_RUNNING).then(|| self.agent_health(&r.id)),
            volumes: volumes::mounted(r),
            disk_bytes: own_disk_bytes(r),
            metrics: self.latest_metrics([r.id.as_str()]).remove(&r.id),
        }
    }

    pub fn snapshot_view(&self, s: &SnapshotRow) -> Result<Snapshot> {
        Ok(Snapshot {
            id: s.id.clone(),
            name: s.name.clone(),
            kind: s.kind,
            runtime: s.runtime.clone(),
            source_sandbox: s.source_sandbox.clone(),
            depends_on: s.depends_on.clone(),
            dependents: self.db.dependents(&s.id)?,
            mem_mib: s.mem_mib,
            vcpus: s.vcpus,
            created_at: s.created_at,
            size_bytes: s.size_bytes,
            implicit: s.implicit,
            pause_ms: s.data.pause_ms,
            pack: s.pack.as_ref().map(PackOrigin::public),
        })
    }

    /// The agent token a VM started from `snap` wakes up holding: its source sandbox's,
    /// or for a snapshot from a pack, the one the pack carried.
    pub(crate) fn boot_token(&self, snap: &SnapshotRow) -> String {
        match &snap.pack {
            Some(p) if !p.agent_token.is_empty() => p.agent_token.clone(),
            _ => self.dirs.agent_key.token(&snap.source_sandbox),
        }
    }

    /// Runs blocking runtime work off the async threads.
    async fn blocking<T: Send + 'static>(
        &self,
        f: impl FnOnce() -> T + Send + 'static,
    ) -> Result<T> {
        tokio::task::spawn_blocking(f)
            .await
            .map_err(|e| Error::Internal(format!("blocking task failed: {e}")))
    }

    /// Removes a sandbox that never ran: files, cgroup, record.
    fn discard(&self, row: &SandboxRow) {
        self.cleanup_files(row);
        if let Err(e) = self.db.release_volumes(&row.id) {
            tracing::warn!("releasing the volumes of {}: {e}", row.id);
        }
        if let Err(e) = self.db.delete_sandbox(&row.id) {
            tracing::warn!("forgetting {}: {e}", row.id);
        }
        self.forget(&row.id);
        self.announce_deleted(&row.id, "not started");
    }

    /// `sandbox deleted` on the event stream (its log went with it).
    fn announce_deleted(&self, id: &str, reason: &str) {
        let fields = [("reason", reason.to_string())];
        self.event_log
            .announce(id, EventLevel::Info, "sandbox deleted", &fields);
    }

    /// `sandbox creating` on the event stream: a new record, not yet worth a log entry
    /// (`sandbox started` follows, or `sandbox deleted` if it never does).
    pub(super) fn announce_creating(&self, row: &SandboxRow) {
        let from = match &row.origin {
            Origin::Branch { parent, .. } => ("parent", parent.clone()),
            _ => ("runtime", row.runtime.clone()),
        };
        self.event_log
            .announce(&row.id, EventLevel::Info, "sandbox creating", &[from]);
    }

    fn cleanup_files(&self, row: &SandboxRow) {
        if let Some(att) = &row.network.attachment {
            self.network.detach(att);
        }
        if let Some(cg) = &row.cgroup.path {
            if let Err(e) = cgroup::destroy(std::path::Path::new(cg)) {
                tracing::warn!("sandbox {}: {e}", row.id);
            }
        }
        let dir = self.dirs.vms.join(&row.id);
        if let Err(e) = std::fs::remove_dir_all(&dir) {
            if e.kind() != std::io::ErrorKind::NotFound {
                tracing::warn!("removing {}: {e}", dir.display());
            }
        }
    }

    /// Kills the VM and removes everything the sandbox owns.
    pub async fn delete(self: &Arc<Self>, id: &str) -> Result<()> {
        self.delete_if(id, "deleted", |_| true).await.map(|_| ())
    }

    /// [`Manager::delete`] if `condition` holds for the sandbox as it is
    /// once locked (the reaper re-checks the deadline there, as the TTL may
    /// have changed since it looked); returns whether it was deleted. `reason` goes
    /// to the event stream's `sandbox deleted`.
    pub(crate) async fn delete_if(
        self: &Arc<Self>,
        id: &str,
        reason: &str,
        condition: impl FnOnce(&SandboxRow) -> bool,
    ) -> Result<bool> {
        let Some((_guard, mut row)) = self.locked_if(id, condition).await? else {
            return Ok(false);
        };
        self.flush_volumes(&row).await;
        row.state = STATE_DELETING.into();
        self.db.put_sandbox(&row)?;
        fault::point("delete.recorded");
        self.finish_delete(&row, reason).await?;
        Ok(true)
    }

    /// The deletion of a sandbox recorded as `deleting`: VM, files, cgroup, record, and
    /// the branch points only it still needed. Also run by start-up for a deletion a
    /// crash interrupted.
    pub(crate) async fn finish_delete(&self, row: &SandboxRow, reason: &str) -> Result<()> {
        if let Some(vm) = row.vm.clone() {
            let rt = self.runtime.clone();
            self.blocking(move || rt.destroy(&vm)).await?;
        }
        fault::point("delete.destroyed");
        if let Some(park) = &row.lifecycle.park {
            pause::remove_park_files(park, true);
        }
        self.cleanup_files(row);
        // Before the record: a crash in between leaves a `deleting` sandbox (finished at
        // the next start), never exposures without their sandbox.
        self.db.delete_ports(&row.id)?;
        // The VM is gone: its writes are in the volume's image (QEMU wrote them through
        // the host's page cache); synced before another sandbox may have it.
        for v in row
            .vm
            .iter()
            .flat_map(|vm| &vm.volumes)
            .filter(|v| v.writes_volume)
        {
            if let Err(e) = std::fs::File::open(&v.file).and_then(|f| f.sync_all()) {
                tracing::warn!("syncing volume {}: {e}", v.volume);
            }
        }
        self.db.release_volumes(&row.id)?;
        fault::point("delete.volumes-released");
        self.db.delete_sandbox(&row.id)?;
        self.forget(&row.id);
        self.announce_deleted(&row.id, reason);
        tracing::info!("sandbox {} deleted", row.id);
        self.collect_garbage()
    }

    pub(crate) fn running_vm(&self, row: &SandboxRow) -> Result<VmRecord> {
        if pause::is_parked(row) {
            return Err(Error::Paused(row.id.clone()));
        }
        match (&row.vm, row.state.as_str()) {
            (Some(vm), STATE_RUNNING | STATE_PAUSED) => match self.fault(&row.id) {
                None => Ok(vm.clone()),
                Some(why) => Err(Error::NotRunning {
                    id: row.id.clone(),
                    state: format!("{STATE_ERROR} ({why})"),
                }),
            },
            _ => Err(Error::NotRunning {
                id: row.id.clone(),
                state: match &row.exit_reason {
                    Some(why) if row.state == STATE_DEAD => format!("{} ({why})", row.state),
                    _ => row.state.clone(),
                },
            }),
        }
    }

    /// The events of sandbox `id`'s log that `q` asks for.
    pub fn events(&self, id: &str, q: &EventsQuery) -> Result<EventList> {
        self.sandbox_row(id)?;
        Ok(EventList {
            events: self.event_log.read(id, q),
        })
    }

    /// `GET /v1/sandboxes/{id}/egress`: the last entries of the sandbox's egress record,
    /// and (to follow it) the new ones of every sandbox from the moment they were read.
    pub fn egress(
        &self,
        id: &str,
        limit: usize,
    ) -> Result<(
        Vec<crate::model::EgressEntry>,
        tokio::sync::broadcast::Receiver<crate::model::EgressEntry>,
    )> {
        self.sandbox_row(id)?;
        let live = self.egress_log.subscribe();
        Ok((self.egress_log.read(id, limit), live))
    }

    /// Where a sandbox's console log is (None: it has none now).
    pub fn console_log(&self, id: &str) -> Result<Option<PathBuf>> {
        let row = self.sandbox_row(id)?;
        Ok(match &row.vm {
            Some(vm) => Some(console::path(&vm.dir)),
            // Paused: the console log of the VM it had, still in its directory.
            None if pause::is_parked(&row) => Some(console::path(&self.dirs.vms.join(&row.id))),
            None => None,
        })
    }

    /// Removes implicit snapshots (branch points) nothing depends on any more.
    pub(crate) fn collect_garbage(&self) -> Result<()> {
        loop {
            let mut removed = false;
            for s in self.db.snapshots()? {
                if s.implicit && self.db.dependents(&s.id)?.is_empty() {
                    self.db.delete_snapshot(&s.id)?;
                    self.remove_snapshot_files(&s);
                    tracing::info!("branch point {} collected", s.id);
                    removed = true;
                }
            }
            if !removed {
                return Ok(());
            }
        }
    }

    pub(crate) fn remove_snapshot_files(&self, s: &SnapshotRow) {
        let _ = std::fs::remove_file(&s.data.disk_layer);
        if let Err(e) = std::fs::remove_dir_all(&s.data.dir) {
            if e.kind() != std::io::ErrorKind::NotFound {
                tracing::warn!("removing {}: {e}", s.data.dir.display());
            }
        }
    }
}

/// Bytes the sandbox's own writable disk layer holds on the host (allocated blocks: a
/// sparse layer counts what it wrote), while it has a VM.
pub(crate) fn own_disk_bytes(r: &SandboxRow) -> Option<u64> {
    use std::os::unix::fs::MetadataExt;
    let vm = r.vm.as_ref()?;
    std::fs::metadata(&vm.disk).ok().map(|m| m.blocks() * 512)
}
