//! The client against fake agents that misbehave: silent after `hello`, alive but never
//! finishing a request, sending garbage, an oversize frame, the wrong response. Every
//! call must end within its deadline plus the liveness check, with an error that says
//! what happened, and the connection's close cause must tell the health of the agent.
use std::io::Write;
use std::os::unix::net::UnixStream;
use std::thread;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use zygote_proto::client::{AgentClient, ClientError, CloseCause, Liveness};
use zygote_proto::frame::{read_frame, write_frame};
use zygote_proto::{ExecRequest, MAX_FRAME_LEN};

/// Short timings so the test takes seconds.
const FAST: Liveness = Liveness {
    interval: Duration::from_millis(300),
    probe_timeout: Duration::from_millis(300),
    exec_grace: Duration::from_millis(300),
};

/// What the fake agent does with a request (`type`, `id`) after `hello`.
type Behaviour = fn(&mut UnixStream, &str, u64);

/// A fake agent on the other end of a socket pair: answers `hello` with `ok`, hands every
/// later request to `on_request`.
fn fake_agent(on_request: Behaviour) -> AgentClient {
    let (ours, mut theirs) = UnixStream::pair().unwrap();
    thread::spawn(move || {
        let mut reader = theirs.try_clone().unwrap();
        while let Ok(Some(bytes)) = read_frame(&mut reader, MAX_FRAME_LEN) {
            let v: Value = serde_json::from_slice(&bytes).unwrap();
            let id = v["id"].as_u64().unwrap();
            match v["type"].as_str().unwrap() {
                "hello" => reply(&mut theirs, json!({"id": id, "type": "ok"})),
                kind => on_request(&mut theirs, kind, id),
            }
        }
    });
    let client = AgentClient::from_stream(Box::new(ours))
        .unwrap()
        .with_liveness(Some(FAST))
        .with_request_timeout(Some(Duration::from_secs(30)));
    client.hello("token", None).expect("hello");
    client
}

fn reply(s: &mut UnixStream, v: Value) {
    let _ = write_frame(s, &serde_json::to_vec(&v).unwrap());
}

fn silent(_: &mut UnixStream, _: &str, _: u64) {}

fn health(s: &mut UnixStream, id: u64) {
    reply(
        s,
        json!({"id": id, "type": "health", "agent_version": "0", "protocol_version": 1,
               "pid1": false, "hostname": "h", "uptime_ms": 1, "dry_run": true}),
    );
}

fn exec_with_timeout(ms: u64) -> ExecRequest {
    let mut req = ExecRequest::new(["sleep", "100"]);
    req.timeout_ms = Some(ms);
    req
}

/// Time allowed on top of the expected limit: scheduling on a busy machine.
const SLACK: Duration = Duration::from_secs(5);

#[test]
fn a_silent_agent_fails_an_exec_within_its_timeout_plus_grace_and_is_dropped() {
    let client = fake_agent(silent);
    let started = Instant::now();
    let err = client.exec_output(exec_with_timeout(200)).unwrap_err();
    let took = started.elapsed();
    assert!(matches!(err, ClientError::Unresponsive(_)), "{err}");
    let limit = Duration::from_millis(200) + FAST.exec_grace + FAST.probe_timeout;
    assert!(took < limit + SLACK, "took {took:?}");
    assert!(
        took >= Duration::from_millis(200) + FAST.exec_grace,
        "{took:?}"
    );
    assert!(
        matches!(client.close_cause(), Some(CloseCause::Unresponsive(_))),
        "{:?}",
        client.close_cause()
    );
    // Later calls fail at once with the same diagnosis.
    let started = Instant::now();
    assert!(matches!(client.health(), Err(ClientError::Unresponsive(_))));
    assert!(started.elapsed() < Duration::from_secs(1));
}

