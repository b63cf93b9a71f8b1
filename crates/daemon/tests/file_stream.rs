//! Issue 19, defect 2 (the rest of it): guest files are streamed, not buffered. A regular
//! file larger than the old 64 MiB cap reads whole and intact, and a client that walks
//! away in the middle of a read leaves the sandbox and the daemon serving at once.
mod common;

use std::io::{Read, Write};
use std::time::{Duration, Instant};

use hyper::Method;
use serde_json::json;
use sha2::{Digest, Sha256};

use common::{create, sh, start_daemon, step, Scratch};

const FILE_MIB: u64 = 80;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_large_guest_file_streams_and_an_abandoned_read_ends() {
    let t0 = Instant::now();
    common::guest_assets();
    let scratch = Scratch::new();
    let d = start_daemon(
        &scratch.state,
        &["--listen", "127.0.0.1:0", "--runtime", "qemu"],
    );
    let c = d.client();
    let body = json!({"image": "minimal", "name": "files", "mem_mib": 256});
    let id = create(&c, body, &scratch.cleanup).await[0].id.clone();
    let made_file = format!(
        "head -c {} /dev/urandom > /root/big && sha256sum /root/big",
        FILE_MIB << 20
    );
    let guest_sum = sh(&c, &id, &made_file).await.expect("make the file");
    let guest_sum = guest_sum.split_whitespace().next().unwrap().to_string();
    step(t0, &format!("{FILE_MIB} MiB file in {id}"));

    let body = c
        .raw(
            Method::GET,
            &format!("/v1/sandboxes/{id}/files?path=/root/big"),
            None,
        )
        .await
        .expect("a file over the old 64 MiB cap reads");
    assert_eq!(body.len() as u64, FILE_MIB << 20);
    assert_eq!(hex::encode(Sha256::digest(&body)), guest_sum);
    step(t0, "read whole and intact");

    // A client that takes the headers and a little of the body, then hangs up.
    let addr = d.url.trim_start_matches("http://").to_string();
    let token = d.token();
    let read_id = id.clone();
    tokio::task::spawn_blocking(move || {
        let mut s = std::net::TcpStream::connect(&addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
        write!(
            s,
            "GET /v1/sandboxes/{read_id}/files?path=/root/big HTTP/1.1\r\nHost: x\r\n\
             Authorization: Bearer {token}\r\n\r\n"
        )
        .unwrap();
        let mut got = vec![0u8; 256 << 10];
        let n = s.read(&mut got).unwrap();
        assert!(
            n > 0 && got.starts_with(b"HTTP/1.1 200"),
            "{:?}",
            &got[..n.min(200)]
        );
    })
    .await
    .unwrap();
    // The sandbox answers at once (the abandoned read holds nothing up).
    let asked = Instant::now();
    assert_eq!(sh(&c, &id, "echo ok").await.unwrap(), "ok\n");
    let small = c
        .raw(
            Method::GET,
            &format!("/v1/sandboxes/{}/files?path=/etc/hostname", id),
            None,
        )
        .await
        .expect("a read after the abandoned one");
    assert!(!small.is_empty());
    step(
        t0,
        &format!(
            "abandoned read left the sandbox serving ({:.0} ms)",
            asked.elapsed().as_secs_f64() * 1e3
        ),
    );
    c.raw(Method::DELETE, &format!("/v1/sandboxes/{}", id), None)
        .await
        .unwrap();
}
