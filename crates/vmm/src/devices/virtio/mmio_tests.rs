use super::*;
use crate::devices::virtio::{ActivateError, INT_CONFIG_CHANGE, INT_USED_RING};
use vm_memory::GuestAddress;

/// (size, descriptor table, avail ring, used ring) of one queue at activation.
type QueueSeen = (u16, u64, u64, u64);

#[derive(Default)]
struct MockState {
    activated: Option<(u64, Vec<QueueSeen>)>,
    resets: usize,
    config: [u8; 8],
}

struct MockDevice(Arc<Mutex<MockState>>);

impl VirtioDevice for MockDevice {
    fn device_type(&self) -> u32 {
        4
    }
    fn features(&self) -> u64 {
        VIRTIO_F_VERSION_1 | 0b101
    }
    fn queue_max_sizes(&self) -> Vec<u16> {
        vec![16, 8]
    }
    fn read_config(&self, offset: u64, data: &mut [u8]) {
        let cfg = self.0.lock().unwrap().config;
        for (i, b) in data.iter_mut().enumerate() {
            *b = cfg.get(offset as usize + i).copied().unwrap_or(0);
        }
    }
    fn write_config(&mut self, offset: u64, data: &[u8]) {
        let mut st = self.0.lock().unwrap();
        for (i, b) in data.iter().enumerate() {
            if let Some(slot) = st.config.get_mut(offset as usize + i) {
                *slot = *b;
            }
        }
    }
    fn activate(&mut self, ctx: ActivateContext) -> Result<(), ActivateError> {
        let qs = ctx
            .queues
            .iter()
            .map(|q| (q.size(), q.desc_table(), q.avail_ring(), q.used_ring()))
            .collect();
        self.0.lock().unwrap().activated = Some((ctx.acked_features, qs));
        Ok(())
    }
    fn reset(&mut self) {
        self.0.lock().unwrap().resets += 1;
    }
}

fn transport() -> (MmioTransport, Arc<Mutex<MockState>>) {
    let state = Arc::new(Mutex::new(MockState::default()));
    let mem = GuestMemoryMmap::from_ranges(&[(GuestAddress(0), 1 << 20)]).unwrap();
    // The loop is dropped (and its thread stopped) right away; the registrar stays usable.
    let registrar = crate::event_loop::EventLoop::start()
        .unwrap()
        .registrar()
        .clone();
    let device = Arc::new(Mutex::new(MockDevice(state.clone())));
    let t = MmioTransport::new(device, mem, registrar).unwrap();
    (t, state)
}

fn rd(t: &mut MmioTransport, off: u64) -> u32 {
    let mut b = [0u8; 4];
    t.read(off, &mut b);
    u32::from_le_bytes(b)
}

fn wr(t: &mut MmioTransport, off: u64, v: u32) {
    t.write(off, &v.to_le_bytes());
}

/// The Linux driver's initialization sequence up to FEATURES_OK.
fn negotiate(t: &mut MmioTransport, features: u64) {
    wr(t, reg::STATUS, 0);
    wr(t, reg::STATUS, status::ACKNOWLEDGE);
    wr(t, reg::STATUS, status::ACKNOWLEDGE | status::DRIVER);
    wr(t, reg::DRIVER_FEATURES_SEL, 0);
    wr(t, reg::DRIVER_FEATURES, features as u32);
    wr(t, reg::DRIVER_FEATURES_SEL, 1);
    wr(t, reg::DRIVER_FEATURES, (features >> 32) as u32);
    wr(
        t,
        reg::STATUS,
        status::ACKNOWLEDGE | status::DRIVER | status::FEATURES_OK,
    );
}

fn setup_queue(t: &mut MmioTransport, sel: u32, size: u32, base: u64) {
    wr(t, reg::QUEUE_SEL, sel);
    wr(t, reg::QUEUE_NUM, size);
    wr(t, reg::QUEUE_DESC_LOW, base as u32);
    wr(t, reg::QUEUE_DESC_HIGH, 0);
    wr(t, reg::QUEUE_DRIVER_LOW, (base + 0x1000) as u32);
    wr(t, reg::QUEUE_DRIVER_HIGH, 0);
    wr(t, reg::QUEUE_DEVICE_LOW, (base + 0x2000) as u32);
    wr(t, reg::QUEUE_DEVICE_HIGH, 0);
    wr(t, reg::QUEUE_READY, 1);
}

#[test]
fn identity_registers() {
    let (mut t, _) = transport();
    assert_eq!(rd(&mut t, reg::MAGIC), MAGIC);
    assert_eq!(rd(&mut t, reg::VERSION), 2);
    assert_eq!(rd(&mut t, reg::DEVICE_ID), 4);
    wr(&mut t, reg::DEVICE_FEATURES_SEL, 1);
    assert_eq!(rd(&mut t, reg::DEVICE_FEATURES), 1);
    wr(&mut t, reg::DEVICE_FEATURES_SEL, 0);
    assert_eq!(rd(&mut t, reg::DEVICE_FEATURES), 0b101);
    wr(&mut t, reg::QUEUE_SEL, 1);
    assert_eq!(rd(&mut t, reg::QUEUE_NUM_MAX), 8);
    wr(&mut t, reg::QUEUE_SEL, 7);
    assert_eq!(rd(&mut t, reg::QUEUE_NUM_MAX), 0, "nonexistent queue");
}

