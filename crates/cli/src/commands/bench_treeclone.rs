//! `zygote bench treeclone`: CoW tree materialization vs a naive per-file copy
//! and the inode-creation floor, each timed until visible and until synced.
use std::path::PathBuf;

use zygote_treeclone::bench::{run_bench, BenchOptions, MIN_RUNS};

#[derive(clap::Args)]
pub struct TreecloneBenchArgs {
    /// Print the report as JSON on stdout instead of a table.
    #[arg(long)]
    json: bool,
    /// Timed runs per side (baseline and treatment, interleaved); at least 5.
    #[arg(long, default_value_t = MIN_RUNS)]
    runs: usize,
    /// Directory for generated trees and the scratch XFS image
    /// (default: the system temp dir). Its filesystem is the "default fs" part.
    #[arg(long)]
    work_dir: Option<PathBuf>,
    /// Only these shapes (repeatable): small_flat, deep_nested, medium_flat, large_flat.
    #[arg(long = "shape")]
    shapes: Vec<String>,
    /// Skip the loop-mounted XFS part.
    #[arg(long)]
    no_xfs: bool,
    /// Treatment worker threads (0 = one per core).
    #[arg(long, default_value_t = 0)]
    threads: usize,
}

pub fn run(args: TreecloneBenchArgs) -> anyhow::Result<i32> {
    let opts = BenchOptions {
        runs: args.runs,
        work_dir: args.work_dir,
        shapes: args.shapes,
        xfs: !args.no_xfs,
        default_fs: true,
        threads: args.threads,
    };
    let report = run_bench(&opts, &mut |line| eprintln!("[treeclone] {line}"))?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print!("{report}");
    }
    Ok(0)
}
