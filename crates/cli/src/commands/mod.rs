//! One module per CLI verb. Each exposes a clap `Args`/`Subcommand` type and a
//! `run(...) -> anyhow::Result<i32>` returning the process exit code.
pub mod bench;
pub mod bench_branch;
pub mod bench_fanout;
pub mod bench_ksm;
pub mod bench_linux;
pub mod bench_stats;
pub mod bench_treeclone;
pub mod branch;
pub mod cp;
pub mod create;
pub mod daemon_client;
pub mod doctor;
pub mod exec;
pub mod image;
pub mod images;
pub mod logs;
pub mod probe;
pub mod ps;
pub mod restore;
pub mod rm;
pub mod run;
pub mod serve;
pub mod snapshot;
pub mod ttl;
pub mod vm;
pub mod vm_serve;
