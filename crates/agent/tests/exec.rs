//! exec over a real agent process: streaming, exit codes, signals, timeouts,
//! stdin, concurrency, kill.

mod common;

use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use common::*;
use zygote_proto::{ErrorCode, ExecRequest, Stream};

#[test]
fn output_is_streamed_before_the_program_ends() {
    let agent = TestAgent::start(&[]);
    let client = agent.client();
    let start = Instant::now();
    let mut chunks: Vec<(Duration, Vec<u8>)> = Vec::new();
    let result = client
        .exec(
            ExecRequest::shell("echo a; sleep 1; echo b"),
            |stream, data| {
                assert_eq!(stream, Stream::Stdout);
                chunks.push((start.elapsed(), data.to_vec()));
            },
        )
        .unwrap();
    let total = start.elapsed();
    assert!(result.success(), "{result:?}");
    assert!(total >= Duration::from_millis(1000), "{total:?}");
    let (first_at, first) = &chunks[0];
    assert_eq!(first, b"a\n");
    // The first line must arrive long before the program finishes.
    assert!(
        *first_at + Duration::from_millis(600) < total,
        "first chunk at {first_at:?}, exit at {total:?}"
    );
    let all: Vec<u8> = chunks.iter().flat_map(|c| c.1.clone()).collect();
    assert_eq!(all, b"a\nb\n");
}

#[test]
fn exit_codes_signals_and_stderr() {
    let agent = TestAgent::start(&[]);
    let client = agent.client();

    let out = client.exec_output(ExecRequest::new(["true"])).unwrap();
    assert_eq!(out.result.exit_code, Some(0));
    assert_eq!(out.result.signal, None);

    let out = client
        .exec_output(ExecRequest::shell("echo out; echo err >&2; exit 3"))
        .unwrap();
    assert_eq!(out.result.exit_code, Some(3));
    assert!(!out.result.timed_out);
    assert_eq!(out.stdout, b"out\n");
    assert_eq!(out.stderr, b"err\n");

    let out = client
        .exec_output(ExecRequest::shell("kill -TERM $$; sleep 5"))
        .unwrap();
    assert_eq!(out.result.exit_code, None);
    assert_eq!(out.result.signal, Some(libc::SIGTERM));
    assert!(!out.result.success());
}

#[test]
fn env_cwd_and_clear_env() {
    let agent = TestAgent::start(&[]);
    let client = agent.client();
    let mut req = ExecRequest::shell("echo \"$ZYGOTE_X:$(pwd)\"");
    req.env.insert("ZYGOTE_X".into(), "hello".into());
    req.cwd = Some(agent.dir.path().to_str().unwrap().into());
    let out = client.exec_output(req).unwrap();
    let expected = format!(
        "hello:{}\n",
        agent.dir.path().canonicalize().unwrap().display()
    );
    assert_eq!(String::from_utf8(out.stdout).unwrap(), expected);

    let mut req = ExecRequest::new(["/usr/bin/env"]);
    req.clear_env = true;
    req.env.insert("ONLY".into(), "1".into());
    let out = client.exec_output(req).unwrap();
    assert_eq!(out.stdout, b"ONLY=1\n");
}

#[test]
fn timeout_kills_the_whole_process_group() {
    let agent = TestAgent::start(&[]);
    let client = agent.client();
    let mut req = ExecRequest::shell("sleep 30 & echo $!; wait");
    req.timeout_ms = Some(500);
    let start = Instant::now();
    let out = client.exec_output(req).unwrap();
    let took = start.elapsed();
    assert!(out.result.timed_out, "{:?}", out.result);
    assert_eq!(out.result.signal, Some(libc::SIGKILL));
    assert!(took >= Duration::from_millis(500), "{took:?}");
    assert!(took < Duration::from_secs(5), "{took:?}");
    let bg: u32 = String::from_utf8(out.stdout)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    assert!(
        eventually(Duration::from_secs(3), || is_dead(bg)),
        "background sleep {bg} survived the timeout"
    );
}

#[test]
fn stdin_is_delivered_then_closed() {
    let agent = TestAgent::start(&[]);
    let client = agent.client();
    // More than a pipe buffer, so the agent has to interleave writing stdin
    // with reading stdout.
    let data: Vec<u8> = (0..3_000_000u32).map(|i| (i * 31 % 251) as u8).collect();
    let mut req = ExecRequest::new(["cat"]);
    req.stdin = Some(data.clone());
    let out = client.exec_output(req).unwrap();
    assert!(out.result.success());
    assert_eq!(out.stdout.len(), data.len());
    assert!(out.stdout == data);

    // No stdin: /dev/null, so `cat` ends at once instead of hanging.
    let out = client.exec_output(ExecRequest::new(["cat"])).unwrap();
    assert!(out.result.success() && out.stdout.is_empty());

    // A program that ignores its stdin must not wedge the exec.
    let mut req = ExecRequest::new(["true"]);
    req.stdin = Some(vec![b'x'; 1_000_000]);
    assert!(client.exec_output(req).unwrap().result.success());
}

#[test]
fn large_output_arrives_complete() {
    let agent = TestAgent::start(&[]);
    let client = agent.client();
    let mut chunks = 0;
    let mut total = 0;
    let result = client
        .exec(ExecRequest::shell("head -c 5000000 /dev/zero"), |_, d| {
            chunks += 1;
            total += d.len();
        })
        .unwrap();
    assert!(result.success());
    assert_eq!(total, 5_000_000);
    assert!(chunks > 1, "output should be streamed in chunks");
}

