use super::*;
use crate::devices::virtio::testutil::{activate_ctx, guest_mem, Driver};
use crate::devices::virtio::INT_USED_RING;

fn active_rng(mem: &crate::memory::GuestMemoryMmap, drv: &Driver) -> Rng {
    let (ctx, _w, _i) = activate_ctx(mem, vec![drv.queue()], VIRTIO_F_VERSION_1);
    let mut rng = Rng::new();
    rng.activate(ctx).unwrap();
    rng
}

#[test]
fn fills_buffers_with_distinct_random_bytes() {
    let mem = guest_mem(1);
    let mut drv = Driver::new(&mem, 0, 16);
    let rng = active_rng(&mem, &drv);
    let h1 = drv.add(&[(0x10000, 64, true)]);
    let h2 = drv.add(&[(0x20000, 16, true), (0x20100, 48, true)]);
    let worker = rng.active.as_ref().unwrap().0.clone();
    assert_eq!(worker.lock().unwrap().process(), 2);
    assert_eq!(drv.used(), vec![(u32::from(h1), 64), (u32::from(h2), 64)]);
    let a = drv.read(0x10000, 64);
    let mut b = drv.read(0x20000, 16);
    b.extend(drv.read(0x20100, 48));
    assert!(a.iter().any(|&x| x != 0));
    assert_ne!(a, b, "two reads differ");
    assert_eq!(
        worker.lock().unwrap().q.interrupt.status() & INT_USED_RING,
        INT_USED_RING
    );
}

#[test]
fn malformed_chains_are_returned_empty() {
    let mem = guest_mem(1);
    let mut drv = Driver::new(&mem, 0, 16);
    let rng = active_rng(&mem, &drv);
    // Readable-only chain: nothing to write into.
    let h1 = drv.add(&[(0x10000, 64, false)]);
    // Buffer outside guest memory.
    let h2 = drv.add(&[(0x7fff_0000, 64, true)]);
    // Readable after writable.
    let h3 = drv.add(&[(0x10000, 8, true), (0x10100, 8, false)]);
    // A head index beyond the table: the queue must skip it without panicking.
    drv.publish(200);
    let worker = rng.active.as_ref().unwrap().0.clone();
    worker.lock().unwrap().process();
    let used = drv.used();
    assert!(used.contains(&(u32::from(h1), 0)), "{used:?}");
    assert!(used.contains(&(u32::from(h2), 0)), "{used:?}");
    assert!(used.contains(&(u32::from(h3), 0)), "{used:?}");
}

#[test]
fn oversized_requests_get_a_capped_answer_and_state_round_trips() {
    let mem = guest_mem(2);
    let mut drv = Driver::new(&mem, 0, 16);
    let mut rng = active_rng(&mem, &drv);
    let h = drv.add(&[(0x10000, 1 << 20, true)]);
    let worker = rng.active.as_ref().unwrap().0.clone();
    worker.lock().unwrap().process();
    assert_eq!(drv.used(), vec![(u32::from(h), MAX_BYTES_PER_CHAIN as u32)]);
    let state = rng.save_state();
    assert!(state.virtio.activated);
    assert_eq!(state.virtio.queues[0].next_avail, 1);
    assert_eq!(state.virtio.queues[0].next_used, 1);
    let json = serde_json::to_string(&DeviceState::Rng(state.clone())).unwrap();
    let back: DeviceState = serde_json::from_str(&json).unwrap();
    assert_eq!(back, DeviceState::Rng(state.clone()));
    let restored = Rng::restore(&state).unwrap();
    assert_eq!(restored.acked_features, VIRTIO_F_VERSION_1);
    rng.reset();
    assert!(rng.active.is_none());
    assert!(!rng.save_state().virtio.activated);
}
