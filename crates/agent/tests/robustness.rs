//! Bad input never crashes the agent: every malformed, oversize, truncated or
//! unknown frame is answered with an error, and the agent keeps serving.

mod common;

use std::net::Shutdown;
use std::thread;
use std::time::Duration;

use common::*;
use serde_json::json;
use zygote_proto::ExecRequest;

#[test]
fn malformed_frames_get_errors_and_the_connection_survives() {
    let mut agent = TestAgent::start(&[]);
    let mut c = agent.raw();

    c.send_bytes(b"{not json");
    let r = c.recv_some();
    assert_eq!(
        (r["id"].clone(), r["type"].clone()),
        (json!(0), json!("error")),
        "{r}"
    );
    assert_eq!(r["code"], "malformed_frame");
    c.assert_healthy(1);

    c.send_bytes(b"[1,2,3]");
    assert_eq!(c.recv_some()["code"], "malformed_frame");
    c.send_bytes(&[0xff, 0xfe, 0x00]);
    assert_eq!(c.recv_some()["code"], "malformed_frame");
    c.send_bytes(b"");
    assert_eq!(c.recv_some()["code"], "malformed_frame");
    c.send(&json!({"type": "health"}));
    assert_eq!(c.recv_some()["code"], "malformed_frame");
    c.send(&json!({"id": -4, "type": "health"}));
    assert_eq!(c.recv_some()["code"], "malformed_frame");
    c.send(&json!({"id": 5}));
    let r = c.recv_some();
    assert_eq!(
        (r["id"].clone(), r["code"].clone()),
        (json!(5), json!("malformed_frame"))
    );
    c.assert_healthy(2);

    c.send(&json!({"id": 6, "type": "format_disk"}));
    let r = c.recv_some();
    assert_eq!(
        (r["id"].clone(), r["code"].clone()),
        (json!(6), json!("unknown_request"))
    );

    // Known type, bad fields.
    for bad in [
        json!({"id": 7, "type": "exec", "argv": "ls"}),
        json!({"id": 7, "type": "exec"}),
        json!({"id": 7, "type": "read_file"}),
        json!({"id": 7, "type": "write_file", "path": "/tmp/x", "data": "!!notbase64"}),
        json!({"id": 7, "type": "kill", "exec_id": "one"}),
        json!({"id": 7, "type": "reidentify", "time": {"secs": "soon"}}),
        json!({"id": 7, "type": "write_file", "path": "/tmp/x", "data": "", "mode": 65535}),
        json!({"id": 0, "type": "health"}),
    ] {
        c.send(&bad);
        let r = c.recv_some();
        assert_eq!(r["type"], "error", "{bad} -> {r}");
        assert_eq!(r["code"], "bad_request", "{bad} -> {r}");
    }
    c.assert_healthy(3);
    agent.assert_alive();
}

#[test]
fn duplicate_ids_are_refused() {
    let agent = TestAgent::start(&[]);
    let mut c = agent.raw();
    c.send(&json!({"id": 10, "type": "exec", "argv": ["sleep", "1"]}));
    assert_eq!(c.recv_some()["type"], "exec_started");
    c.send(&json!({"id": 10, "type": "health"}));
    let r = c.recv_some();
    assert_eq!(
        (r["id"].clone(), r["code"].clone()),
        (json!(10), json!("duplicate_id"))
    );
    let r = c.recv_some();
    assert_eq!(
        (r["id"].clone(), r["type"].clone()),
        (json!(10), json!("exit"))
    );
    // Once finished, the id may be reused.
    c.assert_healthy(10);
}

#[test]
fn oversize_frame_is_refused_and_the_agent_keeps_serving() {
    let mut agent = TestAgent::start(&[]);
    let mut c = agent.raw();
    let len = (zygote_proto::MAX_FRAME_LEN as u32) + 1;
    c.write_raw(&len.to_be_bytes());
    c.write_raw(b"{\"id\":1,");
    let r = c.recv_some();
    assert_eq!(
        (r["id"].clone(), r["code"].clone()),
        (json!(0), json!("frame_too_large"))
    );
    c.assert_closed();
    agent.assert_alive();
    agent.raw().assert_healthy(1);
}

#[test]
fn truncated_frame_is_reported() {
    let mut agent = TestAgent::start(&[]);
    let mut c = agent.raw();
    c.write_raw(&100u32.to_be_bytes());
    c.write_raw(b"{\"id\":1,\"type\":");
    c.stream.shutdown(Shutdown::Write).unwrap();
    let r = c.recv_some();
    assert_eq!(r["code"], "truncated_frame", "{r}");
    c.assert_closed();

    // A header cut short, then the peer vanishes entirely.
    let mut c = agent.raw();
    c.write_raw(&[0, 0]);
    drop(c);
    agent.assert_alive();
    agent.raw().assert_healthy(1);
}

#[test]
fn client_disconnecting_mid_exec_kills_the_program() {
    let mut agent = TestAgent::start(&["--subreaper"]);
    let mut c = agent.raw();
    c.send(&json!({"id": 1, "type": "exec", "argv": ["sh", "-c", "echo $$; sleep 30"]}));
    assert_eq!(c.recv_some()["type"], "exec_started");
    let out = c.recv_some();
    let data = zygote_proto::b64::decode(out["data"].as_str().unwrap()).unwrap();
    let pid: u32 = String::from_utf8(data).unwrap().trim().parse().unwrap();
    assert!(!is_dead(pid));
    drop(c);
    assert!(
        eventually(Duration::from_secs(5), || proc_state(pid).is_none()),
        "exec {pid} still there (state {:?}) after its client left",
        proc_state(pid)
    );
    agent.assert_alive();
    assert!(zombie_children(agent.pid()).is_empty());
    agent.client().health().unwrap();
}

#[test]
fn client_disconnecting_during_heavy_output() {
    let mut agent = TestAgent::start(&[]);
    let client = agent.client();
    let handle = client.spawn_exec(ExecRequest::new(["yes"])).unwrap();
    let pid = handle.pid();
    // The connection goes away while `yes` floods it (the handle, which
    // would send a kill on drop, stays alive until the end).
    client.close();
    assert!(
        eventually(Duration::from_secs(5), || is_dead(pid)),
        "`yes` kept running after its client vanished"
    );
    agent.assert_alive();
    agent.client().health().unwrap();
    drop(handle);
}

#[test]
fn many_connections_and_requests_at_once() {
    let mut agent = TestAgent::start(&[]);
    let threads: Vec<_> = (0..8)
        .map(|i| {
            let client = agent.client();
            thread::spawn(move || {
                for j in 0..10 {
                    let out = client
                        .exec_output(ExecRequest::shell(format!("echo {i}-{j}")))
                        .unwrap();
                    assert_eq!(out.stdout, format!("{i}-{j}\n").into_bytes());
                    client.health().unwrap();
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    agent.assert_alive();
}
