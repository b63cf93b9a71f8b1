//! Sandboxes from OCI images, end to end on the qemu runtime: an image made by umoci
//! (a static busybox and a tree that exercises whiteouts, an opaque directory, a hard
//! link, a symlink, a FIFO, owners and modes) pushed by skopeo to Debian's
//! docker-registry on 127.0.0.1, pulled by the daemon (on first use, and through
//! `POST /v1/images` with credentials), booted, and checked from inside the guest: the
//! tree exactly, the image's Env/WorkingDir/User for execs, branch and snapshot. Skips,
//! saying why, without the tools.
#[path = "../../oci/tests/common/mod.rs"]
mod oci_fixture;

mod common;

use std::path::Path;

use hyper::Method;
use serde_json::{json, Value};
use zygote_daemon::client::Client;
use zygote_daemon::model::{BuildEvent, ImageList, SandboxList, Snapshot};

use common::{start_daemon_with_env, step, Cleanup};
use oci_fixture::{build_layout, push, Auth, Config, Entry, Format, ImageSpec, Registry};

/// The guest's tree under /data, as `listing` prints it.
const EXPECTED_DATA: &str = "\
/data|directory|755|0:0|3
/data/cache|directory|755|0:0|2
/data/cache/c|regular file|644|0:0|1
/data/current|symbolic link|777|0:0|1
/data/fifo|fifo|644|0:0|1
/data/late|regular file|644|0:0|1
/data/owned|regular file|640|1000:1000|1
/data/replaced|regular file|644|0:0|1
/data/suid|regular file|4755|0:0|1
/data/tool|regular file|755|0:0|2
/data/tool-link|regular file|755|0:0|2
";

/// Every path under /data with its type, mode, owner and link count, sorted.
const LISTING: &str =
    "find /data | sort | while read -r p; do stat -c '%n|%F|%a|%u:%g|%h' \"$p\"; done";

fn spec() -> ImageSpec {
    let busybox = std::fs::read("/bin/busybox").expect("busybox-static");
    let mut base = vec![
        Entry::dir("bin"),
        Entry::file("bin/busybox", busybox).mode(0o755),
        Entry::dir("etc"),
        Entry::file(
            "etc/passwd",
            "root:x:0:0:root:/root:/bin/sh\napp:x:1000:1000::/app:/bin/sh\n",
        ),
        Entry::file("etc/group", "root:x:0:\napp:x:1000:\n"),
        Entry::dir("app").owner(1000, 1000),
        Entry::dir("data"),
        Entry::file("data/old.txt", "old\n"),
        Entry::dir("data/cache"),
        Entry::file("data/cache/a", "a\n"),
        Entry::file("data/cache/b", "b\n"),
        Entry::dir("data/replaced"),
        Entry::file("data/replaced/inner", "x\n"),
        Entry::file("data/tool", "#!tool\n").mode(0o755),
    ];
    for applet in [
        "sh", "ls", "find", "stat", "id", "pwd", "cat", "echo", "sort", "test",
    ] {
        base.push(Entry::symlink(&format!("bin/{applet}"), "busybox"));
    }
    let changes = vec![
        Entry::Whiteout("data/old.txt".into()),
        Entry::Opaque("data/cache".into()),
        Entry::file("data/cache/c", "c\n"),
        Entry::hardlink("data/tool-link", "data/tool"),
        Entry::symlink("data/current", "cache"),
        Entry::file("data/owned", "mine\n")
            .mode(0o640)
            .owner(1000, 1000),
        Entry::file("data/suid", "s\n").mode(0o4755),
        Entry::Fifo {
            path: "data/fifo".into(),
        },
        Entry::file("data/replaced", "now a file\n"),
    ];
    let top = vec![Entry::file("data/late", "late\n")];
    ImageSpec {
        layers: vec![base, changes, top],
        config: Config {
            env: vec!["PATH=/bin".into(), "GREETING=hello world".into()],
            working_dir: Some("/app".into()),
            user: Some("app".into()),
            entrypoint: vec!["/bin/sh".into()],
            cmd: vec![],
        },
        arch: "amd64".into(),
    }
}

/// Why this machine cannot run the suite, if it cannot.
fn unavailable() -> Option<String> {
    // htpasswd: the registry with Basic auth (apache2-utils).
    for tool in [
        "docker-registry",
        "skopeo",
        "umoci",
        "qemu-system-x86_64",
        "htpasswd",
    ] {
        if oci_fixture::which(tool).is_none() {
            return Some(format!("`{tool}` is not installed (scripts/setup.sh)"));
        }
    }
    (!Path::new("/bin/busybox").is_file()).then(|| "no /bin/busybox (busybox-static)".into())
}

