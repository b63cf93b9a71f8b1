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
    };
    match result {
        Ok(code) => std::process::exit(code),
        Err(err) => {
            eprintln!("zygote: error: {err:#}");
            std::process::exit(1);
        }
    }
}
