//! `zygote bench ...`
use clap::Subcommand;

#[derive(Subcommand)]
pub enum BenchCommand {
    /// Tree materialization, every method (subvolume, overlay, reflink, cp) vs a per-file copy.
    Treeclone(super::bench_treeclone::TreecloneBenchArgs),
    /// Pause and time-to-running of fork-based BRANCH vs live/diff/full snapshots.
    Branch(super::bench_branch::BranchBenchArgs),
    /// Branch N children from one live VM: wall time and unique memory per child.
    Fanout(super::bench_fanout::FanoutBenchArgs),
    /// KSM density: memory saved across VMs with identical pages.
    Ksm(super::bench_ksm::KsmBenchArgs),
    /// BRANCH of a real Linux sandbox through a private daemon: pause, until 1 and 4
    /// children answer, snapshot pauses (medians and p90; the last line is JSON).
    Linux(super::bench_linux::LinuxBenchArgs),
    /// Park and resume a sandbox through a private daemon, per guest size: pause and
    /// resume times, memory given back, first exec after resume (the last line is JSON).
    Pause(super::bench_pause::PauseBenchArgs),
    /// Soak: N create/exec/branch/exec/delete cycles through a private daemon, watching
    /// its fds, threads, RSS and leftover processes/files (the last line is JSON).
    Soak(super::bench_soak::SoakBenchArgs),
    /// The largest branch the host holds through the daemon's streaming endpoint: time
    /// to the branch point, the first and the last child, per child, and the daemon's
    /// answers to another request meanwhile (medians and p90; the last line is JSON).
    ApiFanout(super::bench_api_fanout::ApiFanoutBenchArgs),
    /// Isolated sandbox networking against QEMU user networking, interleaved: create,
    /// branch and guest-to-remote TCP throughput (medians and p90; the last line is JSON).
    Net(super::bench_net::NetBenchArgs),
}

pub fn run(cmd: BenchCommand) -> anyhow::Result<i32> {
    match cmd {
        BenchCommand::Treeclone(args) => super::bench_treeclone::run(args),
        BenchCommand::Branch(args) => super::bench_branch::run(args),
        BenchCommand::Fanout(args) => super::bench_fanout::run(args),
        BenchCommand::Ksm(args) => super::bench_ksm::run(args),
        BenchCommand::Linux(args) => super::bench_linux::run(args),
        BenchCommand::Soak(args) => super::bench_soak::run(args),
        BenchCommand::Pause(args) => super::bench_pause::run(args),
        BenchCommand::Net(args) => super::bench_net::run(args),
        BenchCommand::ApiFanout(args) => super::bench_api_fanout::run(args),
    }
}
