//! `zygoted`: the zygote daemon (also `zygote serve`).
use clap::Parser;

#[derive(Parser)]
#[command(
    name = "zygoted",
    version,
    about = "zygote daemon: REST API for microVM sandboxes"
)]
struct Cli {
    #[command(flatten)]
    serve: zygote_daemon::ServeArgs,
}

fn main() {
    // The qemu runtime starts this binary again as its VMs' console pumps.
    let args: Vec<_> = std::env::args_os().collect();
    if let Some(code) = zygote_daemon::runtime::console::run_pump_if_asked(&args) {
        std::process::exit(code);
    }
    daemon();
}

#[tokio::main]
async fn daemon() {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("ZYGOTE_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
    if let Err(e) = zygote_daemon::serve(cli.serve).await {
        eprintln!("zygoted: error: {e}");
        std::process::exit(1);
    }
}
