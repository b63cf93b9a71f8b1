//! QEMU child processes that cannot outlive us, and per-VM scratch directories
//! that do not outlive their VM.
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{self, Sender};
use std::sync::{Mutex, OnceLock};

type SpawnRequest = (Command, Sender<std::io::Result<Child>>);

/// Spawns `cmd` so that it gets SIGKILL when this process dies, however it
/// dies (even SIGKILL, where no Drop runs).
///
/// PR_SET_PDEATHSIG fires when the *thread* that forked the child exits, not
/// the process. VMs are often created on short-lived threads (a test, a
/// request handler), so every fork happens on one spawner thread that lives
/// as long as the process.
pub(crate) fn spawn_supervised(mut cmd: Command) -> std::io::Result<Child> {
    static SPAWNER: OnceLock<Mutex<Sender<SpawnRequest>>> = OnceLock::new();
    let parent = std::process::id() as libc::pid_t;
    // SAFETY: the closure only calls async-signal-safe functions (prctl,
    // getppid, setpgid) between fork and exec.
    unsafe {
        cmd.pre_exec(move || {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            // The parent may have died before prctl took effect.
            if libc::getppid() != parent {
                libc::_exit(1);
            }
            // Own process group: a terminal's Ctrl-C goes to us, and we decide
            // how to tear the VM down (the CLI kills it and cleans up).
            libc::setpgid(0, 0);
            Ok(())
        });
    }
    let spawner = SPAWNER.get_or_init(|| {
        let (tx, rx) = mpsc::channel::<SpawnRequest>();
        std::thread::Builder::new()
            .name("zygote-qemu-spawner".into())
            .spawn(move || {
                for (mut cmd, reply) in rx {
                    let _ = reply.send(cmd.spawn());
                }
            })
            .expect("cannot start the QEMU spawner thread");
        Mutex::new(tx)
    });
    let (reply_tx, reply_rx) = mpsc::channel();
    spawner
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .send((cmd, reply_tx))
        .map_err(|_| std::io::Error::other("QEMU spawner thread is gone"))?;
    reply_rx
        .recv()
        .map_err(|_| std::io::Error::other("QEMU spawner thread is gone"))?
}

const WORKDIR_PREFIX: &str = "zygote-qemu-";

/// A fresh scratch directory `<tmp>/zygote-qemu-<pid>-<n>` for one VM.
/// Directories left by processes that no longer exist (killed before their
/// Drop ran) are removed first.
pub(crate) fn make_workdir() -> std::io::Result<PathBuf> {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let base = std::env::temp_dir();
    remove_stale_workdirs(&base);
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    let dir = base.join(format!("{WORKDIR_PREFIX}{}-{n}", std::process::id()));
    std::fs::create_dir(&dir)?;
    Ok(dir)
}

fn remove_stale_workdirs(base: &Path) {
    let Ok(entries) = std::fs::read_dir(base) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(rest) = name.to_str().and_then(|n| n.strip_prefix(WORKDIR_PREFIX)) else {
            continue;
        };
        let Some(pid) = rest.split('-').next().and_then(|p| p.parse::<u32>().ok()) else {
            continue;
        };
        if !Path::new(&format!("/proc/{pid}")).exists() {
            tracing::debug!("removing stale VM directory {}", entry.path().display());
            let _ = std::fs::remove_dir_all(entry.path());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn supervised_child_runs_in_its_own_group() {
        let mut cmd = Command::new("sh");
        cmd.args(["-c", "ps -o pgid= -p $$"]);
        cmd.stdout(std::process::Stdio::piped());
        let child = spawn_supervised(cmd).unwrap();
        let pid = child.id();
        let out = child.wait_with_output().unwrap();
        let pgid: u32 = String::from_utf8_lossy(&out.stdout).trim().parse().unwrap();
        assert_eq!(pgid, pid);
    }

    #[test]
    fn stale_workdirs_are_removed() {
        let base = std::env::temp_dir();
        // pid 0 never names a live process in /proc.
        let stale = base.join(format!("{WORKDIR_PREFIX}0-99"));
        std::fs::create_dir_all(stale.join("x")).unwrap();
        let dir = make_workdir().unwrap();
        assert!(!stale.exists());
        assert!(dir.is_dir());
        // Our own directories survive: we are alive.
        remove_stale_workdirs(&base);
        assert!(dir.is_dir());
        std::fs::remove_dir_all(dir).unwrap();
    }
}
