//! `zygote bench ...`
use clap::Subcommand;

#[derive(Subcommand)]
pub enum BenchCommand {
    /// Materialize generated trees with reflink/copy and compare against a per-file copy.
    Treeclone(super::bench_treeclone::TreecloneBenchArgs),
    /// Pause and time-to-running of fork-based BRANCH vs live/diff/full snapshots.
    Branch(super::bench_branch::BranchBenchArgs),
    /// Branch N children from one live VM: wall time and unique memory per child.
    Fanout(super::bench_fanout::FanoutBenchArgs),
}

pub fn run(cmd: BenchCommand) -> anyhow::Result<i32> {
    match cmd {
        BenchCommand::Treeclone(args) => super::bench_treeclone::run(args),
        BenchCommand::Branch(args) => super::bench_branch::run(args),
        BenchCommand::Fanout(args) => super::bench_fanout::run(args),
    }
}
