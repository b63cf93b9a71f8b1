//! Shared set-up for zygoted tests: a daemon process on a private state
//! directory, a client for it, and clean-up that kills exactly the
//! processes this test started (by pid).
#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use zygote_daemon::client::Client;

pub struct Daemon {
    pub child: Child,
    pub url: String,
    pub state: PathBuf,
}

/// Starts `zygoted` with `args` on `state` and waits for its URL line. Its port proxy
/// gets a port of its own (`--proxy-listen 127.0.0.1:0`) unless `args` choose one:
/// tests run daemons side by side. [`proxy_url`] finds it.
pub fn start_daemon(state: &Path, args: &[&str]) -> Daemon {
    start_daemon_with_env(state, args, &[])
}

/// [`start_daemon`] with extra environment variables.
pub fn start_daemon_with_env(state: &Path, args: &[&str], env: &[(&str, &str)]) -> Daemon {
    let proxy: &[&str] = match args.contains(&"--proxy-listen") {
        true => &[],
        false => &["--proxy-listen", "127.0.0.1:0"],
    };
    let mut child = Command::new(env!("CARGO_BIN_EXE_zygoted"))
        .arg("--state-dir")
        .arg(state)
        .args(args)
        .args(proxy)
        .envs(env.iter().copied())
        // Quiet unless asked: libtest cannot capture a child process's output.
        .env(
            "ZYGOTE_LOG",
            std::env::var("ZYGOTE_LOG").unwrap_or_else(|_| "warn".into()),
        )
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("starting zygoted");
    let stdout = child.stdout.take().expect("piped stdout");
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if let Some(url) = line.strip_prefix("zygoted listening on ") {
                let _ = tx.send(url.to_string());
            }
        }
    });
    let url = match rx.recv_timeout(Duration::from_secs(120)) {
        Ok(url) => url,
        Err(_) => {
            let _ = child.kill();
            let status = child.wait();
            panic!("zygoted did not start: {status:?}");
        }
    };
    Daemon {
        child,
        url,
        state: state.to_path_buf(),
    }
}

impl Daemon {
    pub fn token(&self) -> String {
        std::fs::read_to_string(self.state.join("token"))
            .expect("token file")
            .trim()
            .to_string()
    }

