//! virtio-net (virtio 1.x §5.1) over a tap device: queue 0 = RX, queue 1 = TX, MAC in
//! config space, no offloads. Every frame carries the 12-byte virtio_net_hdr, which the
//! tap (IFF_VNET_HDR) consumes and produces as-is. Optional per VM.
pub mod tap;

use std::fs::File;
use std::io::{ErrorKind, Read, Write};
use std::os::fd::{AsRawFd, RawFd};
use std::sync::{Arc, Mutex};

use serde::{Deserialize, Serialize};
use vmm_sys_util::epoll::EventSet;

use self::tap::{open_tap, TapError, VNET_HDR_LEN};
use super::common::{deactivate, Active, Cursor, DeviceQueues, Registration, Segments};
use super::state::{DeviceState, VirtioState};
use super::{ActivateContext, ActivateError, VirtioDevice, VIRTIO_F_VERSION_1};
use crate::event_loop::{EventHandler, EventRegistrar};

pub const DEVICE_TYPE_NET: u32 = 1;
pub const VIRTIO_NET_F_MAC: u64 = 1 << 5;
const QUEUE_SIZE: u16 = 256;
const RXQ: usize = 0;
const TXQ: usize = 1;
/// Largest frame without offloads: 64 KiB IP packet + Ethernet/VLAN header, plus ours.
pub const MAX_PACKET: usize = VNET_HDR_LEN + 65_535 + 18;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NetConfig {
    /// Tap interface name (`%d` lets the kernel number it).
    pub tap: String,
    pub mac: [u8; 6],
}

