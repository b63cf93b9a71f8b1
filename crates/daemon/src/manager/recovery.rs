//! Finishing or undoing what a killed daemon left half-done. Every multi-step operation
//! records its intent before it changes anything a restart could misread:
//!
//! * snapshot and branch: the sandbox row carries a [`PendingCapture`] (and shows
//!   `paused`) while the runtime captures; the result and the cleared intent are one
//!   transaction. At start-up the runtime says whether the capture completed: if the VM
//!   runs on the new layer, the snapshot (or branch point) is recorded and the sandbox's
//!   chain follows it; if not, its files go. Either way the VM is resumed.
//! * branch children, creations and restores are rows in `creating` until their VM is
//!   recorded; start-up kills whatever VM they started and reports them dead.
//! * deletion marks the row `deleting` first; start-up finishes it.
//! * pause and resume are recorded as `pausing` / `resuming` with the park directory
//!   named first; start-up settles them (`pause`).
//! * snapshot deletion forgets the record before removing files.
//!
//! Orphan removal then deletes files no record names, except those a live VM holds
//! open: a file in use is never removed, whatever the records say.
use std::collections::HashSet;
use std::path::{Path, PathBuf};

use super::{now, Manager};
use crate::db::{PendingCapture, SandboxRow, SnapshotRow};
use crate::error::Result;
use crate::procs::{self, ProcId};

impl Manager {
    /// Settles the capture a crash interrupted on `row`'s live VM (see the module doc).
    /// If the runtime cannot tell, the intent and every file stay for the next start.
    pub(crate) async fn finish_capture(&self, row: &mut SandboxRow) -> Result<()> {
        let (Some(pending), Some(vm)) = (row.pending.clone(), row.vm.clone()) else {
            return Ok(());
        };
        let rt = self.runtime.clone();
        let p = pending.clone();
        let outcome = self
            .blocking(move || rt.finished_capture(&vm, p.kind, &p.dir, &p.next_disk))
            .await?;
        match outcome {
            Ok(Some(data)) => {
                let PendingCapture {
                    snapshot,
                    kind,
                    name,
                    next_disk,
                    ..
                } = pending;
                let snap = SnapshotRow::captured(row, snapshot.clone(), name, kind, data, now());
                row.depends_on.push(snapshot.clone());
                if let Some(vm) = row.vm.as_mut() {
                    vm.disk = next_disk;
                }
                row.pending = None;
                self.db.commit(&[row], &[&snap])?;
                tracing::warn!(
                    "sandbox {}: the {} {snapshot} a crash interrupted had completed: recorded",
                    row.id,
                    kind.as_str()
                );
            }
            Ok(None) => {
                let _ = std::fs::remove_file(&pending.next_disk);
                if let Err(e) = std::fs::remove_dir_all(&pending.dir) {
                    if e.kind() != std::io::ErrorKind::NotFound {
                        tracing::warn!("removing {}: {e}", pending.dir.display());
                    }
                }
                row.pending = None;
                self.db.put_sandbox(row)?;
                tracing::warn!(
                    "sandbox {}: the {} {} a crash interrupted had not been taken: undone",
                    row.id,
                    pending.kind.as_str(),
                    pending.snapshot
                );
            }
            Err(e) => tracing::warn!(
                "sandbox {}: cannot tell whether the {} {} a crash interrupted completed \
                 ({e}); its files stay until a later start can",
                row.id,
                pending.kind.as_str(),
                pending.snapshot
            ),
        }
        Ok(())
    }

    /// Layer files and snapshot directories no record mentions (left by a daemon killed
    /// in the middle of an operation), unless a live VM has them open.
    pub(crate) fn remove_orphans(&self) -> Result<()> {
        let mut keep: HashSet<PathBuf> = HashSet::new();
        let mut in_use: Vec<PathBuf> = Vec::new();
        for s in self.db.sandboxes()? {
            if let Some(vm) = s.vm {
                if vm.process.is_alive() {
                    in_use.extend(procs::open_files(vm.process.pid));
                }
                keep.insert(vm.disk);
            }
            if let Some(p) = s.pending {
                keep.insert(p.dir);
                keep.insert(p.next_disk);
            }
            if let Some(p) = s.lifecycle.park {
                keep.insert(p.data.dir);
                keep.insert(p.data.disk_layer);
                keep.insert(p.disk);
            }
            keep.insert(self.dirs.vms.join(&s.id));
        }
        let sandboxes: HashSet<String> = self.db.sandboxes()?.into_iter().map(|s| s.id).collect();
        self.event_log.remove_orphans(|id| sandboxes.contains(id));
        self.egress_log.remove_orphans(|id| sandboxes.contains(id));
        for s in self.db.snapshots()? {
            keep.insert(s.data.disk_layer);
            keep.insert(s.data.dir);
        }
        // Scratch space of operations (packing a snapshot) the last daemon did not finish.
        let scratch = self.dirs.state.join("tmp");
        for dir in [
            &self.dirs.layers,
            &self.dirs.snapshots,
            &self.dirs.vms,
            &scratch,
        ] {
            let Ok(entries) = std::fs::read_dir(dir) else {
                continue;
            };
            for e in entries.flatten() {
                let path = e.path();
                if keep.contains(&path) {
                    continue;
                }
                if let Some(open) = in_use.iter().find(|f| f.starts_with(&path)) {
                    tracing::warn!(
                        "{} is named by no record but a running VM has {} open: kept",
                        path.display(),
                        open.display()
                    );
                    continue;
                }
                tracing::info!("removing orphan {}", path.display());
                let res = if path.is_dir() {
                    std::fs::remove_dir_all(&path)
                } else {
                    std::fs::remove_file(&path)
                };
                if let Err(e) = res {
                    tracing::warn!("removing {}: {e}", path.display());
                }
            }
        }
        // Pack imports a killed daemon left: staged blobs (of this daemon's, or of
        // another's sharing the cache whose lock nobody holds) and decoded base images.
        let swept = zygote_oci::pack::staging::sweep();
        if swept > 0 {
            tracing::info!("removed {swept} pack import staging directories left by a crash");
        }
        if let Err(e) = zygote_images::pack::scratch_dir() {
            tracing::warn!("cleaning the image store's scratch directory: {e}");
        }
        Ok(())
    }
}

/// Kills the VM processes of a creation the daemon did not finish (their pids were never
/// recorded): the pid file QEMU writes in the VM's directory names one (its command line
/// must mention the directory, so a recycled pid is never hit), and any process holding
/// a file in that directory open is one too (a branch child of zygote's VMM holds its
/// console there) unless it is a VM some record names (`recorded`: a parent VMM).
pub(crate) fn kill_unrecorded(dir: &Path, recorded: &[ProcId]) {
    let mut victims = Vec::new();
    if let Some(pid) = std::fs::read_to_string(dir.join("qemu.pid"))
        .ok()
        .and_then(|s| s.trim().parse::<u32>().ok())
    {
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
        if String::from_utf8_lossy(&cmdline).contains(&*dir.to_string_lossy()) {
            victims.extend(ProcId::of(pid));
        }
    }
    victims.extend(procs::holding_files_under(dir));
    for id in victims {
        if recorded.contains(&id) {
            continue;
        }
        tracing::info!(
            "killing VM process {} of an unfinished creation in {}",
            id.pid,
            dir.display()
        );
        id.signal(libc::SIGKILL);
    }
}
