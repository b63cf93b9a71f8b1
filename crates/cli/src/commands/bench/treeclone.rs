//! `zygote bench treeclone`: every tree materialization method (per-file
//! reflink, btrfs subvolume snapshot, overlay mount) against a naive per-file
//! copy, `cp -r`, `cp -r --reflink=always` and the inode-creation floor, each
//! timed until visible and until synced.
use std::path::PathBuf;

use zygote_treeclone::bench::{run_bench, BenchOptions, BenchReport, SideKind, MIN_RUNS};

use super::plot::{self, BarPanel, BarSeries};

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
    /// Also draw each method's median (visible clock) as bars, one chart per filesystem,
    /// into this PNG.
    #[arg(long, value_name = "FILE.png")]
    plot: Option<PathBuf>,
}

/// One bar chart per filesystem that ran: shapes along x, a bar per side that ran on it
/// (sides skipped there have no bar).
fn bar_panels(report: &BenchReport) -> Vec<BarPanel> {
    report
        .filesystems
        .iter()
        .filter(|fs| fs.skipped.is_none() && !fs.shapes.is_empty())
        .map(|fs| {
            let ran = |kind: SideKind| {
                fs.shapes
                    .iter()
                    .any(|sh| sh.sides.iter().any(|s| s.side == kind && s.times.is_some()))
            };
            let series = SideKind::ALL
                .into_iter()
                .enumerate()
                .filter(|&(_, k)| ran(k))
                .map(|(color, kind)| {
                    let per_shape = fs
                        .shapes
                        .iter()
                        .map(|sh| {
                            sh.sides
                                .iter()
                                .find(|s| s.side == kind)
                                .and_then(|s| s.times.as_ref())
                                .map(|t| t.visible_median_ms)
                        })
                        .collect();
                    BarSeries {
                        label: kind.as_str().to_string(),
                        color,
                        values: per_shape,
                    }
                })
                .collect();
            BarPanel {
                title: fs.fs_type.clone().unwrap_or_else(|| fs.label.clone()),
                groups: fs.shapes.iter().map(|s| s.shape.clone()).collect(),
                series,
            }
        })
        .collect()
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
    if let Some(path) = &args.plot {
        let title = format!(
            "bench treeclone: median time until the clone is visible, {} runs per method",
            report.runs
        );
        plot::bar_panels(path, &title, "ms (log scale)", &bar_panels(&report))?;
        eprintln!("plot written to {}", path.display());
    }
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print!("{report}");
    }
    Ok(0)
}
