//! Raw HTTP/1.1 and Connect envelopes for the E2B tests: one request per connection,
//! chunked answers decoded, so the tests see exactly the bytes E2B's clients would.
use std::io::{Read, Write};

use serde_json::Value;

use crate::common::Daemon;

/// A whole HTTP/1.1 answer.
pub struct Answer {
    pub status: u16,
    pub head: String,
    pub body: Vec<u8>,
}

impl Answer {
    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|_| panic!("not JSON: {} {}", self.status, self.text()))
    }

    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    pub fn content_type(&self) -> String {
        self.header("content-type").unwrap_or_default()
    }

    /// The value of header `name` (any case), if the answer has it.
    pub fn header(&self, name: &str) -> Option<String> {
        self.head.lines().find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.eq_ignore_ascii_case(name).then(|| v.trim().to_string())
        })
    }

    /// The Connect envelopes of a streamed answer: (flags, JSON).
    pub fn envelopes(&self) -> Vec<(u8, Value)> {
        let mut out = Vec::new();
        let mut b = &self.body[..];
        while !b.is_empty() {
            assert!(b.len() >= 5, "a torn envelope prefix: {b:?}");
            let len = u32::from_be_bytes([b[1], b[2], b[3], b[4]]) as usize;
            let msg = serde_json::from_slice(&b[5..5 + len]).expect("envelope JSON");
            out.push((b[0], msg));
            b = &b[5 + len..];
        }
        out
    }
}

/// A daemon on loopback that starts no VM (a cgroup root without controllers), for
/// the tests of answers to bad input; `dir` holds its state.
pub fn daemon_without_vms(dir: &std::path::Path) -> Daemon {
    let cg = dir.join("cg");
    std::fs::create_dir_all(&cg).unwrap();
    std::fs::write(cg.join("cgroup.controllers"), "").unwrap();
    let cg = cg.display().to_string();
    crate::common::start_daemon(
        &dir.join("state"),
        &["--listen", "127.0.0.1:0", "--cgroup-root", &cg],
    )
}

/// One request on a fresh connection (`Connection: close`), chunked answers decoded.
pub fn http(addr: &str, method: &str, path: &str, headers: &[(&str, &str)], body: &[u8]) -> Answer {
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    let mut req = format!(
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\nContent-Length: {}\r\n",
        body.len()
    );
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    req.push_str("\r\n");
    s.write_all(req.as_bytes()).unwrap();
    s.write_all(body).unwrap();
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).unwrap();
    let split = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .unwrap_or_else(|| panic!("no header end: {:?}", String::from_utf8_lossy(&raw)));
    let head = String::from_utf8_lossy(&raw[..split]).into_owned();
    let mut body = raw[split + 4..].to_vec();
    if head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked")
    {
        body = dechunk(&body);
    }
    let status = head.split(' ').nth(1).and_then(|c| c.parse().ok()).unwrap();
    Answer { status, head, body }
}

pub fn dechunk(mut b: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    loop {
        let line_end = b
            .windows(2)
            .position(|w| w == b"\r\n")
            .expect("chunk size line");
        let size = usize::from_str_radix(std::str::from_utf8(&b[..line_end]).unwrap().trim(), 16)
            .expect("hex chunk size");
        b = &b[line_end + 2..];
        if size == 0 {
            return out;
        }
        out.extend_from_slice(&b[..size]);
        b = &b[size + 2..];
    }
}

pub fn hostport(url: &str) -> String {
    url.trim_start_matches("http://")
        .trim_end_matches('/')
        .to_string()
}

/// The proxy's address, from `GET /v1/info`.
pub fn proxy_addr(d: &Daemon) -> String {
    let token = format!("Bearer {}", d.token());
    let info = http(
        &hostport(&d.url),
        "GET",
        "/v1/info",
        &[("Authorization", &token)],
        b"",
    );
    hostport(
        info.json()["proxy"]["url"]
            .as_str()
            .expect("the proxy runs"),
    )
}

pub fn envelope(json: &Value) -> Vec<u8> {
    let bytes = serde_json::to_vec(json).unwrap();
    let mut out = vec![0u8];
    out.extend_from_slice(&(bytes.len() as u32).to_be_bytes());
    out.extend_from_slice(&bytes);
    out
}
