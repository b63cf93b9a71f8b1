//! Seeded randomized test of the host side of the agent protocol: what the client does
//! with frames a hostile guest writes (the cargo-fuzz target `agent_frames` in
//! `fuzz/` feeds the same decoder; `scripts/fuzz.sh` runs either).
//!
//! Streams of valid responses, mutated ones (bytes flipped, inserted, cut), wrong
//! lengths, truncated and huge frames, bad JSON (deep nesting, huge numbers, invalid
//! UTF-8 and base64, wrong types) go through [`read_response`] frame by frame, and now
//! and then through a whole [`AgentClient`]. The properties: no panic; every failure is
//! an error value with a short message; no allocation beyond the frame limit, and a
//! frame that announces more than it carries costs memory for what it carries only.
//!
//! `ZYGOTE_FUZZ_ITERS` (default 2000) and `ZYGOTE_FUZZ_SEED` (default fixed; printed)
//! set the run; a failure prints the seed and iteration to reproduce it.
use std::alloc::{GlobalAlloc, Layout, System};
use std::io::Cursor;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use serde_json::{json, Value};
use zygote_proto::client::{read_response, AgentClient, ClientError, Liveness};
use zygote_proto::MAX_FRAME_LEN;

/// Records the largest single allocation, so a test can bound what decoding costs.
struct Largest;

static LARGEST: AtomicUsize = AtomicUsize::new(0);

