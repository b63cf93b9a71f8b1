//! `zygote shell` against a real daemon (qemu runtime) and guest: with piped stdin
//! (no terminal: input forwarded, its end is end of file, the exit code comes back)
//! and under a pseudo-terminal driven by Python's `pty` module (raw mode: Ctrl-C
//! reaches the guest; the window size follows SIGWINCH; the local terminal's mode
//! is the same afterwards).
use std::io::{BufRead, BufReader, Write};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use serde_json::json;
use zygote_api::client::{block_on, Client, Method};
use zygote_api::model::SandboxList;

fn skip(why: &str) {
    let _ = writeln!(std::io::stderr(), "skipping zygote shell tests: {why}");
}

fn have(program: &str) -> bool {
    Command::new("sh")
        .args(["-c", &format!("command -v {program}")])
        .stdout(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

struct Daemon {
    child: Child,
    url: String,
    token: String,
    state: std::path::PathBuf,
}

impl Drop for Daemon {
    fn drop(&mut self) {
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        let _ = self.child.wait();
        // SIGTERM leaves VMs running by design: a failed test must not leave its VM.
        let state = self.state.display().to_string();
        for entry in std::fs::read_dir("/proc").unwrap().flatten() {
            let Ok(pid) = entry.file_name().to_string_lossy().parse::<i32>() else {
                continue;
            };
            let cmdline = std::fs::read(entry.path().join("cmdline")).unwrap_or_default();
            if String::from_utf8_lossy(&cmdline).contains(&state) {
                unsafe { libc::kill(pid, libc::SIGKILL) };
            }
        }
    }
}

fn start_daemon(state: &std::path::Path) -> Daemon {
    let mut child = Command::new(env!("CARGO_BIN_EXE_zygote"))
        .args([
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--proxy-listen",
            "127.0.0.1:0",
        ])
        .args(["--runtime", "qemu", "--state-dir"])
        .arg(state)
        .env(
            "ZYGOTE_LOG",
            std::env::var("ZYGOTE_LOG").unwrap_or_else(|_| "warn".into()),
        )
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .spawn()
        .expect("zygote serve");
    let stdout = BufReader::new(child.stdout.take().unwrap());
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in stdout.lines().map_while(Result::ok) {
            if let Some(url) = line.strip_prefix("zygoted listening on ") {
                let _ = tx.send(url.to_string());
            }
        }
    });
    let url = rx
        .recv_timeout(Duration::from_secs(120))
        .expect("the daemon did not start");
    let token = std::fs::read_to_string(state.join("token"))
        .unwrap()
        .trim()
        .to_string();
    Daemon {
        child,
        url,
        token,
        state: state.to_path_buf(),
    }
}

/// `zygote shell ARGS`, killed if it runs for more than two minutes.
fn shell(d: &Daemon, args: &[&str]) -> Command {
    let mut cmd = Command::new("timeout");
    cmd.args(["120", env!("CARGO_BIN_EXE_zygote"), "shell"])
        .args(args)
        .env("ZYGOTE_URL", &d.url)
        .env("ZYGOTE_TOKEN", &d.token);
    cmd
}

/// Runs `zygote shell` with `input` on a pipe; (exit code, stdout).
fn piped(d: &Daemon, args: &[&str], input: &str) -> (i32, String) {
    let mut child = shell(d, args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(input.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    (out.status.code().expect("an exit code"), text)
}

/// Drives a program on a pty: sets the window size, then for each step waits for
/// its expected text and sends its input (or resizes). Prints what it saw.
const DRIVER: &str = r#"
import fcntl, json, os, pty, select, struct, sys, termios, time
steps = json.loads(sys.argv[1])
pid, fd = pty.fork()
if pid == 0:
    os.execvp(sys.argv[2], sys.argv[2:])
def size(cols, rows):
    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))