    pub fn client(&self) -> Client {
        Client::new(&self.url, Some(self.token())).expect("client")
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// SIGKILL, no chance to clean up: what a crash looks like.
    pub fn kill9(mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        // SIGTERM: a graceful stop (VMs survive it by design).
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Pids of processes whose command line mentions `dir`: the VMs (and their
/// supervisors) a daemon on that state directory started.
pub fn processes_using(dir: &Path) -> Vec<u32> {
    let needle = dir.to_string_lossy().to_string();
    let me = std::process::id();
    let mut out = Vec::new();
    for e in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
            continue;
        };
        if pid == me {
            continue;
        }
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        let zombie = stat
            .rsplit_once(')')
            .is_some_and(|(_, r)| r.trim_start().starts_with('Z'));
        if !zombie && String::from_utf8_lossy(&cmdline).contains(&needle) {
            out.push(pid);
        }
    }
    out
}

/// Kills everything [`processes_using`] finds (by pid) and removes the
/// cgroups listed, so a failed test leaves nothing behind.
pub struct Cleanup {
    pub state: PathBuf,
    pub cgroups: std::sync::Mutex<Vec<PathBuf>>,
}

impl Drop for Cleanup {
    fn drop(&mut self) {
        for pid in processes_using(&self.state) {
            unsafe { libc::kill(pid as i32, libc::SIGKILL) };
        }
        std::thread::sleep(Duration::from_millis(200));
        for cg in self.cgroups.lock().unwrap().iter() {
            let _ = std::fs::remove_dir(cg);
        }
        // Network namespaces of sandboxes the test did not delete (their veth pairs go
        // with them now that no VM holds them).
        if let Ok(state) = self.state.canonicalize() {
            let prefix = zygote_daemon::network::netns_prefix_for(&state);
            for ns in zygote_daemon::network::host::netns_names() {
                if ns.starts_with(&prefix) {
                    zygote_daemon::network::host::remove(&ns, None);
                }
            }
        }
    }
}

/// Builds (or finds cached) the guest kernel and the `minimal` image for a test on the
/// qemu runtime; false, with "skipping {test}: ..." printed, when QEMU is not installed.
pub fn qemu_guest_ready(test: &str) -> bool {
    let on_path = std::env::var_os("PATH")
        .is_some_and(|p| std::env::split_paths(&p).any(|d| d.join("qemu-system-x86_64").exists()));
    if !on_path {
        let _ = std::io::Write::write_all(
            &mut std::io::stderr(),
            format!("skipping {test}: qemu-system-x86_64 is not on PATH, so no sandbox can boot\n")
                .as_bytes(),
        );
        return false;
    }
    zygote_images::build_kernel(&mut |l| eprintln!("    {l}")).expect("guest kernel");
    zygote_images::build_image("minimal", &mut |l| eprintln!("    {l}")).expect("minimal image");
    true
}

/// Blocks until `f` returns Some or `timeout` passes.
pub async fn eventually<T>(timeout: Duration, mut f: impl AsyncFnMut() -> Option<T>) -> Option<T> {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(v) = f().await {
            return Some(v);
        }
        if Instant::now() >= deadline {
            return None;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Files left under a directory (recursively), for "nothing left behind".
pub fn files_under(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let p = e.path();
        if p.is_dir() {
            out.extend(files_under(&p));
            out.push(p);
        } else {
            out.push(p);
        }
    }
    out
}

/// A timestamped progress line on stderr (libtest shows it with --nocapture).
pub fn step(t0: Instant, what: &str) {
    use std::io::Write;
    let _ = writeln!(
        std::io::stderr(),
        "[{:6.1}s] {what}",
        t0.elapsed().as_secs_f64()
    );
}

/// Runs `sh -c script` in a sandbox; its stdout, or why it failed or exited non-zero.
pub async fn sh(c: &Client, id: &str, script: &str) -> Result<String, String> {
    let r: zygote_daemon::model::ExecResponse = c
        .json(
            hyper::Method::POST,
            &format!("/v1/sandboxes/{id}/exec"),
            Some(&serde_json::json!({"argv": ["sh", "-c", script]})),
        )
        .await
        .map_err(|e| format!("exec in {id}: {e}"))?;
    if r.exit_code != Some(0) {
        return Err(format!(
            "exec in {id} exited {:?}: {}",
            r.exit_code, r.stderr
        ));
    }
    Ok(r.stdout)
}

/// The guest kernel and the `minimal` image, built (or found cached).
pub fn guest_assets() {
    zygote_images::build_kernel(&mut |l| eprintln!("    {l}")).expect("guest kernel");
    zygote_images::build_image("minimal", &mut |l| eprintln!("    {l}")).expect("minimal image");
}

/// A private daemon state directory, and the clean-up of what daemons on it start.
pub struct Scratch {
    pub state: PathBuf,
    pub cleanup: Cleanup,
    _dir: tempfile::TempDir,
}

impl Scratch {
    pub fn new() -> Scratch {
        let dir = tempfile::tempdir().unwrap();
        let state = dir.path().join("state");
        Scratch {
            cleanup: Cleanup {
                state: state.clone(),
                cgroups: Default::default(),
            },
            state,
            _dir: dir,
        }
    }
}

/// The daemon's port proxy (`http://127.0.0.1:<port>`, from `GET /v1/info`), if it runs.
pub async fn proxy_url(c: &Client) -> Option<String> {
    let info: serde_json::Value = c
        .json(hyper::Method::GET, "/v1/info", None::<&()>)
        .await
        .expect("GET /v1/info");
    info["proxy"]["url"].as_str().map(str::to_string)
}

/// A sandbox as the API shows it now.
pub async fn get(c: &Client, id: &str) -> zygote_daemon::model::Sandbox {
    c.json(
        hyper::Method::GET,
        &format!("/v1/sandboxes/{id}"),
        None::<&()>,
    )
    .await
    .unwrap_or_else(|e| panic!("GET {id}: {e}"))
}

/// `POST /v1/sandboxes` with `body`; the new sandboxes' cgroups go to `cleanup`.
pub async fn create(
    c: &Client,
    body: serde_json::Value,
    cleanup: &Cleanup,
) -> Vec<zygote_daemon::model::Sandbox> {
    let made: zygote_daemon::model::SandboxList = c
        .json(hyper::Method::POST, "/v1/sandboxes", Some(&body))
        .await
        .unwrap_or_else(|e| panic!("create {body}: {e}"));
    for sb in &made.sandboxes {
        if let Some(cg) = &sb.cgroup.path {
            cleanup.cgroups.lock().unwrap().push(cg.into());
        }
    }
    made.sandboxes
}

/// A tmpfs mounted by [`mount_tmpfs`], unmounted (lazily) on drop.
pub struct Mounted(pub PathBuf);

impl Drop for Mounted {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.0).status();
    }
}

/// A tmpfs of `size_mib` at `dir` (for a full disk on demand); Err (needs root) says why.
pub fn mount_tmpfs(dir: &Path, size_mib: u64) -> Result<Mounted, String> {
    std::fs::create_dir_all(dir).map_err(|e| e.to_string())?;
    let out = Command::new("mount")
        .args(["-t", "tmpfs", "-o"])
        .arg(format!("size={size_mib}m,mode=0700"))
        .arg("zygote-test")
        .arg(dir)
        .output()
        .map_err(|e| format!("mount: {e}"))?;
    if !out.status.success() {
        return Err(String::from_utf8_lossy(&out.stderr).trim().to_string());
    }
    Ok(Mounted(dir.to_path_buf()))
}

/// Free bytes for unprivileged writers on the filesystem holding `dir`.
pub fn free_bytes(dir: &Path) -> u64 {
    zygote_images::space::free_bytes(dir).expect("statvfs of a test directory")
}
