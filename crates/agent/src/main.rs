//! `zygote-agent` binary: flags, PID-1 set-up, then serve forever.
//! See `config::USAGE` for the flags and the library docs for the design.

use std::panic;
use std::process;
use std::thread;

use zygote_agent::config::{self, Args, USAGE};
use zygote_agent::{
    fds, log, reaper, system, Agent, AgentOptions, Listener, ReapMode, ShutdownAction,
};

fn main() {
    let pid1 = system::is_pid1();
    let args = match config::parse_args(std::env::args().skip(1)) {
        Ok(a) => a,
        // Init must come up whatever the kernel passed as arguments.
        Err(e) if pid1 => {
            log!("ignoring arguments: {e}");
            Args::default()
        }
        Err(e) => {
            eprintln!("zygote-agent: {e}\n\n{USAGE}");
            process::exit(2);
        }
    };
    if args.help {
        print!("{USAGE}");
        return;
    }
    if args.version {
        println!("zygote-agent {}", env!("CARGO_PKG_VERSION"));
        return;
    }
    // A panic during start-up must not end PID 1 (that panics the kernel).
    if panic::catch_unwind(|| start(&args, pid1)).is_err() {
        fatal(pid1, "start-up panicked");
    }
    loop {
        thread::park();
    }
}

fn fatal(pid1: bool, why: &str) -> ! {
    log!("fatal: {why}");
    if pid1 {
        // Rebooting makes QEMU (run with -no-reboot) exit, which the host
        // notices at once; a hung init would only show up as a boot timeout.
        // RB_AUTOBOOT rather than RB_POWER_OFF: microvm has no ACPI power-off.
        system::reboot(libc::RB_AUTOBOOT);
    }
    process::exit(1);
}

fn start(args: &Args, pid1: bool) {
    let reap_all = pid1 || args.subreaper;
    if reap_all {
        // Before any thread exists, so every thread inherits the mask and the
        // reaper / signal threads are the only receivers.
        let mut signals = vec![libc::SIGCHLD];
        if pid1 {
            signals.push(libc::SIGTERM);
        }
        if let Err(e) = reaper::block_signals(&signals) {
            fatal(pid1, &format!("cannot block signals: {e}"));
        }
    }
    if pid1 {
        system::init_as_pid1();
    } else if args.subreaper && unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1) } != 0 {
        fatal(
            pid1,
            &format!(
                "PR_SET_CHILD_SUBREAPER: {}",
                std::io::Error::last_os_error()
            ),
        );
    }

    // After PID-1 set-up: /proc is mounted by then.
    let fd_limit = fds::raise_limit();
    if fd_limit.now > fd_limit.started_with {
        log!(
            "file descriptor limit raised from {} to {} (programs get {})",
            fd_limit.started_with,
            fd_limit.now,
            fd_limit.started_with
        );
    }

    let cmdline = system::read_cmdline();
    let listeners = config::resolve_listeners(args, &cmdline).unwrap_or_else(|e| {
        log!("kernel command line: {e}; using the defaults");
        config::Listeners::from_cmdline("").expect("empty command line parses")
    });
    let options = AgentOptions {
        dry_run: args.no_system_changes,
        reap: if reap_all {
            ReapMode::All
        } else {
            ReapMode::PerChild
        },
        shutdown: if args.no_system_changes {
            ShutdownAction::Refuse
        } else if pid1 {
            ShutdownAction::Reboot
        } else {
            ShutdownAction::ExitProcess
        },
        pid1,
    };
    let agent = Agent::new(options).unwrap_or_else(|e| fatal(pid1, &format!("cannot start: {e}")));
    if pid1 {
        let handled = reaper::handle_signals(&[libc::SIGTERM], |_| {
            log!("SIGTERM: powering off");
            system::reboot(libc::RB_POWER_OFF);
        });
        if let Err(e) = handled {
            log!("cannot handle SIGTERM: {e}");
        }
    }

    let mut bound = Vec::new();
    let attempts = listeners
        .tcp
        .iter()
        .map(|a| (format!("tcp {a}"), Listener::bind_tcp(*a)))
        .chain(
            listeners
                .unix
                .iter()
                .map(|p| (format!("unix {}", p.display()), Listener::bind_unix(p))),
        )
        .chain(
            listeners
                .vsock
                .iter()
                .map(|p| (format!("vsock port {p}"), Listener::bind_vsock(*p))),
        );
    for (what, result) in attempts {
        // One unavailable transport (no vsock device, say) must not stop the others.
        let served = result.and_then(|l| {
            let actual = l.describe(); // shows the real port when 0 was asked for
            agent.serve(l).map(|()| actual)
        });
        match served {
            Ok(actual) => bound.push(actual),
            Err(e) => log!("cannot listen on {what}: {e}"),
        }
    }
    for name in &listeners.ports {
        match agent.serve_port(name) {
            Ok(()) => bound.push(format!("virtio-serial port {name}")),
            Err(e) => log!("cannot serve port {name}: {e}"),
        }
    }
    if bound.is_empty() {
        fatal(pid1, "no listener could be started");
    }
    log!(
        "v{} ready (pid {}, {}) on {}",
        env!("CARGO_PKG_VERSION"),
        process::id(),
        if args.no_system_changes {
            "dry run"
        } else {
            "live"
        },
        bound.join(", ")
    );
}
