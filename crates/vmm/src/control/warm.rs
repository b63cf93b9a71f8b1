//! Warm spawners in a served VMM (see `vmm::warm`): the loop keeps `warm_spawners` of
//! them ready and caught up between requests, and a branch into one child with no
//! point to keep goes through one when it is cheaper than a fork. Everything else (and
//! any warm failure before the pause) takes the fork path, so a reply never depends on
//! a spawner being there.
use std::os::fd::RawFd;
use std::os::unix::net::UnixListener;
use std::time::{Duration, Instant};

use super::protocol::{BranchInfo, ChildInfo, ChildSpec};
use super::server::{console_sink, serve_listener, ServeOptions};
use crate::devices::virtio::persist::DeviceHostConfig;
use crate::vmm::branch::ChildContext;
use crate::vmm::warm::{
    ChildSetup, Payload, SpawnerSetup, WarmBranchRequest, WarmError, DEFAULT_MAX_PAGES,
};
use crate::Vmm;

/// How often the loop catches spawners up (reads the dirty logs, writes what changed)
/// while it is busy with requests.
const MAINTAIN_EVERY: Duration = Duration::from_millis(50);

/// No spawner is forked for this long after the VMM starts (a branch child's included)
/// or after a branch: a spawner's fork pauses the guest and its VM build takes a CPU,
/// and both would land on what matters then, the new child's first moments (its agent
/// reidentifying, the caller's first exec). Measured in the nested lane: forking them
/// at once made every child's bring-up ~100 ms slower than the fork path's.
const QUIET_AFTER_BRANCH: Duration = Duration::from_millis(1000);

/// The loop's bookkeeping for [`maintain`].
pub struct Upkeep {
    last: Option<Instant>,
    quiet_until: Instant,
}

impl Default for Upkeep {
    fn default() -> Self {
        Self::new()
    }
}

impl Upkeep {
    pub fn new() -> Self {
        Self {
            last: None,
            quiet_until: Instant::now() + QUIET_AFTER_BRANCH,
        }
    }

    /// A branch was asked for: hold new spawners back for a while.
    pub fn branched(&mut self) {
        self.quiet_until = Instant::now() + QUIET_AFTER_BRANCH;
    }
}

/// Keep `opts.warm_spawners` spawners: catch the ready ones up with the guest, and fork
/// one more when fewer are kept (one per call: each fork pauses the guest briefly), once
/// no branch has been asked for a while.
pub fn maintain(vmm: &mut Vmm, opts: &ServeOptions, upkeep: &mut Upkeep) {
    if opts.warm_spawners == 0 || vmm.is_paused() {
        return;
    }
    let quiet = Instant::now() >= upkeep.quiet_until;
    let missing = quiet && vmm.spawner_count() < opts.warm_spawners;
    if !missing && upkeep.last.is_some_and(|t| t.elapsed() < MAINTAIN_EVERY) {
        return;
    }
    upkeep.last = Some(Instant::now());
    if let Err(e) = vmm.catch_up_spawners() {
        tracing::warn!(%e, "catching warm spawners up");
        return;
    }
    let kept = match vmm.spawners() {
        Ok(s) => s.len(),
        Err(_) => return, // the guest has ended: the loop sees it next
    };
    if quiet && kept < opts.warm_spawners {
        prepare(vmm, opts);
    }
}

/// The child a spawner becomes, from the branch's payload: the child's `ChildSpec` as
/// JSON (its control socket is already bound by the parent; the listener comes as the
/// payload's first fd).
fn child_setup(payload: &mut Payload) -> ChildSetup {
    let spec: ChildSpec = serde_json::from_slice(&payload.bytes).unwrap_or_else(|e| {
        // The parent wrote it: unreadable means a bug. A setup without resources
        // fails the restore of any VM with devices, which the parent then reports.
        eprintln!("zygote: warm spawner: bad child description: {e}");
        ChildSpec::default()
    });
    ChildSetup {
        serial: console_sink(spec.console.as_deref()),
        devices: DeviceHostConfig {
            vsock_uds: spec.vsock.clone(),
            net_tap: spec.tap.clone(),
            disk_files: spec.disk_files.clone(),
        },
        cgroup: spec.cgroup.clone(),
        netns: spec.netns.clone(),
    }
}

fn prepare(vmm: &mut Vmm, opts: &ServeOptions) {
    let opts = opts.clone();
    let child_main = move |ctx: ChildContext, mut payload: Payload| -> i32 {
        let Ok(spec) = serde_json::from_slice::<ChildSpec>(&payload.bytes) else {
            return 1;
        };
        if payload.fds.is_empty() {
            eprintln!("zygote: warm branch child: no listener was passed");
            return 1;
        }
        let listener = UnixListener::from(payload.fds.remove(0));
        serve_listener(ctx.vmm, listener, &spec.socket, opts.clone())
    };
    let setup = SpawnerSetup {
        cgroup: None,
        child: &child_setup,
        child_main: &child_main,
        keep_fds: Vec::new(),
    };
    if let Err(e) = vmm.prepare_spawner(&setup) {
        tracing::warn!(%e, "preparing a warm spawner");
    }
}

/// Branch into `spec`'s child through a warm spawner. None: no spawner could take it
/// before the pause (none ready, or too far behind): the caller forks instead.
pub fn branch(
    vmm: &mut Vmm,
    spec: &ChildSpec,
    listener: RawFd,
    timeout_ms: u64,
    opts: &ServeOptions,
) -> Option<Result<BranchInfo, WarmError>> {
    if opts.warm_spawners == 0 {
        return None;
    }
    let payload = serde_json::to_vec(spec).ok()?;
    let result = vmm.branch_warm(&WarmBranchRequest {
        payload: &payload,
        fds: &[listener],
        ready_timeout: Duration::from_millis(timeout_ms),
        max_pages: DEFAULT_MAX_PAGES,
        by_cost: true,
        verify: false,
    });
    let info = match result {
        Err(e @ (WarmError::NoSpawner | WarmError::TooStale { .. })) => {
            tracing::info!(reason = %e, "branch forks instead of using a warm spawner");
            return None;
        }
        Err(e) => return Some(Err(e)),
        Ok(r) => BranchInfo {
            children: vec![ChildInfo {
                index: 0,
                pid: r.child.pid,
                socket: spec.socket.clone(),
                ready_ms: r.child.ready_after.as_secs_f64() * 1e3,
                restore_ms: r.child.restore.as_secs_f64() * 1e3,
                catch_up_ms: Some(r.catch_up.as_secs_f64() * 1e3),
                state_ms: Some(r.send.as_secs_f64() * 1e3),
                state_bytes: Some(r.state_bytes),
            }],
            pause_ms: r.pause.as_secs_f64() * 1e3,
            spawner: None,
            warm: true,
        },
    };
    // The replacement is forked by the loop's next `maintain`, after this reply left.
    Some(Ok(info))
}
