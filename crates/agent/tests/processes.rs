//! Background processes over a real agent process: they outlive the connection that
//! started them, their output can be read from any offset by anyone, stdin stays
//! open, signals reach the process group, and bad requests are refused.

mod common;

use std::time::{Duration, Instant};

use common::*;
use zygote_proto::client::{AgentClient, ClientError};
use zygote_proto::process::{
    ProcessInfo, ProcessOutputRequest, ProcessState, ProcessStdinRequest, MAX_OUTPUT_WAIT_MS,
};
use zygote_proto::{ErrorCode, ExecRequest, Stream};

fn code(e: ClientError) -> Option<ErrorCode> {
    e.code()
}

/// Everything `pid` prints from `offset` until it ends: (stdout, stderr, the process).
fn follow(client: &AgentClient, pid: u32, mut offset: u64) -> (String, String, ProcessInfo) {
    let (mut out, mut err) = (Vec::new(), Vec::new());
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        assert!(Instant::now() < deadline, "process {pid} did not end");
        let got = client
            .process_output(ProcessOutputRequest {
                pid,
                offset,
                wait_ms: 2000,
            })
            .unwrap();
        assert_eq!(got.offset, offset, "no output was dropped");
        for c in &got.chunks {
            match c.stream {
                Stream::Stdout => out.extend_from_slice(&c.data),
                Stream::Stderr => err.extend_from_slice(&c.data),
            }
        }
        offset = got.next_offset;
        if got.process.state == ProcessState::Exited && offset == got.process.output_bytes {
            let text = |b: Vec<u8>| String::from_utf8(b).unwrap();
            return (text(out), text(err), got.process);
        }
    }
}

#[test]
fn a_background_process_outlives_its_connection_and_keeps_its_output() {
    let agent = TestAgent::start(&[]);
    let first = agent.client();
    let info = first
        .spawn_process(ExecRequest::shell(
            "echo started; echo warn >&2; sleep 1; echo done; exit 7",
        ))
        .unwrap();
    assert_eq!(info.state, ProcessState::Running);
    assert_eq!(info.argv[0], "sh");
    assert!(info.stdin_open);
    first.close();
    drop(first);

    // Another connection finds it, and reads everything from the start.
    let second = agent.client();
    let listed = second.processes().unwrap();
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].pid, info.pid);
    let (out, err, ended) = follow(&second, info.pid, 0);
    assert_eq!(out, "started\ndone\n");
    assert_eq!(err, "warn\n");
    let exit = ended.exit.expect("an exited process says how");
    assert_eq!(exit.exit_code, Some(7));
    assert!(!ended.stdin_open);
    // Reading again from an offset gives the tail only.
    let (out, _, _) = follow(&second, info.pid, 8);
    assert_eq!(out, "done\n");
}

#[test]
fn output_waits_for_new_bytes_up_to_wait_ms() {
    let agent = TestAgent::start(&[]);
    let client = agent.client();
    let info = client
        .spawn_process(ExecRequest::shell("sleep 0.5; echo late; sleep 30"))
        .unwrap();
    let t = Instant::now();
    let got = client
        .process_output(ProcessOutputRequest {
            pid: info.pid,
            offset: 0,
            wait_ms: 10_000,
        })
        .unwrap();
    assert!(
        t.elapsed() >= Duration::from_millis(300),
        "{:?}",
        t.elapsed()
    );
    assert!(t.elapsed() < Duration::from_secs(8), "{:?}", t.elapsed());
    assert_eq!(got.chunks[0].data, b"late\n");
    // Nothing new: the wait ends at wait_ms with no chunks.
    let t = Instant::now();
    let got = client
        .process_output(ProcessOutputRequest {
            pid: info.pid,
            offset: got.next_offset,
            wait_ms: 300,
        })
        .unwrap();
    assert!(got.chunks.is_empty());
    assert!(
        t.elapsed() >= Duration::from_millis(250),
        "{:?}",
        t.elapsed()
    );
    assert_eq!(got.process.state, ProcessState::Running);
    client.process_signal(info.pid, 9).unwrap();
    let (_, _, ended) = follow(&client, info.pid, got.next_offset);
    assert_eq!(ended.exit.unwrap().signal, Some(9));
}

#[test]
fn stdin_stays_open_until_eof() {
    let agent = TestAgent::start(&[]);
    let client = agent.client();
    let mut req = ExecRequest::shell("while read l; do echo \"got $l\"; done; echo bye");
    req.stdin = Some(b"one\n".to_vec());
    let info = client.spawn_process(req).unwrap();
    let send = |data: &[u8], eof: bool| {
        client.process_stdin(ProcessStdinRequest {
            pid: info.pid,
            data: data.to_vec(),
            eof,
        })
    };
    send(b"two\n", false).unwrap();
    send(b"three\n", true).unwrap();
    let (out, _, ended) = follow(&client, info.pid, 0);
    assert_eq!(out, "got one\ngot two\ngot three\nbye\n");
    assert_eq!(ended.exit.unwrap().exit_code, Some(0));
    // Its stdin is gone with it.
    assert_eq!(
        code(send(b"x", false).unwrap_err()),
        Some(ErrorCode::ProcessExited)
    );
}

