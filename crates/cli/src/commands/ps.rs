//! `zygote ps`: list sandboxes.
use zygote_daemon::client::{block_on, Method};
use zygote_daemon::model::{Origin, SandboxList};

use super::daemon_client::{age, expires_in, print_json, print_table, ApiArgs};

#[derive(clap::Args)]
pub struct PsArgs {
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    api: ApiArgs,
}

pub fn run(args: PsArgs) -> anyhow::Result<i32> {
    let list: SandboxList = block_on(args.api.client()?.json(
        Method::GET,
        "/v1/sandboxes",
        None::<&()>,
    ))?;
    if args.json {
        print_json(&list)?;
        return Ok(0);
    }
    let rows: Vec<Vec<String>> = list
        .sandboxes
        .iter()
        .map(|s| {
            let origin = match &s.origin {
                Origin::Image { name, .. } => format!("image {name}"),
                Origin::Snapshot { id } => format!("snapshot {id}"),
                Origin::Branch { parent, .. } => format!("branch of {parent}"),
            };
            let state = match &s.exit_reason {
                Some(r) if s.state == "dead" => format!("dead: {r}"),
                _ => s.state.clone(),
            };
            vec![
                s.id.clone(),
                s.name.clone().unwrap_or_default(),
                s.runtime.clone(),
                s.pid.map(|p| p.to_string()).unwrap_or_default(),
                origin,
                age(s.created_at),
                expires_in(s.expires_at),
                state,
            ]
        })
        .collect();
    print_table(
        &[
            "ID", "NAME", "RUNTIME", "PID", "ORIGIN", "AGE", "EXPIRES", "STATE",
        ],
        &rows,
    );
    Ok(0)
}
