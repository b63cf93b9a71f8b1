//! `zygote run [OPTIONS] -- CMD ARGS...`: boot a sandbox, run one command in
//! it with its output streamed here, exit with its status, tear it down.
//! Habits follow `docker run`: `-e`, `-w`, `-i`; exit code 127/126 when the
//! command cannot be found/executed, 128+N when killed by signal N.
use std::io::{IsTerminal, Read, Write};
use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};
use std::time::Instant;

use anyhow::Context;
use zygote_proto::client::ClientError;
use zygote_proto::{ErrorCode, ExecRequest, Stream};
use zygote_qemu::{QemuConfig, QemuVm};

use super::image::with_progress;

/// Exit status when `--timeout` expires (as timeout(1) does).
const TIMEOUT_EXIT: i32 = 124;

#[derive(Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Runtime {
    /// QEMU microvm (hardware virtualization when available, else emulation).
    Qemu,
    /// zygote's own KVM VMM.
    Kvm,
}

#[derive(clap::Args)]
pub struct RunArgs {
    /// Which VM runtime boots the sandbox.
    #[arg(long, value_enum, default_value = "qemu")]
    runtime: Runtime,
    /// Image name (built on first use), `name-sha256`, or a sha256 prefix.
    #[arg(long, default_value = "minimal")]
    image: String,
    /// Guest memory in MiB.
    #[arg(long, default_value_t = 512)]
    mem_mib: u32,
    /// Number of vCPUs.
    #[arg(long, default_value_t = 1)]
    vcpus: u32,
    /// Kill the command after this many seconds (exit status 124).
    #[arg(long)]
    timeout: Option<f64>,
    /// Set an environment variable in the command (KEY=VALUE, repeatable).
    #[arg(short = 'e', long = "env", value_name = "KEY=VALUE")]
    env: Vec<String>,
    /// Working directory inside the sandbox.
    #[arg(short = 'w', long = "workdir")]
    workdir: Option<String>,
    /// Send this process's stdin to the command (read fully before it starts).
    #[arg(short = 'i', long)]
    interactive: bool,
    /// Report boot progress and timings on stderr.
    #[arg(short = 'v', long)]
    verbose: bool,
    /// The command and its arguments.
    #[arg(required = true, trailing_var_arg = true, allow_hyphen_values = true)]
    command: Vec<String>,
}

/// Set by the signal handler; the number of the first signal received.
static INTERRUPTED: AtomicI32 = AtomicI32::new(0);
/// QEMU's pid while a VM runs, so the handler can stop it at once.
static QEMU_PID: AtomicI32 = AtomicI32::new(0);
static HANDLERS: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(sig: libc::c_int) {
    // Only async-signal-safe calls here (atomics, kill, _exit).
    if INTERRUPTED.swap(sig, Ordering::SeqCst) != 0 {
        // Second Ctrl-C: give up waiting for a clean teardown. QEMU still
        // dies with us (it was spawned with a parent-death signal).
        unsafe { libc::_exit(128 + sig) };
    }
    let pid = QEMU_PID.load(Ordering::SeqCst);
    if pid > 0 {
        // Killing QEMU closes the agent connection, which wakes the main
        // thread; it then removes the overlay and exits 128+sig.
        unsafe { libc::kill(pid, libc::SIGKILL) };
    }
}

fn install_signal_handlers() {
    if HANDLERS.swap(true, Ordering::SeqCst) {
        return;
    }
    for sig in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP] {
        // SAFETY: the handler only performs async-signal-safe operations.
        unsafe { libc::signal(sig, on_signal as *const () as libc::sighandler_t) };
    }
}

fn interrupted() -> Option<i32> {
    match INTERRUPTED.load(Ordering::SeqCst) {
        0 => None,
        sig => Some(128 + sig),
    }
}

