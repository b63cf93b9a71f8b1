//! `zygote snapshot`: take, list and delete snapshots.
use zygote_api::client::{block_on, Method};
use zygote_api::model::{Snapshot, SnapshotKind, SnapshotList, SnapshotRequest};

use super::daemon_client::{age, print_json, print_list, ApiArgs};

#[derive(clap::Subcommand)]
pub enum SnapshotCommand {
    /// Snapshot a running sandbox (it keeps running).
    Create {
        /// Sandbox id.
        sandbox: String,
        /// full, diff or live (what the runtime supports: see `zygote ps`'s daemon info).
        #[arg(long, default_value = "full")]
        kind: String,
        #[arg(long)]
        name: Option<String>,
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        api: ApiArgs,
    },
    /// List snapshots with their lineage.
    Ls {
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        api: ApiArgs,
    },
    /// Delete a snapshot nothing depends on.
    Rm {
        id: String,
        #[command(flatten)]
        api: ApiArgs,
    },
    #[command(flatten)]
    Pack(super::snapshot_pack::PackCommand),
}

pub fn run(cmd: SnapshotCommand) -> anyhow::Result<i32> {
    match cmd {
        SnapshotCommand::Pack(p) => return super::snapshot_pack::run(p),
        SnapshotCommand::Create {
            sandbox,
            kind,
            name,
            json,
            api,
        } => {
            let client = api.client()?;
            let kind = SnapshotKind::parse(&kind)
                .ok_or_else(|| anyhow::anyhow!("--kind {kind:?}: want full, diff or live"))?;
            let body = SnapshotRequest {
                sandbox,
                kind: Some(kind),
                name,
            };
            let snap: Snapshot = block_on(client.json(Method::POST, "/v1/snapshots", Some(&body)))?;
            if json {
                print_json(&snap)?;
            } else {
                println!("{}", snap.id);
            }
        }
        SnapshotCommand::Ls { json, api } => {
            let list: SnapshotList = block_on(api.client()?.json(
                Method::GET,
                "/v1/snapshots",
                None::<&()>,
            ))?;
            let headers = ["ID", "NAME", "KIND", "SOURCE", "SIZE", "USED BY", "AGE"];
            print_list(&list, json, &headers, &list.snapshots, |s| {
                vec![
                    s.id.clone(),
                    s.name.clone().unwrap_or_default(),
                    s.kind.as_str().to_string(),
                    s.source_sandbox.clone(),
                    format!("{:.1}M", s.size_bytes as f64 / 1048576.0),
                    s.dependents.join(","),
                    age(s.created_at),
                ]
            })?;
        }
        SnapshotCommand::Rm { id, api } => {
            block_on(
                api.client()?
                    .raw(Method::DELETE, &format!("/v1/snapshots/{id}"), None),
            )?;
        }
    }
    Ok(0)
}
