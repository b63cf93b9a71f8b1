//! Placeholder while this command is being written (owned by one developer).
#[derive(clap::Subcommand)]
pub enum ImageCommand {
    /// Not implemented yet.
    Todo,
}

pub fn run(_cmd: ImageCommand) -> anyhow::Result<i32> {
    anyhow::bail!("not implemented yet")
}
