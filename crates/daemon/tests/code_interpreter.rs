//! The code interpreter live (issue 37), on the qemu runtime here and on the kvm runtime
//! in the nested lane's full run (`vmm`'s Linux path; skips where KVM cannot boot Linux):
//! image `code-interpreter`,
//! `POST /v1/sandboxes/{id}/code` and its contexts. State across calls, a matplotlib
//! figure as a real PNG, per-execution envs (restored after), bad input, timeout and
//! client-disconnect interrupts, a kernel crash and restart, contexts, and a 50 MiB
//! DataFrame branched into 4 children that each change it their own way (and draw
//! different random numbers).
mod common;

use std::time::{Duration, Instant};

use hyper::Method;
use serde_json::{json, Value};
use zygote_api::code_client::Execution;
use zygote_daemon::client::{Client, ClientError};
use zygote_daemon::model::{BranchResponse, CodeEvent, CodeRequest, CreateContextRequest};

use common::{create, qemu_guest_ready, start_daemon, step, Cleanup};

fn code(src: &str) -> CodeRequest {
    CodeRequest {
        code: src.into(),
        ..Default::default()
    }
}

async fn run(c: &Client, id: &str, req: CodeRequest) -> Execution {
    let src = req.code.chars().take(80).collect::<String>();
    c.run_code(id, &req, |_| {})
        .await
        .unwrap_or_else(|e| panic!("{id}: run {src:?}: {e}"))
}

/// The main result's text/plain, with no error.
async fn value(c: &Client, id: &str, src: &str) -> String {
    let ex = run(c, id, code(src)).await;
    assert_eq!(ex.error, None, "{id}: {src:?}: {ex:?}");
    assert!(ex.execution_count.is_some(), "{ex:?}");
    ex.text()
        .unwrap_or_else(|| panic!("{id}: {src:?} has no value: {ex:?}"))
        .to_string()
}

/// (HTTP status, error code) of a request that must fail.
async fn refused(c: &Client, path: &str, body: Value) -> (u16, String) {
    match c.json::<Value>(Method::POST, path, Some(&body)).await {
        Err(ClientError::Api { status, code, .. }) => (status, code),
        other => panic!("{path} {}: {other:?}", body.to_string().len()),
    }
}

/// Width and height from a PNG's IHDR, checked independently of the daemon's own check.
fn png_size(b64: &str) -> (u32, u32) {
    use base64::Engine as _;
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(b64)
        .expect("base64 PNG");
    assert_eq!(&bytes[..8], b"\x89PNG\r\n\x1a\n", "PNG signature");
    assert_eq!(&bytes[12..16], b"IHDR");
    let be = |i: usize| u32::from_be_bytes(bytes[i..i + 4].try_into().unwrap());
    assert!(bytes.ends_with(b"IEND\xaeB`\x82"), "the PNG is complete");
    (be(16), be(20))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn code_interpreter_live() {
    if !qemu_guest_ready("code_interpreter_live") {
        return;
    }
    suite("code_interpreter_live", "qemu").await;
}

/// The same on the kvm runtime: the nested lane stages the image built on its host.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kvm_code_interpreter_live() {
    if !zygote_vmm::host::linux_guests_or_skip("the kvm code interpreter suite") {
        return;
    }
    common::guest_assets();
    suite("kvm_code_interpreter_live", "kvm").await;
}

