use std::io::{Read, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::time::Duration;

use super::packet::{op, HOST_CID, SHUTDOWN_RCV, SHUTDOWN_SEND, TYPE_STREAM};
use super::*;
use crate::devices::virtio::testutil::{activate_ctx, guest_mem, Driver};
use crate::memory::GuestMemoryMmap;

const CID: u64 = 3;
const RX_BUFS: u64 = 0x40000;
const RX_BUF_LEN: u32 = 4096;
const TX_BUF: u64 = 0x80000;

struct Rig<'a> {
    rx: Driver<'a>,
    tx: Driver<'a>,
    ev: Driver<'a>,
    dev: Vsock,
    worker: Arc<Mutex<VsockWorker>>,
    dir: tempfile::TempDir,
    rx_slot: u64,
    tx_slot: u64,
    /// Delivered packets no `wait_for` has claimed yet.
    backlog: Vec<(Header, Vec<u8>)>,
}

fn rig(mem: &GuestMemoryMmap) -> Rig<'_> {
    let dir = tempfile::tempdir().unwrap();
    let rx = Driver::new(mem, 0x0000, 64);
    let tx = Driver::new(mem, 0x4000, 64);
    let ev = Driver::new(mem, 0x8000, 4);
    let mut dev = Vsock::new(VsockConfig {
        guest_cid: CID,
        uds_path: dir.path().join("vm.sock"),
    })
    .unwrap();
    let (ctx, _w, _i) = activate_ctx(
        mem,
        vec![rx.queue(), tx.queue(), ev.queue()],
        VIRTIO_F_VERSION_1,
    );
    dev.activate(ctx).unwrap();
    let worker = dev.active.as_ref().unwrap().0.clone();
    Rig {
        rx,
        tx,
        ev,
        dev,
        worker,
        dir,
        rx_slot: 0,
        tx_slot: 0,
        backlog: Vec::new(),
    }
}

fn hdr(src_port: u32, dst_port: u32, op: u16, len: u32) -> Header {
    Header {
        src_cid: CID,
        dst_cid: HOST_CID,
        src_port,
        dst_port,
        len,
        kind: TYPE_STREAM,
        op,
        flags: 0,
        buf_alloc: 64 * 1024,
        fwd_cnt: 0,
    }
}

