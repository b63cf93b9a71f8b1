//! Placeholder while this command is being written (owned by one developer).
#[derive(clap::Args)]
pub struct TreecloneBenchArgs {}

pub fn run(_args: TreecloneBenchArgs) -> anyhow::Result<i32> {
    anyhow::bail!("not implemented yet")
}