async fn suite(test: &str, runtime: &str) {
    let t0 = Instant::now();
    // The first build downloads Debian packages (minutes); later ones are cached. Only a
    // host that builds images may skip: the nested lane stages the image, so its absence
    // there is a failure.
    if let Err(e) = zygote_images::build_image("code-interpreter", &mut |l| eprintln!("    {l}")) {
        assert_eq!(runtime, "qemu", "image code-interpreter: {e}");
        eprintln!("skipping {test}: image code-interpreter cannot be built: {e}");
        return;
    }
    step(t0, "code-interpreter image ready");
    let tmp = tempfile::tempdir().unwrap();
    let state = tmp.path().join("state");
    let cleanup = Cleanup {
        state: state.clone(),
        cgroups: Default::default(),
    };
    let d = start_daemon(&state, &["--listen", "127.0.0.1:0", "--runtime", runtime]);
    let c = d.client();

    // An image without the interpreter says so.
    let plain = create(&c, json!({"image": "minimal", "mem_mib": 128}), &cleanup).await;
    let path = format!("/v1/sandboxes/{}/code", plain[0].id);
    assert_eq!(
        refused(&c, &path, json!({"code": "1"})).await,
        (422, "no_code_interpreter".into())
    );
    c.raw(
        Method::DELETE,
        &format!("/v1/sandboxes/{}", plain[0].id),
        None,
    )
    .await
    .unwrap();

    let made = create(
        &c,
        json!({"image": "code-interpreter", "mem_mib": 1024}),
        &cleanup,
    )
    .await;
    let id = made[0].id.clone();
    step(t0, &format!("sandbox {id}"));

    // State across calls, output streamed as events.
    let mut seen = Vec::new();
    let first = c
        .run_code(&id, &code("x = 40\nprint('hello')\nx + 1"), |e| {
            seen.push(e.clone())
        })
        .await
        .unwrap();
    assert_eq!(first.stdout, "hello\n", "{first:?}");
    assert_eq!(first.text(), Some("41"));
    assert!(
        matches!(seen.last(), Some(CodeEvent::Done { .. })),
        "{seen:?}"
    );
    assert_eq!(value(&c, &id, "x += 2\nx").await, "42");
    // The longest timeout an execution may ask for (the relay's own limit is clamped).
    let longest = CodeRequest {
        timeout_ms: Some(zygote_daemon::model::MAX_EXEC_TIMEOUT_MS),
        ..code("x")
    };
    assert_eq!(run(&c, &id, longest).await.text(), Some("42"));
    step(t0, "state kept across calls");

    // envs: set for one execution only; afterwards each name is as it was (removed, or
    // its old value back), also after an error or a timeout; silently (the executions
    // are numbered on by one).
    let with_envs = |src: &str, kv: &[(&str, &str)]| CodeRequest {
        envs: Some(
            kv.iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        ),
        ..code(src)
    };
    let show = "import os; print(os.environ.get('ZYG_A'))";
    let mut counts = Vec::new();
    for (req, want) in [
        (code(show), "None\n"),
        (with_envs(show, &[("ZYG_A", "1")]), "1\n"),
        (code(show), "None\n"),
    ] {
        let ex = run(&c, &id, req).await;
        assert_eq!((ex.stdout.as_str(), &ex.error), (want, &None), "{ex:?}");
        counts.push(ex.execution_count.expect("a count"));
    }
    assert_eq!(
        counts,
        [counts[0], counts[0] + 1, counts[0] + 2],
        "{counts:?}"
    );
    let home = value(
        &c,
        &id,
        "os.environ['ZYG_B'] = 'mine'\nos.environ.get('HOME')",
    )
    .await;
    let over = run(
        &c,
        &id,
        with_envs(
            "import subprocess\nprint(os.environ['ZYG_B'], os.environ['HOME'])\n\
             print(subprocess.run(['sh', '-c', 'echo $ZYG_B'], capture_output=True, text=True).stdout)",
            &[("ZYG_B", "once"), ("HOME", "/tmp")],
        ),
    )
    .await;
    assert_eq!(over.stdout, "once /tmp\nonce\n\n", "{over:?}");
    let back = value(&c, &id, "os.environ['ZYG_B'], os.environ.get('HOME')").await;
    assert_eq!(
        back,
        format!("('mine', {home})"),
        "overridden names come back"
    );
    let raised = run(
        &c,
        &id,
        with_envs(
            "raise ValueError(os.environ['ZYG_A'])",
            &[("ZYG_A", "boom")],
        ),
    )
    .await;
    let error = raised.error.as_ref().map(|e| (e.0.as_str(), e.1.as_str()));
    assert_eq!(error, Some(("ValueError", "boom")), "{raised:?}");
    assert_eq!(
        run(&c, &id, code(show)).await.stdout,
        "None\n",
        "after an error"
    );
    let slow = CodeRequest {
        timeout_ms: Some(3000),
        ..with_envs("import time\ntime.sleep(600)", &[("ZYG_A", "t")])
    };
    let timed_out = run(&c, &id, slow).await;
    let error = timed_out.error.as_ref().map(|e| e.0.as_str());
    assert_eq!(error, Some("TimeoutError"), "{timed_out:?}");
    assert_eq!(
        run(&c, &id, code(show)).await.stdout,
        "None\n",
        "after a timeout"
    );
    step(
        t0,
        "envs for one execution, restored after it (also after an error and a timeout)",
    );

    // A figure: a display result with a real PNG.
    let fig = run(
        &c,
        &id,
        code("import matplotlib.pyplot as plt\nplt.plot([1, 3, 2])\nplt.title('t')\nplt.show()"),
    )
    .await;
    assert_eq!(fig.error, None, "{fig:?}");
    let png = fig
        .results
        .iter()
        .find_map(|r| match r {
            CodeEvent::Result { data, .. } => data.get("image/png")?.as_str(),
            _ => None,
        })
        .unwrap_or_else(|| panic!("no image/png: {fig:?}"));
    let (w, h) = png_size(png);
    assert!(w > 100 && h > 100, "{w}x{h}");
    step(t0, &format!("matplotlib figure: a {w}x{h} PNG"));

    // Bad input.
    let path = format!("/v1/sandboxes/{id}/code");
    let bad = [
        (
            json!({"code": "1", "language": "r"}),
            400,
            "invalid_argument",
        ),
        (
            json!({"code": "1", "context": "nope"}),
            404,
            "code_context_not_found",
        ),
        (json!({"code": "  \n"}), 400, "invalid_argument"),
        (
            json!({"code": "x".repeat(20 << 20)}),
            400,
            "invalid_argument",
        ),
        (
            json!({"code": "1", "context": "../x"}),
            400,
            "invalid_argument",
        ),
        (
            json!({"code": "1", "envs": {"1A": "x"}}),
            400,
            "invalid_argument",
        ),
        (
            json!({"code": "1", "envs": {"A": 1}}),
            400,
            "malformed_body",
        ),
    ];
    for (body, status, want) in bad {
        assert_eq!(refused(&c, &path, body).await, (status, want.to_string()));
    }
    step(
        t0,
        "bad input refused (language, context, empty, 20 MiB, envs)",
    );

    // A timeout interrupts; the context and its state stay.
    let spin = run(
        &c,
        &id,
        CodeRequest {
            timeout_ms: Some(3000),
            ..code("while True:\n    pass")
        },
    )
    .await;
    assert_eq!(
        spin.error.as_ref().map(|e| e.0.as_str()),
        Some("TimeoutError"),
        "{spin:?}"
    );
    assert!(spin.execution_count.is_some(), "{spin:?}");
    assert_eq!(value(&c, &id, "x").await, "42");
    step(
        t0,
        "an infinite loop interrupted by its timeout; state intact",
    );

    // A client that goes away interrupts its execution: the next one runs at once
    // (executions of one context are serialized, so it would wait 1000 s otherwise).
    let gone = tokio::time::timeout(
        Duration::from_secs(5),
        c.run_code(&id, &code("import time\ntime.sleep(1000)"), |_| {}),
    )
    .await;
    assert!(gone.is_err(), "the sleep ended early: {gone:?}");
    let next = tokio::time::timeout(Duration::from_secs(120), value(&c, &id, "x")).await;
    assert_eq!(
        next.as_deref(),
        Ok("42"),
        "the next execution waited: the abandoned one was not interrupted"
    );
    step(t0, "a disconnected client's execution was interrupted");

    // Contexts: independent kernels.
    let ctx = c
        .create_code_context(&id, &CreateContextRequest::default())
        .await
        .unwrap();
    let in_ctx = |src: &str| CodeRequest {
        context: Some(ctx.id.clone()),
        ..code(src)
    };
    assert_eq!(run(&c, &id, in_ctx("y = 5\ny")).await.text(), Some("5"));
    let missing = run(&c, &id, code("y")).await;
    assert_eq!(
        missing.error.as_ref().map(|e| e.0.as_str()),
        Some("NameError")
    );
    // An execution that ignores the interrupt past its timeout: its context's kernel is
    // restarted (its state lost), and the answer still ends as every answer does.
    let deaf = run(
        &c,
        &id,
        CodeRequest {
            timeout_ms: Some(2000),
            ..in_ctx("import signal\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\nwhile True:\n    pass")
        },
    )
    .await;
    let (name, why, _) = deaf.error.clone().expect("an error");
    assert_eq!(name, "TimeoutError", "{deaf:?}");
    assert!(why.contains("restarted"), "{deaf:?}");
    assert_eq!(deaf.failure, None, "{deaf:?}");
    assert!(deaf.execution_count.is_some(), "{deaf:?}");
    assert_eq!(
        run(&c, &id, in_ctx("'y' in dir()")).await.text(),
        Some("False")
    );
    assert_eq!(
        value(&c, &id, "x").await,
        "42",
        "the default context is untouched"
    );
    let listed = c.code_contexts(&id).await.unwrap();
    assert!(listed.iter().any(|x| x.id == "default"), "{listed:?}");
    assert!(listed.contains(&ctx), "{listed:?}");
    c.delete_code_context(&id, &ctx.id).await.unwrap();
    let deleted = c.run_code(&id, &in_ctx("1"), |_| {}).await.unwrap_err();
    assert_eq!(deleted.code(), Some("code_context_not_found"), "{deleted}");
    step(
        t0,
        "contexts: created, independent, listed, deleted; a deaf one restarted at its timeout",
    );

    // A kernel crash is reported; the context restarts on request.
    let crash = run(&c, &id, code("import os\nos._exit(3)")).await;
    assert_eq!(
        crash.error.as_ref().map(|e| e.0.as_str()),
        Some("KernelDied"),
        "{crash:?}"
    );
    let still = run(&c, &id, code("1")).await;
    assert_eq!(
        still.error.as_ref().map(|e| e.0.as_str()),
        Some("KernelDied")
    );
    c.restart_code_context(&id, "default").await.unwrap();
    assert_eq!(value(&c, &id, "'x' in dir()").await, "False");
    assert_eq!(value(&c, &id, "1 + 1").await, "2");
    step(t0, "kernel crash reported; restarted on request");

    // 50 MiB DataFrame loaded once, branched into 4 children.
    let load = "import pandas as pd, numpy as np, random\n\
                df = pd.DataFrame({'v': np.arange(6553600, dtype='float64')})\n\
                random.seed(7); np.random.seed(7)\n\
                int(df.memory_usage(deep=True).sum())";
    let bytes: u64 = value(&c, &id, load).await.parse().unwrap();
    assert!(bytes >= 50 << 20, "{bytes}");
    step(t0, &format!("DataFrame of {} MiB loaded", bytes >> 20));
    let br: BranchResponse = c
        .json(
            Method::POST,
            &format!("/v1/sandboxes/{id}/branch"),
            Some(&json!({"count": 4})),
        )
        .await
        .expect("branch");
    assert_eq!(br.children.len(), 4);
    step(t0, &format!("branched into {:?}", br.children));
    for (i, child) in br.children.iter().enumerate() {
        let change = format!("df.loc[{i}, 'v'] = -1.0 - {i}\nint((df['v'] < 0).sum())");
        assert_eq!(value(&c, child, &change).await, "1", "{child}");
    }
    let mut draws = Vec::new();
    for (i, child) in br.children.iter().enumerate() {
        let mine = value(
            &c,
            child,
            "list(df.index[df['v'] < 0]), float(df['v'].min())",
        )
        .await;
        assert_eq!(mine, format!("([{i}], {:.1})", -1.0 - i as f64), "{child}");
        draws.push(value(&c, child, "(random.random(), float(np.random.rand()))").await);
    }
    let parent = value(&c, &id, "int((df['v'] < 0).sum())").await;
    assert_eq!(parent, "0", "the parent's DataFrame is untouched");
    let mut distinct = draws.clone();
    distinct.sort();
    distinct.dedup();
    assert_eq!(
        distinct.len(),
        4,
        "children drew the same numbers: {draws:?}"
    );
    step(
        t0,
        "each child sees only its own change; their random draws differ",
    );

    // Snapshot/restore: the kernel rolls back with the VM and answers at once after.
    let snap: Value = c
        .json(Method::POST, "/v1/snapshots", Some(&json!({"sandbox": id})))
        .await
        .expect("snapshot");
    let snap = snap["id"].as_str().expect("snapshot id").to_string();
    let changed = "df.loc[5, 'v'] = -99.0\nint((df['v'] < 0).sum())";
    assert_eq!(value(&c, &id, changed).await, "1");
    c.raw(
        Method::POST,
        &format!("/v1/sandboxes/{id}/restore"),
        Some((
            bytes::Bytes::from(json!({"snapshot": snap}).to_string()),
            "application/json",
        )),
    )
    .await
    .expect("restore");
    assert_eq!(value(&c, &id, "int((df['v'] < 0).sum())").await, "0");
    step(
        t0,
        "restored from a snapshot: the change after it is gone, the kernel answers",
    );

    // Pause/resume keeps the kernel and its data.
    for action in ["pause", "resume"] {
        c.raw(Method::POST, &format!("/v1/sandboxes/{id}/{action}"), None)
            .await
            .unwrap_or_else(|e| panic!("{action}: {e}"));
    }
    assert_eq!(value(&c, &id, "len(df)").await, "6553600");
    step(t0, "the DataFrame survived pause/resume");

    // A hostile guest: its relay answers garbage, which ends as a clear error, never a
    // malformed stream or a hang.
    let child = &br.children[0];
    let liar = "#!/bin/sh\ncat >/dev/null\necho '{\"type\":\"started\"}'\n\
                echo '{\"type\":\"result\",\"main\":true,\"data\":{\"image/png\":\"bm90IGEgcG5n\",\"text/plain\":\"x\"}}'\n\
                echo '{\"type\":\"shell\",\"cmd\":\"x\"}'\n";
    c.raw(
        Method::PUT,
        &format!("/v1/sandboxes/{child}/files?path=/usr/local/bin/zygote-codeint&mode=755"),
        Some((bytes::Bytes::from(liar), "application/octet-stream")),
    )
    .await
    .expect("replace the relay");
    // It never says it applies envs (as a server older than them): an execution with envs
    // is refused, not run without them.
    let envs = json!({"code": "1", "envs": {"ZYG_A": "1"}});
    let path = format!("/v1/sandboxes/{child}/code");
    assert_eq!(
        refused(&c, &path, envs).await,
        (422, "code_envs_unsupported".into())
    );
    let lied = run(&c, child, code("1")).await;
    let data = match lied.results.first() {
        Some(CodeEvent::Result { data, .. }) => data.clone(),
        other => panic!("{other:?}"),
    };
    assert!(
        !data.contains_key("image/png"),
        "a fake PNG passed: {data:?}"
    );
    let failure = lied.failure.clone().expect("a failure event");
    assert_eq!(failure.0, "code_server_malformed", "{failure:?}");
    step(
        t0,
        &format!("a lying relay: envs refused, fake PNG dropped, then {failure:?}"),
    );

    for sb in br.children.iter().chain([&id]) {
        c.raw(Method::DELETE, &format!("/v1/sandboxes/{sb}"), None)
            .await
            .unwrap();
    }
    c.raw(Method::DELETE, &format!("/v1/snapshots/{snap}"), None)
        .await
        .unwrap();
}
