//! A hostile registry on 127.0.0.1: answers each request with what a test's handler
//! says, including bodies far larger than anything a client should read (sent as
//! they are written, never held in memory), and counts the body bytes it managed to
//! send, so a test can tell how much the client read before it hung up.
//!
//! HTTP/1.1 with keep-alive, one thread per connection; request bodies are read and
//! dropped. Stops on drop.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

/// A request as the handler sees it.
#[derive(Debug, Clone)]
pub struct Request {
    pub method: String,
    pub path: String,
    pub headers: Vec<(String, String)>,
}

impl Request {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

/// What to answer.
pub struct Reply {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Body,
}

pub enum Body {
    Bytes(Vec<u8>),
    /// `len` bytes of `byte`, chunked (no length said) or with a `Content-Length`.
    Repeat {
        byte: u8,
        len: u64,
        chunked: bool,
    },
}

impl Reply {
    pub fn new(status: u16, body: Body) -> Reply {
        Reply {
            status,
            headers: Vec::new(),
            body,
        }
    }

    pub fn bytes(status: u16, data: impl Into<Vec<u8>>) -> Reply {
        Reply::new(status, Body::Bytes(data.into()))
    }

    pub fn header(mut self, name: &str, value: &str) -> Reply {
        self.headers.push((name.to_string(), value.to_string()));
        self
    }
}

type Handler = dyn Fn(&Request) -> Reply + Send + Sync;

pub struct FakeRegistry {
    addr: SocketAddr,
    log: Arc<Mutex<Vec<String>>>,
    sent: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl FakeRegistry {
    pub fn start(handler: impl Fn(&Request) -> Reply + Send + Sync + 'static) -> FakeRegistry {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1");
        listener.set_nonblocking(true).unwrap();
        let addr = listener.local_addr().unwrap();
        let (log, sent, stop) = Default::default();
        let handler: Arc<Handler> = Arc::new(handler);
        let thread = {
            let (log, sent, stop): (Arc<Mutex<Vec<String>>>, Arc<AtomicU64>, Arc<AtomicBool>) =
                (Arc::clone(&log), Arc::clone(&sent), Arc::clone(&stop));
            std::thread::spawn(move || {
                while !stop.load(Ordering::SeqCst) {
                    match listener.accept() {
                        Ok((conn, _)) => {
                            let (log, sent, handler) = (log.clone(), sent.clone(), handler.clone());
                            std::thread::spawn(move || serve(conn, &*handler, &log, &sent));
                        }
                        Err(_) => std::thread::sleep(Duration::from_millis(5)),
                    }
                }
            })
        };
        FakeRegistry {
            addr,
            log,
            sent,
            stop,
            thread: Some(thread),
        }
    }

    /// `127.0.0.1:<port>`, a registry reached over plain HTTP (loopback).
    pub fn host(&self) -> String {
        self.addr.to_string()
    }

    /// `METHOD path` of every request so far.
    pub fn requests(&self) -> Vec<String> {
        self.log.lock().unwrap().clone()
    }

    /// Body bytes written to clients so far (into their sockets: a client that hangs
    /// up leaves at most its socket buffers unread).
    pub fn sent(&self) -> u64 {
        self.sent.load(Ordering::SeqCst)
    }
}

impl Drop for FakeRegistry {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn serve(conn: TcpStream, handler: &Handler, log: &Mutex<Vec<String>>, sent: &AtomicU64) {
    let _ = conn.set_read_timeout(Some(Duration::from_secs(30)));
    let mut reader = BufReader::new(conn.try_clone().unwrap());
    let mut out = conn;
    loop {
        let Some(request) = read_request(&mut reader) else {
            return;
        };
        log.lock()
            .unwrap()
            .push(format!("{} {}", request.method, request.path));
        let reply = handler(&request);
        if write_reply(&mut out, &request, reply, sent).is_err() {
            return;
        }
    }
}

fn read_request(reader: &mut BufReader<TcpStream>) -> Option<Request> {
    let mut line = String::new();
    reader.read_line(&mut line).ok().filter(|&n| n > 0)?;
    let mut parts = line.split_whitespace();
    let (method, path) = (parts.next()?.to_string(), parts.next()?.to_string());
    let mut headers = Vec::new();
    loop {
        let mut h = String::new();
        reader.read_line(&mut h).ok().filter(|&n| n > 0)?;
        let h = h.trim_end();
        if h.is_empty() {
            break;
        }
        if let Some((k, v)) = h.split_once(':') {
            headers.push((k.trim().to_string(), v.trim().to_string()));
        }
    }
    let request = Request {
        method,
        path,
        headers,
    };
    let len: u64 = request
        .header("content-length")
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    std::io::copy(&mut reader.by_ref().take(len), &mut std::io::sink()).ok()?;
    Some(request)
}

fn write_reply(
    out: &mut TcpStream,
    request: &Request,
    reply: Reply,
    sent: &AtomicU64,
) -> std::io::Result<()> {
    let mut head = format!("HTTP/1.1 {} Fake\r\n", reply.status);
    for (k, v) in &reply.headers {
        head.push_str(&format!("{k}: {v}\r\n"));
    }
    let head_only = request.method == "HEAD";
    match &reply.body {
        Body::Bytes(b) => head.push_str(&format!("Content-Length: {}\r\n", b.len())),
        Body::Repeat { chunked: true, .. } => head.push_str("Transfer-Encoding: chunked\r\n"),
        Body::Repeat { len, .. } => head.push_str(&format!("Content-Length: {len}\r\n")),
    }
    head.push_str("\r\n");
    out.write_all(head.as_bytes())?;
    if head_only {
        return Ok(());
    }
    match reply.body {
        Body::Bytes(b) => {
            out.write_all(&b)?;
            sent.fetch_add(b.len() as u64, Ordering::SeqCst);
        }
        Body::Repeat { byte, len, chunked } => {
            let block = vec![byte; 64 << 10];
            let mut left = len;
            while left > 0 {
                let n = left.min(block.len() as u64) as usize;
                if chunked {
                    out.write_all(format!("{n:x}\r\n").as_bytes())?;
                    out.write_all(&block[..n])?;
                    out.write_all(b"\r\n")?;
                } else {
                    out.write_all(&block[..n])?;
                }
                sent.fetch_add(n as u64, Ordering::SeqCst);
                left -= n as u64;
            }
            if chunked {
                out.write_all(b"0\r\n\r\n")?;
            }
        }
    }
    out.flush()
}
