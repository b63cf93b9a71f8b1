//! `zygote images`: images the daemon can boot, and building one through it.
use zygote_api::client::{block_on, Method};
use zygote_api::model::{BuildEvent, BuildImageRequest, ImageList, PullImageRequest};

use super::daemon_client::{age, print_json, print_list, spinner, ApiArgs};

#[derive(clap::Args)]
pub struct ImagesArgs {
    /// Build this recipe (through the daemon) instead of listing.
    #[arg(long, value_name = "RECIPE", conflicts_with = "pull")]
    build: Option<String>,
    /// Pull this OCI image (through the daemon, with the daemon's registry settings and
    /// docker config) instead of listing.
    #[arg(long, value_name = "REFERENCE")]
    pull: Option<String>,
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    api: ApiArgs,
}

pub fn run(args: ImagesArgs) -> anyhow::Result<i32> {
    let client = args.api.client()?;
    let job = match (&args.build, &args.pull) {
        (Some(name), _) => Some((
            "building",
            name,
            "/v1/images/build",
            serde_json::to_value(BuildImageRequest { name: name.clone() })?,
        )),
        (None, Some(r)) => Some((
            "pulling",
            r,
            "/v1/images",
            serde_json::to_value(PullImageRequest {
                reference: r.clone(),
                ..Default::default()
            })?,
        )),
        (None, None) => None,
    };
    if let Some((verb, name, path, body)) = job {
        let pb = spinner(&format!("{verb} {name}"));
        let mut last = None;
        block_on(client.ndjson(
            Method::POST,
            path,
            Some(&body),
            |ev: BuildEvent| match &ev {
                BuildEvent::Progress { line } => pb.set_message(format!("{verb} {name}: {line}")),
                BuildEvent::Resolved { digest, .. } => pb.set_message(format!("{name}: {digest}")),
                BuildEvent::Layer {
                    index, done, total, ..
                } => pb.set_message(format!(
                    "{verb} {name}: layer {index} {:.1}/{:.1} MiB",
                    *done as f64 / 1048576.0,
                    *total as f64 / 1048576.0
                )),
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
    let headers = ["NAME", "SHA256", "DISK", "BUILT", "SOURCE"];
    print_list(&list, args.json, &headers, &list.images, |i| {
        vec![
            i.name.clone(),
            i.sha256[..12.min(i.sha256.len())].to_string(),
            format!("{:.1}M", i.disk_bytes as f64 / 1048576.0),
            age(i.built_at),
            i.source.clone().unwrap_or_else(|| i.description.clone()),
        ]
    })?;
    if !args.json {
        eprintln!("recipes: {}", list.recipes.join(", "));
    }
    Ok(0)
}