size(101, 33)
seen = b""
for expect, action in steps:
    end = time.time() + 90
    while expect.encode() not in seen:
        r, _, _ = select.select([fd], [], [], max(0, end - time.time()))
        if not r:
            sys.exit("timeout waiting for %r; saw %r" % (expect, seen))
        try:
            data = os.read(fd, 4096)
        except OSError:
            data = b""
        if not data:
            sys.exit("end of output waiting for %r; saw %r" % (expect, seen))
        seen += data
    seen = seen[seen.index(expect.encode()) + len(expect):]
    if isinstance(action, list):
        size(*action)
    elif action == "pause":
        time.sleep(1)
    elif action:
        os.write(fd, action.encode())
os.waitpid(pid, 0)
"#;

#[test]
fn shell_with_a_pipe_and_with_a_terminal() {
    if !have("qemu-system-x86_64") {
        return skip("qemu-system-x86_64 is not installed");
    }
    if !have("python3") {
        return skip("python3 (for the pseudo-terminal driver) is not installed");
    }
    // `zygote serve` runs the zygoted built beside it (`cargo test --workspace` builds it).
    let zygoted = std::path::Path::new(env!("CARGO_BIN_EXE_zygote")).with_file_name("zygoted");
    if !zygoted.is_file() {
        return skip("no zygoted beside zygote (`cargo build --release -p zygote-daemon`)");
    }
    zygote_images::build_kernel(&mut |l| eprintln!("    {l}")).expect("guest kernel");
    zygote_images::build_image("minimal", &mut |l| eprintln!("    {l}")).expect("image");
    let tmp = tempfile::tempdir().unwrap();
    let d = start_daemon(&tmp.path().join("state"));
    let c = Client::new(&d.url, Some(d.token.clone())).unwrap();
    let made: SandboxList = block_on(c.json(
        Method::POST,
        "/v1/sandboxes",
        Some(&json!({"image": "minimal"})),
    ))
    .expect("create");
    let id = made.sandboxes[0].id.clone();

    // Piped: the program's exit code; the end of input is end of file.
    let (code, out) = piped(&d, &[&id, "--", "sh"], "echo hi-$((6*7)); exit 7\n");
    assert_eq!(code, 7, "{out}");
    assert!(out.contains("hi-42"), "{out:?}");
    let (code, out) = piped(&d, &[&id, "--", "sh"], "echo bye-$((1+1))\n");
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("bye-2"), "{out:?}");
    let (code, _) = piped(&d, &["no-such-sandbox"], "");
    assert_eq!(code, 1, "an unknown sandbox is an error");

    // Under a terminal: raw mode, SIGWINCH, Ctrl-C, and the mode restored.
    let before = tmp.path().join("before");
    let after = tmp.path().join("after");
    let script = format!(
        "stty -g > {b}; echo ready; \"$ZYGOTE\" shell -e 'PS1=R> ' {id} -- sh; \
         echo \"rc=$?\"; stty -g > {a}; echo done",
        b = before.display(),
        a = after.display(),
    );
    let steps = json!([
        ["ready", null],
        ["R> ", "stty size\n"],
        ["33 101", null],
        ["R> ", [120, 40]],
        ["", "pause"],
        ["", "stty size\n"],
        ["40 120", null],
        ["R> ", "echo sl''eeping; sleep 100\n"],
        ["sleeping\r\n", "pause"],
        ["", "\u{3}"],
        ["", "echo st=$?\n"],
        ["st=130", null],
        ["R> ", "exit 5\n"],
        ["rc=5", null],
        ["done", null],
    ]);
    let out = Command::new("python3")
        .args(["-c", DRIVER, &steps.to_string(), "sh", "-c", &script])
        .env("ZYGOTE", env!("CARGO_BIN_EXE_zygote"))
        .env("ZYGOTE_URL", &d.url)
        .env("ZYGOTE_TOKEN", &d.token)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "pty driver: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let (b, a) = (
        std::fs::read_to_string(&before).unwrap(),
        std::fs::read_to_string(&after).unwrap(),
    );
    assert!(!b.trim().is_empty());
    assert_eq!(b, a, "the terminal's mode was not restored");

    block_on(c.raw(Method::DELETE, &format!("/v1/sandboxes/{id}"), None)).expect("delete");
}