async fn sh(c: &Client, id: &str, script: &str, extra: Value) -> Value {
    let mut body = json!({"argv": ["sh", "-c", script]});
    for (k, v) in extra.as_object().into_iter().flatten() {
        body[k] = v.clone();
    }
    c.json(
        Method::POST,
        &format!("/v1/sandboxes/{id}/exec"),
        Some(&body),
    )
    .await
    .unwrap_or_else(|e| panic!("exec {script}: {e}"))
}

async fn stdout(c: &Client, id: &str, script: &str, extra: Value) -> String {
    let r = sh(c, id, script, extra).await;
    assert_eq!(r["exit_code"], 0, "{script}: {r}");
    r["stdout"].as_str().unwrap_or_default().to_string()
}

/// The tree and the run config, as the image says, inside sandbox `id`.
async fn check_guest(c: &Client, id: &str) {
    assert_eq!(stdout(c, id, LISTING, json!({})).await, EXPECTED_DATA);
    assert_eq!(
        stdout(c, id, "cat /data/tool-link /data/late", json!({})).await,
        "#!tool\nlate\n"
    );
    let who = "pwd; id -u; id -g; echo \"$GREETING\"";
    assert_eq!(
        stdout(c, id, who, json!({})).await,
        "/app\n1000\n1000\nhello world\n"
    );
    let root = stdout(
        c,
        id,
        who,
        json!({"user": "root", "cwd": "/", "env": {"GREETING": "hi"}}),
    );
    assert_eq!(root.await, "/\n0\n0\nhi\n");
    // The image's user cannot write what is root's alone.
    let r = sh(c, id, "echo w > /data/tool", json!({})).await;
    assert_ne!(r["exit_code"], 0, "{r}");
}

/// A cache of its own for the daemon (the pulled test images stay out of the user's),
/// sharing the built guest kernel.
fn private_cache(tmp: &Path) -> std::path::PathBuf {
    let cache = tmp.join("cache");
    std::fs::create_dir_all(&cache).unwrap();
    let kernel = zygote_images::build_kernel(&mut |l| eprintln!("    {l}")).expect("guest kernel");
    let kernels = kernel.vmlinux.parent().unwrap().parent().unwrap();
    std::os::unix::fs::symlink(kernels, cache.join("kernel")).unwrap();
    cache
}

