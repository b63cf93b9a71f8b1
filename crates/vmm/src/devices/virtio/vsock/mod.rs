//! virtio-vsock (virtio 1.x §5.10) with a host Unix-socket muxer (see [`muxer`]).
//!
//! Queues: 0 = RX (device → guest), 1 = TX (guest → device), 2 = event. Config space:
//! the guest's CID (le64). The device can raise VIRTIO_VSOCK_EVENT_TRANSPORT_RESET
//! ([`Vsock::send_transport_reset`]) so the guest drops connections that no longer
//! exist on the host — after a restore or in a freshly branched VM.
//!
//! A host connection made while the guest has not yet handled that reset would be
//! dropped with the old ones, so the muxer holds new host connections (their guest-side
//! REQUEST) until the guest acknowledges: Linux handles the event, re-posts the event
//! buffer and kicks the event queue. A guest that never does is given
//! [`RESET_ACK_TIMEOUT`]. A restored device also numbers its host-side ports from a
//! random point, so a new connection never reuses the 4-tuple of a connection the
//! guest inherited and has not closed yet.
pub mod conn;
pub mod muxer;
pub mod packet;

use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::fs::FileTypeExt;
use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use vm_memory::{Bytes, GuestAddress};
use vmm_sys_util::epoll::EventSet;
use vmm_sys_util::timerfd::TimerFd;

use self::muxer::{Muxer, Poller};
use self::packet::{Header, EVENT_TRANSPORT_RESET, HEADER_LEN};
use super::common::{deactivate, Active, Cursor, DeviceQueues, Registration, Segments};
use super::state::{DeviceState, VirtioState};
use super::{ActivateContext, ActivateError, VirtioDevice, VIRTIO_F_VERSION_1};
use crate::event_loop::{EventHandler, EventRegistrar};

pub const DEVICE_TYPE_VSOCK: u32 = 19;
pub const DEFAULT_GUEST_CID: u64 = 3;
const QUEUE_SIZE: u16 = 256;
const RXQ: usize = 0;
const TXQ: usize = 1;
const EVQ: usize = 2;
/// Largest TX packet payload accepted; bigger ones are malformed (Linux sends ≤ 64 KiB).
const MAX_TX_PAYLOAD: u64 = 64 * 1024;
/// How long host connections wait for the guest to acknowledge a transport reset.
pub const RESET_ACK_TIMEOUT: Duration = Duration::from_secs(1);

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct VsockConfig {
    pub guest_cid: u64,
    /// Host connections arrive here; guest connections to port P go to `<uds_path>_<P>`.
    pub uds_path: PathBuf,
}

/// Saved state. The connection table is deliberately absent: host sockets cannot be
/// carried into a snapshot or a forked child, so a restored device starts with no
/// connections and tells the guest with a transport-reset event.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct VsockState {
    pub virtio: VirtioState,
    pub guest_cid: u64,
}

#[derive(Debug, thiserror::Error)]
pub enum VsockError {
    #[error("guest CID {0} is reserved (CIDs 0-2 and u32::MAX belong to the host/hypervisor)")]
    BadCid(u64),
    #[error("{path} exists and is not a socket")]
    PathInUse { path: PathBuf },
    #[error("binding {path}: {source}")]
    Bind {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("state is not a vsock device's (device type {0})")]
    WrongDevice(u32),
}

pub struct Vsock {
    config: VsockConfig,
    listener: UnixListener,
    active: Active<VsockWorker>,
    acked_features: u64,
    /// Send a transport reset as soon as the guest's queues are live (after restore).
    reset_on_activate: bool,
    /// The process that bound `uds_path`: a fork(2)ed child inherits this value and
    /// must not unlink its parent's socket when it drops it.
    bound_by: u32,
}

