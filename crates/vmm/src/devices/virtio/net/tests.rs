use std::os::fd::FromRawFd;

use super::*;
use crate::devices::virtio::testutil::{activate_ctx, guest_mem, Driver};
use crate::memory::GuestMemoryMmap;

/// A packet-preserving fd pair standing in for a tap: (device end, "wire" end).
fn dgram_pair() -> (File, File) {
    let mut fds = [0; 2];
    // SAFETY: socketpair fills two fds we then own.
    let rc = unsafe {
        libc::socketpair(
            libc::AF_UNIX,
            libc::SOCK_DGRAM | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
            0,
            fds.as_mut_ptr(),
        )
    };
    assert_eq!(rc, 0);
    // SAFETY: fresh fds from socketpair.
    unsafe { (File::from_raw_fd(fds[0]), File::from_raw_fd(fds[1])) }
}

fn active(mem: &GuestMemoryMmap, rx: &Driver, tx: &Driver) -> (Net, File, Arc<Mutex<NetWorker>>) {
    let (dev_end, wire) = dgram_pair();
    let cfg = NetConfig {
        tap: "test".into(),
        mac: [0x02, 1, 2, 3, 4, 5],
    };
    let mut net = Net::with_backend(cfg, dev_end, "test".into());
    let (ctx, _w, _i) = activate_ctx(
        mem,
        vec![rx.queue(), tx.queue()],
        VIRTIO_F_VERSION_1 | VIRTIO_NET_F_MAC,
    );
    net.activate(ctx).unwrap();
    let w = net.active.as_ref().unwrap().0.clone();
    (net, wire, w)
}

#[test]
fn tx_and_rx_frames_keep_the_vnet_header() {
    let mem = guest_mem(1);
    let mut rx = Driver::new(&mem, 0, 16);
    let mut tx = Driver::new(&mem, 0x4000, 16);
    let (net, mut wire, w) = active(&mem, &rx, &tx);
    let mut mac = [0u8; 6];
    net.read_config(0, &mut mac);
    assert_eq!(mac, [0x02, 1, 2, 3, 4, 5]);

    // TX: header and frame in separate descriptors arrive as one datagram.
    let frame: Vec<u8> = (0..60u8).collect();
    tx.write(0x10000, &[0u8; VNET_HDR_LEN]);
    tx.write(0x11000, &frame);
    tx.add(&[(0x10000, VNET_HDR_LEN as u32, false), (0x11000, 60, false)]);
    w.lock().unwrap().process_tx();
    assert_eq!(tx.used().len(), 1);
    let mut got = [0u8; 100];
    let n = wire.read(&mut got).unwrap();
    assert_eq!(n, VNET_HDR_LEN + 60);
    assert_eq!(&got[VNET_HDR_LEN..n], &frame[..]);

    // RX: no buffers yet, so the frame waits in the backend.
    let mut pkt = vec![0u8; VNET_HDR_LEN];
    pkt.extend_from_slice(b"incoming frame");
    wire.write_all(&pkt).unwrap();
    w.lock().unwrap().process_rx();
    assert!(w.lock().unwrap().rx_blocked);
    rx.add(&[(0x20000, 1526, true)]);
    w.lock().unwrap().process_rx();
    let used = rx.used();
    assert_eq!(used, vec![(0, pkt.len() as u32)]);
    let data = rx.read(0x20000, pkt.len());
    assert_eq!(u16::from_le_bytes([data[10], data[11]]), 1, "num_buffers");
    assert_eq!(&data[VNET_HDR_LEN..], b"incoming frame");
    // Every buffer is used: the tap is not watched until the guest posts more.
    assert!(w.lock().unwrap().rx_blocked);
    rx.add(&[(0x21000, 1526, true)]);
    w.lock().unwrap().process_rx();
    assert!(!w.lock().unwrap().rx_blocked, "watching the tap again");
    assert!(rx.used().is_empty());
}

#[test]
fn bad_frames_are_dropped_without_stalling() {
    let mem = guest_mem(1);
    let mut rx = Driver::new(&mem, 0, 16);
    let mut tx = Driver::new(&mem, 0x4000, 16);
    let (mut net, mut wire, w) = active(&mem, &rx, &tx);
    // TX: shorter than the header, oversized, outside memory, writable-only.
    tx.add(&[(0x10000, 4, false)]);
    tx.add(&[(0x10000, MAX_PACKET as u32 + 1, false)]);
    tx.add(&[(0x7fff_0000, 64, false)]);
    tx.add(&[(0x10000, 64, true)]);
    w.lock().unwrap().process_tx();
    assert_eq!(tx.used().len(), 4);
    assert_eq!(w.lock().unwrap().dropped, 4);
    let mut b = [0u8; 16];
    assert!(wire.read(&mut b).is_err(), "nothing reached the wire");

    // RX: a buffer too small for the frame keeps waiting; the frame is dropped.
    wire.write_all(&[0u8; 200]).unwrap();
    rx.add(&[(0x20000, 64, true)]);
    w.lock().unwrap().process_rx();
    assert!(rx.used().is_empty());
    assert_eq!(w.lock().unwrap().dropped, 5);

    let state = net.save_state();
    assert_eq!(state.mac, [0x02, 1, 2, 3, 4, 5]);
    assert_eq!(state.virtio.queues.len(), 2);
    let json = serde_json::to_string(&DeviceState::Net(state.clone())).unwrap();
    assert_eq!(
        serde_json::from_str::<DeviceState>(&json).unwrap(),
        DeviceState::Net(state)
    );
    net.reset();
    assert!(net.active.is_none());
}

#[test]
fn real_tap_opens_with_vnet_header_when_permitted() {
    use std::io::Write as _;
    if !std::path::Path::new("/dev/net/tun").exists() {
        let _ = writeln!(std::io::stderr(), "skipping: /dev/net/tun absent");
        return;
    }
    match Net::new(NetConfig::new("zyg%d")) {
        Ok(net) => {
            assert!(net.ifname().starts_with("zyg"), "{}", net.ifname());
            let mac = net.config.mac;
            assert_eq!(mac[0] & 0x03, 0x02, "locally administered unicast");
        }
        Err(NetError::Tap(TapError::Ioctl { source, .. }))
            if source.raw_os_error() == Some(libc::EPERM) =>
        {
            let _ = writeln!(
                std::io::stderr(),
                "skipping: no CAP_NET_ADMIN to create a tap"
            );
        }
        Err(e) => panic!("opening a tap failed: {e}"),
    }
    assert!(matches!(
        open_tap("this-name-is-too-long"),
        Err(TapError::BadName(_))
    ));
}
