//! Snapshots of a running VM and restore from them.
//!
//! - `full`: pause, capture, write all memory (all-zero pages become holes), resume.
//! - `diff`: pause, capture, take the pages KVM logged as dirty since the previous
//!   snapshot of this VM, fork; the parent resumes at once while the frozen child writes
//!   those pages as a layer on the previous snapshot.
//! - `live`: pause, capture, fork; the parent resumes at once (the pause equals a branch
//!   pause) while the frozen child writes a full snapshot from its copy-on-write view.
//!
//! Forking is what keeps a diff's pause short: writing its pages while paused cost the
//! same per page as a full snapshot (about 150 ms for 11 MiB in the emulated lane, 1.6 ms
//! of it capture), while a fork only copies page tables. The caller still waits for the
//! writer, so a snapshot is on disk when the call returns.
//!
//! Restore maps the base memory file MAP_PRIVATE (lazy; the page cache is shared by all
//! VMs restored from it), applies diff layers, restores `VmState` and runs.
use std::fs::File;
use std::io::Read;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use super::{RestoreConfig, Vmm, VmmError};
use crate::memory::GuestRam;
pub use crate::persist::snapshot_files::SnapshotMode;
use crate::persist::snapshot_files::{self as files, MemoryView, PendingSnapshot, SnapshotMeta};
use crate::persist::{CpuIdentity, PersistError, VmState, FORMAT_VERSION};

/// Longest failure message a snapshot writer sends back (below PIPE_BUF: one write).
const WRITER_MESSAGE_MAX: usize = 4000;