impl Vsock {
    /// Create the device and bind its host socket (a stale socket file is replaced).
    pub fn new(config: VsockConfig) -> Result<Self, VsockError> {
        if config.guest_cid <= 2 || config.guest_cid >= u64::from(u32::MAX) {
            return Err(VsockError::BadCid(config.guest_cid));
        }
        let listener = bind(&config.uds_path)?;
        Ok(Self {
            config,
            listener,
            active: None,
            acked_features: 0,
            reset_on_activate: false,
            bound_by: std::process::id(),
        })
    }

    /// A device continuing from `state` on a (new) socket path: no connections survive,
    /// and the guest gets a transport reset once the restoring transport activates it
    /// with queues rebuilt from `state.virtio.queues`.
    pub fn restore(state: &VsockState, uds_path: PathBuf) -> Result<Self, VsockError> {
        if state.virtio.device_type != DEVICE_TYPE_VSOCK {
            return Err(VsockError::WrongDevice(state.virtio.device_type));
        }
        let mut dev = Self::new(VsockConfig {
            guest_cid: state.guest_cid,
            uds_path,
        })?;
        dev.acked_features = state.virtio.acked_features;
        dev.reset_on_activate = true;
        Ok(dev)
    }

    pub fn config(&self) -> &VsockConfig {
        &self.config
    }

    pub fn save_state(&self) -> VsockState {
        let queues = self
            .active
            .as_ref()
            .map(|(w, _)| w.lock().unwrap().q.snapshot())
            .unwrap_or_default();
        VsockState {
            virtio: VirtioState {
                device_type: DEVICE_TYPE_VSOCK,
                acked_features: self.acked_features,
                activated: self.active.is_some(),
                queues,
            },
            guest_cid: self.config.guest_cid,
        }
    }

    /// Drop every connection and tell the guest (VIRTIO_VSOCK_EVENT_TRANSPORT_RESET).
    /// Before activation there is nothing to reset.
    pub fn send_transport_reset(&self) {
        if let Some((w, _)) = &self.active {
            w.lock().unwrap().transport_reset();
        }
    }

    pub fn connection_count(&self) -> usize {
        self.active
            .as_ref()
            .map_or(0, |(w, _)| w.lock().unwrap().muxer.connection_count())
    }
}

impl Drop for Vsock {
    fn drop(&mut self) {
        if self.bound_by == std::process::id() {
            let _ = std::fs::remove_file(&self.config.uds_path);
        }
    }
}

fn bind(path: &Path) -> Result<UnixListener, VsockError> {
    if let Ok(meta) = std::fs::symlink_metadata(path) {
        if !meta.file_type().is_socket() {
            return Err(VsockError::PathInUse { path: path.into() });
        }
        let _ = std::fs::remove_file(path);
    }
    let l = UnixListener::bind(path).map_err(|source| VsockError::Bind {
        path: path.into(),
        source,
    })?;
    l.set_nonblocking(true).map_err(|source| VsockError::Bind {
        path: path.into(),
        source,
    })?;
    Ok(l)
}

pub(crate) struct VsockWorker {
    pub(crate) q: DeviceQueues,
    pub(crate) muxer: Muxer,
    /// A transport reset is owed to the guest (no event buffer was available).
    reset_pending: bool,
    /// A transport reset was delivered and the guest has not acknowledged it yet: new
    /// host connections are held in the muxer meanwhile.
    reset_unacknowledged: bool,
    /// Bounds that wait ([`RESET_ACK_TIMEOUT`]); registered with the event loop.
    reset_timer: Option<TimerFd>,
}

impl VsockWorker {
    pub(crate) fn new(q: DeviceQueues, muxer: Muxer) -> Self {
        Self {
            q,
            muxer,
            reset_pending: false,
            reset_unacknowledged: false,
            reset_timer: TimerFd::new()
                .map_err(|e| tracing::warn!("vsock: no reset timer: {e}"))
                .ok(),
        }
    }

    /// Move guest packets from the TX queue into the muxer.
    pub(crate) fn process_tx(&mut self) {
        let mut used = false;
        while let Some((head, raw)) = self.q.pop(TXQ) {
            if let Some((h, payload)) = self.read_packet(&raw) {
                self.muxer.on_guest_packet(&h, &payload);
            }
            self.q.add_used(TXQ, head, 0);
            used = true;
        }
        if used {
            self.q.signal_used();
        }
    }

