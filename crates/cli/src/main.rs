//! `zygote`: the command-line interface.
use clap::{Parser, Subcommand};

mod commands;

#[derive(Parser)]
#[command(
    name = "zygote",
    version,
    about = "Copy-on-write microVM sandboxes for AI agents"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Boot the built-in probe guest and stream its self-check report.
    Probe(commands::probe::ProbeArgs),
    /// Low-level VM commands (zygote's own VMM).
    #[command(subcommand)]
    Vm(commands::vm::VmCommand),
    /// Check what this host can run and why.
    Doctor(commands::doctor::DoctorArgs),
    /// Build and list guest images.
    #[command(subcommand)]
    Image(commands::image::ImageCommand),
    /// Boot a sandbox, run a command in it, tear it down.
    Run(commands::run::RunArgs),
    /// Benchmarks.
    #[command(subcommand)]
    Bench(commands::bench::BenchCommand),
    /// Run the zygote daemon (REST API): `zygoted` with these arguments.
    Serve(commands::serve::ServeArgs),
    /// Start sandboxes (daemon).
    Create(commands::create::CreateArgs),
    /// Run a program in a sandbox, output streamed (daemon).
    Exec(commands::exec::ExecArgs),
    /// Run Python in a sandbox's code interpreter (image code-interpreter): text results
    /// printed, images saved to files (daemon).
    Code(commands::code::CodeArgs),
    /// Background processes of a sandbox: ls, logs [-f], stdin, kill (daemon).
    #[command(subcommand, visible_alias = "proc")]
    Process(commands::process::ProcessCommand),
    /// An interactive terminal in a sandbox, like `docker exec -it` (daemon).
    Shell(commands::shell::ShellArgs),
    /// Print a sandbox directory's changes as they happen: `watch ID /path [-r]` (daemon).
    Watch(commands::watch::WatchArgs),
    /// A sandbox's CPU, memory and disk use: the latest sample and a short history (daemon).
    Stats(commands::stats::StatsArgs),
    /// Copy a file into or out of a sandbox: `cp FILE ID:/path`, `cp ID:/path FILE` (daemon).
    Cp(commands::cp::CpArgs),
    /// Branch a running sandbox into copy-on-write children (daemon).
    Branch(commands::branch::BranchArgs),
    /// Draw a sandbox's branch tree with each branch's memory and disk (daemon).
    Tree(commands::tree::TreeArgs),
    /// Keep one branch child: delete its siblings (and with --promote its parent) (daemon).
    Keep(commands::tree::KeepArgs),
    /// How one sandbox's files differ from another's: A(dded), D(eleted), M(odified) (daemon).
    Diff(commands::tree::DiffArgs),
    /// Bring another sandbox's file changes since the common branch point in (daemon).
    Merge(commands::merge::MergeArgs),
    /// Take, list and delete snapshots (daemon).
    #[command(subcommand)]
    Snapshot(commands::snapshot::SnapshotCommand),
    /// Roll a sandbox back to a snapshot (daemon).
    Restore(commands::restore::RestoreArgs),
    /// Pause a sandbox to disk: memory and devices saved, VM process gone (daemon).
    Pause(commands::pause::PauseArgs),
    /// Resume a paused sandbox where it was: same processes, files, network (daemon).
    Resume(commands::pause::PauseArgs),
    /// List sandboxes (daemon).
    Ps(commands::ps::PsArgs),
    /// Kill and remove sandboxes (daemon).
    Rm(commands::rm::RmArgs),
    /// Set (`SECS`, from now) or clear (`none`) a sandbox's time-to-live (daemon).
    Ttl(commands::ttl::TtlArgs),
    /// List images the daemon can boot, or build one (daemon).
    Images(commands::images::ImagesArgs),
    /// A sandbox's console output (daemon).
    Logs(commands::logs::LogsArgs),
    /// What happened to a sandbox and in it: started, branched, paused, commands,
    /// snapshots, network and timeout changes; -f follows them, and without an id every
    /// sandbox's events are followed as they happen (daemon).
    Events(commands::events::EventsArgs),
    /// A sandbox's egress record: the connections its guest made under rules by name,
    /// allowed or refused, bytes each way; --follow streams them (daemon).
    Egress(commands::egress::EgressArgs),
    /// Expose, list and remove a sandbox's guest ports on the daemon's proxy (daemon).
    #[command(subcommand)]
    Port(commands::port::PortCommand),
    /// Change a sandbox's network policy while it runs or is paused (daemon).
    #[command(subcommand)]
    Network(commands::network::NetworkCommand),
    /// Named volumes that outlive sandboxes: create, ls, inspect, rm (daemon); mount one
    /// with `zygote create --volume NAME:/path`.
    #[command(subcommand)]
    Volume(commands::volume::VolumeCommand),
    /// Open the web console in a browser, logged in by a one-time URL (daemon; the token
    /// is never in the URL). --no-open only prints it.
    Ui(commands::ui::UiArgs),
}

