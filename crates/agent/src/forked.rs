//! The "you were forked" contract for guest userspace.
//!
//! A branch child or a restored snapshot wakes up as an exact copy of another
//! guest: same machine-id, same state in every process. The kernel side
//! (entropy, CRNG reseed, clock, hostname, network) is `system::reidentify`;
//! this module is what userspace can see and act on, done when the request
//! names the sandbox (`identity`), in this order, before the agent answers
//! (so before the daemon reports the sandbox ready):
//!
//! 1. `/etc/machine-id` gets a new random id (from the CRNG just reseeded).
//! 2. `/run/zygote/generation` goes up by one, written with a rename so a
//!    process watching the directory with inotify sees one `IN_MOVED_TO`.
//! 3. Every executable regular file in `/etc/zygote/forked.d/` runs, in name
//!    order, with `ZYGOTE_SANDBOX_ID`, `ZYGOTE_PARENT_ID`, `ZYGOTE_SNAPSHOT_ID`
//!    and `ZYGOTE_GENERATION` in its environment, stdin and stdout closed, at
//!    most [`HOOK_TIMEOUT`] each. Each outcome (exit code, the end of its
//!    stderr) is reported; a failing hook does not stop the next one.
use std::fs;
use std::io::{self, Read, Write};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use zygote_proto::{ErrorBody, ErrorCode, HookOutcome, ReidentifyReport, SandboxIdentity};

use crate::reaper::Reaper;

/// Longest a single hook may run before it is killed.
pub const HOOK_TIMEOUT: Duration = Duration::from_secs(10);
/// Most hooks run per reidentify (the rest are reported as skipped).
const MAX_HOOKS: usize = 64;
/// How much of a hook's stderr is kept.
const STDERR_TAIL: usize = 2048;
/// Longest id accepted (sandbox ids are short; this bounds the environment).
const MAX_ID_LEN: usize = 128;

/// Where the contract's files live; tests point it into a scratch directory.
#[derive(Debug, Clone)]
pub struct ForkPaths {
    pub machine_id: PathBuf,
    pub generation: PathBuf,
    pub hooks_dir: PathBuf,
}

impl Default for ForkPaths {
    fn default() -> Self {
        ForkPaths {
            machine_id: "/etc/machine-id".into(),
            generation: "/run/zygote/generation".into(),
            hooks_dir: "/etc/zygote/forked.d".into(),
        }
    }
}

/// Check the ids before anything changes (they end up in hooks' environment).
pub fn validate(id: &SandboxIdentity) -> Result<(), ErrorBody> {
    let ids = [
        Some(&id.sandbox_id),
        id.parent_id.as_ref(),
        id.snapshot_id.as_ref(),
    ];
    for s in ids.into_iter().flatten() {
        let ok = s
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
        if s.is_empty() || s.len() > MAX_ID_LEN || !ok {
            return Err(ErrorBody::new(
                ErrorCode::BadRequest,
                format!("invalid sandbox/parent/snapshot id {s:?}"),
            ));
        }
    }
    Ok(())
}

/// Steps 1-3 of the module docs, results into `report`.
pub fn apply(
    id: &SandboxIdentity,
    paths: &ForkPaths,
    reaper: &Reaper,
    report: &mut ReidentifyReport,
) -> Result<(), ErrorBody> {
    report.machine_id_set =
        write_machine_id(&paths.machine_id).map_err(|e| io_err(&paths.machine_id, &e))?;
    let generation =
        bump_generation(&paths.generation).map_err(|e| io_err(&paths.generation, &e))?;
    report.generation = Some(generation);
    report.hooks = run_hooks(&paths.hooks_dir, id, generation, reaper);
    Ok(())
}

fn io_err(path: &Path, e: &io::Error) -> ErrorBody {
    ErrorBody::from_io(&path.display().to_string(), e)
}

/// Write `contents` to `path` through a temporary file and a rename, so
/// readers see the old or the new contents, never a partial one.
pub(crate) fn replace_file(path: &Path, contents: &[u8], mode: u32) -> io::Result<()> {
    let tmp = path.with_extension("zygote-tmp");
    {
        let mut f = fs::File::create(&tmp)?;
        f.write_all(contents)?;
        f.set_permissions(fs::Permissions::from_mode(mode))?;
    }
    fs::rename(&tmp, path).inspect_err(|_| {
        let _ = fs::remove_file(&tmp);
    })
}

