//! Snapshots of a running VM and restore from them.
//!
//! - `full`: pause, capture, write all memory (all-zero pages become holes), resume.
//! - `diff`: pause, capture, write the pages KVM logged as dirty since the previous
//!   snapshot of this VM, layered on it; resume.
//! - `live`: pause, capture, fork; the parent resumes at once (the pause equals a branch
//!   pause) while the frozen child writes a full snapshot from its copy-on-write view.
//!
//! Restore maps the base memory file MAP_PRIVATE (lazy; the page cache is shared by all
//! VMs restored from it), applies diff layers, restores `VmState` and runs.
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use super::{RestoreConfig, Vmm, VmmError};
use crate::memory::GuestRam;
pub use crate::persist::snapshot_files::SnapshotMode;
use crate::persist::snapshot_files::{self as files, MemoryView, PendingSnapshot, SnapshotMeta};
use crate::persist::{CpuIdentity, PersistError, VmState, FORMAT_VERSION};

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
    #[error("the live-snapshot writer (pid {pid}) failed with status {status:#x}")]
    LiveWriter { pid: libc::pid_t, status: i32 },
    #[error("fork for the live snapshot failed: {0}")]
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
    /// Writing memory and state files while paused: full and diff.
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
            SnapshotMode::Full | SnapshotMode::Diff => {
                let t = Instant::now();
                let bitmap = match parent {
                    // Pages the guest wrote (KVM's log) or the VMM wrote for it (devices
                    // filling buffers and rings, tracked by vm-memory).
                    Some(_) => {
                        let mut log = self.vm.take_dirty_log(&self.ram).map_err(VmmError::from)?;
                        for (w, h) in log.iter_mut().zip(self.ram.take_host_dirty()) {
                            *w |= h;
                        }
                        Some(log)
                    }
                    None => None,
                };
                phases.dirty_log = t.elapsed();
                let t = Instant::now();
                // SAFETY: the VM is paused: no vCPU or device writes guest memory now.
                let mem = MemoryView {
                    bytes: unsafe { self.ram.host_slice() },
                };
                let device_data = self.device_private_data().map_err(PersistError::from)?;
                let pages = write_snapshot(
                    dest,
                    mode,
                    state,
                    &self.cpu,
                    &mem,
                    parent.zip(bitmap.as_deref()),
                    &device_data,
                )?;
                phases.write = t.elapsed();
                if mode == SnapshotMode::Full {
                    self.start_dirty_log()?;
                }
                Ok((pages, resume(self)?))
            }
            SnapshotMode::Live => {
                // Later diffs are relative to this instant.
                self.start_dirty_log()?;
                // SAFETY: all VMM threads are parked holding no locks; the child only writes
                // files from its frozen copy of memory and exits.
                let pid = unsafe { libc::fork() };
                if pid == 0 {
                    self.live_writer_child(dest, state);
                }
                if pid < 0 {
                    let err = std::io::Error::last_os_error();
                    resume(self)?;
                    return Err(SnapshotError::Fork(err));
                }
                let pause = resume(self)?;
                let mut status = 0;
                // SAFETY: waiting for our own child.
                unsafe { libc::waitpid(pid, &mut status, 0) };
                if !(libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0) {
                    return Err(SnapshotError::LiveWriter { pid, status });
                }
                let meta = files::read_meta(dest)?;
                Ok((meta.pages_written, pause))
            }
        }
    }

    fn live_writer_child(&self, dest: &Path, state: &VmState) -> ! {
        let code = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            // Drop every inherited fd except stderr: the writer opens its own files.
            // SAFETY: no Rust object of this child uses the closed descriptors again.
            unsafe { libc::syscall(libc::SYS_close_range, 3u32, u32::MAX, 0) };
            // SAFETY: this process is a frozen copy; nothing else writes its memory.
            let mem = MemoryView {
                bytes: unsafe { self.ram.host_slice() },
            };
            let written = self
                .device_private_data()
                .map_err(PersistError::from)
                .and_then(|data| {
                    write_snapshot(
                        dest,
                        SnapshotMode::Live,
                        state,
                        &self.cpu,
                        &mem,
                        None,
                        &data,
                    )
                });
            match written {
                Ok(_) => 0,
                Err(e) => {
                    eprintln!("zygote: live snapshot writer: {e}");
                    1
                }
            }
        }))
        .unwrap_or(101);
        // Exit without running the parent's destructors.
        super::branch::exit_now(code)
    }

    fn start_dirty_log(&mut self) -> Result<(), VmmError> {
        self.vm.set_dirty_logging(&self.ram, true)?;
        // Enabling starts a fresh log, but drain anything already recorded to be sure,
        // and the VMM's own record of its writes too.
        self.vm.take_dirty_log(&self.ram)?;
        self.ram.take_host_dirty();
        self.dirty_logging = true;
        Ok(())
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