fn main() {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("ZYGOTE_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Probe(args) => commands::probe::run(args),
        Command::Vm(cmd) => commands::vm::run(cmd),
        Command::Doctor(args) => commands::doctor::run(args),
        Command::Image(cmd) => commands::image::run(cmd),
        Command::Run(args) => commands::run::run(args),
        Command::Bench(cmd) => commands::bench::run(cmd),
        Command::Serve(args) => commands::serve::run(args),
        Command::Create(args) => commands::create::run(args),
        Command::Exec(args) => commands::exec::run(args),
        Command::Code(args) => commands::code::run(args),
        Command::Process(cmd) => commands::process::run(cmd),
        Command::Shell(args) => commands::shell::run(args),
        Command::Watch(args) => commands::watch::run(args),
        Command::Stats(args) => commands::stats::run(args),
        Command::Cp(args) => commands::cp::run(args),
        Command::Branch(args) => commands::branch::run(args),
        Command::Tree(args) => commands::tree::run_tree(args),
        Command::Keep(args) => commands::tree::run_keep(args),
        Command::Diff(args) => commands::tree::run_diff(args),
        Command::Merge(args) => commands::merge::run(args),
        Command::Snapshot(cmd) => commands::snapshot::run(cmd),
        Command::Restore(args) => commands::restore::run(args),
        Command::Pause(args) => commands::pause::run_pause(args),
        Command::Resume(args) => commands::pause::run_resume(args),
        Command::Ps(args) => commands::ps::run(args),
        Command::Rm(args) => commands::rm::run(args),
        Command::Ttl(args) => commands::ttl::run(args),
        Command::Images(args) => commands::images::run(args),
        Command::Logs(args) => commands::logs::run(args),
        Command::Events(args) => commands::events::run(args),
        Command::Egress(args) => commands::egress::run(args),
        Command::Port(cmd) => commands::port::run(cmd),
        Command::Network(cmd) => commands::network::run(cmd),
        Command::Volume(cmd) => commands::volume::run(cmd),
        Command::Ui(args) => commands::ui::run(args),
    };
    match result {
        Ok(code) => std::process::exit(code),
        Err(err) => {
            eprintln!("zygote: error: {}", error_chain(&err));
            std::process::exit(1);
        }
    }
}

/// The error and its causes, `: `-joined, leaving out a cause that the message before
/// it already shows (many error types print their source in their own message).
fn error_chain(err: &anyhow::Error) -> String {
    let mut out = String::new();
    for cause in err.chain() {
        let text = cause.to_string();
        if !out.contains(&text) {
            if !out.is_empty() {
                out.push_str(": ");
            }
            out.push_str(&text);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::error_chain;

    #[derive(Debug, thiserror::Error)]
    #[error("opening lock /x: {source}")]
    struct Shows {
        source: std::io::Error,
    }

    #[test]
    fn a_cause_already_in_the_message_is_not_repeated() {
        let io = || std::io::Error::from_raw_os_error(2);
        let err = anyhow::Error::new(Shows { source: io() }).context("building image minimal");
        assert_eq!(
            error_chain(&err),
            "building image minimal: opening lock /x: No such file or directory (os error 2)"
        );
        let err = anyhow::Error::new(io()).context("reading /y");
        assert_eq!(
            error_chain(&err),
            "reading /y: No such file or directory (os error 2)"
        );
    }
}