    /// Header and payload of a TX chain; None (packet dropped) when malformed.
    fn read_packet(&self, raw: &[super::common::Segment]) -> Option<(Header, Vec<u8>)> {
        let segs = Segments::split(raw).ok()?;
        let mut cur = Cursor::new(&segs.readable);
        let mut hb = [0u8; HEADER_LEN];
        cur.read(&self.q.mem, &mut hb).ok()?;
        let h = Header::parse(&hb);
        let len = u64::from(h.len);
        if len > MAX_TX_PAYLOAD || len > cur.remaining() {
            tracing::debug!("vsock: TX packet claims {len} bytes of payload; dropped");
            return None;
        }
        let mut payload = vec![0u8; len as usize];
        cur.read(&self.q.mem, &mut payload).ok()?;
        Some((h, payload))
    }

    /// Fill RX buffers with whatever the muxer has for the guest.
    pub(crate) fn process_rx(&mut self) {
        let mut used = false;
        while self.muxer.has_rx() {
            let Some((head, raw)) = self.q.pop(RXQ) else {
                break;
            };
            let Ok(segs) = Segments::split(&raw) else {
                self.q.add_used(RXQ, head, 0);
                used = true;
                continue;
            };
            let room = segs.writable_len();
            if room < HEADER_LEN as u64 {
                // Unusable buffer: give it back empty rather than stall the queue.
                self.q.add_used(RXQ, head, 0);
                used = true;
                continue;
            }
            let max = (room - HEADER_LEN as u64).min(usize::MAX as u64) as usize;
            let Some((h, data)) = self.muxer.next_rx(max) else {
                self.q.unpop(RXQ);
                break;
            };
            let mut cur = Cursor::new(&segs.writable);
            let ok = cur.write(&self.q.mem, &h.to_bytes()).is_ok()
                && cur.write(&self.q.mem, &data).is_ok();
            let len = if ok {
                (HEADER_LEN + data.len()) as u32
            } else {
                0
            };
            self.q.add_used(RXQ, head, len);
            used = true;
        }
        if used {
            self.q.signal_used();
        }
    }

    pub(crate) fn transport_reset(&mut self) {
        self.muxer.reset_all();
        self.muxer.hold_host_connections();
        self.reset_pending = true;
        self.process_events();
    }

    /// Deliver an owed transport-reset event if the guest posted an event buffer.
    pub(crate) fn process_events(&mut self) {
        if !self.reset_pending {
            return;
        }
        let Some((head, raw)) = self.q.pop(EVQ) else {
            return;
        };
        let seg = raw.iter().find(|s| s.writable && s.len >= 4);
        let written = seg.is_some_and(|s| {
            self.q
                .mem
                .write_obj(EVENT_TRANSPORT_RESET.to_le(), GuestAddress(s.addr))
                .is_ok()
        });
        self.q.add_used(EVQ, head, if written { 4 } else { 0 });
        if written {
            self.reset_pending = false;
            self.reset_unacknowledged = true;
            if let Some(t) = &mut self.reset_timer {
                if let Err(e) = t.reset(RESET_ACK_TIMEOUT, None) {
                    tracing::warn!("vsock: arming the reset timer: {e}");
                }
            }
        }
        self.q.signal_used();
    }

    /// The guest kicked the event queue: it handles events before it re-posts their
    /// buffers and kicks, so a delivered reset is now behind it.
    pub(crate) fn on_event_queue_kick(&mut self) {
        if self.reset_unacknowledged {
            self.reset_done();
        }
        self.process_events();
    }

    /// The guest did not acknowledge the reset in time: stop holding connections.
    pub(crate) fn on_reset_timeout(&mut self) {
        if let Some(t) = &mut self.reset_timer {
            let _ = t.wait();
        }
        if self.reset_unacknowledged {
            tracing::debug!(
                "vsock: the guest did not acknowledge the transport reset within \
                 {RESET_ACK_TIMEOUT:?}; releasing held host connections"
            );
            self.reset_done();
        }
    }

