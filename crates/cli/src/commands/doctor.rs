//! Placeholder while this command is being written (owned by one developer).
#[derive(clap::Args)]
pub struct DoctorArgs {}

pub fn run(_args: DoctorArgs) -> anyhow::Result<i32> {
    anyhow::bail!("not implemented yet")
}
