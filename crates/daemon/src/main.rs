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

#[tokio::main]
async fn main() {
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
