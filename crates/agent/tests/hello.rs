//! `hello`: the per-sandbox token and sessions (issue 19, defect 1's second half). An
//! agent that was never given a token serves anyone who reaches its channel (that
//! channel is private to the daemon); once the daemon's bring-up set one, every
//! connection must present it, a rotation retires the old token, and a new session on
//! a connection ends the previous session's execs.
mod common;

use std::time::{Duration, Instant};

use common::*;
use zygote_proto::client::ClientError;
use zygote_proto::{ErrorCode, ExecRequest};

fn code(e: ClientError) -> Option<ErrorCode> {
    e.code()
}

#[test]
fn connections_must_present_the_token_once_one_is_set() {
    let mut agent = TestAgent::start(&[]);
    // No token yet: served (agent tests, a guest the daemon has not reached yet).
    agent.client().health().expect("served before any hello");

    let daemon = agent.client();
    daemon
        .hello("parent-token", None)
        .expect("first token taken");
    daemon.health().expect("authenticated");

    let stranger = agent.client();
    let e = stranger.health().expect_err("no hello");
    assert_eq!(code(e), Some(ErrorCode::Unauthorized));
    let e = stranger.hello("guess", None).expect_err("wrong token");
    assert_eq!(code(e), Some(ErrorCode::Unauthorized));
    let e = stranger
        .exec_output(ExecRequest::shell("echo pwned"))
        .expect_err("still not authenticated");
    assert_eq!(code(e), Some(ErrorCode::Unauthorized));

    // A branch child gets its own token; the parent's no longer opens it.
    let child = agent.client();
    child
        .hello("parent-token", Some("child-token"))
        .expect("rotated");
    let e = agent
        .client()
        .hello("parent-token", None)
        .expect_err("the old token is retired");
    assert_eq!(code(e), Some(ErrorCode::Unauthorized));
    let again = agent.client();
    again.hello("child-token", None).expect("the new token");
    let out = again
        .exec_output(ExecRequest::shell("echo ok"))
        .expect("exec after hello");
    assert_eq!(out.stdout, b"ok\n");
    agent.assert_alive();
}

#[test]
fn a_new_session_ends_the_previous_sessions_execs() {
    let agent = TestAgent::start(&[]);
    let c = agent.client();
    c.hello("t", None).unwrap();
    let pidfile = agent.path("sleeper.pid");
    let handle = c
        .spawn_exec(ExecRequest::shell(format!(
            "echo $$ > {pidfile}; exec sleep 300"
        )))
        .expect("exec started");
    let deadline = Instant::now() + Duration::from_secs(10);
    let pid = loop {
        if let Some(pid) = std::fs::read_to_string(&pidfile)
            .ok()
            .and_then(|s| s.trim().parse::<i32>().ok())
        {
            break pid;
        }
        assert!(Instant::now() < deadline, "the exec never wrote its pid");
        std::thread::sleep(Duration::from_millis(20));
    };
    // SAFETY: kill with signal 0 only checks existence.
    let alive = |pid: i32| unsafe { libc::kill(pid, 0) } == 0 && !is_zombie(pid);
    assert!(alive(pid));

    // Same connection, new session: what a virtio-serial port sees when the daemon
    // reconnects. The old exec is killed and its exit is not delivered.
    c.hello("t", None).unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while alive(pid) {
        assert!(
            Instant::now() < deadline,
            "the old session's exec still runs"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(handle.wait(|_, _| {}).map(|r| r.exit_code));
    });
    let waited = rx.recv_timeout(Duration::from_millis(700));
    assert!(
        waited.is_err(),
        "the old session's exit must be dropped, not delivered: {waited:?}"
    );
    // The new session works, and may reuse the old one's ids.
    let out = c.exec_output(ExecRequest::shell("echo fresh")).unwrap();
    assert_eq!(out.stdout, b"fresh\n");
}

fn is_zombie(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map(|s| {
            s.rsplit_once(')')
                .is_some_and(|(_, r)| r.trim_start().starts_with('Z'))
        })
        .unwrap_or(true)
}

#[test]
fn hello_and_reidentify_go_in_one_round_trip() {
    let agent = TestAgent::start(&[]);
    let req = zygote_proto::ReidentifyRequest {
        hostname: Some("child-1".into()),
        ..Default::default()
    };
    // A branch child: shown its parent's token, moved to its own, reidentified.
    agent.client().hello("parent", None).unwrap();
    agent
        .client()
        .hello_and_reidentify("parent", Some("child"), req.clone())
        .expect("authenticated, then reidentified");
    agent
        .client()
        .hello("child", None)
        .expect("the child's token");
    // With a wrong token neither goes through: the hello's refusal is what is reported.
    let e = agent
        .client()
        .hello_and_reidentify("parent", None, req)
        .expect_err("the parent's token is retired");
    assert_eq!(code(e), Some(ErrorCode::Unauthorized));
}
