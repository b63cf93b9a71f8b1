//! Client transports and helpers: TCP, hybrid-vsock handshake, wait_healthy,
//! and the agent library served in-process.

mod common;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpListener;
use std::os::unix::net::{UnixListener, UnixStream};
use std::process::{Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use common::*;
use zygote_agent::{Agent, AgentOptions};
use zygote_proto::client::{wait_healthy, AgentClient, ClientError};
use zygote_proto::ExecRequest;

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

#[test]
fn tcp_listener_reports_its_port_and_serves() {
    let agent = TestAgent::start(&["--tcp", "127.0.0.1:0"]);
    // "... on unix /x/agent.sock, tcp 127.0.0.1:PORT"
    let addr = agent
        .ready_line
        .split("tcp ")
        .nth(1)
        .and_then(|s| s.split([',', ' ']).next())
        .expect("tcp address in ready line")
        .to_string();
    let client = AgentClient::connect_tcp(&addr, Duration::from_secs(5)).unwrap();
    let out = client.exec_output(ExecRequest::shell("echo tcp")).unwrap();
    assert_eq!(out.stdout, b"tcp\n");
}

#[test]
fn vsock_listener_comes_up_when_the_host_has_vsock() {
    let probe = unsafe { libc::socket(libc::AF_VSOCK, libc::SOCK_STREAM, 0) };
    if probe < 0 {
        eprintln!("SKIP: AF_VSOCK sockets unavailable on this host");
        return;
    }
    unsafe { libc::close(probe) };
    // There is no vsock loopback transport here, so only binding is checked;
    // connections over vsock are exercised by the VM tests.
    let port = 20000 + (std::process::id() % 20000);
    let agent = TestAgent::start(&["--vsock", &port.to_string()]);
    assert!(
        agent.ready_line.contains(&format!("vsock port {port}")),
        "{}",
        agent.ready_line
    );
}

/// A stand-in for a VMM's hybrid-vsock socket: expects `CONNECT <port>\n`,
/// answers `reply`, then splices bytes to the agent's Unix socket.
fn fake_vsock_mux(
    dir: &std::path::Path,
    agent_socket: std::path::PathBuf,
    reply: &'static str,
) -> std::path::PathBuf {
    let path = dir.join("vsock.sock");
    let listener = UnixListener::bind(&path).unwrap();
    thread::spawn(move || {
        let (guest_side, _) = listener.accept().unwrap();
        let mut reader = BufReader::new(guest_side.try_clone().unwrap());
        let mut line = String::new();
        reader.read_line(&mut line).unwrap();
        assert_eq!(line, "CONNECT 1024\n");
        (&guest_side).write_all(reply.as_bytes()).unwrap();
        if !reply.starts_with("OK") {
            return;
        }
        let agent = UnixStream::connect(agent_socket).unwrap();
        let (mut a_in, mut a_out) = (agent.try_clone().unwrap(), agent);
        let mut g_out = guest_side;
        thread::spawn(move || {
            let _ = std::io::copy(&mut reader, &mut a_in);
        });
        let _ = std::io::copy(&mut a_out, &mut g_out);
    });
    path
}

#[test]
fn hybrid_vsock_handshake() {
    let agent = TestAgent::start(&[]);
    let mux = fake_vsock_mux(agent.dir.path(), agent.socket.clone(), "OK 1073741824\n");
    let client = AgentClient::connect_vsock_uds(&mux, 1024).unwrap();
    assert!(client.health().is_ok());
    let out = client
        .exec_output(ExecRequest::shell("echo via-vsock"))
        .unwrap();
    assert_eq!(out.stdout, b"via-vsock\n");

    let dir = tempfile::tempdir().unwrap();
    let refused = fake_vsock_mux(dir.path(), agent.socket.clone(), "NOPE\n");
    match AgentClient::connect_vsock_uds(&refused, 1024) {
        Err(ClientError::Handshake(msg)) => assert!(msg.contains("NOPE"), "{msg}"),
        Err(e) => panic!("wrong error {e}"),
        Ok(_) => panic!("handshake should fail"),
    }
}

#[test]
fn wait_healthy_rides_out_a_slow_boot() {
    let port = free_port();
    let addr = format!("127.0.0.1:{port}");
    // Something that accepts and immediately hangs up, like QEMU's hostfwd
    // before the guest listens.
    let decoy = TcpListener::bind(&addr).unwrap();
    let start = Instant::now();
    let agent_addr = addr.clone();
    let starter = thread::spawn(move || {
        for _ in 0..3 {
            let (mut s, _) = decoy.accept().unwrap();
            let mut buf = [0u8; 16];
            let _ = s.read(&mut buf);
        }
        drop(decoy);
        thread::sleep(Duration::from_millis(300));
        let mut child = Command::new(env!("CARGO_BIN_EXE_zygote-agent"))
            .args(["--tcp", &agent_addr, "--no-system-changes"])
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        thread::sleep(Duration::from_secs(3));
        let _ = child.kill();
        let _ = child.wait();
    });
    let client = wait_healthy(&addr, Instant::now() + Duration::from_secs(15)).unwrap();
    assert!(client.health().unwrap().dry_run);
    assert!(start.elapsed() >= Duration::from_millis(300));
    starter.join().unwrap();

    // Nothing listening: gives up at the deadline with the last error.
    let dead = format!("127.0.0.1:{}", free_port());
    let start = Instant::now();
    assert!(wait_healthy(&dead, Instant::now() + Duration::from_millis(700)).is_err());
    let took = start.elapsed();
    assert!(
        took >= Duration::from_millis(500) && took < Duration::from_secs(3),
        "{took:?}"
    );
}

#[test]
fn in_process_agent_over_a_socketpair() {
    let agent = Agent::new(AgentOptions::embedded()).unwrap();
    let (ours, theirs) = UnixStream::pair().unwrap();
    agent.serve_connection(theirs.into(), "pair".into());
    let client = AgentClient::from_stream(Box::new(ours)).unwrap();
    let h = client.health().unwrap();
    assert!(h.dry_run && !h.pid1);
    let out = client
        .exec_output(ExecRequest::shell("echo in-process; exit 4"))
        .unwrap();
    assert_eq!(
        (out.stdout.as_slice(), out.result.exit_code),
        (&b"in-process\n"[..], Some(4))
    );
    // Embedded agents never reap children they did not start: a child of
    // this test process keeps its exit status for us.
    let mut mine = Command::new("sh").args(["-c", "exit 7"]).spawn().unwrap();
    thread::sleep(Duration::from_millis(200));
    client.exec_output(ExecRequest::new(["true"])).unwrap();
    assert_eq!(mine.wait().unwrap().code(), Some(7));
    client.close();
    assert!(client.is_closed());
    assert!(matches!(client.health(), Err(ClientError::Closed(_))));
}
