//! `zygote logs ID`: a sandbox's serial console output.
use zygote_api::client::{block_on, Method};

use super::daemon_client::{print_json, ApiArgs};

#[derive(clap::Args)]
pub struct LogsArgs {
    /// Sandbox id.
    id: String,
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    api: ApiArgs,
}

pub fn run(args: LogsArgs) -> anyhow::Result<i32> {
    let bytes = block_on(args.api.client()?.raw(
        Method::GET,
        &format!("/v1/sandboxes/{}/logs", args.id),
        None,
    ))?;
    let text = String::from_utf8_lossy(&bytes);
    if args.json {
        print_json(&serde_json::json!({"id": args.id, "console": text}))?;
    } else {
        print!("{text}");
    }
    Ok(0)
}
