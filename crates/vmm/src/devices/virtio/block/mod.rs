//! virtio-blk (virtio 1.x §5.2): one request queue over a [`disk::Disk`].
//!
//! The root disk is a [`disk::CowImage`]: a content-addressed base image mapped
//! `MAP_PRIVATE`, so guest writes stay in this VM's memory and a fork(2) shares them
//! copy-on-write. A data disk is a plain file ([`disk::FileDisk`]). Either may be
//! exposed read-only (VIRTIO_BLK_F_RO; writes fail with IOERR).
//!
//! A persistent disk is the one kind whose state lives outside this process, so it is
//! the one kind a copy of the VM must not simply re-open: a branch child or a restored
//! snapshot writing into the same file as the VM it came from would corrupt it. Whoever
//! restores such a VM names, per disk id, the file it gets instead ([`DiskFile`]): a
//! frozen copy of the disk made while the source VM was paused, opened copy-on-write.
pub mod disk;
pub mod request;

use std::io::{Read, Write};
use std::os::fd::{AsRawFd, RawFd};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use serde::{Deserialize, Serialize};
use vmm_sys_util::epoll::EventSet;

use self::disk::{CowImage, Disk, DiskError, FileDisk, PAGE};
use self::request::{Exec, Outcome, ID_BYTES};
use super::common::{deactivate, Active, DeviceQueues, Registration};
use super::state::{DeviceState, VirtioState};
use super::{ActivateContext, ActivateError, VirtioDevice, VIRTIO_F_VERSION_1};
use crate::event_loop::{EventHandler, EventRegistrar};

pub const DEVICE_TYPE_BLOCK: u32 = 2;
pub const VIRTIO_BLK_F_RO: u64 = 1 << 5;
pub const VIRTIO_BLK_F_FLUSH: u64 = 1 << 9;
const QUEUE_SIZE: u16 = 256;

/// How the disk file is used.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum DiskMode {
    /// Read-only base image, private copy-on-write overlay in memory.
    CopyOnWrite,
    /// Writes go to the file.
    Persistent,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BlockConfig {
    pub path: PathBuf,
    pub mode: DiskMode,
    /// Expose VIRTIO_BLK_F_RO and fail writes.
    pub read_only: bool,
    /// GET_ID answer (at most 20 bytes are used); defaults to the file name.
    pub id: Option<String>,
}

impl BlockConfig {
    pub fn cow(path: impl Into<PathBuf>) -> Self {
        Self {
            path: path.into(),
            mode: DiskMode::CopyOnWrite,
            read_only: false,
            id: None,
        }
    }

    pub fn persistent(path: impl Into<PathBuf>) -> Self {
        Self {
            mode: DiskMode::Persistent,
            ..Self::cow(path)
        }
    }

    /// Whether this device is the one `file` names.
    pub fn is_named(&self, file: &DiskFile) -> bool {
        self.id.as_deref() == Some(file.id.as_str())
    }

    fn id_bytes(&self) -> [u8; ID_BYTES] {
        let name = self.id.clone().unwrap_or_else(|| {
            self.path
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default()
        });
        let mut id = [0u8; ID_BYTES];
        let n = name.len().min(ID_BYTES);
        id[..n].copy_from_slice(&name.as_bytes()[..n]);
        id
    }
}

/// The file a restored block device uses instead of the one it was saved with, found
/// by the device's id (its GET_ID answer).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DiskFile {
    pub id: String,
    pub path: PathBuf,
    /// Open it copy-on-write (writes stay in the VM's memory) rather than persistent.
    pub copy_on_write: bool,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BlockState {
    pub virtio: VirtioState,
    pub config: BlockConfig,
    /// Disk size in bytes when saved (the file must still have it).
    pub size: u64,
    /// CopyOnWrite: the 4 KiB pages that differ from the base, ascending. Their
    /// contents travel separately ([`Block::write_overlay`]), in this order.
    pub overlay_pages: Vec<u64>,
}