impl Rig<'_> {
    fn post_rx(&mut self, n: usize) {
        for _ in 0..n {
            let addr = RX_BUFS + (self.rx_slot % 32) * u64::from(RX_BUF_LEN);
            self.rx.add(&[(addr, RX_BUF_LEN, true)]);
            self.rx_slot += 1;
        }
    }

    /// Guest sends a packet (header and payload in separate descriptors, like Linux).
    fn send(&mut self, h: Header, payload: &[u8]) {
        let addr = TX_BUF + (self.tx_slot % 16) * 0x1000;
        self.tx_slot += 1;
        self.tx.write(addr, &h.to_bytes());
        self.tx.write(addr + 64, payload);
        if payload.is_empty() {
            self.tx.add(&[(addr, HEADER_LEN as u32, false)]);
        } else {
            self.tx.add(&[
                (addr, HEADER_LEN as u32, false),
                (addr + 64, payload.len() as u32, false),
            ]);
        }
        self.worker.lock().unwrap().process_tx();
        assert_eq!(self.tx.used().len(), 1);
    }

    /// Let the muxer look at every socket and fill RX buffers.
    fn pump(&mut self) {
        let mut w = self.worker.lock().unwrap();
        w.muxer.poll_all();
        w.process_rx();
    }

    /// Packets the device delivered and nobody claimed yet.
    fn received(&mut self) -> Vec<(Header, Vec<u8>)> {
        let mut out = std::mem::take(&mut self.backlog);
        out.extend(self.fresh());
        out
    }

    fn fresh(&mut self) -> Vec<(Header, Vec<u8>)> {
        self.pump();
        let used = self.rx.used();
        used.iter()
            .map(|&(id, len)| {
                assert!(len as usize >= HEADER_LEN, "packet too short: {len}");
                let addr = self.rx_addr(id);
                let b = self.rx.read(addr, len as usize);
                let h = Header::parse(b[..HEADER_LEN].try_into().unwrap());
                assert_eq!(h.len as usize, len as usize - HEADER_LEN);
                (h, b[HEADER_LEN..].to_vec())
            })
            .collect()
    }

    fn rx_addr(&self, head: u32) -> u64 {
        // Each single-descriptor chain's head is its descriptor: read its address back.
        let raw = self.rx.read(u64::from(head) * 16, 8);
        u64::from_le_bytes(raw.try_into().unwrap())
    }

    fn wait_for(&mut self, what: impl Fn(&(Header, Vec<u8>)) -> bool) -> (Header, Vec<u8>) {
        for _ in 0..200 {
            let fresh = self.fresh();
            self.backlog.extend(fresh);
            if let Some(i) = self.backlog.iter().position(&what) {
                return self.backlog.remove(i);
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        panic!("expected packet never arrived");
    }
}

#[test]
fn guest_connects_to_host_listener_and_exchanges_data() {
    let mem = guest_mem(1);
    let mut r = rig(&mem);
    let listener =
        UnixListener::bind(format!("{}_5000", r.dev.config().uds_path.display())).unwrap();
    r.post_rx(8);
    r.send(hdr(1234, 5000, op::REQUEST, 0), &[]);
    let (h, _) = r.wait_for(|(h, _)| h.op == op::RESPONSE);
    assert_eq!(
        (h.src_cid, h.dst_cid, h.src_port, h.dst_port),
        (HOST_CID, CID, 5000, 1234)
    );
    assert_eq!(h.buf_alloc, conn::TX_BUF_SIZE);
    let (mut host, _) = listener.accept().unwrap();
    host.set_read_timeout(Some(Duration::from_secs(5))).unwrap();

    r.send(hdr(1234, 5000, op::RW, 5), b"hello");
    let mut got = [0u8; 5];
    host.read_exact(&mut got).unwrap();
    assert_eq!(&got, b"hello");

    host.write_all(b"world").unwrap();
    let (h, data) = r.wait_for(|(h, _)| h.op == op::RW);
    assert_eq!(data, b"world");
    assert_eq!(h.fwd_cnt, 5, "our fwd_cnt counts forwarded guest bytes");

    // Full shutdown from the guest: the host sees EOF and the guest gets RST.
    let mut sd = hdr(1234, 5000, op::SHUTDOWN, 0);
    sd.flags = SHUTDOWN_RCV | SHUTDOWN_SEND;
    r.send(sd, &[]);
    r.wait_for(|(h, _)| h.op == op::RST);
    assert_eq!(host.read(&mut got).unwrap(), 0);
    assert_eq!(r.dev.connection_count(), 0);
}

#[test]
fn unreachable_ports_and_bad_packets_are_reset_or_dropped() {
    let mem = guest_mem(1);
    let mut r = rig(&mem);
    r.post_rx(16);
    r.send(hdr(1, 7777, op::REQUEST, 0), &[]);
    let (h, _) = r.wait_for(|(h, _)| h.op == op::RST);
    assert_eq!((h.src_port, h.dst_port), (7777, 1));
    // Data, shutdown and credit requests on unknown connections: RST each.
    r.send(hdr(2, 7777, op::RW, 3), b"abc");
    r.wait_for(|(h, _)| h.op == op::RST && h.dst_port == 2);
    // Spoofed source CID: silently dropped.
    let mut spoof = hdr(3, 7777, op::REQUEST, 0);
    spoof.src_cid = 99;
    r.send(spoof, &[]);
    // Datagram type: RST.
    let mut dgram = hdr(4, 7777, op::REQUEST, 0);
    dgram.kind = 3;
    r.send(dgram, &[]);
    r.wait_for(|(h, _)| h.op == op::RST && h.dst_port == 4);
    assert!(r.received().iter().all(|(h, _)| h.dst_port != 3));

    // Malformed TX chains: short header, payload length lies, writable-only, outside RAM.
    let a = TX_BUF + 0x8000;
    r.tx.write(a, &hdr(5, 7777, op::RW, 1000).to_bytes());
    for chain in [
        vec![(a, 20, false)],
        vec![(a, HEADER_LEN as u32, false), (a + 64, 10, false)],
        vec![(a, HEADER_LEN as u32, true)],
        vec![(0x7fff_0000, HEADER_LEN as u32, false)],
    ] {
        r.tx.add(&chain);
    }
    r.worker.lock().unwrap().process_tx();
    assert_eq!(r.tx.used().len(), 4, "all returned to the guest");
    assert_eq!(r.dev.connection_count(), 0);

    // RX buffers too small for a header are returned empty instead of wedging the queue.
    let mut r2 = rig(&mem);
    r2.rx.add(&[(RX_BUFS, 8, true)]);
    r2.send(hdr(1, 7777, op::REQUEST, 0), &[]);
    r2.pump();
    assert_eq!(r2.rx.used(), vec![(0, 0)]);
}

#[test]
fn host_initiated_connection_with_hybrid_handshake() {
    let mem = guest_mem(1);
    let mut r = rig(&mem);
    r.post_rx(8);
    let mut host = UnixStream::connect(&r.dev.config().uds_path).unwrap();
    host.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    host.write_all(b"CONNECT 52\nearly").unwrap();
    let (req, _) = r.wait_for(|(h, _)| h.op == op::REQUEST);
    assert_eq!(req.dst_port, 52);
    assert!(req.src_port >= 1 << 30);
    let mut resp = hdr(52, req.src_port, op::RESPONSE, 0);
    resp.dst_port = req.src_port;
    r.send(resp, &[]);
    let mut line = [0u8; 14];
    host.read_exact(&mut line).unwrap();
    assert_eq!(
        std::str::from_utf8(&line).unwrap(),
        format!("OK {}\n", req.src_port)
    );
    // Bytes sent right after the CONNECT line reach the guest first.
    let (_, data) = r.wait_for(|(h, _)| h.op == op::RW);
    assert_eq!(data, b"early");
    let mut rw = hdr(52, req.src_port, op::RW, 2);
    rw.dst_port = req.src_port;
    r.send(rw, b"hi");
    let mut got = [0u8; 2];
    host.read_exact(&mut got).unwrap();
    assert_eq!(&got, b"hi");
    // The host hangs up: the guest is told with a full SHUTDOWN.
    drop(host);
    let (sd, _) = r.wait_for(|(h, _)| h.op == op::SHUTDOWN);
    assert_eq!(sd.flags, SHUTDOWN_RCV | SHUTDOWN_SEND);

    // Garbage instead of a CONNECT line: the socket is closed.
    let mut bad = UnixStream::connect(&r.dev.config().uds_path).unwrap();
    bad.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    bad.write_all(b"HELLO 1\n").unwrap();
    r.pump();
    r.pump();
    let mut b = [0u8; 1];
    assert_eq!(bad.read(&mut b).unwrap(), 0);
}

#[test]
fn credit_limits_host_to_guest_data() {
    let mem = guest_mem(1);
    let mut r = rig(&mem);
    let listener =
        UnixListener::bind(format!("{}_6000", r.dev.config().uds_path.display())).unwrap();
    r.post_rx(16);
    let mut req = hdr(10, 6000, op::REQUEST, 0);
    req.buf_alloc = 4; // the guest can hold 4 bytes
    r.send(req, &[]);
    r.wait_for(|(h, _)| h.op == op::RESPONSE);
    let (mut host, _) = listener.accept().unwrap();
    host.write_all(b"0123456789").unwrap();
    let (_, data) = r.wait_for(|(h, _)| h.op == op::RW);
    assert_eq!(data, b"0123");
    r.wait_for(|(h, _)| h.op == op::CREDIT_REQUEST);
    assert!(r.received().is_empty(), "nothing beyond the credit");
    // The guest consumed the 4 bytes.
    let mut upd = hdr(10, 6000, op::CREDIT_UPDATE, 0);
    upd.buf_alloc = 4;
    upd.fwd_cnt = 4;
    r.send(upd, &[]);
    let (_, data) = r.wait_for(|(h, _)| h.op == op::RW);
    assert_eq!(data, b"4567");
    // Guest asks for our credit: it gets a CREDIT_UPDATE.
    r.send(hdr(10, 6000, op::CREDIT_REQUEST, 0), &[]);
    r.wait_for(|(h, _)| h.op == op::CREDIT_UPDATE);
    // A guest that overruns the credit we gave it is reset.
    let big = vec![7u8; 60 * 1024];
    let _hold = host; // not reading: the socket buffer fills, then ours
    for _ in 0..8 {
        r.send(hdr(10, 6000, op::RW, big.len() as u32), &big);
    }
    r.wait_for(|(h, _)| h.op == op::RST);
}

#[test]
fn connection_limit_resets_the_excess() {
    let mem = guest_mem(1);
    let mut r = rig(&mem);
    r.worker.lock().unwrap().muxer.max_connections = 2;
    let _l = UnixListener::bind(format!("{}_7000", r.dev.config().uds_path.display())).unwrap();
    r.post_rx(16);
    for port in [1, 2, 3] {
        r.send(hdr(port, 7000, op::REQUEST, 0), &[]);
    }
    let got: Vec<(u16, u32)> = r
        .received()
        .iter()
        .map(|(h, _)| (h.op, h.dst_port))
        .collect();
    assert_eq!(
        got,
        vec![(op::RESPONSE, 1), (op::RESPONSE, 2), (op::RST, 3)]
    );
    assert_eq!(r.dev.connection_count(), 2);
}

#[test]
fn transport_reset_event_drops_connections_and_state_round_trips() {
    let mem = guest_mem(1);
    let mut r = rig(&mem);
    let listener =
        UnixListener::bind(format!("{}_8000", r.dev.config().uds_path.display())).unwrap();
    r.post_rx(4);
    r.send(hdr(1, 8000, op::REQUEST, 0), &[]);
    r.wait_for(|(h, _)| h.op == op::RESPONSE);
    let (mut host, _) = listener.accept().unwrap();
    host.set_read_timeout(Some(Duration::from_secs(5))).unwrap();

    // No event buffer yet: the reset is owed, then delivered when one is posted.
    r.dev.send_transport_reset();
    assert_eq!(r.dev.connection_count(), 0);
    assert_eq!(host.read(&mut [0u8; 1]).unwrap(), 0, "host side closed");
    assert!(r.ev.used().is_empty());
    r.ev.write(0x9000, &[0xff; 4]);
    r.ev.add(&[(0x9000, 4, true)]);
    r.worker.lock().unwrap().process_events();
    assert_eq!(r.ev.used(), vec![(0, 4)]);
    assert_eq!(r.ev.read(0x9000, 4), EVENT_TRANSPORT_RESET.to_le_bytes());

    let state = r.dev.save_state();
    assert_eq!(state.guest_cid, CID);
    assert_eq!(state.virtio.queues.len(), 3);
    let json = serde_json::to_string(&DeviceState::Vsock(state.clone())).unwrap();
    let DeviceState::Vsock(back) = serde_json::from_str(&json).unwrap() else {
        panic!("wrong variant")
    };
    let restored = Vsock::restore(&back, r.dir.path().join("restored.sock")).unwrap();
    assert!(restored.reset_on_activate);
    let mut cid = [0u8; 8];
    restored.read_config(0, &mut cid);
    assert_eq!(u64::from_le_bytes(cid), CID);
    assert!(Vsock::new(VsockConfig {
        guest_cid: 2,
        uds_path: r.dir.path().join("x")
    })
    .is_err());
    r.dev.reset();
    assert_eq!(r.dev.connection_count(), 0);
}

#[test]
fn host_connections_wait_until_the_guest_has_handled_a_transport_reset() {
    let mem = guest_mem(1);
    let mut r = rig(&mem);
    r.post_rx(16);
    let connect = |r: &Rig| {
        let mut host = UnixStream::connect(&r.dev.config().uds_path).unwrap();
        host.write_all(b"CONNECT 1024\n").unwrap();
        host
    };
    let requests = |r: &mut Rig| -> Vec<Header> {
        // Let the muxer accept and read the CONNECT line.
        for _ in 0..20 {
            r.pump();
            std::thread::sleep(Duration::from_millis(5));
        }
        r.received()
            .into_iter()
            .map(|(h, _)| h)
            .filter(|h| h.op == op::REQUEST)
            .collect()
    };

    // The guest has an event buffer: the reset is delivered at once...
    r.ev.add(&[(0x9000, 4, true)]);
    r.dev.send_transport_reset();
    assert_eq!(r.ev.used(), vec![(0, 4)]);
    // ...and a host connection made now is held: the guest would reset it too.
    let _a = connect(&r);
    assert!(
        requests(&mut r).is_empty(),
        "REQUEST sent before the guest handled the reset"
    );
    // The guest handles the event, re-posts the buffer and kicks: the REQUEST goes out.
    r.ev.add(&[(0x9000, 4, true)]);
    r.worker.lock().unwrap().on_event_queue_kick();
    let got = requests(&mut r);
    assert_eq!(got.len(), 1, "{got:?}");
    assert_eq!(got[0].dst_port, 1024);

    // A guest that never acknowledges holds connections only until the timeout.
    r.dev.send_transport_reset();
    let _b = connect(&r);
    assert!(requests(&mut r).is_empty());
    r.worker.lock().unwrap().on_reset_timeout();
    assert_eq!(requests(&mut r).len(), 1);

    // Without a reset in flight, connections go through at once.
    let _c = connect(&r);
    assert_eq!(requests(&mut r).len(), 1);
}

#[test]
fn a_restored_device_numbers_host_ports_anew() {
    let mut a = Muxer::new(CID, "/nonexistent".into(), None);
    let mut b = Muxer::new(CID, "/nonexistent".into(), None);
    a.randomize_local_ports();
    b.randomize_local_ports();
    let (pa, pb) = (a.alloc_local_port(1024), b.alloc_local_port(1024));
    assert!(pa >= 1 << 30 && pb >= 1 << 30);
    assert_ne!(
        (pa, pb),
        (1 << 30, 1 << 30),
        "both started at the first port"
    );
}
