//! VM processes that outlive the daemon.
//!
//! Each VM program (QEMU, or zygote's VMM) runs under a tiny `/bin/sh`
//! supervisor in its own session and cgroup. The shell waits for the VM and
//! writes its exit status to `<vm dir>/exit`, so why a VM died is known even
//! if the daemon was down (or restarted) when it happened. VMs deliberately
//! have no parent-death signal: a daemon restart re-attaches to them. A VM that prints
//! its console to stdout has it piped, inside the same shell, into a console pump that
//! writes the bounded log (`console`), so that log does not depend on the daemon either.
use std::fs::{File, OpenOptions};
use std::os::fd::AsRawFd;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use super::RuntimeError;
use crate::procs::ProcId;

/// `exit.tmp` + rename: the daemon never reads a half-written status.
const SCRIPT: &str = r#""$@"; status=$?; echo "$status" > exit.tmp && mv exit.tmp exit"#;

/// [`SCRIPT`] with the VM's stdout piped into `$1 <pump arg> $2` (a console pump and its
/// log); if the pump cannot run, the output is drained so that the VM never blocks on it.
fn script_with_pump() -> String {
    format!(
        r#"pump=$1; log=$2; shift 2; {{ {SCRIPT}; }} | {{ "$pump" {} "$log" || exec cat >/dev/null; }}"#,
        super::console::PUMP_ARG
    )
}

/// A console pump for a VM that prints its console on stdout (see `console`).
pub struct ConsolePump<'a> {
    /// The program (this daemon's executable).
    pub program: &'a Path,
    /// The bounded log it writes.
    pub log: &'a Path,
}
/// Starts `program args` in `dir` under the supervisor shell, with stderr
/// to `stderr`, stdout into `console` if given (else discarded) and, if given, inside
/// `cgroup` and the network namespace `netns` (a `/run/netns` file: the VM's tap lives
/// there). Returns the shell's identity.
pub fn spawn(
    program: &str,
    args: &[String],
    dir: &Path,
    cgroup: Option<&Path>,
    netns: Option<&Path>,
    stderr: File,
    console: Option<&ConsolePump>,
) -> Result<ProcId, RuntimeError> {
    let mut cmd = Command::new("/bin/sh");
    cmd.arg("-c");
    match console {
        Some(pump) => cmd
            .arg(script_with_pump())
            .arg("zygote-vm")
            .arg(pump.program)
            .arg(pump.log),
        None => cmd.arg(SCRIPT).arg("zygote-vm"),
    };
    cmd.arg(program)
        .args(args)
        .current_dir(dir)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(stderr);
    // Opened before fork: the child only has to write "0" (= "me") to it,
    // which moves it, and everything it starts, into the cgroup. The fd is
    // close-on-exec, so the VM does not inherit it.
    let procs: Option<File> = cgroup.and_then(|cg| {
        let path = cg.join("cgroup.procs");
        OpenOptions::new()
            .write(true)
            .open(&path)
            .map_err(|e| tracing::warn!("cannot open {}: {e}; VM runs outside it", path.display()))
            .ok()
    });
    let procs_fd = procs.as_ref().map(|f| f.as_raw_fd());
    // Opened before fork too (close-on-exec): the child joins it with setns(2).
    let netns_file = netns
        .map(File::open)
        .transpose()
        .map_err(RuntimeError::io(format!(
            "opening network namespace {}",
            netns.unwrap_or(Path::new("")).display()
        )))?;
    let netns_fd = netns_file.as_ref().map(|f| f.as_raw_fd());
    // SAFETY: only async-signal-safe calls (setsid, write, setns) run between fork and
    // exec.
    unsafe {
        cmd.pre_exec(move || {
            if let Some(fd) = netns_fd {
                if libc::setns(fd, libc::CLONE_NEWNET) < 0 {
                    return Err(std::io::Error::last_os_error());
                }
            }
            // Own session: a terminal's Ctrl-C aimed at `zygote serve` must not kill VMs.
            if libc::setsid() < 0 {
                return Err(std::io::Error::last_os_error());
            }
            if let Some(fd) = procs_fd {
                if libc::write(fd, b"0".as_ptr().cast(), 1) < 0 {
                    return Err(std::io::Error::last_os_error());
                }
            }
            Ok(())
        });
    }
    let mut child = cmd.spawn().map_err(|source| RuntimeError::Spawn {
        program: program.to_string(),
        source,
    })?;
    drop(procs);
    drop(netns_file);
    let id = ProcId::of(child.id());
    // Reap the shell when it ends (after a daemon restart init does that).
    let spawned = std::thread::Builder::new()
        .name("zygote-vm-reaper".into())
        .spawn(move || {
            let _ = child.wait();
        });
    if let Err(e) = spawned {
        tracing::warn!("cannot start a reaper thread: {e}");
    }
    id.ok_or_else(|| RuntimeError::Boot(format!("{program} exited immediately")))
}