#[derive(Debug, thiserror::Error)]
pub enum BlockError {
    #[error(transparent)]
    Disk(#[from] DiskError),
    #[error("state is not a block device's (device type {0})")]
    WrongDevice(u32),
    #[error("overlay I/O: {0}")]
    Overlay(std::io::Error),
    #[error("overlay page {0} is outside the disk")]
    OverlayPage(u64),
    #[error("disk {0}: its copy-on-write pages cannot be restored onto a persistent file")]
    PersistentOverCow(String),
    #[error("disk {path}: the copy this process inherited does not match the saved state: {why}")]
    Inherited { path: PathBuf, why: String },
}

/// One virtio-blk device.
pub struct Block {
    config: BlockConfig,
    disk: Arc<Mutex<Disk>>,
    id: [u8; ID_BYTES],
    active: Active<BlockWorker>,
    acked_features: u64,
}

impl Block {
    pub fn open(config: BlockConfig) -> Result<Self, BlockError> {
        let disk = match config.mode {
            DiskMode::CopyOnWrite => Disk::Cow(CowImage::open(&config.path)?),
            DiskMode::Persistent => Disk::File(FileDisk::open(&config.path, config.read_only)?),
        };
        Ok(Self::with_disk(config, disk))
    }

    /// A device over an arbitrary backend (tests, fuzzing).
    pub fn with_disk(config: BlockConfig, disk: Disk) -> Self {
        Self::with_shared_disk(config, Arc::new(Mutex::new(disk)))
    }

    fn with_shared_disk(config: BlockConfig, disk: Arc<Mutex<Disk>>) -> Self {
        Self {
            id: config.id_bytes(),
            config,
            disk,
            active: None,
            acked_features: 0,
        }
    }

    pub fn config(&self) -> &BlockConfig {
        &self.config
    }

    pub fn capacity_sectors(&self) -> u64 {
        self.disk.lock().unwrap().size() / request::SECTOR
    }

    /// Bytes of disk this VM holds privately (CoW pages written); 0 for file disks.
    pub fn private_bytes(&self) -> u64 {
        self.disk.lock().unwrap().private_bytes()
    }

    /// Host address of a CoW mapping, for measuring it in /proc/self/smaps.
    pub fn cow_host_addr(&self) -> Option<u64> {
        match &*self.disk.lock().unwrap() {
            Disk::Cow(c) => Some(c.host_addr()),
            _ => None,
        }
    }

    pub fn save_state(&self) -> BlockState {
        let queues = self
            .active
            .as_ref()
            .map(|(w, _)| w.lock().unwrap().q.snapshot())
            .unwrap_or_default();
        let disk = self.disk.lock().unwrap();
        BlockState {
            virtio: VirtioState {
                device_type: DEVICE_TYPE_BLOCK,
                acked_features: self.acked_features,
                activated: self.active.is_some(),
                queues,
            },
            config: self.config.clone(),
            size: disk.size(),
            overlay_pages: match &*disk {
                Disk::Cow(c) => c.dirty_pages(),
                _ => Vec::new(),
            },
        }
    }

    /// Stream the CoW overlay: the pages listed in `state.overlay_pages`, 4 KiB each.
    pub fn write_overlay(&self, state: &BlockState, out: &mut dyn Write) -> Result<(), BlockError> {
        let disk = self.disk.lock().unwrap();
        let Disk::Cow(c) = &*disk else {
            return Ok(());
        };
        for &p in &state.overlay_pages {
            let page = c.page(p).ok_or(BlockError::OverlayPage(p))?;
            out.write_all(page).map_err(BlockError::Overlay)?;
        }
        Ok(())
    }

    /// The disk itself, shared: a fork(2) copy of this process holds its own copy of
    /// it, which [`Block::adopt`] turns into that copy's device.
    pub fn disk(&self) -> Arc<Mutex<Disk>> {
        self.disk.clone()
    }

    /// Copy-on-write pages written since the last call (see [`CowImage::take_recent`]);
    /// None for file disks or when nothing was written.
    pub fn take_recent_writes(&self) -> Option<Vec<u64>> {
        match &mut *self.disk.lock().unwrap() {
            Disk::Cow(c) => c.take_recent(),
            _ => None,
        }
    }

    /// Record `pages` as written: a warm spawner's source has put their contents in
    /// this process's copy of the mapping (at the same addresses) and says which they
    /// are, so that the overlay matches its own (see `vmm::inherit`).
    pub fn mark_written(&self, pages: &[u64]) -> Result<(), BlockError> {
        let mut disk = self.disk.lock().unwrap();
        let Disk::Cow(c) = &mut *disk else {
            return Err(BlockError::Inherited {
                path: self.config.path.clone(),
                why: "pages written to a disk that is not copy-on-write".into(),
            });
        };
        if !c.mark_written(pages) {
            let outside = pages.iter().max().copied().unwrap_or_default();
            return Err(BlockError::OverlayPage(outside));
        }
        Ok(())
    }