/// The initial stdin of a spawn is written from a thread of its own; stdin sent right
/// after the answer must still come after it (this raced once: "got hello" before
/// "got first"). Repeated, with an initial part larger than a pipe holds.
#[test]
fn initial_stdin_comes_before_stdin_sent_after_the_spawn() {
    let agent = TestAgent::start(&[]);
    let client = agent.client();
    for round in 0..20 {
        let big = round % 4 == 3;
        let initial = if big {
            let mut v = vec![b'x'; 256 * 1024];
            v.push(b'\n');
            v
        } else {
            b"first\n".to_vec()
        };
        let mut req = ExecRequest::shell("cat");
        req.stdin = Some(initial.clone());
        let info = client.spawn_process(req).unwrap();
        client
            .process_stdin(ProcessStdinRequest {
                pid: info.pid,
                data: b"second\n".to_vec(),
                eof: true,
            })
            .unwrap();
        let (out, _, _) = follow(&client, info.pid, 0);
        let mut expected = String::from_utf8(initial).unwrap();
        expected.push_str("second\n");
        assert!(
            out == expected,
            "round {round}: stdin out of order ({} bytes)",
            out.len()
        );
    }
}

#[test]
fn signals_reach_the_whole_group_and_ended_processes_refuse_them() {
    let agent = TestAgent::start(&[]);
    let client = agent.client();
    let info = client
        .spawn_process(ExecRequest::shell(
            "trap 'echo interrupted; exit 130' INT; sleep 30 & wait",
        ))
        .unwrap();
    // Let the shell install its trap.
    assert!(eventually(Duration::from_secs(10), || {
        std::fs::read_to_string(format!("/proc/{}/status", info.pid))
            .map(|s| {
                s.lines()
                    .any(|l| l.starts_with("SigCgt:") && !l.ends_with("0000000000000000"))
            })
            .unwrap_or(false)
    }));
    client.process_signal(info.pid, libc::SIGINT).unwrap();
    let (out, _, ended) = follow(&client, info.pid, 0);
    assert_eq!(out, "interrupted\n");
    assert_eq!(ended.exit.unwrap().exit_code, Some(130));
    assert_eq!(
        code(client.process_signal(info.pid, 9).unwrap_err()),
        Some(ErrorCode::ProcessExited)
    );
}

#[test]
fn bad_requests_are_refused() {
    let agent = TestAgent::start(&[]);
    let client = agent.client();
    let missing = ProcessOutputRequest {
        pid: 999_999,
        offset: 0,
        wait_ms: 0,
    };
    assert_eq!(
        code(client.process_output(missing.clone()).unwrap_err()),
        Some(ErrorCode::NotFound)
    );
    assert_eq!(
        code(client.process_signal(999_999, 9).unwrap_err()),
        Some(ErrorCode::NotFound)
    );
    let info = client
        .spawn_process(ExecRequest::shell("sleep 30"))
        .unwrap();
    assert_eq!(
        code(client.process_signal(info.pid, 0).unwrap_err()),
        Some(ErrorCode::BadRequest)
    );
    assert_eq!(
        code(client.process_signal(info.pid, 65).unwrap_err()),
        Some(ErrorCode::BadRequest)
    );
    let too_long = ProcessOutputRequest {
        pid: info.pid,
        offset: 0,
        wait_ms: MAX_OUTPUT_WAIT_MS + 1,
    };
    assert_eq!(
        code(client.process_output(too_long).unwrap_err()),
        Some(ErrorCode::BadRequest)
    );
    assert_eq!(
        code(
            client
                .spawn_process(ExecRequest::new(["/no/such/program"]))
                .unwrap_err()
        ),
        Some(ErrorCode::SpawnFailed)
    );
    assert_eq!(
        code(
            client
                .spawn_process(ExecRequest::new(Vec::<String>::new()))
                .unwrap_err()
        ),
        Some(ErrorCode::BadRequest)
    );
    client.process_signal(info.pid, 9).unwrap();
}

#[test]
fn a_timeout_kills_a_background_process() {
    let agent = TestAgent::start(&[]);
    let client = agent.client();
    let mut req = ExecRequest::shell("echo up; sleep 30");
    req.timeout_ms = Some(300);
    let info = client.spawn_process(req).unwrap();
    let (out, _, ended) = follow(&client, info.pid, 0);
    assert_eq!(out, "up\n");
    let exit = ended.exit.unwrap();
    assert!(exit.timed_out, "{exit:?}");
    assert_eq!(exit.signal, Some(9));
}
