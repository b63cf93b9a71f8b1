//! `vsock`: connect to host port `VSOCK_HOST_PORT` through the first virtio-vsock
//! device, send `VSOCK_PING`, expect `VSOCK_PONG` back, shut down and wait for the
//! host's RST. The host test listens on `<uds_path>_<VSOCK_HOST_PORT>`.

use crate::checks::{fail, fail_with, BootInfo, Fail};
use crate::say;
use crate::virtio::{self, get, put, Vq};
use zygote_probe_abi::{
    VIRTIO_AREA_GPA, VSOCK_GUEST_PORT, VSOCK_HOST_PORT, VSOCK_PING, VSOCK_PONG,
};

const C: &str = "vsock";
const HDR_LEN: u64 = 44;
const OP_REQUEST: u16 = 1;
const OP_RESPONSE: u16 = 2;
const OP_RST: u16 = 3;
const OP_SHUTDOWN: u16 = 4;
const OP_RW: u16 = 5;
const HOST_CID: u64 = 2;
const RX_BUFS: u16 = 4;
const RX_BUF_LEN: u32 = 0x1000;

const TX_BUF: u64 = VIRTIO_AREA_GPA + 0x8000;
const EV_BUF: u64 = VIRTIO_AREA_GPA + 0x9000;
fn rx_buf(i: u16) -> u64 {
    VIRTIO_AREA_GPA + 0x10000 + i as u64 * RX_BUF_LEN as u64
}

struct Conn {
    cid: u64,
    rx: Vq,
    tx: Vq,
    /// Payload bytes received (our fwd_cnt: the probe consumes data at once).
    received: u32,
}

impl Conn {
    fn send(&mut self, op: u16, flags: u32, payload: &[u8]) -> Result<(), Fail> {
        put::<u64>(TX_BUF, self.cid);
        put::<u64>(TX_BUF + 8, HOST_CID);
        put::<u32>(TX_BUF + 16, VSOCK_GUEST_PORT);
        put::<u32>(TX_BUF + 20, VSOCK_HOST_PORT);
        put::<u32>(TX_BUF + 24, payload.len() as u32);
        put::<u16>(TX_BUF + 28, 1); // stream
        put::<u16>(TX_BUF + 30, op);
        put::<u32>(TX_BUF + 32, flags);
        put::<u32>(TX_BUF + 36, RX_BUFS as u32 * RX_BUF_LEN);
        put::<u32>(TX_BUF + 40, self.received);
        for (i, &b) in payload.iter().enumerate() {
            put::<u8>(TX_BUF + HDR_LEN + i as u64, b);
        }
        self.tx
            .push(0, &[(TX_BUF, HDR_LEN as u32 + payload.len() as u32, false)]);
        self.tx.notify();
        match self.tx.wait_used() {
            Some(_) => Ok(()),
            None => Err(fail_with(C, "TX packet not consumed, op", op as u64)),
        }
    }

    /// Next packet from the host: (op, payload address, payload length); the buffer is
    /// re-posted after `f` has looked at it.
    fn recv<R>(&mut self, f: impl FnOnce(u16, u64, u32) -> R) -> Result<R, Fail> {
        let Some((head, len)) = self.rx.wait_used() else {
            return Err(fail(C, "no packet from the host"));
        };
        if head >= RX_BUFS as u32 || (len as u64) < HDR_LEN {
            return Err(fail_with(C, "bad RX completion, len", len as u64));
        }
        let buf = rx_buf(head as u16);
        let ok = get::<u64>(buf) == HOST_CID
            && get::<u64>(buf + 8) == self.cid
            && get::<u32>(buf + 16) == VSOCK_HOST_PORT
            && get::<u32>(buf + 20) == VSOCK_GUEST_PORT;
        let plen = get::<u32>(buf + 24);
        let op = get::<u16>(buf + 30);
        if !ok {
            return Err(fail_with(C, "packet for another connection, op", op as u64));
        }
        let r = f(op, buf + HDR_LEN, plen);
        self.rx.push(head as u16, &[(buf, RX_BUF_LEN, true)]);
        self.rx.notify();
        Ok(r)
    }
}

pub fn run(info: &BootInfo) -> Result<(), Fail> {
    let Some(base) = virtio::find(info.cmdline, 19) else {
        return Err(fail(C, "no virtio-vsock device on the command line"));
    };
    virtio::init(base, 0).map_err(|w| fail(C, w))?;
    let cid = virtio::config_u64(base, 0);
    let rx = virtio::setup_queue(base, 0, VIRTIO_AREA_GPA, 8).map_err(|w| fail(C, w))?;
    let tx = virtio::setup_queue(base, 1, VIRTIO_AREA_GPA + 0x1000, 8).map_err(|w| fail(C, w))?;
    let mut ev =
        virtio::setup_queue(base, 2, VIRTIO_AREA_GPA + 0x2000, 4).map_err(|w| fail(C, w))?;
    virtio::driver_ok(base).map_err(|w| fail(C, w))?;
    ev.push(0, &[(EV_BUF, 4, true)]);
    ev.notify();
    let mut c = Conn {
        cid,
        rx,
        tx,
        received: 0,
    };
    for i in 0..RX_BUFS {
        c.rx.push(i, &[(rx_buf(i), RX_BUF_LEN, true)]);
    }
    c.rx.notify();

    c.send(OP_REQUEST, 0, &[])?;
    let op = c.recv(|op, _, _| op)?;
    if op != OP_RESPONSE {
        return Err(fail_with(C, "connect refused, op", op as u64));
    }
    c.send(OP_RW, 0, VSOCK_PING)?;
    // The reply may come in pieces, possibly after credit updates.
    let mut got = 0usize;
    while got < VSOCK_PONG.len() {
        let (op, bad) = c.recv(|op, addr, len| {
            let mut bad = false;
            if op == OP_RW {
                for i in 0..len as usize {
                    let want = VSOCK_PONG.get(got + i).copied();
                    bad |= want != Some(get::<u8>(addr + i as u64));
                }
                got += len as usize;
            }
            (op, bad)
        })?;
        if bad {
            return Err(fail_with(
                C,
                "reply differs from VSOCK_PONG, bytes so far",
                got as u64,
            ));
        }
        if op == OP_RST || op == OP_SHUTDOWN {
            return Err(fail_with(C, "connection closed early, op", op as u64));
        }
    }
    c.received = got as u32;
    c.send(OP_SHUTDOWN, 3, &[])?;
    loop {
        let op = c.recv(|op, _, _| op)?;
        if op == OP_RST {
            break;
        }
    }
    say!(
        "check vsock ok cid=",
        cid,
        " port=",
        VSOCK_HOST_PORT as u64,
        " reply_bytes=",
        got
    );
    Ok(())
}
