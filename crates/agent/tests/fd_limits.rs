//! The agent's file descriptors (issue 33): background processes and ptys are refused
//! with `limit_reached` while enough descriptors stay free for execs, which keep working;
//! the agent raises its own limit at start and gives its programs the one it started
//! with.

mod common;

use std::time::Duration;

use common::*;
use zygote_proto::client::ClientError;
use zygote_proto::{ErrorCode, ExecRequest, PtyOpenRequest};

/// Soft limit of the `Max open files` line of /proc/PID/limits.
fn soft_nofile(pid: u32) -> u64 {
    let limits = std::fs::read_to_string(format!("/proc/{pid}/limits")).unwrap();
    let line = limits
        .lines()
        .find(|l| l.starts_with("Max open files"))
        .expect("a Max open files line");
    line.split_whitespace().nth(3).unwrap().parse().unwrap()
}

#[test]
fn background_processes_stop_at_a_clear_limit_and_execs_keep_working() {
    // A limit low enough to reach in a moment (what a guest's 1024 was to a few hundred
    // processes), set on the running agent: it raised its own at start if it could.
    let agent = TestAgent::start(&[]);
    let lim = libc::rlimit {
        rlim_cur: 256,
        rlim_max: 256,
    };
    // SAFETY: prlimit reads the struct we pass; lowering another process's limit needs
    // no privilege beyond owning it.
    let set = unsafe {
        libc::prlimit(
            agent.pid() as libc::pid_t,
            libc::RLIMIT_NOFILE,
            &lim,
            std::ptr::null_mut(),
        )
    };
    assert_eq!(set, 0, "prlimit: {}", std::io::Error::last_os_error());
    let client = agent.client();
    let mut started = Vec::new();
    let refusal = loop {
        assert!(started.len() < 256, "never refused");
        match client.spawn_process(ExecRequest::new(["sleep", "600"])) {
            Ok(p) => started.push(p.pid),
            Err(e) => break e,
        }
    };
    let ClientError::Agent(body) = &refusal else {
        panic!("not an agent error: {refusal}");
    };
    assert_eq!(body.code, ErrorCode::LimitReached, "{body}");
    assert!(body.message.contains("file descriptors"), "{body}");
    // Most of the budget went to processes: the reserve is not the whole limit.
    assert!(started.len() >= 15, "only {} started", started.len());

    // A plain exec (and more than one) still works.
    for _ in 0..3 {
        let out = client
            .exec_output(ExecRequest::shell("echo still here"))
            .expect("exec after the limit");
        assert_eq!(out.stdout, b"still here\n");
    }
    // A pty is a long-lived holder too: refused the same way.
    let err = client
        .open_pty(PtyOpenRequest {
            argv: vec!["sh".into()],
            cols: 80,
            rows: 24,
            ..Default::default()
        })
        .err()
        .expect("pty refused");
    assert_eq!(err.code(), Some(ErrorCode::LimitReached), "{err}");

    // Ending processes makes room again.
    for pid in started.iter().take(5) {
        client.process_signal(*pid, libc::SIGKILL).unwrap();
    }
    assert!(
        eventually(Duration::from_secs(10), || client
            .spawn_process(ExecRequest::new(["sleep", "600"]))
            .is_ok()),
        "no room after killing processes"
    );
    for pid in started {
        let _ = client.process_signal(pid, libc::SIGKILL);
    }
}

#[test]
fn the_agent_raises_its_limit_and_programs_get_the_one_it_started_with() {
    let agent = TestAgent::start_with_fd_limit(&[], Some((200, 4096)));
    assert!(
        soft_nofile(agent.pid()) >= 4096,
        "the agent's own limit was not raised"
    );
    let client = agent.client();
    let out = client
        .exec_output(ExecRequest::shell("ulimit -n"))
        .expect("exec");
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "200");
}
