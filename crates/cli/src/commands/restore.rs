//! `zygote restore ID SNAPSHOT`: roll a sandbox back (or forward) to a snapshot.
use zygote_api::client::{block_on, Method};
use zygote_api::model::{RestoreRequest, Sandbox};

use super::daemon_client::{print_json, spinner, ApiArgs};

#[derive(clap::Args)]
pub struct RestoreArgs {
    /// Sandbox id.
    id: String,
    /// Snapshot id.
    snapshot: String,
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    api: ApiArgs,
}

pub fn run(args: RestoreArgs) -> anyhow::Result<i32> {
    let client = args.api.client()?;
    let pb = (!args.json).then(|| spinner(&format!("restoring {}", args.id)));
    let s: Result<Sandbox, _> = block_on(client.json(
        Method::POST,
        &format!("/v1/sandboxes/{}/restore", args.id),
        Some(&RestoreRequest {
            snapshot: args.snapshot.clone(),
        }),
    ));
    if let Some(pb) = pb {
        pb.finish_and_clear();
    }
    let s = s?;
    if args.json {
        print_json(&s)?;
    } else {
        println!("{} {} (pid {})", s.id, s.state, s.pid.unwrap_or_default());
    }
    Ok(0)
}