#[derive(Debug, thiserror::Error)]
pub enum SnapshotError {
    #[error(transparent)]
    Vmm(#[from] VmmError),
    #[error(transparent)]
    Persist(#[from] PersistError),
    #[error("a diff snapshot needs an earlier full or live snapshot of this VM (or a VM restored from one)")]
    NoBase,
    #[error("snapshot {0} is a diff chain without a full base")]
    BrokenChain(PathBuf),
    #[error("writing the {mode} snapshot failed: {message} (writer pid {pid})")]
    Writer {
        mode: SnapshotMode,
        pid: libc::pid_t,
        message: String,
    },
    #[error("fork for the snapshot writer failed: {0}")]
    Fork(std::io::Error),
    #[error(transparent)]
    Memory(#[from] crate::memory::MemoryError),
}

#[derive(Debug, Clone)]
pub struct SnapshotReport {
    pub path: PathBuf,
    pub mode: SnapshotMode,
    /// How long the vCPUs were stopped.
    pub pause: Duration,
    /// Until the snapshot was complete on disk.
    pub total: Duration,
    pub pages_written: u64,
    /// Where the pause went.
    pub phases: SnapshotPhases,
}

/// The parts of a snapshot's pause (zero where a mode has no such part).
#[derive(Debug, Clone, Copy, Default)]
pub struct SnapshotPhases {
    /// Stopping the vCPUs and reading vCPU, platform and device state.
    pub capture: Duration,
    /// Reading (and re-arming) KVM's dirty log: diff only.
    pub dirty_log: Duration,
    /// Writing memory and state files while paused: full only (diff and live snapshots
    /// are written by a frozen copy while the VM runs).
    pub write: Duration,
}

fn now_unix() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// Write a complete snapshot directory from a consistent memory view.
fn write_snapshot(
    dest: &Path,
    mode: SnapshotMode,
    state: &VmState,
    cpu: &CpuIdentity,
    mem: &MemoryView,
    diff: Option<(&Path, &[u64])>,
    device_data: &[Vec<u8>],
) -> Result<u64, PersistError> {
    let pending = PendingSnapshot::create(dest)?;
    for (i, data) in device_data
        .iter()
        .enumerate()
        .filter(|(_, d)| !d.is_empty())
    {
        files::write_file_synced(&pending.file(&files::device_data_file(i)), data)?;
    }
    let (pages, crc) = match diff {
        Some((_, bitmap)) => {
            files::write_file_synced(
                &pending.file(files::DIRTY_FILE),
                &files::bitmap_bytes(bitmap),
            )?;
            files::write_memory(
                &pending.file(files::MEMORY_FILE),
                mem,
                |p| files::bit_set(bitmap, p),
                false,
            )?
        }
        None => files::write_memory(&pending.file(files::MEMORY_FILE), mem, |_| true, true)?,
    };
    pending.write_state(state, cpu)?;
    pending.commit(&SnapshotMeta {
        format_version: FORMAT_VERSION,
        mode,
        parent: diff.map(|(p, _)| p.to_path_buf()),
        mem_bytes: mem.bytes.len() as u64,
        pages_written: pages,
        memory_crc32: crc,
        created_unix: now_unix(),
    })?;
    Ok(pages)
}

fn absolute(p: &Path) -> PathBuf {
    std::path::absolute(p).unwrap_or_else(|_| p.to_path_buf())
}

impl Vmm {
    /// Take a snapshot into the (new) directory `dest`.
    pub fn snapshot(
        &mut self,
        mode: SnapshotMode,
        dest: &Path,
    ) -> Result<SnapshotReport, SnapshotError> {
        let dest = absolute(dest);
        let started = Instant::now();
        let was_paused = self.paused;
        let parent = match mode {
            SnapshotMode::Diff => Some(
                self.last_snapshot
                    .clone()
                    .filter(|_| self.dirty_logging)
                    .ok_or(SnapshotError::NoBase)?,
            ),
            _ => None,
        };
        let state = self.pause_and_capture()?;
        let mut phases = SnapshotPhases {
            capture: started.elapsed(),
            ..Default::default()
        };
        let result = self.snapshot_paused(
            mode,
            &dest,
            &state,
            parent.as_deref(),
            (started, &mut phases),
            was_paused,
        );
        if result.is_err() && !was_paused && self.paused && self.exit.is_none() {
            let _ = self.resume();
        }
        let (pages, pause) = result?;
        self.last_snapshot = Some(dest.clone());
        Ok(SnapshotReport {
            path: dest,
            mode,
            pause,
            total: started.elapsed(),
            pages_written: pages,
            phases,
        })
    }

    fn snapshot_paused(
        &mut self,
        mode: SnapshotMode,
        dest: &Path,
        state: &VmState,
        parent: Option<&Path>,
        (started, phases): (Instant, &mut SnapshotPhases),
        was_paused: bool,
    ) -> Result<(u64, Duration), SnapshotError> {
        let resume = |vmm: &mut Vmm| -> Result<Duration, SnapshotError> {
            if !was_paused {
                vmm.resume()?;
            }
            Ok(started.elapsed())
        };
        match mode {
            SnapshotMode::Full => {
                let t = Instant::now();
                // SAFETY: the VM is paused: no vCPU or device writes guest memory now.
                let mem = MemoryView {
                    bytes: unsafe { self.ram.host_slice() },
                };
                let device_data = self.device_private_data().map_err(PersistError::from)?;
                let pages = write_snapshot(dest, mode, state, &self.cpu, &mem, None, &device_data)?;
                phases.write = t.elapsed();
                self.start_dirty_log()?;
                Ok((pages, resume(self)?))
            }
            SnapshotMode::Diff => {
                let t = Instant::now();
                let bitmap = self.take_dirty_pages()?;
                phases.dirty_log = t.elapsed();
                let written = self.write_from_frozen_copy(
                    dest,
                    mode,
                    state,
                    parent.map(|p| (p, bitmap.as_slice())),
                    started,
                    was_paused,
                );
                if written.is_err() {
                    // Those pages are out of KVM's log now: the next diff writes them.
                    super::dirty::or_into(&mut self.unsaved_dirty, &bitmap);
                }
                written
            }
            SnapshotMode::Live => {
                // Later diffs are relative to this instant, unless the writer fails: then
                // they still layer on the previous snapshot and owe what it has not.
                let owed = if self.dirty_logging {
                    self.take_dirty_pages()?
                } else {
                    Vec::new()
                };
                self.start_dirty_log()?;
                let written =
                    self.write_from_frozen_copy(dest, mode, state, None, started, was_paused);
                if written.is_err() {
                    super::dirty::or_into(&mut self.unsaved_dirty, &owed);
                }
                written
            }
        }
    }

    /// Fork a frozen copy that writes the snapshot, resume at once, wait for the copy.
    /// Returns the pages written and the pause.
    fn write_from_frozen_copy(
        &mut self,
        dest: &Path,
        mode: SnapshotMode,
        state: &VmState,
        diff: Option<(&Path, &[u64])>,
        started: Instant,
        was_paused: bool,
    ) -> Result<(u64, Duration), SnapshotError> {
        // The writer reports why it failed through this pipe.
        let mut fds = [0 as RawFd; 2];
        // SAFETY: plain pipe creation.
        if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
            return Err(SnapshotError::Fork(std::io::Error::last_os_error()));
        }
        // SAFETY: both ends are ours from here on.
        let (err_r, err_w) = unsafe { (File::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
        // SAFETY: all VMM threads are parked holding no locks; the child only writes
        // files from its frozen copy of memory and exits.
        let pid = unsafe { libc::fork() };
        if pid == 0 {
            self.snapshot_writer_child(dest, mode, state, diff, err_w.as_raw_fd());
        }
        drop(err_w);
        let fork_err = (pid < 0).then(std::io::Error::last_os_error);
        if !was_paused {
            self.resume()?;
        }
        let pause = started.elapsed();
        if let Some(err) = fork_err {
            return Err(SnapshotError::Fork(err));
        }
        // The message is short (bounded by the writer) and the writer's only output:
        // read it to EOF (the writer's exit), then reap.
        let mut message = String::new();
        let _ = err_r
            .take(WRITER_MESSAGE_MAX as u64)
            .read_to_string(&mut message);
        let mut status = 0;
        // SAFETY: waiting for our own child.
        unsafe { libc::waitpid(pid, &mut status, 0) };
        if !(libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0) {
            if message.is_empty() {
                message = format!("exited with status {status:#x}");
            }
            return Err(SnapshotError::Writer { mode, pid, message });
        }
        let meta = files::read_meta(dest)?;
        Ok((meta.pages_written, pause))
    }

    /// A full snapshot of this process's memory as it is, for a frozen copy (the branch
    /// spawner) in which nothing else runs.
    pub(super) fn write_full_snapshot(
        &self,
        state: &VmState,
        dest: &Path,
    ) -> Result<u64, PersistError> {
        // SAFETY: called in a frozen copy; nothing else writes its memory.
        let mem = MemoryView {
            bytes: unsafe { self.ram.host_slice() },
        };
        let data = self.device_private_data()?;
        write_snapshot(
            dest,
            SnapshotMode::Full,
            state,
            &self.cpu,
            &mem,
            None,
            &data,
        )
    }

    fn snapshot_writer_child(
        &self,
        dest: &Path,
        mode: SnapshotMode,
        state: &VmState,
        diff: Option<(&Path, &[u64])>,
        err_w: RawFd,
    ) -> ! {
        let code = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            // Drop every inherited fd except stderr and the error pipe: the writer opens
            // its own files.
            super::branch::close_fds_except(&mut [err_w]);
            // SAFETY: this process is a frozen copy; nothing else writes its memory.
            let mem = MemoryView {
                bytes: unsafe { self.ram.host_slice() },
            };
            let written = self
                .device_private_data()
                .map_err(PersistError::from)
                .and_then(|data| write_snapshot(dest, mode, state, &self.cpu, &mem, diff, &data));
            match written {
                Ok(_) => 0,
                Err(e) => {
                    let mut text = e.to_string();
                    text.truncate(WRITER_MESSAGE_MAX);
                    // SAFETY: writing a short buffer to our pipe.
                    unsafe { libc::write(err_w, text.as_ptr().cast(), text.len()) };
                    1
                }
            }
        }))
        .unwrap_or(101);
        // Exit without running the parent's destructors.
        super::branch::exit_now(code)
    }

    /// Rebuild a VM from the snapshot at `dir` (following diff layers to their base).
    /// With `verify`, every memory file's checksum is recomputed first (reads it all).
    pub fn restore_snapshot(
        dir: &Path,
        mut cfg: RestoreConfig,
        verify: bool,
    ) -> Result<Vmm, SnapshotError> {
        let dir = absolute(dir);
        let chain = files::chain(&dir)?;
        let (base_dir, base_meta) = &chain[0];
        if base_meta.mode == SnapshotMode::Diff {
            return Err(SnapshotError::BrokenChain(dir));
        }
        if verify {
            for (d, meta) in &chain {
                files::verify_memory(d, meta)?;
            }
        }
        let state = files::read_state(&dir, &CpuIdentity::host())?;
        let ram = GuestRam::from_file(&base_dir.join(files::MEMORY_FILE), &state.memory)?;
        for (d, _) in &chain[1..] {
            apply_diff_layer(&ram, d)?;
        }
        if cfg.device_data.is_empty() {
            for i in 0..state.devices.virtio.len() {
                let path = dir.join(files::device_data_file(i));
                cfg.device_data.push(if path.exists() {
                    std::fs::read(path).map_err(PersistError::from)?
                } else {
                    Vec::new()
                });
            }
        }
        let mut vmm = Vmm::restore(ram, &state, cfg)?;
        vmm.last_snapshot = Some(dir);
        vmm.start_dirty_log()?;
        Ok(vmm)
    }
}

/// Copy the pages a diff snapshot stored into the (private) guest mapping.
fn apply_diff_layer(ram: &GuestRam, dir: &Path) -> Result<(), PersistError> {
    use std::os::unix::fs::FileExt;
    let bitmap = files::read_bitmap(dir)?;
    let file = std::fs::File::open(dir.join(files::MEMORY_FILE))?;
    let total = ram.size() as usize;
    let pages = total / files::PAGE;
    for p in (0..pages).filter(|&p| files::bit_set(&bitmap, p)) {
        // SAFETY: the page lies inside our private mapping; no vCPU runs yet.
        let page = unsafe {
            std::slice::from_raw_parts_mut(ram.host_base().add(p * files::PAGE), files::PAGE)
        };
        file.read_exact_at(page, (p * files::PAGE) as u64)?;
    }
    Ok(())
}
