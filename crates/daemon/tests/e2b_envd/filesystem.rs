//! envd's filesystem service and users (issue 35): Stat, ListDir, MakeDir, Move and
//! Remove in envd's JSON, the acting user from `Authorization: Basic` and `?username=`,
//! and the answers to bad input: malformed bodies, a depth or tree too large, paths
//! with `..` (resolved inside the guest, never on the host), unknown users, wrong
//! tokens and another sandbox's id.
use std::time::Instant;

use base64::Engine as _;
use serde_json::{json, Value};

use crate::common::{qemu_guest_ready, start_daemon, step, Scratch};
use crate::wire::{envelope, hostport, http, proxy_addr, Answer};

const ENVD_UNAUTHORIZED: &str =
    "unauthorized access, please provide a valid access token or method signing if supported";

struct Sandbox<'a> {
    proxy: &'a str,
    id: String,
    token: String,
}

impl Sandbox<'_> {
    fn call(&self, path: &str, ct: &str, extra: &[(&str, &str)], body: &[u8]) -> Answer {
        let mut h = vec![
            ("E2b-Sandbox-Id", self.id.as_str()),
            ("E2b-Sandbox-Port", "49983"),
            ("X-Access-Token", self.token.as_str()),
            ("Content-Type", ct),
            ("Connect-Protocol-Version", "1"),
        ];
        h.extend_from_slice(extra);
        http(self.proxy, "POST", path, &h, body)
    }

    fn fs(&self, method: &str, body: Value) -> Answer {
        self.fs_as(method, &[], &serde_json::to_vec(&body).unwrap())
    }

    fn fs_as(&self, method: &str, extra: &[(&str, &str)], body: &[u8]) -> Answer {
        let path = format!("/filesystem.Filesystem/{method}");
        self.call(&path, "application/json", extra, body)
    }

    /// Runs `script` with /bin/sh as root; its stdout.
    fn sh(&self, script: &str) -> String {
        let req = json!({"process": {"cmd": "/bin/sh", "args": ["-c", script]}});
        let a = self.call(
            "/process.Process/Start",
            "application/connect+json",
            &[("Authorization", "Basic cm9vdDo=")],
            &envelope(&req),
        );
        assert_eq!(a.status, 200, "{}", a.text());
        let b64 = base64::engine::general_purpose::STANDARD;
        a.envelopes()
            .iter()
            .filter_map(|(_, m)| m["event"]["data"]["stdout"].as_str())
            .map(|s| String::from_utf8(b64.decode(s).unwrap()).unwrap())
            .collect()
    }
}

fn basic(user: &str) -> String {
    let b64 = base64::engine::general_purpose::STANDARD;
    format!("Basic {}", b64.encode(format!("{user}:")))
}

fn code(a: &Answer) -> (u16, Value) {
    (a.status, a.json()["code"].clone())
}

