//! The JSON shapes documented in PROTOCOL.md, pinned down.

use serde_json::{json, Value};
use zygote_proto::process::{ProcessOutputRequest, ProcessSignalRequest, ProcessStdinRequest};
use zygote_proto::*;

fn to_value<T: serde::Serialize>(v: &T) -> Value {
    serde_json::to_value(v).unwrap()
}

#[test]
fn request_shapes() {
    let health = RequestFrame {
        id: 1,
        request: Request::Health,
    };
    assert_eq!(to_value(&health), json!({"id": 1, "type": "health"}));

    let mut exec = ExecRequest::shell("echo hi");
    exec.stdin = Some(b"abc".to_vec());
    exec.timeout_ms = Some(1500);
    exec.env.insert("A".into(), "1".into());
    let frame = RequestFrame {
        id: 7,
        request: Request::Exec(exec.clone()),
    };
    let v = to_value(&frame);
    assert_eq!(
        v,
        json!({"id": 7, "type": "exec", "argv": ["sh", "-c", "echo hi"],
               "env": {"A": "1"}, "stdin": "YWJj", "timeout_ms": 1500})
    );
    let back: RequestFrame = serde_json::from_value(v).unwrap();
    assert_eq!(back.request, Request::Exec(exec));

    let kill: RequestFrame =
        serde_json::from_value(json!({"id": 3, "type": "kill", "exec_id": 7})).unwrap();
    assert_eq!(
        kill.request,
        Request::Kill(KillRequest {
            exec_id: 7,
            signal: 9
        })
    );

    // Unknown fields are ignored; stat follows symlinks by default.
    let stat: RequestFrame = serde_json::from_value(
        json!({"id": 4, "type": "stat", "path": "/x", "future_field": true}),
    )
    .unwrap();
    assert_eq!(
        stat.request,
        Request::Stat(StatRequest {
            path: "/x".into(),
            follow_symlinks: true
        })
    );

    let reid = RequestFrame {
        id: 5,
        request: Request::Reidentify(ReidentifyRequest {
            entropy: vec![0xff; 4],
            hostname: Some("vm-1".into()),
            time: Some(UnixTime {
                secs: 1_700_000_000,
                nanos: 5,
            }),
            net: None,
            identity: None,
        }),
    };
    assert_eq!(
        to_value(&reid),
        json!({"id": 5, "type": "reidentify", "entropy": "/////w==", "hostname": "vm-1",
               "time": {"secs": 1_700_000_000, "nanos": 5}})
    );
}

#[test]
fn every_request_type_is_listed() {
    let samples = [
        Request::Hello(HelloRequest {
            token: "t".into(),
            new_token: None,
        }),
        Request::Health,
        Request::Exec(ExecRequest::new(["true"])),
        Request::Kill(KillRequest {
            exec_id: 1,
            signal: 15,
        }),
        Request::ReadFile(ReadFileRequest {
            path: "/a".into(),
            offset: 0,
            len: None,
        }),
        Request::WriteFile(WriteFileRequest {
            path: "/a".into(),
            data: vec![],
            mode: None,
            append: false,
            create_parents: false,
            owner: None,
        }),
        Request::ListDir(PathRequest { path: "/".into() }),
        Request::Stat(StatRequest {
            path: "/".into(),
            follow_symlinks: false,
        }),
        Request::Rename(RenameRequest {
            from: "/a".into(),
            to: "/b".into(),
        }),
        Request::Remove(RemoveRequest {
            path: "/a".into(),
            recursive: true,
        }),
        Request::Reidentify(ReidentifyRequest::default()),
        Request::Walk(WalkRequest {
            path: "/root".into(),
            hash: true,
        }),
        Request::Apply(ApplyRequest {
            ops: vec![TreeOp::Remove {
                path: "/a".into(),
                recursive: false,
            }],
        }),
        Request::Spawn(ExecRequest::shell("sleep 1")),
        Request::Processes,
        Request::ProcessOutput(ProcessOutputRequest {
            pid: 7,
            offset: 0,
            wait_ms: 0,
        }),
        Request::ProcessStdin(ProcessStdinRequest {
            pid: 7,
            data: b"x".to_vec(),
            eof: true,
        }),
        Request::ProcessSignal(ProcessSignalRequest { pid: 7, signal: 2 }),
        Request::Shutdown,
        Request::PtyOpen(PtyOpenRequest {
            cols: 80,
            rows: 24,
            ..Default::default()
        }),
        Request::PtyInput(PtyInputRequest {
            pty_id: 1,
            data: b"ls\n".to_vec(),
        }),
        Request::PtyResize(PtyResizeRequest {
            pty_id: 1,
            cols: 80,
            rows: 24,
        }),
        Request::Watch(zygote_proto::watch::WatchRequest {
            path: "/tmp".into(),
            recursive: true,
        }),
        Request::Unwatch(zygote_proto::watch::UnwatchRequest { watch_id: 1 }),
        Request::Stats,
    ];
    assert_eq!(samples.len(), Request::TYPES.len());
    for (req, name) in samples.iter().zip(Request::TYPES) {
        assert_eq!(to_value(req)["type"], json!(name));
    }
}

