//! `zygote bench treeclone`: every tree materialization method (per-file
//! reflink, btrfs subvolume snapshot, overlay mount) against a naive per-file
//! copy, `cp -r`, `cp -r --reflink=always` and the inode-creation floor, each
//! timed until visible and until synced.
use std::path::PathBuf;

use zygote_treeclone::bench::{run_bench, BenchOptions, MIN_RUNS};

#[derive(clap::Args)]
pub struct TreecloneBenchArgs {
    /// Print the report as JSON on stdout instead of a table.
    #[arg(long)]
    json: bool,
    /// Timed runs per side (all sides interleaved run by run); at least 5.
    #[arg(long, default_value_t = MIN_RUNS)]
    runs: usize,
    /// Directory for generated trees and the scratch XFS and btrfs images
    /// (default: the system temp dir). Its filesystem is the "default fs" part.
    #[arg(long)]
    work_dir: Option<PathBuf>,
    /// Only these shapes (repeatable): small_flat, deep_nested, medium_flat, large_flat.
    #[arg(long = "shape")]
    shapes: Vec<String>,
    /// Only these sides (repeatable or comma-separated): per_file, floor, cp,
    /// cp_reflink, subvolume, overlay. The baseline always runs.
    #[arg(long = "methods", value_delimiter = ',')]
    methods: Vec<String>,
    /// Run the loop-mounted XFS part (the default; needs root).
    #[arg(long, overrides_with = "no_xfs")]
    xfs: bool,
    /// Skip the loop-mounted XFS part.
    #[arg(long, overrides_with = "xfs")]
    no_xfs: bool,
    /// Run the loop-mounted btrfs part (the default; needs root).
    #[arg(long, overrides_with = "no_btrfs")]
    btrfs: bool,
    /// Skip the loop-mounted btrfs part.
    #[arg(long, overrides_with = "btrfs")]
    no_btrfs: bool,
    /// Treatment worker threads (0 = one per core).
    #[arg(long, default_value_t = 0)]
    threads: usize,
}

pub fn run(args: TreecloneBenchArgs) -> anyhow::Result<i32> {
    let opts = BenchOptions {
        runs: args.runs,
        work_dir: args.work_dir,
        shapes: args.shapes,
        // The last of --xfs / --no-xfs wins; neither means on.
        xfs: args.xfs || !args.no_xfs,
        btrfs: args.btrfs || !args.no_btrfs,
        methods: args.methods,
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