#[test]
fn e2b_envd_filesystem_and_users_answer_as_envd_and_refuse_bad_input() {
    if !qemu_guest_ready("e2b_envd_filesystem_and_users_answer_as_envd_and_refuse_bad_input") {
        return;
    }
    let t0 = Instant::now();
    let scratch = Scratch::new();
    let d = start_daemon(
        &scratch.state,
        &["--listen", "127.0.0.1:0", "--runtime", "qemu"],
    );
    let (api, proxy, token) = (hostport(&d.url), proxy_addr(&d), d.token());
    let create = || {
        let body = br#"{"templateID": "minimal", "timeout": 600}"#;
        let a = http(
            &api,
            "POST",
            "/e2b/v2/sandboxes",
            &[("X-API-Key", &token)],
            body,
        );
        assert_eq!(a.status, 201, "{}", a.text());
        let v = a.json();
        Sandbox {
            proxy: &proxy,
            id: v["sandboxID"].as_str().unwrap().into(),
            token: v["envdAccessToken"].as_str().unwrap().into(),
        }
    };
    let (a, b) = (create(), create());
    step(t0, "two sandboxes");

    // A guest user, made as E2B's templates make `user`; it is the default from now on.
    a.sh(
        "echo 'user:x:1000:1000::/home/user:/bin/sh' >> /etc/passwd; \
          echo 'user:x:1000:' >> /etc/group; mkdir -p /home/user; chown 1000:1000 /home/user; \
          echo f > /tmp/file; ln -s file /tmp/link",
    );
    let made = a.fs("MakeDir", json!({"path": "work/sub"}));
    assert_eq!(made.status, 200, "{}", made.text());
    let e = &made.json()["entry"];
    assert_eq!(
        e["path"], "/home/user/work/sub",
        "relative to the default user's home"
    );
    assert_eq!(
        (
            &e["type"],
            &e["owner"],
            &e["group"],
            &e["mode"],
            &e["permissions"]
        ),
        (
            &json!("FILE_TYPE_DIRECTORY"),
            &json!("user"),
            &json!("user"),
            &json!(0o755),
            &json!("drwxr-xr-x")
        )
    );
    assert!(e["modifiedTime"].as_str().unwrap().ends_with('Z'), "{e}");
    assert_eq!(a.sh("stat -c %U:%G /home/user/work"), "user:user\n");
    let again = a.fs("MakeDir", json!({"path": "/home/user/work/sub"}));
    assert_eq!(code(&again), (409, json!("already_exists")));
    let on_file = a.fs("MakeDir", json!({"path": "/tmp/file"}));
    assert_eq!(
        code(&on_file),
        (400, json!("invalid_argument")),
        "{}",
        on_file.text()
    );

    let st = a.fs("Stat", json!({"path": "/tmp/file"})).json();
    assert_eq!(
        st["entry"],
        json!({
            "name": "file", "type": "FILE_TYPE_FILE", "path": "/tmp/file", "size": "2",
            "mode": 0o644, "permissions": "-rw-r--r--", "owner": "root", "group": "root",
            "modifiedTime": st["entry"]["modifiedTime"].clone()
        })
    );
    let link = a.fs("Stat", json!({"path": "/tmp/link"})).json();
    assert_eq!(
        (
            &link["entry"]["type"],
            &link["entry"]["symlinkTarget"],
            &link["entry"]["isSymlink"]
        ),
        (&json!("FILE_TYPE_SYMLINK"), &json!("file"), &json!(true))
    );
    // `..` resolves inside the guest, as envd's filepath.Abs: never a host path.
    let up = a.fs("Stat", json!({"path": "../../../../../etc/passwd"}));
    assert_eq!(up.json()["entry"]["path"], "/etc/passwd", "{}", up.text());
    let missing = a.fs("Stat", json!({"path": "/nope"}));
    assert_eq!(code(&missing), (404, json!("not_found")));
    step(t0, "MakeDir and Stat");

    let list = a
        .fs("ListDir", json!({"path": "/home/user", "depth": 2}))
        .json();
    let paths: Vec<&str> = list["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["path"].as_str().unwrap())
        .collect();
    assert_eq!(paths, ["/home/user/work", "/home/user/work/sub"]);
    let one = a.fs("ListDir", json!({"path": "/home/user"})).json();
    assert_eq!(
        one["entries"].as_array().unwrap().len(),
        1,
        "no depth lists one level"
    );
    let huge = a.fs(
        "ListDir",
        json!({"path": "/home/user", "depth": 4294967295u64}),
    );
    assert_eq!(
        huge.status,
        200,
        "a huge depth stops where the tree does: {}",
        huge.text()
    );
    assert_eq!(huge.json()["entries"].as_array().unwrap().len(), 2);
    a.sh("mkdir /tmp/many && cd /tmp/many && i=0; while [ $i -le 10000 ]; do : > f$i; i=$((i+1)); done");
    let many = a.fs("ListDir", json!({"path": "/tmp/many"}));
    assert_eq!(
        code(&many),
        (429, json!("resource_exhausted")),
        "{}",
        many.text()
    );
    let on_file = a.fs("ListDir", json!({"path": "/tmp/file"}));
    assert_eq!(code(&on_file), (400, json!("invalid_argument")));
    step(t0, "ListDir, its depth and its bound");

    let mv = a.fs(
        "Move",
        json!({"source": "/tmp/file", "destination": "/tmp/moved/here/f2"}),
    );
    assert_eq!(mv.status, 200, "{}", mv.text());
    assert_eq!(mv.json()["entry"]["path"], "/tmp/moved/here/f2");
    assert_eq!(
        a.sh("stat -c %U /tmp/moved; cat /tmp/moved/here/f2"),
        "user\nf\n"
    );
    let gone = a.fs(
        "Move",
        json!({"source": "/tmp/file", "destination": "/tmp/x"}),
    );
    assert_eq!(code(&gone), (404, json!("not_found")));
    // /tmp is another filesystem: rename(2) fails there, as with envd (no copy).
    let exdev = a.fs(
        "Move",
        json!({"source": "/tmp/moved", "destination": "elsewhere"}),
    );
    assert_eq!(code(&exdev), (500, json!("internal")), "{}", exdev.text());
    assert_eq!(a.fs("Remove", json!({"path": "/tmp/moved"})).status, 200);
    assert_eq!(a.sh("ls /tmp/moved 2>/dev/null; echo done"), "done\n");
    let root = a.fs("Remove", json!({"path": "/.."}));
    assert_eq!(code(&root), (400, json!("invalid_argument")));
    step(t0, "Move and Remove");

    // Users: root by name, unknown names and malformed credentials.
    let as_root = a.fs_as(
        "MakeDir",
        &[("Authorization", &basic("root"))],
        br#"{"path": "r"}"#,
    );
    assert_eq!(
        as_root.json()["entry"]["path"],
        "/root/r",
        "{}",
        as_root.text()
    );
    let ghost = a.fs_as(
        "Stat",
        &[("Authorization", &basic("ghost"))],
        br#"{"path": "/"}"#,
    );
    assert_eq!(
        (ghost.status, ghost.json()),
        (
            401,
            json!({"code": "unauthenticated", "message": "invalid username: 'ghost'"})
        )
    );
    let bad_auth = a.fs_as(
        "Stat",
        &[("Authorization", "Basic !!")],
        br#"{"path": "/"}"#,
    );
    assert_eq!(code(&bad_auth), (401, json!("unauthenticated")));
    let files = |sbx: &Sandbox, query: &str| {
        let h = [
            ("E2b-Sandbox-Id", sbx.id.as_str()),
            ("E2b-Sandbox-Port", "49983"),
            ("X-Access-Token", a.token.as_str()),
        ];
        http(&proxy, "GET", &format!("/files?{query}"), &h, b"")
    };
    let ghost = files(&a, "path=/etc/hostname&username=ghost");
    assert_eq!(
        (ghost.status, ghost.json()),
        (
            401,
            json!({"code": 401, "message": "invalid username: 'ghost'"})
        )
    );
    let rel = files(
        &a,
        "path=work/../../user/work/../.profile-missing&username=user",
    );
    assert_eq!(rel.status, 404);
    assert_eq!(
        rel.json()["message"],
        "path '/home/user/.profile-missing' does not exist"
    );
    step(t0, "users");

    // Malformed bodies: envd's invalid_argument; other sandbox, wrong token: 401.
    for (method, body) in [
        ("Stat", &b"{\"path\": "[..]),
        ("Stat", b"{\"path\": 7}"),
        ("Stat", b"{\"path\": \"\"}"),
        ("Stat", b"{\"path\": \"/tmp/a\\u0000b\"}"),
        ("ListDir", b"{\"path\": \"/\", \"depth\": -1}"),
        ("ListDir", b"{\"path\": \"/\", \"depth\": \"deep\"}"),
        ("ListDir", b"{\"path\": \"/\", \"depth\": 1099511627776}"),
        ("Move", b"{\"source\": \"/tmp/link\"}"),
        ("Remove", b"[]"),
    ] {
        let r = a.fs_as(method, &[], body);
        assert_eq!(
            code(&r),
            (400, json!("invalid_argument")),
            "{method} {}: {}",
            String::from_utf8_lossy(body),
            r.text()
        );
        assert!(
            !r.text().contains(&*scratch.state.to_string_lossy()),
            "no host path"
        );
    }
    let other = Sandbox {
        proxy: &proxy,
        id: b.id.clone(),
        token: a.token.clone(),
    };
    let wrong = Sandbox {
        proxy: &proxy,
        id: a.id.clone(),
        token: "wrong".into(),
    };
    for (who, sbx) in [("A's token for B", &other), ("a wrong token", &wrong)] {
        for method in ["Stat", "ListDir", "MakeDir", "Move", "Remove"] {
            let r = sbx.fs(
                method,
                json!({"path": "/tmp/b-owned", "source": "/tmp/b-owned", "destination": "/x"}),
            );
            assert_eq!(r.status, 401, "{who} {method}");
            assert_eq!(r.json(), json!({"code": 401, "message": ENVD_UNAUTHORIZED}));
        }
    }
    let get = files(&b, "path=/etc/passwd");
    assert_eq!(get.status, 401, "A's token reads nothing of B's");
    // B answers, and has neither A's user nor anything A's token tried to make.
    assert_eq!(
        b.sh("grep -c ^user: /etc/passwd; ls /x /tmp/b-owned 2>&1 | wc -l"),
        "0\n2\n"
    );
    let st = b.fs("Stat", json!({"path": "/home/user"}));
    assert_eq!(code(&st), (404, json!("not_found")), "B has no /home/user");
    step(t0, "bad input refused; B untouched");
}