/// A new machine-id (32 lowercase hex digits, a version-4 UUID's bits as
/// systemd makes them). Returns false when the image has no `/etc` (nothing
/// to write into); an image with one gets the file even if it had none.
fn write_machine_id(path: &Path) -> io::Result<bool> {
    if !path.parent().is_some_and(Path::is_dir) {
        return Ok(false);
    }
    let mut id = [0u8; 16];
    fs::File::open("/dev/urandom")?.read_exact(&mut id)?;
    id[6] = (id[6] & 0x0f) | 0x40;
    id[8] = (id[8] & 0x3f) | 0x80;
    let hex: String = id.iter().map(|b| format!("{b:02x}")).collect();
    replace_file(path, format!("{hex}\n").as_bytes(), 0o444)?;
    Ok(true)
}

/// The counter's next value: one more than what the file holds (0 if it is
/// missing or unreadable, as on the first boot).
fn bump_generation(path: &Path) -> io::Result<u64> {
    if let Some(dir) = path.parent() {
        fs::create_dir_all(dir)?;
    }
    let current = fs::read_to_string(path)
        .ok()
        .and_then(|s| s.trim().parse::<u64>().ok())
        .unwrap_or(0);
    let next = current.saturating_add(1);
    replace_file(path, format!("{next}\n").as_bytes(), 0o644)?;
    Ok(next)
}

fn run_hooks(
    dir: &Path,
    id: &SandboxIdentity,
    generation: u64,
    reaper: &Reaper,
) -> Vec<HookOutcome> {
    let Ok(entries) = fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut hooks: Vec<PathBuf> = entries
        .flatten()
        .map(|e| e.path())
        .filter(|p| {
            // Not following symlinks to decide: a hook is a regular file
            // that is executable, like run-parts would take.
            fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        })
        .collect();
    hooks.sort();
    let mut out = Vec::new();
    for (i, hook) in hooks.iter().enumerate() {
        let name = hook
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        if i >= MAX_HOOKS {
            out.push(HookOutcome {
                name,
                error: Some(format!("skipped: more than {MAX_HOOKS} hooks")),
                ..Default::default()
            });
            continue;
        }
        out.push(run_hook(hook, name, id, generation, reaper, HOOK_TIMEOUT));
    }
    out
}