async fn pull_events(c: &Client, body: Value) -> Vec<BuildEvent> {
    let mut events = Vec::new();
    c.ndjson(Method::POST, "/v1/images", Some(&body), |e: BuildEvent| {
        events.push(e)
    })
    .await
    .expect("the pull stream");
    events
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sandboxes_from_oci_images_on_qemu() {
    if let Some(why) = unavailable() {
        eprintln!("skipping the OCI image suite: {why}");
        return;
    }
    let t0 = std::time::Instant::now();
    let open = Registry::start(Auth::None).expect("a registry");
    let private = Registry::start(Auth::basic("ci", "pw")).expect("a registry with auth");
    let tmp = tempfile::tempdir().unwrap();
    let layout = build_layout(&spec(), &tmp.path().join("layout"), "v1").expect("the image");
    let digest = push(&layout, &open, "team/app:v1", Format::Oci).unwrap();
    push(&layout, &private, "team/app:v1", Format::Docker).unwrap();
    let open_ref = format!("{}/team/app:v1", open.host());
    let private_ref = format!("{}/team/app:v1", private.host());
    step(
        t0,
        "image pushed to an open and a password-protected registry",
    );

    let cache = private_cache(tmp.path());
    let docker_config = tmp.path().join("docker");
    std::fs::create_dir_all(&docker_config).unwrap();
    let state = tmp.path().join("state");
    let cleanup = Cleanup {
        state: state.clone(),
        cgroups: Default::default(),
    };
    let env = [
        ("ZYGOTE_CACHE_DIR", cache.to_str().unwrap()),
        ("DOCKER_CONFIG", docker_config.to_str().unwrap()),
    ];
    let d = start_daemon_with_env(
        &state,
        &["--listen", "127.0.0.1:0", "--runtime", "qemu"],
        &env,
    );
    let c = d.client();

    // Pulled on first use.
    let made: SandboxList = c
        .json(
            Method::POST,
            "/v1/sandboxes",
            Some(&json!({"image": open_ref})),
        )
        .await
        .expect("create from a reference");
    let a = made.sandboxes[0].clone();
    step(
        t0,
        &format!("created {} from {open_ref} (pulled on first use)", a.id),
    );
    check_guest(&c, &a.id).await;
    step(
        t0,
        "the guest sees the image's tree exactly; execs get its Env, WorkingDir and User",
    );
    let list: ImageList = c
        .json(Method::GET, "/v1/images", None::<&()>)
        .await
        .unwrap();
    let listed = list
        .images
        .iter()
        .find(|i| i.name == open_ref)
        .expect("listed");
    assert_eq!(listed.digest.as_deref(), Some(digest.as_str()));
    assert_eq!(listed.source.as_deref(), Some(open_ref.as_str()));

    // Branch and snapshot behave as for built-in images.
    let branch: Value = c
        .json(
            Method::POST,
            &format!("/v1/sandboxes/{}/branch", a.id),
            Some(&json!({"count": 1})),
        )
        .await
        .expect("branch");
    let child = branch["children"][0].as_str().unwrap().to_string();
    check_guest(&c, &child).await;
    let snap: Snapshot = c
        .json(
            Method::POST,
            "/v1/snapshots",
            Some(&json!({"sandbox": a.id})),
        )
        .await
        .expect("snapshot");
    let restored: SandboxList = c
        .json(
            Method::POST,
            "/v1/sandboxes",
            Some(&json!({"snapshot": snap.id})),
        )
        .await
        .expect("create from the snapshot");
    check_guest(&c, &restored.sandboxes[0].id).await;
    step(
        t0,
        "a branch child and a sandbox from a snapshot keep the tree and the run config",
    );

    // A private registry: refused without credentials, pulled with them.
    let e = c
        .json::<SandboxList>(
            Method::POST,
            "/v1/sandboxes",
            Some(&json!({"image": private_ref})),
        )
        .await
        .unwrap_err();
    assert_eq!(e.code(), Some("registry_unauthorized"), "{e}");
    let events = pull_events(
        &c,
        json!({"reference": private_ref, "username": "ci", "password": "nope"}),
    )
    .await;
    assert!(
        matches!(events.last(), Some(BuildEvent::Error { code, .. }) if code == "registry_unauthorized"),
        "{events:?}"
    );
    let events = pull_events(
        &c,
        json!({"reference": private_ref, "username": "ci", "password": "pw"}),
    )
    .await;
    assert!(
        events
            .iter()
            .any(|e| matches!(e, BuildEvent::Resolved { layers: 3, .. })),
        "{events:?}"
    );
    let Some(BuildEvent::Done { image }) = events.last() else {
        panic!("{events:?}")
    };
    assert_eq!(image.name, private_ref);
    let made: SandboxList = c
        .json(
            Method::POST,
            "/v1/sandboxes",
            Some(&json!({"image": private_ref})),
        )
        .await
        .expect("create from the pulled private image");
    check_guest(&c, &made.sandboxes[0].id).await;
    step(
        t0,
        "a private registry: 403 without credentials, pulled with them",
    );

    // Bad input: clear errors, nothing made.
    let before: SandboxList = c
        .json(Method::GET, "/v1/sandboxes", None::<&()>)
        .await
        .unwrap();
    for (body, code) in [
        (json!({"reference": "Not A Reference"}), "invalid_argument"),
        (
            json!({"reference": open_ref, "username": "x"}),
            "invalid_argument",
        ),
    ] {
        let e = c
            .json::<Value>(Method::POST, "/v1/images", Some(&body))
            .await
            .unwrap_err();
        assert_eq!(e.code(), Some(code), "{body}: {e}");
    }
    let events = pull_events(
        &c,
        json!({"reference": format!("{}/team/missing:1", open.host())}),
    )
    .await;
    assert!(
        matches!(events.last(), Some(BuildEvent::Error { code, .. }) if code == "image_not_found"),
        "{events:?}"
    );
    let closed = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let e = c
        .json::<SandboxList>(
            Method::POST,
            "/v1/sandboxes",
            Some(&json!({"image": format!("{closed}/x/y:1")})),
        )
        .await
        .unwrap_err();
    assert_eq!(e.code(), Some("registry_error"), "{e}");
    let e = c
        .json::<SandboxList>(
            Method::POST,
            "/v1/sandboxes",
            Some(&json!({"image": "no-such-recipe"})),
        )
        .await
        .unwrap_err();
    assert_eq!(e.code(), Some("not_found"), "{e}");
    let after: SandboxList = c
        .json(Method::GET, "/v1/sandboxes", None::<&()>)
        .await
        .unwrap();
    assert_eq!(after.sandboxes.len(), before.sandboxes.len());
    step(
        t0,
        "bad references, missing images and unreachable registries: clear errors, nothing made",
    );

    for s in after.sandboxes {
        c.raw(Method::DELETE, &format!("/v1/sandboxes/{}", s.id), None)
            .await
            .expect("delete");
    }
    drop(cleanup);
}
