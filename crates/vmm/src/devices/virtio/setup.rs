//! Building a VM's virtio device set from paths and options: what `zygote vm run` and
//! the kvm runtime of `zygote run` attach to a Linux guest.
//!
//! Order matters to the guest: devices get virtio-mmio windows (and Linux probes them)
//! in list order, so the root disk comes first and is `/dev/vda`, data disks follow
//! (`/dev/vdb`, ...), then vsock, rng and net.
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use super::block::{Block, BlockConfig, BlockError, DiskFile, DiskMode};
use super::net::{Net, NetConfig, NetError};
use super::rng::Rng;
use super::vsock::{Vsock, VsockConfig, VsockError, DEFAULT_GUEST_CID};
use super::VirtioDevice;

#[derive(Debug, Clone, Default)]
pub struct GuestDeviceConfig {
    /// Root disk: a content-addressed base image, mapped copy-on-write.
    pub root_image: Option<PathBuf>,
    /// Expose the root disk read-only (VIRTIO_BLK_F_RO).
    pub root_read_only: bool,
    /// Persistent data disks (writes reach the files).
    pub data_disks: Vec<PathBuf>,
    /// Data disks with an id of their own (the guest's GET_ID, e.g. a volume's id),
    /// after the unnamed ones.
    pub named_disks: Vec<DiskFile>,
    pub vsock: Option<VsockConfig>,
    /// Tap interface for virtio-net; none by default.
    pub net_tap: Option<String>,
    /// Attach virtio-rng (the guest's entropy at boot).
    pub rng: bool,
}

#[derive(Debug, thiserror::Error)]
pub enum SetupError {
    #[error("disk {path}: {source}")]
    Disk { path: PathBuf, source: BlockError },
    #[error("vsock: {0}")]
    Vsock(#[from] VsockError),
    #[error("net: {0}")]
    Net(#[from] NetError),
}

/// The devices of one VM, typed so callers can query them (private disk bytes,
/// transport reset, tap name) after handing them to the VMM.
#[derive(Default)]
pub struct GuestDevices {
    pub root: Option<Arc<Mutex<Block>>>,
    pub data: Vec<Arc<Mutex<Block>>>,
    pub vsock: Option<Arc<Mutex<Vsock>>>,
    pub rng: Option<Arc<Mutex<Rng>>>,
    pub net: Option<Arc<Mutex<Net>>>,
}

fn open_disk(cfg: BlockConfig) -> Result<Arc<Mutex<Block>>, SetupError> {
    let path = cfg.path.clone();
    Block::open(cfg)
        .map(|b| Arc::new(Mutex::new(b)))
        .map_err(|source| SetupError::Disk { path, source })
}

impl GuestDevices {
    pub fn build(cfg: &GuestDeviceConfig) -> Result<Self, SetupError> {
        let mut d = GuestDevices::default();
        if let Some(root) = &cfg.root_image {
            d.root = Some(open_disk(BlockConfig {
                read_only: cfg.root_read_only,
                id: Some("zygote-root".into()),
                ..BlockConfig::cow(root)
            })?);
        }
        for (i, path) in cfg.data_disks.iter().enumerate() {
            d.data.push(open_disk(BlockConfig {
                id: Some(format!("zygote-data{i}")),
                ..BlockConfig::persistent(path)
            })?);
        }
        for f in &cfg.named_disks {
            d.data.push(open_disk(BlockConfig {
                id: Some(f.id.clone()),
                mode: if f.copy_on_write {
                    DiskMode::CopyOnWrite
                } else {
                    DiskMode::Persistent
                },
                ..BlockConfig::persistent(&f.path)
            })?);
        }
        if let Some(v) = &cfg.vsock {
            d.vsock = Some(Arc::new(Mutex::new(Vsock::new(v.clone())?)));
        }
        if cfg.rng {
            d.rng = Some(Arc::new(Mutex::new(Rng::new())));
        }
        if let Some(tap) = &cfg.net_tap {
            d.net = Some(Arc::new(Mutex::new(Net::new(NetConfig::new(tap.clone()))?)));
        }
        Ok(d)
    }

    /// For `VmConfig::virtio_devices`, in guest-visible order.
    pub fn virtio_devices(&self) -> Vec<Arc<Mutex<dyn VirtioDevice>>> {
        let mut v: Vec<Arc<Mutex<dyn VirtioDevice>>> = Vec::new();
        if let Some(r) = &self.root {
            v.push(r.clone());
        }
        for d in &self.data {
            v.push(d.clone());
        }
        if let Some(s) = &self.vsock {
            v.push(s.clone());
        }
        if let Some(r) = &self.rng {
            v.push(r.clone());
        }
        if let Some(n) = &self.net {
            v.push(n.clone());
        }
        v
    }

    /// Kernel parameters for the root disk (empty without one).
    pub fn root_cmdline(&self) -> String {
        match &self.root {
            Some(r) if r.lock().unwrap().config().read_only => "root=/dev/vda ro".into(),
            Some(_) => "root=/dev/vda rw".into(),
            None => String::new(),
        }
    }

    /// Bytes of root disk this VM holds privately (its CoW divergence from the base).
    pub fn root_private_bytes(&self) -> u64 {
        self.root
            .as_ref()
            .map_or(0, |r| r.lock().unwrap().private_bytes())
    }
}

/// The kvm runtime's device set: the root image copy-on-write as /dev/vda, vsock on
/// `vsock_uds` with guest CID `guest_cid` (the agent listens in the guest; the host
/// reaches it by connecting to `vsock_uds` and writing `CONNECT <port>\n`), and rng.
/// Append [`GuestDevices::root_cmdline`] to the kernel command line.
pub fn for_root_image(
    root_image: &Path,
    vsock_uds: &Path,
    guest_cid: Option<u64>,
) -> Result<GuestDevices, SetupError> {
    GuestDevices::build(&GuestDeviceConfig {
        root_image: Some(root_image.into()),
        vsock: Some(VsockConfig {
            guest_cid: guest_cid.unwrap_or(DEFAULT_GUEST_CID),
            uds_path: vsock_uds.into(),
        }),
        rng: true,
        ..Default::default()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn builds_devices_in_guest_order() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("root.img");
        let data = dir.path().join("data.img");
        std::fs::write(&root, vec![1u8; 8192]).unwrap();
        std::fs::write(&data, vec![2u8; 4096]).unwrap();
        let devs = GuestDevices::build(&GuestDeviceConfig {
            root_image: Some(root.clone()),
            data_disks: vec![data],
            vsock: Some(VsockConfig {
                guest_cid: 3,
                uds_path: dir.path().join("v.sock"),
            }),
            rng: true,
            ..Default::default()
        })
        .unwrap();
        let types: Vec<u32> = devs
            .virtio_devices()
            .iter()
            .map(|d| d.lock().unwrap().device_type())
            .collect();
        assert_eq!(types, vec![2, 2, 19, 4]);
        assert_eq!(devs.root_cmdline(), "root=/dev/vda rw");
        assert_eq!(devs.root_private_bytes(), 0);
        let rt = for_root_image(&root, &dir.path().join("w.sock"), None).unwrap();
        assert_eq!(rt.virtio_devices().len(), 3);
        assert_eq!(
            rt.vsock
                .as_ref()
                .unwrap()
                .lock()
                .unwrap()
                .config()
                .guest_cid,
            3
        );
        let missing = GuestDevices::build(&GuestDeviceConfig {
            root_image: Some(dir.path().join("nope")),
            ..Default::default()
        });
        assert!(matches!(missing, Err(SetupError::Disk { .. })));
    }
}