#[test]
fn response_shapes() {
    let out = ResponseFrame {
        id: 2,
        response: Response::Output {
            stream: Stream::Stderr,
            data: b"oops".to_vec(),
        },
    };
    assert_eq!(
        to_value(&out),
        json!({"id": 2, "type": "output", "stream": "stderr", "data": "b29wcw=="})
    );
    let exit = ResponseFrame {
        id: 2,
        response: Response::Exit(ExecResult {
            exit_code: None,
            signal: Some(9),
            timed_out: true,
            duration_ms: 10,
        }),
    };
    assert_eq!(
        to_value(&exit),
        json!({"id": 2, "type": "exit", "exit_code": null, "signal": 9, "timed_out": true,
               "duration_ms": 10})
    );
    let err = ResponseFrame {
        id: 0,
        response: Response::Error(ErrorBody::new(ErrorCode::FrameTooLarge, "too big")),
    };
    assert_eq!(
        to_value(&err),
        json!({"id": 0, "type": "error", "code": "frame_too_large", "message": "too big"})
    );
    assert_eq!(
        to_value(&ResponseFrame {
            id: 9,
            response: Response::Ok
        }),
        json!({"id": 9, "type": "ok"})
    );
}

#[test]
fn newer_agents_do_not_break_older_clients() {
    let f: ResponseFrame =
        serde_json::from_value(json!({"id": 1, "type": "progress", "pct": 50})).unwrap();
    assert_eq!(f.response, Response::Unknown);
    let f: ResponseFrame = serde_json::from_value(
        json!({"id": 1, "type": "error", "code": "quota_exceeded", "message": "m"}),
    )
    .unwrap();
    match f.response {
        Response::Error(body) => assert_eq!(body.code, ErrorCode::Unknown),
        other => panic!("{other:?}"),
    }
}

#[test]
fn error_code_strings_match_serde() {
    for code in [
        ErrorCode::MalformedFrame,
        ErrorCode::FrameTooLarge,
        ErrorCode::TruncatedFrame,
        ErrorCode::UnknownRequest,
        ErrorCode::BadRequest,
        ErrorCode::DuplicateId,
        ErrorCode::Busy,
        ErrorCode::NotFound,
        ErrorCode::PermissionDenied,
        ErrorCode::AlreadyExists,
        ErrorCode::SpawnFailed,
        ErrorCode::ResponseTooLarge,
        ErrorCode::Unsupported,
        ErrorCode::Io,
        ErrorCode::Internal,
        ErrorCode::Unauthorized,
        ErrorCode::ProcessExited,
    ] {
        assert_eq!(to_value(&code), json!(code.as_str()));
    }
}

#[test]
fn max_data_chunk_fits_a_frame() {
    let req = RequestFrame {
        id: u64::MAX,
        request: Request::WriteFile(WriteFileRequest {
            path: "/".repeat(4096),
            data: vec![0xAB; MAX_DATA_CHUNK],
            mode: Some(0o7777),
            append: true,
            create_parents: true,
            owner: None,
        }),
    };
    assert!(serde_json::to_vec(&req).unwrap().len() < MAX_FRAME_LEN);
}

#[test]
fn file_kind_names_are_the_wire_names() {
    for k in [
        FileKind::File,
        FileKind::Dir,
        FileKind::Symlink,
        FileKind::Other,
    ] {
        assert_eq!(to_value(&k), json!(k.as_str()));
    }
}
