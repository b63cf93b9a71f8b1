//! The watch on running VMs. A VM process that exits without being asked to is recorded
//! as dead with the reason. A VM whose process lives can still have stopped running its
//! guest (QEMU stops it when a disk write fails, e.g. on a full host disk): the watcher
//! asks each VM for its own run state, shows such a sandbox as `error` with the reason
//! (so execs fail at once with it instead of hanging), and lets it go on when the cause
//! is gone (free space again on the disk layer's filesystem). The fault is kept in
//! memory, not in the database, which a full disk may not let us write. A running VM
//! whose agent stopped answering or garbled its replies (`agent_link`) is connected to
//! again in the background, so its `agent` health recovers without a call.
use std::sync::Arc;
use std::time::Duration;

use zygote_images::space::free_bytes;

use super::{Manager, STATE_RUNNING};
use crate::error::Result;
use crate::model::EventLevel;
use crate::runtime::RunState;

/// How often VM processes are checked for unexpected exits.
const WATCH_INTERVAL: Duration = Duration::from_millis(500);
/// VMs are asked for their run state every this many intervals (a QMP round trip each).
const RUN_STATE_EVERY: u32 = 4;
/// Free space a full disk layer's filesystem needs again before its VM is resumed.
const RESUME_FREE_BYTES: u64 = 64 << 20;

impl Manager {
    pub async fn watch(self: Arc<Self>) {
        let mut tick = tokio::time::interval(WATCH_INTERVAL);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut n = 0u32;
        loop {
            tick.tick().await;
            n = n.wrapping_add(1);
            if let Err(e) = self.check_all(n.is_multiple_of(RUN_STATE_EVERY)).await {
                tracing::warn!("watching VMs: {e}");
            }
        }
    }

    async fn check_all(self: &Arc<Self>, ask_run_state: bool) -> Result<()> {
        for row in self.db.sandboxes()? {
            if row.state != STATE_RUNNING || row.vm.is_none() {
                continue;
            }
            // Busy sandboxes are being changed on purpose; look next time.
            let Ok(_guard) = self.lock_for(&row.id).try_lock_owned() else {
                continue;
            };
            // Re-read under the lock: a delete may have just finished.
            let Some(mut row) = self.db.sandbox(&row.id)? else {
                continue;
            };
            let Some(vm) = row.vm.clone() else { continue };
            if row.state != STATE_RUNNING {
                continue;
            }
            let rt = self.runtime.clone();
            if !vm.process.is_alive() {
                if let Some(exit) = self.blocking(move || rt.exit_status(&vm)).await? {
                    self.set_fault(&row.id, None);
                    self.mark_dead(&mut row, exit.reason)?;
                    self.forget_agent(&row.id);
                }
                continue;
            }
            let known = self.fault(&row.id);
            if !ask_run_state && known.is_none() {
                continue;
            }
            if known.is_none() && self.agent_needs_healing(&row.id) {
                self.heal_agent(&row.id);
            }
            let disk_has_room = free_bytes(&vm.disk).is_none_or(|f| f >= RESUME_FREE_BYTES);
            let state = self
                .blocking(move || {
                    let state = rt.run_state(&vm)?;
                    match state {
                        RunState::Faulted {
                            resumable: true, ..
                        } if disk_has_room => {
                            rt.resume(&vm)?;
                            rt.run_state(&vm)
                        }
                        other => Ok(other),
                    }
                })
                .await?;
            match state {
                Ok(RunState::Running) => {
                    if known.is_some() {
                        tracing::info!("sandbox {}: running again", row.id);
                        self.set_fault(&row.id, None);
                        self.event_log
                            .record(&row.id, EventLevel::Info, "running again", &[]);
                    }
                }
                Ok(RunState::Faulted { reason, resumable }) => {
                    if known.as_deref() != Some(&*reason) {
                        let then = if resumable {
                            " (it goes on once that is fixed)"
                        } else {
                            ""
                        };
                        tracing::warn!(
                            "sandbox {}: the VM stopped running its guest: {reason}{then}",
                            row.id
                        );
                        self.event_log.record(
                            &row.id,
                            EventLevel::Error,
                            "the VM stopped running its guest",
                            &[
                                ("reason", reason.clone()),
                                ("resumable", resumable.to_string()),
                            ],
                        );
                        self.set_fault(&row.id, Some(reason));
                    }
                }
                // The VM did not answer: the next round looks again (and the process
                // check catches an exit).
                Err(e) => tracing::debug!("sandbox {}: run state: {e}", row.id),
            }
        }
        Ok(())
    }
}