pub fn run(args: RunArgs) -> anyhow::Result<i32> {
    if args.runtime == Runtime::Kvm {
        anyhow::bail!("the kvm runtime arrives with the devices issue; use --runtime qemu");
    }
    let mut request = exec_request(&args)?;
    install_signal_handlers();
    let (cfg, image) = prepare(&args)?;
    apply_image_config(&image, &mut request);
    if let Some(code) = interrupted() {
        return Ok(code);
    }
    let vm = QemuVm::boot(&cfg).context("booting the sandbox")?;
    if let Some(pid) = vm.pid() {
        QEMU_PID.store(pid as i32, Ordering::SeqCst);
    }
    // Ctrl-C while booting (before the handler knew QEMU's pid): stop here.
    // Checked after publishing the pid, so a later signal kills QEMU itself.
    if let Some(code) = interrupted() {
        return Ok(code);
    }
    if args.verbose {
        eprintln!(
            "zygote: booted in {:.2}s ({}, {} MiB, {} vCPU)",
            vm.boot_duration().as_secs_f64(),
            vm.accel().as_str(),
            args.mem_mib,
            args.vcpus
        );
    }
    let started = Instant::now();
    let outcome = run_command(&vm, request);
    QEMU_PID.store(0, Ordering::SeqCst);
    if let Some(code) = interrupted() {
        drop(vm);
        return Ok(code);
    }
    let code = match outcome {
        Ok(code) => code,
        Err(CommandError::NotStarted(code, msg)) => {
            eprintln!("zygote: {msg}");
            code
        }
        Err(CommandError::Client(e)) => {
            let log = vm.serial_log();
            let tail: Vec<&str> = log.lines().rev().take(20).collect();
            let tail: Vec<&str> = tail.into_iter().rev().collect();
            return Err(anyhow::Error::new(e).context(format!(
                "lost the sandbox while running the command\n--- serial console ---\n{}",
                tail.join("\n")
            )));
        }
    };
    if let (TIMEOUT_EXIT, Some(t)) = (code, args.timeout) {
        eprintln!("zygote: command timed out after {t}s");
    }
    if args.verbose {
        eprintln!(
            "zygote: command ran {:.2}s, exit {code}",
            started.elapsed().as_secs_f64()
        );
    }
    let teardown = Instant::now();
    vm.shutdown().context("tearing the sandbox down")?;
    if args.verbose {
        eprintln!(
            "zygote: torn down in {:.2}s",
            teardown.elapsed().as_secs_f64()
        );
    }
    Ok(code)
}

/// Kernel + image, building (a recipe) or pulling (a reference) them if needed. An
/// image already there is used as is (like `docker run` with a local image); `zygote
/// image build|pull` refreshes it.
fn prepare(args: &RunArgs) -> anyhow::Result<(QemuConfig, zygote_images::ImageInfo)> {
    let verbose = args.verbose;
    let kernel = with_progress("preparing the guest kernel", |p| {
        // A cache hit is the normal case: say nothing unless asked.
        zygote_images::build_kernel(&mut |line| {
            if verbose || !line.contains("cached: ") {
                p(line)
            }
        })
    })
    .context("building the guest kernel")?;
    let image = match zygote_oci::find_local(&args.image).context("looking up the image")? {
        Some(info) => info,
        None if zygote_oci::ImageRef::looks_like_reference(&args.image) => {
            let opts = zygote_oci::PullOptions {
                transport: zygote_oci::Transport::from_env(),
                ..Default::default()
            };
            super::image_pull::pull_with_progress(&args.image, &opts)
                .with_context(|| format!("pulling {}", args.image))?
        }
        None => with_progress(&format!("building image {}", args.image), |p| {
            zygote_images::build_image(&args.image, p)
        })
        .with_context(|| format!("building image {}", args.image))?,
    };
    let mut cfg = QemuConfig::new(kernel.vmlinux, image.path.clone());
    cfg.mem_mib = args.mem_mib;
    cfg.vcpus = args.vcpus;
    Ok((cfg, image))
}

/// An OCI image's Env under the command's own, its WorkingDir and User unless given.
fn apply_image_config(image: &zygote_images::ImageInfo, req: &mut ExecRequest) {
    let Some(oci) = &image.oci else { return };
    let c = &oci.config;
    for (k, v) in c.env.iter().filter_map(|kv| kv.split_once('=')) {
        req.env
            .entry(k.to_string())
            .or_insert_with(|| v.to_string());
    }
    if req.cwd.is_none() {
        req.cwd = c.working_dir.clone();
    }
    if req.uid.is_none() {
        (req.uid, req.gid) = (c.uid, c.gid);
    }
}

