//! Saving and re-creating virtio devices for branch children and snapshot restores.
//!
//! A saved device is its transport's registers plus the device's own state. Re-creating
//! it needs host resources that must not be shared with the VM it came from: a vsock
//! device gets a new Unix socket path, a network device a new tap. A block device's
//! private copy-on-write pages travel as separate "private data" (streamed from the old
//! device in a forked child, or stored beside a snapshot).
use std::io::Read;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use serde::{Deserialize, Serialize};

use super::block::disk::Disk;
use super::block::{Block, BlockState, DiskFile};
use super::net::Net;
use super::rng::Rng;
use super::state::{DeviceState, QueueSnapshot};
use super::vsock::Vsock;
use super::VirtioDevice;

/// The driver-visible registers of a virtio-mmio transport.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TransportState {
    pub device_status: u32,
    pub acked_features: u64,
    pub interrupt_status: u32,
    pub config_generation: u32,
    pub queue_sel: u32,
    pub device_features_sel: u32,
    pub driver_features_sel: u32,
    /// Queue configuration as the driver programmed it.
    pub queues: Vec<QueueSnapshot>,
}

/// One saved virtio device.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct VirtioDeviceState {
    pub transport: TransportState,
    pub device: DeviceState,
}

/// Host resources for the devices of a rebuilt VM.
#[derive(Debug, Clone, Default)]
pub struct DeviceHostConfig {
    /// Unix socket for a vsock device (required when the VM has one).
    pub vsock_uds: Option<PathBuf>,
    /// Tap interface for a network device (required when the VM has one).
    pub net_tap: Option<String>,
    /// Files for block devices, by id, instead of the ones they were saved with: a
    /// persistent disk must get one (see [`super::block`]), or it re-opens the file of
    /// the VM it came from. Every entry must name a device of the saved VM.
    pub disk_files: Vec<DiskFile>,
}

#[derive(Debug, thiserror::Error)]
pub enum DeviceRestoreError {
    #[error("the saved VM has a vsock device: give the restored VM its own vsock socket path")]
    NeedVsockPath,
    #[error("the saved VM has a network device: give the restored VM its own tap")]
    NeedTap,
    #[error("disk id {0:?} names no block device of the saved VM, or is given twice")]
    NoSuchDisk(String),
    #[error("re-creating the {kind} device failed: {detail}")]
    Device { kind: &'static str, detail: String },
}

fn failed(kind: &'static str) -> impl FnOnce(String) -> DeviceRestoreError {
    move |detail| DeviceRestoreError::Device { kind, detail }
}

/// Checks that every file of `host.disk_files` names a block device of `saved`, once.
pub fn check_disk_files(
    saved: &[VirtioDeviceState],
    host: &DeviceHostConfig,
) -> Result<(), DeviceRestoreError> {
    for (i, f) in host.disk_files.iter().enumerate() {
        let named = |s: &VirtioDeviceState| match &s.device {
            DeviceState::Block(b) => b.config.is_named(f),
            _ => false,
        };
        let repeated = host.disk_files[..i].iter().any(|g| g.id == f.id);
        if repeated || saved.iter().filter(|s| named(s)).count() != 1 {
            return Err(DeviceRestoreError::NoSuchDisk(f.id.clone()));
        }
    }
    Ok(())
}

/// Re-create a block device over a copy-on-write disk this process inherited by
/// fork(2) (see [`Block::adopt`]), not yet activated.
pub fn adopt_block(
    state: &BlockState,
    disk: Arc<Mutex<Disk>>,
) -> Result<Arc<Mutex<dyn VirtioDevice>>, DeviceRestoreError> {
    Ok(Arc::new(Mutex::new(
        Block::adopt(state, disk).map_err(|e| failed("block")(e.to_string()))?,
    )))
}

/// Re-create a device from its saved state (not yet activated: its transport does that).
pub fn restore_device(
    state: &DeviceState,
    host: &DeviceHostConfig,
    private_data: Option<&mut dyn Read>,
) -> Result<Arc<Mutex<dyn VirtioDevice>>, DeviceRestoreError> {
    Ok(match state {
        DeviceState::Block(s) => {
            let file = host.disk_files.iter().find(|f| s.config.is_named(f));
            Arc::new(Mutex::new(
                Block::restore(s, private_data, file)
                    .map_err(|e| failed("block")(e.to_string()))?,
            ))
        }
        DeviceState::Vsock(s) => {
            let path = host
                .vsock_uds
                .clone()
                .ok_or(DeviceRestoreError::NeedVsockPath)?;
            Arc::new(Mutex::new(
                Vsock::restore(s, path).map_err(|e| failed("vsock")(e.to_string()))?,
            ))
        }
        DeviceState::Rng(s) => Arc::new(Mutex::new(
            Rng::restore(s).map_err(|e| failed("rng")(e.to_string()))?,
        )),
        DeviceState::Net(s) => {
            let tap = host.net_tap.as_deref().ok_or(DeviceRestoreError::NeedTap)?;
            Arc::new(Mutex::new(
                Net::restore(s, tap).map_err(|e| failed("net")(e.to_string()))?,
            ))
        }
    })
}