/// Waits until the VM program wrote its pid file; fails if the supervisor
/// ended first (the VM could not start) or after `timeout`.
pub fn wait_pid_file(
    pid_file: &Path,
    supervisor: &ProcId,
    timeout: Duration,
) -> Result<ProcId, RuntimeError> {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(id) = std::fs::read_to_string(pid_file)
            .ok()
            .and_then(|s| s.trim().parse::<u32>().ok())
            .and_then(ProcId::of)
        {
            return Ok(id);
        }
        if !supervisor.is_alive() {
            return Err(RuntimeError::Boot(
                "the VM process exited during start-up".into(),
            ));
        }
        if Instant::now() >= deadline {
            return Err(RuntimeError::Boot(format!(
                "no pid file {} after {timeout:?}",
                pid_file.display()
            )));
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// The exit status the supervisor recorded, if any.
pub fn recorded_status(dir: &Path) -> Option<i32> {
    std::fs::read_to_string(dir.join("exit"))
        .ok()?
        .trim()
        .parse()
        .ok()
}

/// Shell exit status -> words (the shell reports death by signal N as 128+N).
pub fn describe_status(program: &str, status: i32) -> String {
    match status {
        0 => format!("{program} exited normally (the guest shut down or rebooted)"),
        s if s > 128 && s < 128 + 65 => {
            let sig = s - 128;
            // SAFETY: strsignal returns a pointer to a static or thread-local string.
            let name = unsafe {
                let p = libc::strsignal(sig);
                if p.is_null() {
                    String::new()
                } else {
                    std::ffi::CStr::from_ptr(p).to_string_lossy().into_owned()
                }
            };
            format!("{program} was killed by signal {sig} ({name})")
        }
        s => format!("{program} exited with status {s}"),
    }
}

/// Ends a VM for good: kills it and its supervisor, then removes its disk layer and
/// directory (the same for every runtime).
pub fn destroy_vm(vm: &super::VmRecord) {
    kill_and_wait(&vm.process, vm.supervisor.as_ref());
    let _ = std::fs::remove_file(&vm.disk);
    if let Err(e) = std::fs::remove_dir_all(&vm.dir) {
        if e.kind() != std::io::ErrorKind::NotFound {
            tracing::warn!("removing {}: {e}", vm.dir.display());
        }
    }
}

/// Appends the guest's kernel panic line, if the end of its console log (in the VM
/// directory `dir`) shows one, to an exit reason.
pub fn add_guest_panic(reason: &mut String, dir: &Path) {
    let console = super::console::tail_text(dir, super::console::SCAN_BYTES);
    if let Some(panic) = console.lines().find(|l| l.contains("Kernel panic")) {
        reason.push_str(&format!(" (guest: {})", panic.trim()));
    }
}

/// Kills `vm` (if it is still that process) and waits for it and its
/// supervisor to be gone, up to a few seconds.
pub fn kill_and_wait(vm: &ProcId, supervisor: Option<&ProcId>) {
    vm.signal(libc::SIGKILL);
    let deadline = Instant::now() + Duration::from_secs(5);
    while (vm.is_alive() || supervisor.is_some_and(ProcId::is_alive)) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    if let Some(s) = supervisor {
        // A supervisor that outlived its VM would only write the exit file.
        s.signal(libc::SIGKILL);
    }
}

/// Starts every branch child concurrently, one scoped thread each, and hands each
/// result to `done` (with the child's index) from that child's thread as soon as it is
/// known, so one slow child does not hold back the news of its siblings; a start that
/// panics becomes an error for that child only. Returns once every child is done.
pub fn start_children<T, R, F, D>(children: &[T], start: F, done: D)
where
    T: Sync,
    F: Fn(usize, &T) -> Result<R, RuntimeError> + Sync,
    D: Fn(usize, Result<R, RuntimeError>) + Sync,
{
    std::thread::scope(|s| {
        let (start, done) = (&start, &done);
        for (i, child) in children.iter().enumerate() {
            s.spawn(move || {
                let result =
                    std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| start(i, child)))
                        .unwrap_or_else(|_| Err(RuntimeError::Boot("child start panicked".into())));
                done(i, result);
            });
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_words() {
        assert!(describe_status("qemu", 0).contains("normally"));
        assert!(describe_status("qemu", 137).contains("signal 9"));
        assert!(describe_status("qemu", 1).contains("status 1"));
    }

    #[test]
    fn supervisor_records_exit_status() {
        let dir = tempfile::tempdir().unwrap();
        let err = File::create(dir.path().join("err")).unwrap();
        let sup = spawn(
            "sh",
            &["-c".into(), "echo $$ > pid; exit 3".into()],
            dir.path(),
            None,
            None,
            err,
            None,
        )
        .unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        while recorded_status(dir.path()).is_none() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
        assert_eq!(recorded_status(dir.path()), Some(3));
        while sup.is_alive() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
        assert!(!sup.is_alive());
    }

    #[test]
    fn a_console_pump_gets_the_vm_output_and_the_status_is_still_recorded() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        // Stands in for the daemon's binary: `<pump> PUMP_ARG <log>` copies stdin.
        let pump = dir.path().join("pump");
        std::fs::write(
            &pump,
            "#!/bin/sh\n[ \"$1\" = __zygote-console-pump ] && cat > \"$2\"\n",
        )
        .unwrap();
        std::fs::set_permissions(&pump, std::fs::Permissions::from_mode(0o755)).unwrap();
        let log = dir.path().join("serial.log");
        let err = File::create(dir.path().join("err")).unwrap();
        spawn(
            "sh",
            &["-c".into(), "echo booted; exit 5".into()],
            dir.path(),
            None,
            None,
            err,
            Some(&ConsolePump {
                program: &pump,
                log: &log,
            }),
        )
        .unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        while recorded_status(dir.path()).is_none() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
        assert_eq!(recorded_status(dir.path()), Some(5));
        while std::fs::read_to_string(&log).unwrap_or_default() != "booted\n"
            && Instant::now() < deadline
        {
            std::thread::sleep(Duration::from_millis(10));
        }
        assert_eq!(std::fs::read_to_string(&log).unwrap(), "booted\n");
    }
}