fn exec_request(args: &RunArgs) -> anyhow::Result<ExecRequest> {
    let mut req = ExecRequest::new(args.command.iter().cloned());
    for kv in &args.env {
        let (k, v) = kv
            .split_once('=')
            .with_context(|| format!("-e {kv:?}: expected KEY=VALUE"))?;
        req.env.insert(k.to_string(), v.to_string());
    }
    req.cwd = args.workdir.clone();
    if let Some(t) = args.timeout {
        anyhow::ensure!(
            t > 0.0 && t.is_finite(),
            "--timeout must be a positive number"
        );
        req.timeout_ms = Some((t * 1000.0).ceil() as u64);
    }
    if args.interactive {
        let mut input = Vec::new();
        let stdin = std::io::stdin();
        if stdin.is_terminal() {
            eprintln!("zygote: reading stdin until EOF (Ctrl-D)...");
        }
        stdin
            .lock()
            .read_to_end(&mut input)
            .context("reading stdin")?;
        req.stdin = Some(input);
    }
    Ok(req)
}

enum CommandError {
    /// The agent could not start the program: (exit code, message).
    NotStarted(i32, String),
    Client(ClientError),
}

/// Runs the command, copying its output here as it arrives; returns the exit
/// code docker would (status, 128+signal, 124 on timeout, 126/127 if it
/// could not be executed/found).
fn run_command(vm: &QemuVm, req: ExecRequest) -> Result<i32, CommandError> {
    let program = req.argv.first().cloned().unwrap_or_default();
    let handle = match vm.client().spawn_exec(req) {
        Ok(h) => h,
        Err(ClientError::Agent(body)) if body.code == ErrorCode::SpawnFailed => {
            let code = match body.errno {
                Some(libc::ENOENT) => 127,
                _ => 126,
            };
            return Err(CommandError::NotStarted(
                code,
                format!("cannot run {program:?}: {}", body.message),
            ));
        }
        Err(e) => return Err(CommandError::Client(e)),
    };
    let stdout = std::io::stdout();
    let stderr = std::io::stderr();
    let result = handle
        .wait(|stream, data| {
            // Flush per chunk: output must show up while the command runs.
            let _ = match stream {
                Stream::Stdout => {
                    let mut out = stdout.lock();
                    out.write_all(data).and_then(|_| out.flush())
                }
                Stream::Stderr => {
                    let mut err = stderr.lock();
                    err.write_all(data).and_then(|_| err.flush())
                }
            };
        })
        .map_err(CommandError::Client)?;
    Ok(exit_code(&result))
}

fn exit_code(r: &zygote_proto::ExecResult) -> i32 {
    if r.timed_out {
        TIMEOUT_EXIT
    } else if let Some(sig) = r.signal {
        128 + sig
    } else {
        r.exit_code.unwrap_or(1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use zygote_proto::ExecResult;

    fn result(exit_code: Option<i32>, signal: Option<i32>, timed_out: bool) -> ExecResult {
        ExecResult {
            exit_code,
            signal,
            timed_out,
            duration_ms: 1,
        }
    }

    #[test]
    fn exit_codes_follow_docker() {
        assert_eq!(exit_code(&result(Some(0), None, false)), 0);
        assert_eq!(exit_code(&result(Some(3), None, false)), 3);
        assert_eq!(exit_code(&result(None, Some(9), false)), 137);
        assert_eq!(exit_code(&result(None, Some(15), false)), 143);
        assert_eq!(exit_code(&result(None, Some(9), true)), TIMEOUT_EXIT);
    }

    #[test]
    fn parses_command_after_double_dash() {
        use clap::Parser;
        #[derive(clap::Parser)]
        struct Cli {
            #[command(flatten)]
            run: RunArgs,
        }
        let cli = Cli::try_parse_from([
            "zygote", "--image", "python", "-e", "A=1", "--", "python3", "-c", "print(1)",
        ])
        .unwrap();
        assert_eq!(cli.run.image, "python");
        assert_eq!(cli.run.command, ["python3", "-c", "print(1)"]);
        let req = exec_request(&cli.run).unwrap();
        assert_eq!(req.env.get("A").map(String::as_str), Some("1"));
        let cli = Cli::try_parse_from(["zygote", "ls", "-la"]).unwrap();
        assert_eq!(cli.run.command, ["ls", "-la"]);
        assert!(
            Cli::try_parse_from(["zygote"]).is_err(),
            "a command is required"
        );
        let cli = Cli::try_parse_from(["zygote", "-e", "NOVALUE", "--", "true"]).unwrap();
        assert!(exec_request(&cli.run).is_err());
    }
}
