//! virtio-rng (entropy device, virtio 1.x §5.4): one queue of device-writable buffers,
//! filled from the host kernel's getrandom(2).
use std::os::fd::{AsRawFd, RawFd};
use std::sync::{Arc, Mutex};

use serde::{Deserialize, Serialize};
use vmm_sys_util::epoll::EventSet;

use super::common::{deactivate, Active, Cursor, DeviceQueues, Registration, Segments};
use super::state::{DeviceState, VirtioState};
use super::{ActivateContext, ActivateError, VirtioDevice, VIRTIO_F_VERSION_1};
use crate::event_loop::{EventHandler, EventRegistrar};

pub const DEVICE_TYPE_RNG: u32 = 4;
const QUEUE_SIZE: u16 = 256;
/// Most bytes handed out per buffer: a guest asking for megabytes per request gets a
/// short (but valid) answer instead of stalling the event thread.
const MAX_BYTES_PER_CHAIN: usize = 64 * 1024;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RngState {
    pub virtio: VirtioState,
}

#[derive(Debug, thiserror::Error)]
pub enum RngError {
    #[error("state is not an entropy device's (device type {0})")]
    WrongDevice(u32),
}

/// The entropy device.
#[derive(Default)]
pub struct Rng {
    active: Active<RngWorker>,
    acked_features: u64,
}

impl Rng {
    pub fn new() -> Self {
        Self::default()
    }

    /// A device that continues from `state`: the restoring transport activates it with
    /// queues rebuilt from `state.virtio.queues`. Nothing host-side needs re-creating.
    pub fn restore(state: &RngState) -> Result<Self, RngError> {
        if state.virtio.device_type != DEVICE_TYPE_RNG {
            return Err(RngError::WrongDevice(state.virtio.device_type));
        }
        Ok(Self {
            active: None,
            acked_features: state.virtio.acked_features,
        })
    }

    pub fn save_state(&self) -> RngState {
        let queues = self
            .active
            .as_ref()
            .map(|(w, _)| w.lock().unwrap().q.snapshot())
            .unwrap_or_default();
        RngState {
            virtio: VirtioState {
                device_type: DEVICE_TYPE_RNG,
                acked_features: self.acked_features,
                activated: self.active.is_some(),
                queues,
            },
        }
    }
}

pub(crate) struct RngWorker {
    pub(crate) q: DeviceQueues,
}

impl RngWorker {
    pub(crate) fn new(q: DeviceQueues) -> Self {
        Self { q }
    }

    /// Fill every available buffer; returns how many chains were used.
    pub(crate) fn process(&mut self) -> usize {
        let mut used = 0;
        let mut buf = vec![0u8; MAX_BYTES_PER_CHAIN];
        while let Some((head, raw)) = self.q.pop(0) {
            let written = match Segments::split(&raw) {
                Ok(segs) => {
                    let want = (segs.writable_len() as usize).min(MAX_BYTES_PER_CHAIN);
                    match fill_random(&mut buf[..want]) {
                        Ok(()) => {
                            match Cursor::new(&segs.writable).write(&self.q.mem, &buf[..want]) {
                                Ok(()) => want as u32,
                                Err(e) => {
                                    tracing::debug!("virtio-rng: {e}");
                                    0
                                }
                            }
                        }
                        Err(e) => {
                            tracing::warn!("virtio-rng: getrandom failed: {e}");
                            0
                        }
                    }
                }
                Err(e) => {
                    tracing::debug!("virtio-rng: malformed chain: {e}");
                    0
                }
            };
            self.q.add_used(0, head, written);
            used += 1;
        }
        if used > 0 {
            self.q.signal_used();
        }
        used
    }
}

/// getrandom(2) until `buf` is full; blocks only before the host pool is initialized.
fn fill_random(buf: &mut [u8]) -> std::io::Result<()> {
    let mut done = 0;
    while done < buf.len() {
        // SAFETY: writes at most the remaining length into our own buffer.
        let n = unsafe {
            libc::getrandom(
                buf[done..].as_mut_ptr() as *mut libc::c_void,
                buf.len() - done,
                0,
            )
        };
        if n < 0 {
            let e = std::io::Error::last_os_error();
            if e.kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        done += n as usize;
    }
    Ok(())
}

impl EventHandler for RngWorker {
    fn handle_event(&mut self, fd: RawFd, _events: EventSet, _r: &EventRegistrar) {
        if self.q.queue_for_fd(fd).is_some() {
            self.process();
        }
    }
}

impl VirtioDevice for Rng {
    fn device_type(&self) -> u32 {
        DEVICE_TYPE_RNG
    }

    fn features(&self) -> u64 {
        VIRTIO_F_VERSION_1
    }

    fn queue_max_sizes(&self) -> Vec<u16> {
        vec![QUEUE_SIZE]
    }

    fn read_config(&self, _offset: u64, data: &mut [u8]) {
        // The entropy device has no configuration space.
        data.fill(0);
    }

    fn write_config(&mut self, _offset: u64, _data: &[u8]) {}

    fn activate(&mut self, ctx: ActivateContext) -> Result<(), ActivateError> {
        let (q, registrar) = DeviceQueues::from_ctx(ctx, 1)?;
        self.acked_features = q.acked_features;
        let fd = q.evts[0].as_raw_fd();
        let worker = Arc::new(Mutex::new(RngWorker::new(q)));
        let mut reg = Registration::new(registrar);
        reg.add(fd, EventSet::IN, worker.clone())?;
        // Buffers the driver posted before DRIVER_OK are served right away.
        worker.lock().unwrap().process();
        self.active = Some((worker, reg));
        Ok(())
    }

    fn reset(&mut self) {
        deactivate(&mut self.active);
        self.acked_features = 0;
    }

    fn save(&self) -> Option<DeviceState> {
        Some(DeviceState::Rng(self.save_state()))
    }
}

#[cfg(test)]
#[path = "rng_tests.rs"]
mod tests;