impl NetConfig {
    /// A tap with a random locally administered unicast MAC.
    pub fn new(tap: impl Into<String>) -> Self {
        let mut mac = [0u8; 6];
        // SAFETY: fills our own 6-byte buffer.
        let n = unsafe { libc::getrandom(mac.as_mut_ptr() as *mut libc::c_void, 6, 0) };
        if n != 6 {
            mac = [0, 0, 0, 0, 0, 1];
        }
        mac[0] = (mac[0] & 0xfe) | 0x02;
        Self {
            tap: tap.into(),
            mac,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NetState {
    pub virtio: VirtioState,
    pub mac: [u8; 6],
}

#[derive(Debug, thiserror::Error)]
pub enum NetError {
    #[error(transparent)]
    Tap(#[from] TapError),
    #[error("state is not a network device's (device type {0})")]
    WrongDevice(u32),
}

pub struct Net {
    config: NetConfig,
    /// The tap (or, in tests, any packet-preserving fd such as a SOCK_DGRAM socket).
    backend: File,
    /// Actual interface name, once the kernel picked it.
    ifname: String,
    active: Active<NetWorker>,
    acked_features: u64,
}

impl Net {
    pub fn new(config: NetConfig) -> Result<Self, NetError> {
        let (backend, ifname) = open_tap(&config.tap)?;
        Ok(Self::with_backend(config, backend, ifname))
    }

    pub fn with_backend(config: NetConfig, backend: File, ifname: String) -> Self {
        Self {
            config,
            backend,
            ifname,
            active: None,
            acked_features: 0,
        }
    }

    /// Continue from `state` on tap `tap` (a forked child needs its own tap: two VMs
    /// must not read one queue).
    pub fn restore(state: &NetState, tap: &str) -> Result<Self, NetError> {
        if state.virtio.device_type != DEVICE_TYPE_NET {
            return Err(NetError::WrongDevice(state.virtio.device_type));
        }
        let mut dev = Self::new(NetConfig {
            tap: tap.into(),
            mac: state.mac,
        })?;
        dev.acked_features = state.virtio.acked_features;
        Ok(dev)
    }

    pub fn ifname(&self) -> &str {
        &self.ifname
    }

    pub fn save_state(&self) -> NetState {
        let queues = self
            .active
            .as_ref()
            .map(|(w, _)| w.lock().unwrap().q.snapshot())
            .unwrap_or_default();
        NetState {
            virtio: VirtioState {
                device_type: DEVICE_TYPE_NET,
                acked_features: self.acked_features,
                activated: self.active.is_some(),
                queues,
            },
            mac: self.config.mac,
        }
    }
}

pub(crate) struct NetWorker {
    pub(crate) q: DeviceQueues,
    backend: File,
    registrar: EventRegistrar,
    backend_token: Option<u64>,
    /// RX buffers ran out: EPOLLIN on the tap is off (level-triggered readiness would
    /// spin) until the guest posts more and kicks the RX queue.
    rx_blocked: bool,
    buf: Vec<u8>,
    pub(crate) dropped: u64,
}

impl NetWorker {
    /// Frames from the guest to the tap.
    pub(crate) fn process_tx(&mut self) {
        let mut used = false;
        while let Some((head, raw)) = self.q.pop(TXQ) {
            match Segments::split(&raw) {
                Ok(segs)
                    if segs.readable_len() as usize <= MAX_PACKET
                        && segs.readable_len() as usize >= VNET_HDR_LEN =>
                {
                    let n = segs.readable_len() as usize;
                    let ok = Cursor::new(&segs.readable).read(&self.q.mem, &mut self.buf[..n]);
                    // One write per frame: the tap keeps frame boundaries.
                    if ok.is_err() || self.backend.write(&self.buf[..n]).is_err() {
                        self.dropped += 1;
                    }
                }
                _ => self.dropped += 1,
            }
            self.q.add_used(TXQ, head, 0);
            used = true;
        }
        if used {
            self.q.signal_used();
        }
    }

    /// Frames from the tap into guest RX buffers.
    pub(crate) fn process_rx(&mut self) {
        let mut used = false;
        loop {
            let Some((head, raw)) = self.q.pop(RXQ) else {
                self.set_rx_blocked(true);
                break;
            };
            let n = match self.backend.read(&mut self.buf) {
                Ok(n) => n,
                Err(e) => {
                    self.q.unpop(RXQ);
                    if e.kind() != ErrorKind::WouldBlock {
                        tracing::warn!("virtio-net: reading the tap failed: {e}");
                    }
                    self.set_rx_blocked(false);
                    break;
                }
            };
            let segs = Segments::split(&raw).unwrap_or_default();
            if n < VNET_HDR_LEN || segs.writable_len() < n as u64 {
                // Too small a buffer (the guest sized it for what it negotiated): drop
                // the frame, keep the buffer.
                self.dropped += 1;
                self.q.unpop(RXQ);
                continue;
            }
            // num_buffers (le16 at 10) = 1: without MRG_RXBUF a frame fills one buffer.
            self.buf[10..12].copy_from_slice(&1u16.to_le_bytes());
            let len = match Cursor::new(&segs.writable).write(&self.q.mem, &self.buf[..n]) {
                Ok(()) => n as u32,
                Err(_) => {
                    self.dropped += 1;
                    0
                }
            };
            self.q.add_used(RXQ, head, len);
            used = true;
        }
        if used {
            self.q.signal_used();
        }
    }

    fn set_rx_blocked(&mut self, blocked: bool) {
        if self.rx_blocked == blocked {
            return;
        }
        self.rx_blocked = blocked;
        if let Some(t) = self.backend_token {
            let ev = if blocked {
                EventSet::empty()
            } else {
                EventSet::IN
            };
            let _ = self.registrar.modify(t, ev);
        }
    }
}

impl EventHandler for NetWorker {
    fn handle_event(&mut self, fd: RawFd, _events: EventSet, _r: &EventRegistrar) {
        match self.q.queue_for_fd(fd) {
            Some(TXQ) => self.process_tx(),
            // New RX buffers, or the tap is readable.
            _ => self.process_rx(),
        }
    }
}

impl VirtioDevice for Net {
    fn device_type(&self) -> u32 {
        DEVICE_TYPE_NET
    }

    fn features(&self) -> u64 {
        VIRTIO_F_VERSION_1 | VIRTIO_NET_F_MAC
    }

    fn queue_max_sizes(&self) -> Vec<u16> {
        vec![QUEUE_SIZE, QUEUE_SIZE]
    }

    fn read_config(&self, offset: u64, data: &mut [u8]) {
        // mac[6], then status (absent without VIRTIO_NET_F_STATUS).
        let mac = self.config.mac;
        for (i, b) in data.iter_mut().enumerate() {
            *b = offset
                .checked_add(i as u64)
                .and_then(|o| mac.get(o as usize))
                .copied()
                .unwrap_or(0);
        }
    }

    fn write_config(&mut self, _offset: u64, _data: &[u8]) {}

    fn activate(&mut self, ctx: ActivateContext) -> Result<(), ActivateError> {
        let (q, registrar) = DeviceQueues::from_ctx(ctx, 2)?;
        self.acked_features = q.acked_features;
        let backend = self
            .backend
            .try_clone()
            .map_err(|e| ActivateError::Device(format!("tap fd: {e}")))?;
        let fds: Vec<RawFd> = q.evts.iter().map(|e| e.as_raw_fd()).collect();
        let tap_fd = backend.as_raw_fd();
        let worker = Arc::new(Mutex::new(NetWorker {
            q,
            backend,
            registrar: registrar.clone(),
            backend_token: None,
            rx_blocked: false,
            buf: vec![0u8; MAX_PACKET],
            dropped: 0,
        }));
        let mut reg = Registration::new(registrar);
        for fd in fds {
            reg.add(fd, EventSet::IN, worker.clone())?;
        }
        let token = reg.add(tap_fd, EventSet::IN, worker.clone())?;
        {
            let mut w = worker.lock().unwrap();
            w.backend_token = Some(token);
            w.process_tx();
            w.process_rx();
        }
        self.active = Some((worker, reg));
        Ok(())
    }

    fn reset(&mut self) {
        deactivate(&mut self.active);
        self.acked_features = 0;
    }

    fn save(&self) -> Option<DeviceState> {
        Some(DeviceState::Net(self.save_state()))
    }
}

#[cfg(test)]
mod tests;
