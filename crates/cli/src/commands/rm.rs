//! `zygote rm ID...`: kill and remove sandboxes.
use zygote_api::client::{block_on, Method};

use super::daemon_client::ApiArgs;

#[derive(clap::Args)]
pub struct RmArgs {
    /// Sandbox ids.
    #[arg(required = true)]
    ids: Vec<String>,
    #[command(flatten)]
    api: ApiArgs,
}

pub fn run(args: RmArgs) -> anyhow::Result<i32> {
    let client = args.api.client()?;
    let mut code = 0;
    for id in &args.ids {
        match block_on(client.raw(Method::DELETE, &format!("/v1/sandboxes/{id}"), None)) {
            Ok(_) => println!("{id}"),
            Err(e) => {
                eprintln!("zygote: {id}: {e}");
                code = 1;
            }
        }
    }
    Ok(code)
}