fn run_hook(
    path: &Path,
    name: String,
    id: &SandboxIdentity,
    generation: u64,
    reaper: &Reaper,
    timeout: Duration,
) -> HookOutcome {
    let mut outcome = HookOutcome {
        name,
        ..Default::default()
    };
    let mut cmd = Command::new(path);
    cmd.env_clear()
        .env("PATH", crate::system::DEFAULT_PATH)
        .env("ZYGOTE_SANDBOX_ID", &id.sandbox_id)
        .env("ZYGOTE_PARENT_ID", id.parent_id.as_deref().unwrap_or(""))
        .env(
            "ZYGOTE_SNAPSHOT_ID",
            id.snapshot_id.as_deref().unwrap_or(""),
        )
        .env("ZYGOTE_GENERATION", generation.to_string())
        .current_dir("/")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .process_group(0);
    crate::exec::start_unblocked(&mut cmd);
    let (mut child, watch) = match reaper.spawn(&mut cmd) {
        Ok(c) => c,
        Err(e) => {
            outcome.error = Some(format!("could not run: {e}"));
            return outcome;
        }
    };
    let pid = child.id() as libc::pid_t;
    // Read stderr on a thread: a hook that leaves a background process
    // holding the pipe must not keep us waiting past its own exit.
    let (tail_tx, tail_rx) = mpsc::channel();
    if let Some(mut err) = child.stderr.take() {
        std::thread::spawn(move || {
            let mut tail = Vec::new();
            let mut buf = [0u8; 1024];
            while let Ok(n) = err.read(&mut buf) {
                if n == 0 {
                    break;
                }
                tail.extend_from_slice(&buf[..n]);
                if tail.len() > STDERR_TAIL {
                    tail.drain(..tail.len() - STDERR_TAIL);
                }
            }
            let _ = tail_tx.send(tail);
        });
    }
    drop(child);
    let status = match watch.status.recv_timeout(timeout) {
        Ok(s) => s,
        Err(_) => {
            // SAFETY: signalling the hook's own process group.
            unsafe { libc::kill(-pid, libc::SIGKILL) };
            outcome.error = Some(format!("timed out after {:.1} s", timeout.as_secs_f64()));
            watch.status.recv().unwrap_or(0)
        }
    };
    if let Ok(tail) = tail_rx.recv_timeout(Duration::from_millis(200)) {
        outcome.stderr_tail = String::from_utf8_lossy(&tail).into_owned();
    }
    if libc::WIFEXITED(status) {
        outcome.exit_code = Some(libc::WEXITSTATUS(status));
        if outcome.exit_code != Some(0) && outcome.error.is_none() {
            outcome.error = Some(format!("exited with {}", libc::WEXITSTATUS(status)));
        }
    } else if libc::WIFSIGNALED(status) && outcome.error.is_none() {
        outcome.error = Some(format!("killed by signal {}", libc::WTERMSIG(status)));
    }
    outcome
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::reaper::ReapMode;

    fn paths(root: &Path) -> ForkPaths {
        fs::create_dir_all(root.join("etc/zygote/forked.d")).unwrap();
        ForkPaths {
            machine_id: root.join("etc/machine-id"),
            generation: root.join("run/zygote/generation"),
            hooks_dir: root.join("etc/zygote/forked.d"),
        }
    }

    fn hook(p: &ForkPaths, name: &str, script: &str, mode: u32) {
        let f = p.hooks_dir.join(name);
        fs::write(&f, format!("#!/bin/sh\n{script}\n")).unwrap();
        fs::set_permissions(&f, fs::Permissions::from_mode(mode)).unwrap();
    }

    fn ident() -> SandboxIdentity {
        SandboxIdentity {
            sandbox_id: "sb-child".into(),
            parent_id: Some("sb-parent".into()),
            snapshot_id: None,
        }
    }

    #[test]
    fn machine_id_changes_generation_counts_and_hooks_run_in_order_with_ids() {
        let t = tempfile::tempdir().unwrap();
        let p = paths(t.path());
        let log = t.path().join("log");
        let l = log.display();
        hook(
            &p,
            "20-second",
            &format!("echo \"2 $ZYGOTE_GENERATION\" >> {l}"),
            0o755,
        );
        hook(
            &p,
            "10-first",
            &format!(
                "echo \"1 $ZYGOTE_SANDBOX_ID $ZYGOTE_PARENT_ID\" >> {l}; echo oops >&2; exit 3"
            ),
            0o755,
        );
        hook(
            &p,
            "30-not-executable",
            &format!("echo never >> {l}"),
            0o644,
        );
        let reaper = Reaper::new(ReapMode::PerChild).unwrap();
        let mut r = ReidentifyReport::default();
        apply(&ident(), &p, &reaper, &mut r).unwrap();
        let first_id = fs::read_to_string(&p.machine_id).unwrap();
        assert_eq!(first_id.trim().len(), 32);
        assert!(r.machine_id_set);
        assert_eq!(r.generation, Some(1));
        assert_eq!(
            fs::read_to_string(&log).unwrap(),
            "1 sb-child sb-parent\n2 1\n"
        );
        assert_eq!(r.hooks.len(), 2);
        assert_eq!(r.hooks[0].name, "10-first");
        assert_eq!(r.hooks[0].exit_code, Some(3));
        assert!(!r.hooks[0].succeeded());
        assert_eq!(r.hooks[0].stderr_tail, "oops\n");
        assert!(r.hooks[1].succeeded(), "{:?}", r.hooks[1]);

        let mut again = ReidentifyReport::default();
        apply(&ident(), &p, &reaper, &mut again).unwrap();
        assert_eq!(again.generation, Some(2));
        assert_eq!(fs::read_to_string(&p.generation).unwrap(), "2\n");
        assert_ne!(fs::read_to_string(&p.machine_id).unwrap(), first_id);
    }

    #[test]
    fn a_hung_hook_is_killed_and_reported() {
        let t = tempfile::tempdir().unwrap();
        let p = paths(t.path());
        hook(&p, "hang", "sleep 1000", 0o755);
        let reaper = Reaper::new(ReapMode::PerChild).unwrap();
        let start = std::time::Instant::now();
        let limit = Duration::from_millis(300);
        let outcome = run_hook(
            &p.hooks_dir.join("hang"),
            "hang".into(),
            &ident(),
            1,
            &reaper,
            limit,
        );
        assert!(start.elapsed() >= limit);
        assert!(outcome.error.unwrap().contains("timed out"));
        assert_eq!(outcome.exit_code, None);
    }

    #[test]
    fn ids_that_would_smuggle_anything_are_refused() {
        for bad in ["", "a b", "a;b", "x\n", &"a".repeat(200)] {
            let id = SandboxIdentity {
                sandbox_id: bad.into(),
                ..Default::default()
            };
            assert!(validate(&id).is_err(), "{bad:?}");
        }
        assert!(validate(&ident()).is_ok());
    }
}