unsafe impl GlobalAlloc for Largest {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        LARGEST.fetch_max(layout.size(), Ordering::Relaxed);
        unsafe { System.alloc(layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        LARGEST.fetch_max(layout.size(), Ordering::Relaxed);
        unsafe { System.alloc_zeroed(layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        LARGEST.fetch_max(new_size, Ordering::Relaxed);
        unsafe { System.realloc(ptr, layout, new_size) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static ALLOC: Largest = Largest;

/// xorshift64*: small, deterministic, good enough to pick cases.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
    /// Up to `max` random bytes.
    fn bytes(&mut self, max: usize) -> Vec<u8> {
        let n = self.below(max + 1);
        (0..n).map(|_| self.next() as u8).collect()
    }
}

/// Responses as an agent sends them, one of each shape the client decodes.
fn samples(id: u64) -> Vec<Value> {
    vec![
        json!({"id": id, "type": "ok"}),
        json!({"id": id, "type": "health", "agent_version": "0.1", "protocol_version": 1,
               "pid1": true, "hostname": "h", "uptime_ms": 5, "dry_run": false}),
        json!({"id": id, "type": "exec_started", "pid": 42}),
        json!({"id": id, "type": "output", "stream": "stdout", "data": "aGVsbG8K"}),
        json!({"id": id, "type": "exit", "exit_code": 0, "timed_out": false, "duration_ms": 3}),
        json!({"id": id, "type": "file_data", "offset": 0, "data": "AAEC", "size": 3,
               "eof": true}),
        json!({"id": id, "type": "error", "code": "not_found", "message": "nope", "errno": 2}),
        json!({"id": 0, "type": "error", "code": "frame_too_large", "message": "x"}),
        json!({"id": id, "type": "processes", "processes": [{"pid": 1, "argv": ["a"],
               "state": "running", "started_unix_ms": 1, "output_bytes": 0,
               "stdin_open": true}]}),
        json!({"id": id, "type": "dir_listing", "entries": [{"name": "a", "kind": "file",
               "size": 1, "mode": 420, "uid": 0, "gid": 0, "mtime": 0}]}),
        json!({"id": id, "type": "spawned", "pid": 7, "argv": [], "state": "exited",
               "exit": {"exit_code": 1, "timed_out": false, "duration_ms": 1},
               "started_unix_ms": 0, "output_bytes": 9, "stdin_open": false}),
        json!({"id": id, "type": "some_future_type", "x": [1, 2, 3]}),
    ]
}

/// Payloads that are not valid responses in ways a parser has to survive.
fn nasty_payload(rng: &mut Rng) -> Vec<u8> {
    match rng.below(9) {
        0 => {
            let depth = 1 + rng.below(50_000);
            let mut v = "[".repeat(depth).into_bytes();
            v.extend("]".repeat(rng.below(depth + 1)).as_bytes());
            v
        }
        1 => format!(
            r#"{{"id": 1{}, "type": "ok"}}"#,
            "9".repeat(rng.below(5000))
        )
        .into_bytes(),
        2 => br#"{"id": 1, "type": "exec_started", "pid": 1e999999}"#.to_vec(),
        3 => {
            let mut v = br#"{"id": 3, "type": "output", "stream": "stdout", "data": ""#.to_vec();
            v.extend(rng.bytes(4096));
            v.extend(br#""}"#);
            v
        }
        4 => {
            br#"{"id": 3, "type": "output", "stream": "stdout", "data": "!!not base64=="}"#.to_vec()
        }
        5 => br#"{"id": "3", "type": 5}"#.to_vec(),
        6 => rng.bytes(2048),
        7 => format!(
            r#"{{"id": 1, "type": "error", "code": "x", "message": "{}"}}"#,
            "m".repeat(rng.below(1 << 20))
        )
        .into_bytes(),
        _ => br#"{"id": 1, "type": "exit", "exit_code": "zero"}"#.to_vec(),
    }
}

fn mutate(rng: &mut Rng, mut payload: Vec<u8>) -> Vec<u8> {
    for _ in 0..1 + rng.below(4) {
        match rng.below(3) {
            0 if !payload.is_empty() => {
                let i = rng.below(payload.len());
                payload[i] = rng.next() as u8;
            }
            1 => {
                let i = rng.below(payload.len() + 1);
                payload.insert(i, rng.next() as u8);
            }
            _ if !payload.is_empty() => {
                let i = rng.below(payload.len());
                payload.remove(i);
            }
            _ => {}
        }
    }
    payload
}

fn framed(payload: &[u8]) -> Vec<u8> {
    let mut out = (payload.len() as u32).to_be_bytes().to_vec();
    out.extend_from_slice(payload);
    out
}

/// One byte stream of a few frames, and whether it announces a frame longer than the
/// bytes that follow (the lazy-allocation case).
fn stream(rng: &mut Rng) -> (Vec<u8>, bool) {
    let mut out = Vec::new();
    let mut short = false;
    for _ in 0..1 + rng.below(5) {
        let id = rng.next() % 1000;
        let sample = serde_json::to_vec(&samples(id)[rng.below(12)]).unwrap();
        match rng.below(7) {
            0 | 1 => out.extend(framed(&sample)),
            2 => out.extend(framed(&mutate(rng, sample))),
            3 => out.extend(framed(&nasty_payload(rng))),
            4 => {
                // A length that does not match the payload.
                let mut f = framed(&sample);
                let len = (sample.len() as i64 + rng.below(64) as i64 - 32).max(0) as u32;
                f[..4].copy_from_slice(&len.to_be_bytes());
                out.extend(f);
            }
            5 => {
                // Announces up to 4 GiB (or exactly the limit) and stops early.
                let len = match rng.below(3) {
                    0 => MAX_FRAME_LEN as u32,
                    1 => u32::MAX - rng.below(1000) as u32,
                    _ => (MAX_FRAME_LEN / 2 + rng.below(MAX_FRAME_LEN / 2)) as u32,
                };
                out.extend(len.to_be_bytes());
                out.extend(rng.bytes(256));
                short |= len as usize <= MAX_FRAME_LEN;
                return (out, short);
            }
            _ => {
                // Cut inside the header or the payload.
                let f = framed(&sample);
                out.extend(&f[..rng.below(f.len())]);
                return (out, false);
            }
        }
    }
    (out, short)
}

fn check_stream(bytes: &[u8], short: bool, whole_client: bool) -> Result<(), String> {
    LARGEST.store(0, Ordering::Relaxed);
    let mut r = bytes;
    for _ in 0..64 {
        match read_response(&mut r) {
            Ok(Some(_)) => continue,
            Ok(None) => break,
            Err(e) => {
                let shown = e.to_string();
                if shown.len() > 1024 {
                    return Err(format!("error message of {} bytes", shown.len()));
                }
                break;
            }
        }
    }
    let largest = LARGEST.load(Ordering::Relaxed);
    if largest > MAX_FRAME_LEN {
        return Err(format!("allocated {largest} bytes at once"));
    }
    if short && largest > 1 << 20 {
        return Err(format!(
            "a frame cut short after {} bytes cost {largest} bytes",
            bytes.len()
        ));
    }
    if whole_client {
        let client = AgentClient::from_split(
            Box::new(Cursor::new(bytes.to_vec())),
            Box::new(std::io::sink()),
        )
        .with_liveness(Some(Liveness {
            interval: Duration::from_millis(200),
            probe_timeout: Duration::from_millis(200),
            exec_grace: Duration::from_millis(200),
        }))
        .with_request_timeout(Some(Duration::from_secs(5)));
        match client.health() {
            Err(
                ClientError::Closed(_) | ClientError::Malformed(_) | ClientError::Unresponsive(_),
            ) => {}
            other => return Err(format!("whole client: {other:?}")),
        }
    }
    Ok(())
}

#[test]
fn agent_frames_decode_safely() {
    let iters: u64 = std::env::var("ZYGOTE_FUZZ_ITERS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2000);
    let seed: u64 = std::env::var("ZYGOTE_FUZZ_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0x5eed_a9e7_f4a3_e5a1);
    eprintln!("agent_frames: {iters} iterations, seed {seed}");
    let mut rng = Rng(seed | 1);
    for i in 0..iters {
        let (bytes, short) = stream(&mut rng);
        if let Err(e) = check_stream(&bytes, short, i % 16 == 0) {
            panic!(
                "agent_frames: iteration {i} (ZYGOTE_FUZZ_SEED={seed}): {e}; input starts {:?}",
                &bytes[..bytes.len().min(64)]
            );
        }
    }
}
