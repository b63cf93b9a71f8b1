//! Placeholder while this command is being written (owned by one developer).
#[derive(clap::Args)]
pub struct ProbeArgs {}

pub fn run(_args: ProbeArgs) -> anyhow::Result<i32> {
    anyhow::bail!("not implemented yet")
}
