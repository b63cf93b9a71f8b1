//! `zygote exec --detach` and `zygote process` against a real daemon (`zygote serve`,
//! qemu runtime) and a real Linux guest: start in the background, list, feed stdin,
//! follow to the exit code, kill, and the errors a user sees; `create -n` with progress.
use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Child, Command, Output, Stdio};

struct Daemon {
    child: Child,
    url: String,
    state: tempfile::TempDir,
}

impl Drop for Daemon {
    fn drop(&mut self) {
        // Sandboxes first (their VMs outlive a daemon by design), then the daemon.
        let ps = zygote(self, &["ps", "--json"]);
        if let Ok(v) = serde_json::from_slice::<serde_json::Value>(&ps.stdout) {
            for s in v["sandboxes"].as_array().into_iter().flatten() {
                zygote(self, &["rm", s["id"].as_str().unwrap_or_default()]);
            }
        }
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        let _ = self.child.wait();
    }
}

fn start_daemon() -> Daemon {
    let state = tempfile::tempdir().unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_zygote"))
        .args(["serve", "--runtime", "qemu", "--listen", "127.0.0.1:0"])
        .args(["--proxy-listen", "none", "--state-dir"])
        .arg(state.path())
        .env("ZYGOTE_LOG", "warn")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .spawn()
        .expect("zygote serve");
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let url = lines
        .by_ref()
        .map_while(Result::ok)
        .find_map(|l| l.strip_prefix("zygoted listening on ").map(str::to_string))
        .expect("the daemon says where it listens");
    std::thread::spawn(move || lines.for_each(drop));
    Daemon { child, url, state }
}

fn command(d: &Daemon, args: &[&str]) -> Command {
    let token = std::fs::read_to_string(d.state.path().join("token")).unwrap();
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_zygote"));
    cmd.args(args)
        .env("ZYGOTE_URL", &d.url)
        .env("ZYGOTE_TOKEN", token.trim());
    cmd
}

fn zygote(d: &Daemon, args: &[&str]) -> Output {
    command(d, args).stdin(Stdio::null()).output().unwrap()
}

/// Runs `args`, which must succeed; its stdout.
fn ok(d: &Daemon, args: &[&str]) -> String {
    let out = zygote(d, args);
    assert!(
        out.status.success(),
        "zygote {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

fn qemu_or_skip() -> bool {
    let found = std::env::var_os("PATH").is_some_and(|p| {
        std::env::split_paths(&p).any(|d| Path::new(&d).join("qemu-system-x86_64").exists())
    });
    if !found {
        eprintln!("SKIP: qemu-system-x86_64 is not installed (the qemu runtime needs it)");
    }
    // `zygote serve` runs the zygoted built beside it (`cargo test --workspace` builds it).
    let zygoted = Path::new(env!("CARGO_BIN_EXE_zygote")).with_file_name("zygoted");
    if found && !zygoted.is_file() {
        eprintln!(
            "SKIP: no {} (`cargo build --release -p zygote-daemon`)",
            zygoted.display()
        );
        return false;
    }
    found
}

#[test]
fn detached_processes_through_the_cli() {
    if !qemu_or_skip() {
        return;
    }
    // This checkout's image (with this checkout's agent), by digest: "minimal" is the
    // newest build of that name, which another checkout sharing the cache may have made.
    let image = zygote_images::build_image("minimal", &mut |l| eprintln!("    {l}"))
        .expect("the minimal image");
    let d = start_daemon();
    let made: serde_json::Value =
        serde_json::from_str(&ok(&d, &["create", "--image", &image.sha256, "--json"])).unwrap();
    let id = made["sandboxes"][0]["id"].as_str().unwrap().to_string();

    let script = "echo ready; while read l; do echo \"got $l\"; done; exit 5";
    let pid = ok(&d, &["exec", "-d", &id, "--", "sh", "-c", script]);
    let pid = pid.trim();
    assert!(
        pid.parse::<u32>().is_ok(),
        "exec -d prints the pid: {pid:?}"
    );
    let listed = ok(&d, &["process", "ls", &id]);
    assert!(
        listed
            .lines()
            .any(|l| l.starts_with(pid) && l.contains("running")),
        "{listed}"
    );

    let mut feed = command(&d, &["proc", "stdin", &id, pid, "--eof"])
        .stdin(Stdio::piped())
        .spawn()
        .unwrap();
    feed.stdin.take().unwrap().write_all(b"one\ntwo\n").unwrap();
    assert!(feed.wait().unwrap().success());
    let followed = zygote(&d, &["process", "logs", "-f", &id, pid]);
    assert_eq!(
        String::from_utf8_lossy(&followed.stdout),
        "ready\ngot one\ngot two\n"
    );
    assert_eq!(
        followed.status.code(),
        Some(5),
        "logs -f exits with its code"
    );
    let tail = ok(&d, &["process", "logs", "--offset", "6", &id, pid]);
    assert_eq!(tail, "got one\ngot two\n");

    let sleeper = ok(&d, &["exec", "--detach", &id, "--", "sleep", "1000"]);
    let sleeper = sleeper.trim();
    ok(&d, &["process", "kill", "-s", "TERM", &id, sleeper]);
    let ended = zygote(&d, &["process", "logs", "-f", &id, sleeper]);
    assert_eq!(ended.status.code(), Some(128 + 15), "killed by SIGTERM");

    // A fan-out streams: a line per sandbox as it runs (stderr), then the table.
    let fan = zygote(
        &d,
        &[
            "create",
            "-n",
            "2",
            "--image",
            &image.sha256,
            "--mem-mib",
            "128",
        ],
    );
    let (out, err) = (
        String::from_utf8_lossy(&fan.stdout),
        String::from_utf8_lossy(&fan.stderr),
    );
    assert!(fan.status.success(), "create -n 2: {err}");
    assert!(err.contains("2 sandboxes recorded after"), "{err}");
    for k in 1..=2 {
        assert!(
            err.lines()
                .any(|l| l.starts_with(&format!("sandboxes {k}/2: sb-"))
                    && l.contains("running after")),
            "{err}"
        );
    }
    let rows: Vec<&str> = out.lines().skip(1).collect();
    assert_eq!(rows.len(), 2, "{out}");
    assert!(rows.iter().all(|r| r.contains("running")), "{out}");
    for r in rows {
        let fid = r.split_whitespace().next().unwrap();
        ok(&d, &["rm", fid]);
    }

    // What a user gets wrong is said plainly, with a failing exit status.
    for (args, needle) in [
        (vec!["process", "kill", &id, sleeper], "process_exited"),
        (
            vec!["process", "kill", "-s", "NOPE", &id, pid],
            "unknown signal",
        ),
        (
            vec!["process", "logs", &id, "999999"],
            "no background process",
        ),
    ] {
        let out = zygote(&d, &args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?}");
        assert!(err.contains(needle), "{args:?}: {err}");
    }
}
