//! `zygote branch ID`: copy-on-write children of a running sandbox.
use serde_json::json;
use zygote_daemon::client::{block_on, Method};
use zygote_daemon::model::BranchResponse;

use super::daemon_client::{print_json, spinner, ApiArgs};

#[derive(clap::Args)]
pub struct BranchArgs {
    /// Parent sandbox id.
    id: String,
    /// Number of children.
    #[arg(long, short = 'c', default_value_t = 1)]
    count: u32,
    /// Children's TTL in seconds (default: the parent's).
    #[arg(long, value_name = "SECS")]
    ttl: Option<u64>,
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    api: ApiArgs,
}

pub fn run(args: BranchArgs) -> anyhow::Result<i32> {
    let client = args.api.client()?;
    let pb = (!args.json).then(|| spinner(&format!("branching {} x{}", args.id, args.count)));
    let res: Result<BranchResponse, _> = block_on(client.json(
        Method::POST,
        &format!("/v1/sandboxes/{}/branch", args.id),
        Some(&json!({"count": args.count, "ttl_secs": args.ttl})),
    ));
    if let Some(pb) = pb {
        pb.finish_and_clear();
    }
    let res = res?;
    if args.json {
        print_json(&res)?;
    } else {
        for c in &res.children {
            println!("{c}");
        }
        eprintln!(
            "branched in {} ms (branch point {})",
            res.duration_ms, res.branch_point
        );
    }
    Ok(0)
}
