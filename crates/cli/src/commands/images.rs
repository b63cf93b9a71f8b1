//! `zygote images`: images the daemon can boot, and building one through it.
use serde_json::json;
use zygote_daemon::client::{block_on, Method};
use zygote_daemon::model::{BuildEvent, ImageList};

use super::daemon_client::{age, print_json, print_table, spinner, ApiArgs};

#[derive(clap::Args)]
pub struct ImagesArgs {
    /// Build this recipe (through the daemon) instead of listing.
    #[arg(long, value_name = "RECIPE")]
    build: Option<String>,
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    api: ApiArgs,
}

pub fn run(args: ImagesArgs) -> anyhow::Result<i32> {
    let client = args.api.client()?;
    if let Some(name) = &args.build {
        let pb = spinner(&format!("building {name}"));
        let mut last = None;
        block_on(client.ndjson(
            Method::POST,
            "/v1/images/build",
            Some(&json!({"name": name})),
            |ev: BuildEvent| match &ev {
                BuildEvent::Progress { line } => pb.set_message(format!("building {name}: {line}")),
                _ => last = Some(ev),
            },
        ))?;
        pb.finish_and_clear();
        return match last {
            Some(BuildEvent::Done { image }) => {
                if args.json {
                    print_json(&image)?;
                } else {
                    println!("{}-{}", image.name, image.sha256);
                }
                Ok(0)
            }
            Some(BuildEvent::Error { code, message }) => anyhow::bail!("{message} ({code})"),
            _ => anyhow::bail!("the daemon ended the build without a result"),
        };
    }
    let list: ImageList = block_on(client.json(Method::GET, "/v1/images", None::<&()>))?;
    if args.json {
        print_json(&list)?;
        return Ok(0);
    }
    let rows: Vec<Vec<String>> = list
        .images
        .iter()
        .map(|i| {
            vec![
                i.name.clone(),
                i.sha256[..12.min(i.sha256.len())].to_string(),
                format!("{:.1}M", i.disk_bytes as f64 / 1048576.0),
                age(i.built_at),
                i.description.clone(),
            ]
        })
        .collect();
    print_table(&["NAME", "SHA256", "DISK", "BUILT", "DESCRIPTION"], &rows);
    eprintln!("recipes: {}", list.recipes.join(", "));
    Ok(0)
}