#[test]
fn background_process_holding_the_pipe_does_not_block_exit() {
    let agent = TestAgent::start(&[]);
    let client = agent.client();
    let start = Instant::now();
    let out = client
        .exec_output(ExecRequest::shell("sleep 5 & echo done"))
        .unwrap();
    assert!(out.result.success());
    assert_eq!(out.stdout, b"done\n");
    assert!(
        start.elapsed() < Duration::from_secs(3),
        "{:?}",
        start.elapsed()
    );
}

#[test]
fn two_execs_run_concurrently_on_one_connection() {
    let agent = TestAgent::start(&[]);
    let client = agent.client();
    let start = Instant::now();
    let outputs = Arc::new(Mutex::new(Vec::new()));
    let threads: Vec<_> = ["one", "two"]
        .into_iter()
        .map(|tag| {
            let client = client.clone();
            let outputs = outputs.clone();
            thread::spawn(move || {
                let out = client
                    .exec_output(ExecRequest::shell(format!("sleep 1; echo {tag}")))
                    .unwrap();
                outputs.lock().unwrap().push(out.stdout);
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    let took = start.elapsed();
    assert!(
        took < Duration::from_millis(1800),
        "execs ran serially: {took:?}"
    );
    let mut got = outputs.lock().unwrap().clone();
    got.sort();
    assert_eq!(got, vec![b"one\n".to_vec(), b"two\n".to_vec()]);
}

#[test]
fn kill_request_signals_the_exec() {
    let agent = TestAgent::start(&[]);
    let client = agent.client();
    let handle = client
        .spawn_exec(ExecRequest::new(["sleep", "30"]))
        .unwrap();
    assert!(handle.pid() > 0);
    let killer = client.clone();
    let id = handle.id();
    thread::spawn(move || {
        thread::sleep(Duration::from_millis(200));
        killer.kill(id, libc::SIGTERM).unwrap();
    });
    let result = handle.wait(|_, _| {}).unwrap();
    assert_eq!(result.signal, Some(libc::SIGTERM));

    let err = client.kill(9999, 9).unwrap_err();
    assert_eq!(err.code(), Some(ErrorCode::NotFound));
    let err = client.kill(id, 0).unwrap_err();
    assert_eq!(err.code(), Some(ErrorCode::BadRequest));
}

#[test]
fn dropping_an_unfinished_exec_handle_kills_it() {
    let agent = TestAgent::start(&[]);
    let client = agent.client();
    let handle = client
        .spawn_exec(ExecRequest::new(["sleep", "30"]))
        .unwrap();
    let pid = handle.pid();
    assert!(!is_dead(pid));
    drop(handle);
    assert!(eventually(Duration::from_secs(3), || is_dead(pid)));
    assert!(client.health().is_ok());
}

#[test]
fn spawn_failures_are_errors() {
    let agent = TestAgent::start(&[]);
    let client = agent.client();
    let err = client
        .exec_output(ExecRequest::new(["/definitely/not/here"]))
        .unwrap_err();
    assert_eq!(err.code(), Some(ErrorCode::SpawnFailed), "{err}");
    let err = client.exec_output(ExecRequest::default()).unwrap_err();
    assert_eq!(err.code(), Some(ErrorCode::BadRequest), "{err}");
    let mut req = ExecRequest::new(["true"]);
    req.cwd = Some("/no/such/dir".into());
    let err = client.exec_output(req).unwrap_err();
    assert_eq!(err.code(), Some(ErrorCode::SpawnFailed), "{err}");
    let mut req = ExecRequest::new(["true"]);
    req.env.insert("A=B".into(), "x".into());
    let err = client.exec_output(req).unwrap_err();
    assert_eq!(err.code(), Some(ErrorCode::BadRequest), "{err}");
    // The connection is fine afterwards.
    assert!(client
        .exec_output(ExecRequest::new(["true"]))
        .unwrap()
        .result
        .success());
}

#[test]
fn children_start_with_a_clean_signal_mask() {
    // In --subreaper mode the agent blocks SIGCHLD in all its threads; a
    // child must not inherit that.
    let agent = TestAgent::start(&["--subreaper"]);
    let out = agent
        .client()
        .exec_output(ExecRequest::shell(
            "grep -E '^Sig(Blk|Ign)' /proc/self/status",
        ))
        .unwrap();
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(text.contains("SigBlk:\t0000000000000000"), "{text}");
    // SIGPIPE (bit 13) must be at its default, not ignored as in Rust programs.
    let ign = text
        .lines()
        .find_map(|l| l.strip_prefix("SigIgn:\t"))
        .map(|h| u64::from_str_radix(h.trim(), 16).unwrap())
        .unwrap();
    assert_eq!(ign & (1 << (libc::SIGPIPE - 1)), 0, "{text}");
}

#[test]
fn subreaper_mode_reaps_orphans_and_keeps_exit_codes() {
    let mut agent = TestAgent::start(&["--subreaper"]);
    let client = agent.client();
    // Orphans: the shell exits while its background children still run; they
    // are re-parented to the agent, which must reap them when they die.
    let out = client
        .exec_output(ExecRequest::shell(
            "for i in 1 2 3; do sleep 0.2 & done; echo ok",
        ))
        .unwrap();
    assert!(out.result.success());
    // Many quick execs at once: the reaper must hand each status to the right exec.
    let threads: Vec<_> = (0..16)
        .map(|i| {
            let client = client.clone();
            thread::spawn(move || {
                let r = client
                    .exec_output(ExecRequest::shell(format!("exit {i}")))
                    .unwrap();
                assert_eq!(r.result.exit_code, Some(i), "{:?}", r.result);
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    thread::sleep(Duration::from_millis(600));
    let pid = agent.pid();
    assert!(
        eventually(Duration::from_secs(3), || zombie_children(pid).is_empty()),
        "zombies left: {:?}",
        zombie_children(pid)
    );
    agent.assert_alive();
}
