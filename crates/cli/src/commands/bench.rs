//! `zygote bench ...`
use clap::Subcommand;

#[derive(Subcommand)]
pub enum BenchCommand {
    /// Materialize generated trees with reflink/copy and compare against a per-file copy.
    Treeclone(super::bench_treeclone::TreecloneBenchArgs),
}

pub fn run(cmd: BenchCommand) -> anyhow::Result<i32> {
    match cmd {
        BenchCommand::Treeclone(args) => super::bench_treeclone::run(args),
    }
}