    /// The pages of `state.overlay_pages` whose contents differ from `overlay` (bytes
    /// in [`Block::write_overlay`]'s format), plus any written page the state does
    /// not list: how far this disk is from the one `state` was saved from. Verification
    /// only (it reads the whole overlay).
    pub fn overlay_mismatches(&self, state: &BlockState, overlay: &[u8]) -> u64 {
        let disk = self.disk.lock().unwrap();
        let Disk::Cow(c) = &*disk else {
            return state.overlay_pages.len() as u64;
        };
        let mut differ = 0;
        for (i, &p) in state.overlay_pages.iter().enumerate() {
            let want = overlay.get(i * PAGE as usize..(i + 1) * PAGE as usize);
            if want.is_none() || c.page(p) != want {
                differ += 1;
            }
        }
        let extra = c
            .dirty_pages()
            .len()
            .saturating_sub(state.overlay_pages.len());
        differ + extra as u64
    }

    /// The device of a fork(2) copy of the VMM, over the copy-on-write disk it
    /// inherited (`disk`, taken from its copy of the source's device): nothing is
    /// re-read or copied, where [`Block::restore`] maps the image again and writes
    /// the whole overlay into it. The disk must be the one `state` was saved from,
    /// brought up to date (see [`Block::mark_written`]): same image, same size, the
    /// same pages written.
    pub fn adopt(state: &BlockState, disk: Arc<Mutex<Disk>>) -> Result<Self, BlockError> {
        if state.virtio.device_type != DEVICE_TYPE_BLOCK {
            return Err(BlockError::WrongDevice(state.virtio.device_type));
        }
        let path = state.config.path.clone();
        let mismatch = |why: String| BlockError::Inherited {
            path: path.clone(),
            why,
        };
        {
            let mut guard = disk.lock().unwrap();
            let size = guard.size();
            let Disk::Cow(c) = &mut *guard else {
                return Err(mismatch("it is not copy-on-write".into()));
            };
            if state.config.mode != DiskMode::CopyOnWrite || c.path() != state.config.path {
                return Err(mismatch(format!("it maps {}", c.path().display())));
            }
            if size != state.size {
                return Err(mismatch(format!("{size} bytes, not {}", state.size)));
            }
            let written = c.dirty_pages();
            if written != state.overlay_pages {
                return Err(mismatch(format!(
                    "{} pages written, {} saved",
                    written.len(),
                    state.overlay_pages.len()
                )));
            }
            c.reopen_after_fork()?;
            // What the source wrote before this copy was made is news to no one here.
            c.take_recent();
        }
        let mut dev = Self::with_shared_disk(state.config.clone(), disk);
        dev.acked_features = state.virtio.acked_features;
        Ok(dev)
    }

    /// Re-open the disk named in `state` (or `file`, when the restorer names one for
    /// this disk) and re-apply its overlay (read from `overlay` in `write_overlay`'s
    /// format). The restoring transport then activates the device with queues rebuilt
    /// from `state.virtio.queues`.
    pub fn restore(
        state: &BlockState,
        overlay: Option<&mut dyn Read>,
        file: Option<&DiskFile>,
    ) -> Result<Self, BlockError> {
        if state.virtio.device_type != DEVICE_TYPE_BLOCK {
            return Err(BlockError::WrongDevice(state.virtio.device_type));
        }
        let mut config = state.config.clone();
        if let Some(f) = file {
            if state.config.mode == DiskMode::CopyOnWrite && !f.copy_on_write {
                return Err(BlockError::PersistentOverCow(f.id.clone()));
            }
            config.path = f.path.clone();
            config.mode = if f.copy_on_write {
                DiskMode::CopyOnWrite
            } else {
                DiskMode::Persistent
            };
        }
        let mut dev = Self::open(config)?;
        {
            let mut disk = dev.disk.lock().unwrap();
            disk::check_size(&dev.config.path, state.size, disk.size())?;
            if let (Disk::Cow(c), Some(r)) = (&mut *disk, overlay) {
                let mut page = vec![0u8; PAGE as usize];
                for &p in &state.overlay_pages {
                    r.read_exact(&mut page).map_err(BlockError::Overlay)?;
                    if !c.set_page(p, &page) {
                        return Err(BlockError::OverlayPage(p));
                    }
                }
            }
        }
        dev.acked_features = state.virtio.acked_features;
        Ok(dev)
    }
}

pub(crate) struct BlockWorker {
    pub(crate) q: DeviceQueues,
    disk: Arc<Mutex<Disk>>,
    read_only: bool,
    id: [u8; ID_BYTES],
    bounce: Vec<u8>,
}

impl BlockWorker {
    pub(crate) fn new(
        q: DeviceQueues,
        disk: Arc<Mutex<Disk>>,
        read_only: bool,
        id: [u8; ID_BYTES],
    ) -> Self {
        Self {
            q,
            disk,
            read_only,
            id,
            bounce: Vec::new(),
        }
    }

