//! Interactive terminals end to end: a shell over the WebSocket route, its echo and
//! output, the terminal size and resizes, Ctrl-C, exit codes, the HTTP errors before
//! an upgrade, and a client that disconnects leaving nothing behind in the guest.
use std::time::Duration;

use zygote_daemon::client::Client;
use zygote_daemon::pty_client::{self, PtyEvent, PtyOptions, PtyReader, PtyWriter};

use super::common::{eventually, sh};

/// How long the guest (TCG here) may take to show something.
const PATIENCE: Duration = Duration::from_secs(60);

struct Term {
    w: PtyWriter,
    r: PtyReader,
    seen: Vec<u8>,
}

fn options(cmd: &[&str]) -> PtyOptions {
    PtyOptions {
        cols: 80,
        rows: 24,
        cmd: cmd.iter().map(|s| s.to_string()).collect(),
        env: vec![("PS1".into(), "$ ".into())],
        cwd: None,
    }
}

impl Term {
    async fn open(c: &Client, id: &str, opts: &PtyOptions) -> Term {
        let (w, r) = pty_client::open(c, id, opts)
            .await
            .unwrap_or_else(|e| panic!("pty in {id}: {e}"));
        Term {
            w,
            r,
            seen: Vec::new(),
        }
    }

    fn text(&self) -> String {
        String::from_utf8_lossy(&self.seen).into_owned()
    }

    async fn next(&mut self) -> PtyEvent {
        match tokio::time::timeout(PATIENCE, self.r.next()).await {
            Ok(ev) => ev.expect("pty event"),
            Err(_) => panic!(
                "no pty event in {PATIENCE:?}; output so far {:?}",
                self.text()
            ),
        }
    }

    /// Reads until the output holds `needle` (anywhere since the last `expect`), and
    /// forgets what came before it.
    async fn expect(&mut self, needle: &str) {
        loop {
            if let Some(at) = self.text().find(needle) {
                let keep = self.text().as_bytes()[at + needle.len()..].to_vec();
                self.seen = keep;
                return;
            }
            match self.next().await {
                PtyEvent::Output(data) => self.seen.extend_from_slice(&data),
                other => panic!(
                    "{other:?} while waiting for {needle:?} in {:?}",
                    self.text()
                ),
            }
        }
    }

    /// Reads (keeping the output) to the next error message; its code.
    async fn refusal(&mut self) -> String {
        loop {
            match self.next().await {
                PtyEvent::Output(data) => self.seen.extend_from_slice(&data),
                PtyEvent::Error { code, .. } => return code,
                other => panic!("{other:?} instead of an error message"),
            }
        }
    }

    async fn input(&mut self, data: &[u8]) {
        self.w.input(data).await.expect("pty input");
    }

    /// Reads to the exit event and the close after it.
    async fn exit(&mut self) -> (Option<i32>, Option<i32>) {
        loop {
            match self.next().await {
                PtyEvent::Output(data) => self.seen.extend_from_slice(&data),
                PtyEvent::Exit { exit_code, signal } => {
                    assert_eq!(self.next().await, PtyEvent::Closed, "close after exit");
                    return (exit_code, signal);
                }
                other => panic!("{other:?} before the exit; output {:?}", self.text()),
            }
        }
    }
}