    fn reset_done(&mut self) {
        self.reset_unacknowledged = false;
        if let Some(t) = &mut self.reset_timer {
            let _ = t.clear();
        }
        self.muxer.release_host_connections();
    }

    fn reset_timer_fd(&self) -> Option<RawFd> {
        self.reset_timer.as_ref().map(AsRawFd::as_raw_fd)
    }
}

impl EventHandler for VsockWorker {
    fn handle_event(&mut self, fd: RawFd, events: EventSet, _r: &EventRegistrar) {
        match self.q.queue_for_fd(fd) {
            Some(TXQ) => self.process_tx(),
            Some(EVQ) => self.on_event_queue_kick(),
            Some(_) => {} // RX buffers arrived: process_rx below
            None if Some(fd) == self.reset_timer_fd() => self.on_reset_timeout(),
            None => self.muxer.on_fd_event(fd, events),
        }
        self.process_rx();
    }
}

impl VirtioDevice for Vsock {
    fn device_type(&self) -> u32 {
        DEVICE_TYPE_VSOCK
    }

    fn features(&self) -> u64 {
        VIRTIO_F_VERSION_1
    }

    fn queue_max_sizes(&self) -> Vec<u16> {
        vec![QUEUE_SIZE; 3]
    }

    fn read_config(&self, offset: u64, data: &mut [u8]) {
        let cfg = self.config.guest_cid.to_le_bytes();
        for (i, b) in data.iter_mut().enumerate() {
            *b = offset
                .checked_add(i as u64)
                .and_then(|o| cfg.get(o as usize))
                .copied()
                .unwrap_or(0);
        }
    }

    fn write_config(&mut self, _offset: u64, _data: &[u8]) {}

    fn activate(&mut self, ctx: ActivateContext) -> Result<(), ActivateError> {
        let (q, registrar) = DeviceQueues::from_ctx(ctx, 3)?;
        self.acked_features = q.acked_features;
        let evt_fds: Vec<RawFd> = q.evts.iter().map(|e| e.as_raw_fd()).collect();
        let listener = self
            .listener
            .try_clone()
            .map_err(|e| ActivateError::Device(format!("vsock listener: {e}")))?;
        let (guest_cid, uds) = (self.config.guest_cid, self.config.uds_path.clone());
        let worker = Arc::new_cyclic(|weak: &Weak<Mutex<VsockWorker>>| {
            let handler: Weak<Mutex<dyn EventHandler>> = weak.clone();
            let poller = Poller {
                registrar: registrar.clone(),
                handler,
            };
            Mutex::new(VsockWorker::new(
                q,
                Muxer::new(guest_cid, uds, Some(poller)),
            ))
        });
        // Registering needs a live Arc, so the listener is attached after construction.
        worker.lock().unwrap().muxer.attach_listener(listener);
        let mut reg = Registration::new(registrar);
        for fd in evt_fds {
            reg.add(fd, EventSet::IN, worker.clone())?;
        }
        let timer_fd = worker.lock().unwrap().reset_timer_fd();
        if let Some(fd) = timer_fd {
            reg.add(fd, EventSet::IN, worker.clone())?;
        }
        {
            let mut w = worker.lock().unwrap();
            if std::mem::take(&mut self.reset_on_activate) {
                // Ports the guest's inherited connections use must not come back.
                w.muxer.randomize_local_ports();
                w.transport_reset();
            }
            w.process_tx();
            w.process_rx();
        }
        self.active = Some((worker, reg));
        Ok(())
    }

    fn reset(&mut self) {
        // Closes every host connection; the listener stays bound for the next driver.
        deactivate(&mut self.active);
        self.acked_features = 0;
    }

    fn save(&self) -> Option<DeviceState> {
        Some(DeviceState::Vsock(self.save_state()))
    }
}

#[cfg(test)]
mod tests;