    /// Serve every available request; returns how many chains were completed.
    pub(crate) fn process(&mut self) -> usize {
        let write_through = self.q.acked_features & VIRTIO_BLK_F_FLUSH == 0;
        let mut n = 0;
        while let Some((head, raw)) = self.q.pop(0) {
            let outcome = {
                let mut disk = self.disk.lock().unwrap();
                request::execute(
                    &self.q.mem,
                    &raw,
                    &mut Exec {
                        disk: &mut disk,
                        read_only: self.read_only,
                        write_through,
                        id: &self.id,
                        bounce: &mut self.bounce,
                    },
                )
            };
            let used_len = match outcome {
                Outcome::Done { used_len, .. } => used_len,
                Outcome::Dropped => {
                    tracing::debug!("virtio-blk: chain {head} has no status byte; dropped");
                    0
                }
            };
            self.q.add_used(0, head, used_len);
            n += 1;
        }
        if n > 0 {
            self.q.signal_used();
        }
        n
    }
}

impl EventHandler for BlockWorker {
    fn handle_event(&mut self, fd: RawFd, _events: EventSet, _r: &EventRegistrar) {
        if self.q.queue_for_fd(fd).is_some() {
            self.process();
        }
    }
}

impl VirtioDevice for Block {
    fn device_type(&self) -> u32 {
        DEVICE_TYPE_BLOCK
    }

    fn features(&self) -> u64 {
        let ro = if self.config.read_only {
            VIRTIO_BLK_F_RO
        } else {
            0
        };
        VIRTIO_F_VERSION_1 | VIRTIO_BLK_F_FLUSH | ro
    }

    fn queue_max_sizes(&self) -> Vec<u16> {
        vec![QUEUE_SIZE]
    }

    fn read_config(&self, offset: u64, data: &mut [u8]) {
        // struct virtio_blk_config: only `capacity` (le64, in sectors) is meaningful
        // without the optional geometry/topology features.
        let mut cfg = [0u8; 8];
        cfg.copy_from_slice(&self.capacity_sectors().to_le_bytes());
        for (i, b) in data.iter_mut().enumerate() {
            *b = offset
                .checked_add(i as u64)
                .and_then(|o| cfg.get(o as usize))
                .copied()
                .unwrap_or(0);
        }
    }

    fn write_config(&mut self, _offset: u64, _data: &[u8]) {
        // Nothing in the block config is driver-writable without VIRTIO_BLK_F_CONFIG_WCE.
    }

    fn activate(&mut self, ctx: ActivateContext) -> Result<(), ActivateError> {
        let (q, registrar) = DeviceQueues::from_ctx(ctx, 1)?;
        self.acked_features = q.acked_features;
        let fd = q.evts[0].as_raw_fd();
        let worker = Arc::new(Mutex::new(BlockWorker::new(
            q,
            self.disk.clone(),
            self.config.read_only,
            self.id,
        )));
        let mut reg = Registration::new(registrar);
        reg.add(fd, EventSet::IN, worker.clone())?;
        worker.lock().unwrap().process();
        self.active = Some((worker, reg));
        Ok(())
    }

    fn reset(&mut self) {
        deactivate(&mut self.active);
        self.acked_features = 0;
    }

    fn save(&self) -> Option<DeviceState> {
        Some(DeviceState::Block(self.save_state()))
    }

    fn write_private_data(&self, out: &mut dyn Write) -> std::io::Result<()> {
        self.write_overlay(&self.save_state(), out)
            .map_err(|e| std::io::Error::other(e.to_string()))
    }

    fn as_block(&self) -> Option<&Block> {
        Some(self)
    }
}

#[cfg(test)]
mod tests;