/// What `check` runs in sandbox `id` (created with envs TASK=parent and the secret
/// API_TOKEN): `url` is the daemon's, for a client without the token.
pub async fn check(c: &Client, url: &str, id: &str) {
    let mut t = Term::open(c, id, &options(&["sh"])).await;
    t.input(b"echo hi-$((40+2)); tty; echo \"env:$TASK:$API_TOKEN:$TERM\"\n")
        .await;
    t.expect("hi-42").await;
    t.expect("/dev/pts/").await;
    t.expect("env:parent:t0k3n-never-shown:xterm-256color")
        .await;

    t.input(b"stty size\n").await;
    t.expect("24 80").await;
    t.w.resize(132, 50).await.unwrap();
    t.input(b"stty size\n").await;
    t.expect("50 132").await;
    // A bad size is refused with an error message; nothing changes, the session goes on.
    for (cols, rows) in [(0, 10), (10, 0), (1001, 10)] {
        t.w.resize(cols, rows).await.unwrap();
        assert_eq!(t.refusal().await, "invalid_argument", "{cols}x{rows}");
    }
    t.w.send_text("{\"type\":\"bogus\"}".into()).await.unwrap();
    assert_eq!(t.refusal().await, "invalid_argument");
    t.input(b"stty size\n").await;
    t.expect("50 132").await;

    // Ctrl-C reaches the foreground program through the terminal, not the shell.
    // The output (not the echo of the typed line) says the shell runs the command.
    t.input(b"echo sl''eeping; sleep 100\n").await;
    t.expect("sleeping\r\n").await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    t.input(&[0x03]).await;
    t.input(b"echo status=$?\n").await;
    t.expect("status=130").await;
    t.input(b"exit 3\n").await;
    assert_eq!(t.exit().await, (Some(3), None));

    // Without cmd: the guest user's login shell.
    let mut t = Term::open(c, id, &options(&[])).await;
    t.input(b"echo login-$((6*7)); exit\n").await;
    t.expect("login-42").await;
    assert_eq!(t.exit().await, (Some(0), None));

    check_errors(c, url, id).await;
    check_disconnect(c, id).await;
}

async fn check_errors(c: &Client, url: &str, id: &str) {
    let refused = |opts: PtyOptions, client: Client, sandbox: String| async move {
        match pty_client::open(&client, &sandbox, &opts).await {
            Ok(_) => panic!("a pty opened in {sandbox} with {opts:?}"),
            Err(e) => e,
        }
    };
    let anonymous = Client::new(url, None).unwrap();
    let e = refused(options(&["sh"]), anonymous, id.into()).await;
    assert_eq!(e.code(), Some("unauthorized"), "{e}");
    let e = refused(options(&["sh"]), c.clone(), "no-such-sandbox".into()).await;
    assert_eq!(e.code(), Some("not_found"), "{e}");
    for (cols, rows) in [(0, 24), (80, 0), (1001, 24), (80, 5000)] {
        let opts = PtyOptions {
            cols,
            rows,
            ..options(&["sh"])
        };
        let e = refused(opts, c.clone(), id.into()).await;
        assert_eq!(e.code(), Some("invalid_argument"), "{cols}x{rows}: {e}");
    }
    let e = refused(options(&["/no/such/program"]), c.clone(), id.into()).await;
    assert_eq!(e.code(), Some("guest_spawn_failed"), "{e}");
    // A plain GET (no upgrade) is a clean 400, not a hang or a 5xx.
    let e = c
        .raw(
            hyper::Method::GET,
            &format!("/v1/sandboxes/{id}/pty?cols=80&rows=24"),
            None,
        )
        .await
        .unwrap_err();
    assert_eq!(e.code(), Some("invalid_argument"), "{e}");
}

/// The marker programs a disconnecting client leaves running in the guest.
async fn leftovers(c: &Client, id: &str) -> String {
    sh(
        c,
        id,
        "for p in /proc/[0-9]*; do tr '\\0' ' ' < $p/cmdline 2>/dev/null; echo; done \
         | grep -E 'sleep 424[23]' || true",
    )
    .await
    .unwrap()
}

async fn check_disconnect(c: &Client, id: &str) {
    let mut t = Term::open(c, id, &options(&["sh"])).await;
    // A background job that ignores SIGHUP (its own process group under job
    // control) and a foreground one.
    t.input(b"trap '' HUP; sleep 4242 & echo started\n").await;
    t.expect("started").await;
    t.input(b"sleep 4243\n").await;
    t.expect("sleep 4243").await;
    // The echo of the typed line comes before the shell starts the command: wait for
    // both to run (a loaded machine takes a while).
    let both = eventually(Duration::from_secs(30), async || {
        let running = leftovers(c, id).await;
        (running.contains("sleep 4242") && running.contains("sleep 4243")).then_some(())
    })
    .await;
    assert!(both.is_some(), "{:?}", leftovers(c, id).await);
    drop(t);
    let gone = eventually(Duration::from_secs(30), async || {
        leftovers(c, id).await.trim().is_empty().then_some(())
    })
    .await;
    assert!(gone.is_some(), "left behind: {:?}", leftovers(c, id).await);
}
