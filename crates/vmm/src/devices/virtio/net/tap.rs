//! Opening a Linux tap interface as a virtio-net backend.
//!
//! The tap is opened with IFF_VNET_HDR and a 12-byte vnet header (virtio 1.x's
//! `virtio_net_hdr` including `num_buffers`), so frames pass between the guest and the
//! tap with their header unchanged. All offloads are switched off because the device
//! negotiates none with the guest: the tap must never hand us GSO or partial-checksum
//! frames the guest did not agree to receive.
use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::OpenOptionsExt;

/// Size of the header in front of every frame (virtio_net_hdr_v1).
pub const VNET_HDR_LEN: usize = 12;

// <linux/if_tun.h>
const TUNSETIFF: libc::c_ulong = 0x4004_54ca;
const TUNSETOFFLOAD: libc::c_ulong = 0x4004_54d0;
const TUNSETVNETHDRSZ: libc::c_ulong = 0x4004_54d8;
const IFF_TAP: libc::c_short = 0x0002;
const IFF_NO_PI: libc::c_short = 0x1000;
const IFF_VNET_HDR: libc::c_short = 0x4000;

#[derive(Debug, thiserror::Error)]
pub enum TapError {
    #[error("tap name {0:?} is empty or longer than 15 bytes")]
    BadName(String),
    #[error("opening /dev/net/tun: {0}")]
    Open(io::Error),
    #[error("{what} on tap {name}: {source}")]
    Ioctl {
        what: &'static str,
        name: String,
        source: io::Error,
    },
}

/// struct ifreq, as far as TUNSETIFF reads it: name, then flags in the union.
#[repr(C)]
struct IfReq {
    name: [u8; libc::IFNAMSIZ],
    flags: libc::c_short,
    _pad: [u8; 22],
}

/// Open (creating if needed) tap `name`; `%d` in the name lets the kernel pick a number.
/// Returns the non-blocking file and the interface's actual name.
pub fn open_tap(name: &str) -> Result<(File, String), TapError> {
    if name.is_empty() || name.len() >= libc::IFNAMSIZ {
        return Err(TapError::BadName(name.into()));
    }
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open("/dev/net/tun")
        .map_err(TapError::Open)?;
    let mut ifr = IfReq {
        name: [0; libc::IFNAMSIZ],
        flags: IFF_TAP | IFF_NO_PI | IFF_VNET_HDR,
        _pad: [0; 22],
    };
    ifr.name[..name.len()].copy_from_slice(name.as_bytes());
    let ioctl_err = |what: &'static str| TapError::Ioctl {
        what,
        name: name.into(),
        source: io::Error::last_os_error(),
    };
    // SAFETY: TUNSETIFF reads and writes an ifreq we own.
    if unsafe { libc::ioctl(file.as_raw_fd(), TUNSETIFF as _, &mut ifr) } < 0 {
        return Err(ioctl_err("TUNSETIFF"));
    }
    let hdr_len = VNET_HDR_LEN as libc::c_int;
    // SAFETY: TUNSETVNETHDRSZ reads one int.
    if unsafe { libc::ioctl(file.as_raw_fd(), TUNSETVNETHDRSZ as _, &hdr_len) } < 0 {
        return Err(ioctl_err("TUNSETVNETHDRSZ"));
    }
    // SAFETY: TUNSETOFFLOAD takes the flags by value.
    if unsafe { libc::ioctl(file.as_raw_fd(), TUNSETOFFLOAD as _, 0 as libc::c_uint) } < 0 {
        return Err(ioctl_err("TUNSETOFFLOAD"));
    }
    let len = ifr
        .name
        .iter()
        .position(|&b| b == 0)
        .unwrap_or(ifr.name.len());
    let actual = String::from_utf8_lossy(&ifr.name[..len]).into_owned();
    Ok((file, actual))
}
