//! `zygote bench ...`: one module per bench (what it measures and how in its own
//! docs), and what they share: statistics (`stats`), pictures (`plot`), the branch
//! measurements (`branch_measure`) and the network bench's remote end and report.
mod api_fanout;
mod branch;
mod branch_measure;
mod fanout;
mod ksm;
mod linux;
mod net;
mod net_remote;
mod net_report;
mod pause;
mod plot;
mod soak;
mod stats;
mod treeclone;
use clap::Subcommand;

#[derive(Subcommand)]
pub enum BenchCommand {
    /// Tree materialization, every method (subvolume, overlay, reflink, cp) vs a per-file copy.
    Treeclone(treeclone::TreecloneBenchArgs),
    /// Pause and time-to-running of fork-based BRANCH vs live/diff/full snapshots.
    Branch(branch::BranchBenchArgs),
    /// Branch N children from one live VM: wall time and unique memory per child.
    Fanout(fanout::FanoutBenchArgs),
    /// KSM density: memory saved across VMs with identical pages.
    Ksm(ksm::KsmBenchArgs),
    /// BRANCH of a real Linux sandbox through a private daemon: pause, until 1 and 4
    /// children answer, snapshot pauses (medians and p90; the last line is JSON).
    Linux(linux::LinuxBenchArgs),
    /// Park and resume a sandbox through a private daemon, per guest size: pause and
    /// resume times, memory given back, first exec after resume (the last line is JSON).
    Pause(pause::PauseBenchArgs),
    /// Soak: N create/exec/branch/exec/delete cycles through a private daemon, watching
    /// its fds, threads, RSS and leftover processes/files (the last line is JSON).
    Soak(soak::SoakBenchArgs),
    /// The largest branch the host holds through the daemon's streaming endpoint: time
    /// to the branch point, the first and the last child, per child, and the daemon's
    /// answers to another request meanwhile (medians and p90; the last line is JSON).
    ApiFanout(api_fanout::ApiFanoutBenchArgs),
    /// Isolated sandbox networking against QEMU user networking, interleaved: create,
    /// branch and guest-to-remote TCP throughput (medians and p90; the last line is JSON).
    Net(net::NetBenchArgs),
}

pub fn run(cmd: BenchCommand) -> anyhow::Result<i32> {
    match cmd {
        BenchCommand::Treeclone(args) => treeclone::run(args),
        BenchCommand::Branch(args) => branch::run(args),
        BenchCommand::Fanout(args) => fanout::run(args),
        BenchCommand::Ksm(args) => ksm::run(args),
        BenchCommand::Linux(args) => linux::run(args),
        BenchCommand::Soak(args) => soak::run(args),
        BenchCommand::Pause(args) => pause::run(args),
        BenchCommand::Net(args) => net::run(args),
        BenchCommand::ApiFanout(args) => api_fanout::run(args),
    }
}