#[test]
fn an_open_ended_wait_on_a_silent_agent_ends_after_the_liveness_check() {
    let client = fake_agent(silent);
    let started = Instant::now();
    // No timeout_ms: the program may run for days, but a dead agent is noticed.
    let err = client
        .exec_output(ExecRequest::new(["sleep", "100"]))
        .unwrap_err();
    assert!(matches!(err, ClientError::Unresponsive(_)), "{err}");
    assert!(started.elapsed() < FAST.interval + FAST.probe_timeout + SLACK);
}

#[test]
fn an_agent_that_answers_health_keeps_its_connection_when_a_request_is_late() {
    fn only_health(s: &mut UnixStream, kind: &str, id: u64) {
        if kind == "health" {
            health(s, id);
        }
    }
    let client = fake_agent(only_health);
    let err = client.exec_output(exec_with_timeout(100)).unwrap_err();
    assert!(matches!(err, ClientError::Timeout { .. }), "{err}");
    assert!(!client.is_closed());
    client.health().expect("still usable");
}

#[test]
fn an_open_ended_wait_goes_on_while_the_agent_answers_health() {
    fn health_then_exit_late(s: &mut UnixStream, kind: &str, id: u64) {
        match kind {
            "health" => health(s, id),
            "exec" => {
                reply(s, json!({"id": id, "type": "exec_started", "pid": 42}));
                let mut s = s.try_clone().unwrap();
                thread::spawn(move || {
                    // Longer than several liveness intervals.
                    thread::sleep(Duration::from_millis(1500));
                    reply(
                        &mut s,
                        json!({"id": id, "type": "exit", "exit_code": 0, "timed_out": false,
                               "duration_ms": 1500}),
                    );
                });
            }
            _ => {}
        }
    }
    let client = fake_agent(health_then_exit_late);
    let out = client
        .exec_output(ExecRequest::new(["sleep", "1.5"]))
        .expect("the slow exec completes");
    assert_eq!(out.result.exit_code, Some(0));
}

#[test]
fn garbage_from_the_agent_is_a_malformed_reply_and_ends_the_connection() {
    fn garbage(s: &mut UnixStream, _: &str, _: u64) {
        let _ = write_frame(s, b"\xff\xfe this is not JSON");
    }
    let client = fake_agent(garbage);
    let err = client.health().unwrap_err();
    assert!(matches!(err, ClientError::Malformed(_)), "{err}");
    assert!(
        matches!(client.close_cause(), Some(CloseCause::Malformed(_))),
        "{:?}",
        client.close_cause()
    );
}

#[test]
fn an_oversize_frame_is_refused_before_it_is_read() {
    fn oversize(s: &mut UnixStream, _: &str, _: u64) {
        let _ = s.write_all(&u32::MAX.to_be_bytes());
    }
    let client = fake_agent(oversize);
    let err = client.health().unwrap_err();
    assert!(matches!(err, ClientError::Malformed(_)), "{err}");
    assert!(err.to_string().contains("exceeds"), "{err}");
}

#[test]
fn the_wrong_response_type_is_malformed_and_bounded() {
    fn wrong(s: &mut UnixStream, _: &str, id: u64) {
        let big = "x".repeat(1 << 20);
        reply(
            s,
            json!({"id": id, "type": "written", "size": 1, "junk": big}),
        );
    }
    let client = fake_agent(wrong);
    let err = client.health().unwrap_err();
    assert!(matches!(err, ClientError::Malformed(_)), "{err}");
    assert!(err.to_string().len() < 400, "{}", err.to_string().len());
}

#[test]
fn the_agent_dropping_a_bad_stream_fails_waiters_at_once() {
    fn too_large(s: &mut UnixStream, _: &str, _: u64) {
        reply(
            s,
            json!({"id": 0, "type": "error", "code": "frame_too_large", "message": "x"}),
        );
    }
    let client = fake_agent(too_large);
    let started = Instant::now();
    let err = client.exec_output(ExecRequest::new(["true"])).unwrap_err();
    assert!(matches!(err, ClientError::Closed(_)), "{err}");
    assert!(started.elapsed() < Duration::from_secs(2));
}
