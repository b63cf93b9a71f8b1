//! The "you were forked" contract, end to end: hooks in `/etc/zygote/forked.d` run in
//! every branch child before it is reported ready, with the child's own ids; the
//! generation counter goes up; each child gets its own machine-id; failing hooks are
//! reported on the sandbox.
use std::sync::LazyLock;

use hyper::Method;
use serde_json::{json, Value};
use zygote_daemon::client::Client;

use super::{exec, get, read, write};

const RECORD: &str = "#!/bin/sh\n\
    printf '%s %s %s %s\\n' \"$ZYGOTE_SANDBOX_ID\" \"$ZYGOTE_PARENT_ID\" \
    \"$ZYGOTE_GENERATION\" \"$(cat /run/zygote/generation)\" > /root/forked.txt\n";
const FAIL: &str = "#!/bin/sh\necho nope >&2\nexit 4\n";

/// Put a recording hook and a failing one into `parent`; returns its generation.
pub async fn install_hooks(c: &Client, parent: &str) -> u64 {
    exec(c, parent, "mkdir -p /etc/zygote/forked.d").await;
    write(c, parent, "/etc/zygote/forked.d/10-record", RECORD).await;
    write(c, parent, "/etc/zygote/forked.d/20-fail", FAIL).await;
    // Not executable, so not a hook.
    write(
        c,
        parent,
        "/etc/zygote/forked.d/README",
        "#!/bin/sh\nexit 9\n",
    )
    .await;
    let r = exec(c, parent, "chmod 755 /etc/zygote/forked.d/[0-9]*").await;
    assert_eq!(r.exit_code, Some(0), "{r:?}");
    let generation = read(c, parent, "/run/zygote/generation")
        .await
        .expect("the parent has a generation counter");
    generation.trim().parse().expect("a number")
}

/// Check every child ran the hooks as itself, and nothing ran in the parent.
pub async fn check_children(c: &Client, parent: &str, parent_generation: u64, children: &[String]) {
    let machine_id =
        |id: String| async move { read(c, &id, "/etc/machine-id").await.expect("machine-id") };
    let mut ids = vec![machine_id(parent.to_string()).await];
    let generation = parent_generation + 1;
    for child in children {
        let got = read(c, child, "/root/forked.txt")
            .await
            .expect("hook output");
        assert_eq!(
            got,
            format!("{child} {parent} {generation} {generation}\n"),
            "the hook in {child} saw other ids"
        );
        let hooks = get(c, child).await.fork_hooks;
        let names: Vec<&str> = hooks.iter().map(|h| h.name.as_str()).collect();
        assert_eq!(names, ["10-record", "20-fail"], "{hooks:?}");
        assert_eq!(hooks[0].exit_code, Some(0));
        assert_eq!(hooks[1].exit_code, Some(4));
        assert_eq!(hooks[1].stderr_tail.trim(), "nope");
        assert!(hooks[1].error.is_some());
        ids.push(machine_id(child.clone()).await);
    }
    for (i, x) in ids.iter().enumerate() {
        assert_eq!(x.trim().len(), 32, "{ids:?}");
        assert!(
            ids[..i].iter().all(|y| y != x),
            "shared machine-id: {ids:?}"
        );
    }
    assert!(
        read(c, parent, "/root/forked.txt").await.is_err(),
        "hooks ran in the parent"
    );
    assert!(get(c, parent).await.fork_hooks.is_empty());
}

pub static PARENT_ENVS: LazyLock<Value> =
    LazyLock::new(|| json!({"TASK": "parent", "SHARED": "1"}));
pub static PARENT_SECRETS: LazyLock<Value> = LazyLock::new(
    || json!({"API_TOKEN": {"value": "t0k3n-never-shown", "inherit": false}, "KEEP_ME": {"value": "k"}}),
);

/// One `env` object per child for the branch request: `TASK` says which child it is.
pub fn child_envs(n: usize) -> Value {
    Value::Array(
        (0..n)
            .map(|i| json!({"TASK": format!("child{i}")}))
            .collect(),
    )
}

/// Execs see the sandbox's envs and secrets (an exec's own env wins); each child has
/// its own `TASK` and not the secret marked `inherit: false`; no value of a secret is
/// ever shown by the API.
pub async fn check_envs(c: &Client, parent: &str, children: &[String]) {
    let show = "echo \"$TASK $SHARED ${API_TOKEN:-none} ${KEEP_ME:-none}\"";
    let got = exec(c, parent, show).await.stdout;
    assert_eq!(got, "parent 1 t0k3n-never-shown k\n");
    let own: super::ExecResponse = c
        .json(
            Method::POST,
            &format!("/v1/sandboxes/{parent}/exec"),
            Some(&json!({"argv": ["sh", "-c", "echo $TASK"], "env": {"TASK": "mine"}})),
        )
        .await
        .unwrap();
    assert_eq!(own.stdout, "mine\n");
    let view = get(c, parent).await;
    assert_eq!(view.secrets, ["API_TOKEN", "KEEP_ME"]);
    for (i, child) in children.iter().enumerate() {
        let got = exec(c, child, show).await.stdout;
        assert_eq!(got, format!("child{i} 1 none k\n"), "{child}");
        assert_eq!(get(c, child).await.secrets, ["KEEP_ME"]);
    }
    let listed = c.raw(Method::GET, "/v1/sandboxes", None).await.unwrap();
    assert!(
        !String::from_utf8_lossy(&listed).contains("t0k3n"),
        "a secret's value is shown by the API"
    );
    // One env object per child, or nothing changes.
    let e = c
        .json::<Value>(
            Method::POST,
            &format!("/v1/sandboxes/{parent}/branch"),
            Some(&json!({"count": 2, "env": [{"A": "1"}]})),
        )
        .await
        .unwrap_err();
    assert_eq!(e.code(), Some("invalid_argument"), "{e}");
}