#[test]
fn full_init_activates_with_negotiated_queues() {
    let (mut t, state) = transport();
    negotiate(&mut t, VIRTIO_F_VERSION_1 | 0b1);
    assert_ne!(rd(&mut t, reg::STATUS) & status::FEATURES_OK, 0);
    setup_queue(&mut t, 0, 16, 0x10000);
    setup_queue(&mut t, 1, 8, 0x20000);
    let all = status::ACKNOWLEDGE | status::DRIVER | status::FEATURES_OK | status::DRIVER_OK;
    wr(&mut t, reg::STATUS, all);
    assert!(t.is_activated());
    let (features, queues) = state.lock().unwrap().activated.clone().unwrap();
    assert_eq!(features, VIRTIO_F_VERSION_1 | 0b1);
    assert_eq!(queues[0], (16, 0x10000, 0x11000, 0x12000));
    assert_eq!(queues[1], (8, 0x20000, 0x21000, 0x22000));
    // Queue registers are frozen after DRIVER_OK.
    wr(&mut t, reg::QUEUE_SEL, 0);
    wr(&mut t, reg::QUEUE_NUM, 4);
    wr(&mut t, reg::STATUS, 0);
    assert!(!t.is_activated());
    assert_eq!(state.lock().unwrap().resets, 1);
    assert_eq!(rd(&mut t, reg::STATUS), 0);
}

#[test]
fn refuses_unoffered_features_and_legacy_drivers() {
    let (mut t, state) = transport();
    negotiate(&mut t, VIRTIO_F_VERSION_1 | 0b10); // bit 1 not offered
    assert_eq!(rd(&mut t, reg::STATUS) & status::FEATURES_OK, 0);
    let (mut t2, _) = transport();
    negotiate(&mut t2, 0b1); // no VERSION_1
    assert_eq!(rd(&mut t2, reg::STATUS) & status::FEATURES_OK, 0);
    // DRIVER_OK without FEATURES_OK never activates.
    wr(
        &mut t,
        reg::STATUS,
        status::ACKNOWLEDGE | status::DRIVER | status::DRIVER_OK,
    );
    assert!(!t.is_activated());
    assert!(state.lock().unwrap().activated.is_none());
}

#[test]
fn invalid_queue_addresses_need_reset_instead_of_activating() {
    let (mut t, state) = transport();
    negotiate(&mut t, VIRTIO_F_VERSION_1);
    setup_queue(&mut t, 0, 16, 0x7fff_0000); // outside the 1 MiB of guest memory
    let all = status::ACKNOWLEDGE | status::DRIVER | status::FEATURES_OK | status::DRIVER_OK;
    wr(&mut t, reg::STATUS, all);
    assert!(!t.is_activated());
    assert!(state.lock().unwrap().activated.is_none());
    assert_ne!(rd(&mut t, reg::STATUS) & status::DEVICE_NEEDS_RESET, 0);
}

#[test]
fn interrupts_and_ack() {
    let (mut t, _) = transport();
    t.interrupt().signal(INT_USED_RING).unwrap();
    t.interrupt().signal(INT_CONFIG_CHANGE).unwrap();
    assert_eq!(rd(&mut t, reg::INTERRUPT_STATUS), 3);
    assert_eq!(t.interrupt().irqfd().read().unwrap(), 2);
    wr(&mut t, reg::INTERRUPT_ACK, INT_USED_RING);
    assert_eq!(rd(&mut t, reg::INTERRUPT_STATUS), INT_CONFIG_CHANGE);
}

#[test]
fn notify_fallback_and_config_space() {
    let (mut t, _) = transport();
    wr(&mut t, reg::QUEUE_NOTIFY, 1);
    assert_eq!(t.queue_evts()[1].read().unwrap(), 1);
    wr(&mut t, reg::QUEUE_NOTIFY, 99); // out of range: ignored, no panic
    t.write(CONFIG_SPACE_OFFSET + 2, &[0xab, 0xcd]);
    let mut b = [0u8; 4];
    t.read(CONFIG_SPACE_OFFSET, &mut b);
    assert_eq!(b, [0, 0, 0xab, 0xcd]);
    assert_eq!(rd(&mut t, reg::CONFIG_GENERATION), 1);
    // Odd-sized register access reads zero and writes are ignored.
    let mut one = [0xffu8; 1];
    t.read(reg::MAGIC, &mut one);
    assert_eq!(one, [0]);
    t.write(reg::STATUS, &[1]);
    assert_eq!(rd(&mut t, reg::STATUS), 0);
}

#[test]
fn cmdline_entry_format() {
    assert_eq!(
        MmioTransport::cmdline_entry(0xd000_0000, 5),
        "virtio_mmio.device=4K@0xd0000000:5"
    );
}
