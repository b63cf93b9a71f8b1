//! `zygote volume`: named volumes that outlive sandboxes (docker's verbs): create, ls,
//! inspect, rm. A volume is mounted at create: `zygote create --volume NAME:/path`.
use zygote_api::client::{block_on, Method};
use zygote_api::model::{CreateVolumeRequest, Volume, VolumeList};

use super::daemon_client::{age, print_json, print_list, ApiArgs};

#[derive(clap::Subcommand)]
pub enum VolumeCommand {
    /// Make an empty volume (an ext4 filesystem; sparse on the host).
    Create {
        name: String,
        /// Size in MiB (default 1024).
        #[arg(long)]
        size_mib: Option<u64>,
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        api: ApiArgs,
    },
    /// List volumes and the sandbox each is mounted in.
    Ls {
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        api: ApiArgs,
    },
    /// One volume as JSON.
    Inspect {
        /// Volume name or id.
        volume: String,
        #[command(flatten)]
        api: ApiArgs,
    },
    /// Delete volumes (with their data) no sandbox has mounted.
    Rm {
        /// Volume names or ids.
        #[arg(required = true)]
        volumes: Vec<String>,
        #[command(flatten)]
        api: ApiArgs,
    },
}

pub fn run(cmd: VolumeCommand) -> anyhow::Result<i32> {
    match cmd {
        VolumeCommand::Create {
            name,
            size_mib,
            json,
            api,
        } => {
            let body = CreateVolumeRequest { name, size_mib };
            let v: Volume = block_on(api.client()?.json(Method::POST, "/v1/volumes", Some(&body)))?;
            if json {
                print_json(&v)?;
            } else {
                println!("{}", v.id);
            }
        }
        VolumeCommand::Ls { json, api } => {
            let list: VolumeList =
                block_on(api.client()?.json(Method::GET, "/v1/volumes", None::<&()>))?;
            let headers = ["ID", "NAME", "SIZE", "MOUNTED IN", "AGE"];
            print_list(&list, json, &headers, &list.volumes, |v| {
                vec![
                    v.id.clone(),
                    v.name.clone(),
                    format!("{}M", v.size_mib),
                    v.attached_to.clone().unwrap_or_default(),
                    age(v.created_at),
                ]
            })?;
        }
        VolumeCommand::Inspect { volume, api } => {
            let v: Volume = block_on(api.client()?.json(
                Method::GET,
                &format!("/v1/volumes/{}", encode(&volume)),
                None::<&()>,
            ))?;
            print_json(&v)?;
        }
        VolumeCommand::Rm { volumes, api } => {
            let client = api.client()?;
            for v in volumes {
                block_on(client.raw(Method::DELETE, &format!("/v1/volumes/{}", encode(&v)), None))?;
                println!("{v}");
            }
        }
    }
    Ok(0)
}

/// A name as one path segment (volume names never need it; a typo might).
fn encode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// `NAME:/path` of `zygote create --volume`.
pub fn parse_mount(spec: &str) -> anyhow::Result<zygote_api::model::VolumeMountSpec> {
    let (name, path) = spec
        .split_once(':')
        .filter(|(n, p)| !n.is_empty() && p.starts_with('/'))
        .ok_or_else(|| anyhow::anyhow!("--volume {spec:?}: want NAME:/absolute/path"))?;
    Ok(zygote_api::model::VolumeMountSpec {
        name: name.to_string(),
        path: path.to_string(),
        shared: None,
    })
}
