//! `zygote pause ID` / `zygote resume ID`: pause a sandbox to disk (its memory and
//! devices saved, its VM process gone) and bring it back where it was.
use zygote_api::client::{block_on, Method};
use zygote_api::model::Sandbox;

use super::daemon_client::{print_json, spinner, ApiArgs};

#[derive(clap::Args)]
pub struct PauseArgs {
    /// Sandbox id.
    id: String,
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    api: ApiArgs,
}

pub fn run_pause(args: PauseArgs) -> anyhow::Result<i32> {
    let s = call(&args, "pause", "pausing")?;
    if !args.json {
        println!("{} paused (state saved, VM stopped)", s.id);
    }
    Ok(0)
}

pub fn run_resume(args: PauseArgs) -> anyhow::Result<i32> {
    let s = call(&args, "resume", "resuming")?;
    if !args.json {
        println!("{} {} (pid {})", s.id, s.state, s.pid.unwrap_or_default());
    }
    Ok(0)
}

fn call(args: &PauseArgs, op: &str, doing: &str) -> anyhow::Result<Sandbox> {
    let client = args.api.client()?;
    let pb = (!args.json).then(|| spinner(&format!("{doing} {}", args.id)));
    let s: Result<Sandbox, _> = block_on(client.json(
        Method::POST,
        &format!("/v1/sandboxes/{}/{op}", args.id),
        None::<&()>,
    ));
    if let Some(pb) = pb {
        pb.finish_and_clear();
    }
    let s = s?;
    if args.json {
        print_json(&s)?;
    }
    Ok(s)
}
