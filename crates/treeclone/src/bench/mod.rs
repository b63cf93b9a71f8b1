//! `zygote bench treeclone`: how much faster is materializing a tree with
//! [`crate::materialize`] than a naive per-file copy, for every method?
//!
//! Method, and why:
//! * Trees of random (incompressible) data in the four issue-8 shapes are
//!   generated once per filesystem and shape; every side copies the same tree.
//! * Sides (`--methods` names): `baseline`, a sequential per-file copy (what
//!   every speedup is against; always run); `per_file`, `materialize` with
//!   `Method::Auto` on the plain generated tree (reflink per file on XFS and
//!   btrfs); `floor`, the same directories and empty files only; `cp` and
//!   `cp_reflink`, GNU `cp -r --reflink=never` and `--reflink=always` as
//!   outside references; `subvolume` and `overlay`, the constant-time
//!   whole-tree methods, cloning a tree sealed once per shape ([`crate::seal`],
//!   untimed, its time reported apart). A side that cannot run on a
//!   filesystem (no btrfs, not root, no reflink) is skipped with the reason.
//! * Runs are interleaved (every side once, then again, ...), so drift in
//!   machine state (other builds on a shared host, writeback) hits all sides
//!   alike. We report medians of `runs` runs of each.
//! * Page cache: we cannot require dropping it, so every side reads a source
//!   that is warm (just generated). That flatters the baseline, if anything.
//! * Two clocks per run, from one start: *visible* stops when the call
//!   returns (the baseline's bytes may sit in the page cache only), and
//!   *complete* when a `syncfs` issued right after it returns (the side's
//!   writeback included). Without the second, the baseline's dominant cost,
//!   writing its bytes out, would land in the untimed `syncfs` that starts
//!   the next run (it keeps one run's leftovers out of the next).
//! * The *floor* bounds what any method that gives each file its own inode
//!   can reach: baseline / floor is that ceiling. Whole-tree methods create
//!   no inode per file and are not bound by it.
//! * Every run's clone is checked (file count and bytes, contents and
//!   FIEMAP sharing on the first run) and removed, untimed, with
//!   [`crate::remove`] (an overlay clone is a mount).
//! * Filesystems: (a) a loop-mounted XFS with reflink and (b) a loop-mounted
//!   btrfs, made and torn down here (skipped with a reason when that is
//!   impossible), and (c) whatever filesystem the work directory is on.
use std::fs;
use std::path::{Path, PathBuf};

use crate::loopfs::{LoopFs, LoopFsError, LoopFsKind};
use crate::Options;

mod report;
mod shapes;
mod sides;
use report::{host_info, utc_now};
pub use report::{
    BenchReport, FsResult, HostInfo, ShapeResult, SideDescription, SideKind, SideResult, SideTimes,
};
pub use shapes::{
    cp_reference, cp_reflink_availability, cp_reflink_reference, create_empty_tree, file_path,
    generate, gnu_cp_available, naive_copy, Shape, SHAPES,
};
use sides::{bench_shape, Caps, ShapeCtx};

/// Fewer runs than this make a median meaningless.
pub const MIN_RUNS: usize = 5;

#[derive(Debug, Clone)]
pub struct BenchOptions {
    /// Timed runs per side per shape (at least [`MIN_RUNS`]).
    pub runs: usize,
    /// Where scratch trees and the XFS image go; default: the system temp dir.
    pub work_dir: Option<PathBuf>,
    /// Shape names to run; empty means all of [`SHAPES`].
    pub shapes: Vec<String>,
    /// Try the loop-mounted XFS part.
    pub xfs: bool,
    /// Try the loop-mounted btrfs part.
    pub btrfs: bool,
    /// Side names to run (see [`SideKind`]); empty means all. The baseline
    /// always runs: every speedup is against it.
    pub methods: Vec<String>,
    /// Run on the work directory's own filesystem.
    pub default_fs: bool,
    /// Treatment worker threads; 0 = one per core.
    pub threads: usize,
}

impl Default for BenchOptions {
    fn default() -> Self {
        BenchOptions {
            runs: MIN_RUNS,
            work_dir: None,
            shapes: Vec::new(),
            xfs: true,
            btrfs: true,
            methods: Vec::new(),
            default_fs: true,
            threads: 0,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    #[error("at least {MIN_RUNS} runs are needed for a meaningful median, got {0}")]
    TooFewRuns(usize),
    #[error("unknown shape {0:?} (known: small_flat, deep_nested, medium_flat, large_flat)")]
    UnknownShape(String),
    #[error("{what} {path}: {source}")]
    Io {
        what: &'static str,
        path: PathBuf,
        source: std::io::Error,
    },
    #[error(
        "unknown method {0:?} (known: baseline, per_file, floor, cp, cp_reflink, subvolume, overlay)"
    )]
    UnknownMethod(String),
    #[error("treatment failed: {0}")]
    Materialize(#[from] crate::Error),
    #[error("sanity check failed: {0}")]
    Verify(String),
    #[error("scratch filesystem: {0}")]
    LoopFs(#[from] LoopFsError),
}

fn io_err(what: &'static str, path: &Path) -> impl FnOnce(std::io::Error) -> BenchError {
    let path = path.to_path_buf();
    move |source| BenchError::Io { what, path, source }
}

/// Run the bench; `progress` receives one line per step.
pub fn run_bench(
    opts: &BenchOptions,
    progress: &mut dyn FnMut(&str),
) -> Result<BenchReport, BenchError> {
    if opts.runs < MIN_RUNS {
        return Err(BenchError::TooFewRuns(opts.runs));
    }
    let shapes: Vec<Shape> = if opts.shapes.is_empty() {
        SHAPES.to_vec()
    } else {
        opts.shapes
            .iter()
            .map(|n| {
                SHAPES
                    .iter()
                    .find(|s| s.name == n)
                    .copied()
                    .ok_or_else(|| BenchError::UnknownShape(n.clone()))
            })
            .collect::<Result<_, _>>()?
    };
    let sides = select_sides(&opts.methods)?;
    let work = opts.work_dir.clone().unwrap_or_else(std::env::temp_dir);
    let treatment_opts = Options {
        threads: opts.threads,
        ..Options::default()
    };
    let threads = treatment_opts.effective_threads();
    let mut report = BenchReport {
        date_utc: utc_now(),
        host: host_info(),
        runs: opts.runs,
        treatment: format!("zygote_treeclone::materialize, Method::Auto, {threads} threads"),
        baseline: "sequential per-file read-whole-file + write(2), like cp -r without reflink"
            .into(),
        floor: format!("create the same directories and empty files only, {threads} threads"),
        sides: sides
            .iter()
            .map(|&side| SideDescription {
                side,
                description: describe(side, threads),
            })
            .collect(),
        filesystems: Vec::new(),
    };
    let ctx = Run {
        shapes: &shapes,
        sides: &sides,
        runs: opts.runs,
        topts: &treatment_opts,
    };

    // Room for one shape's source plus two full copies at a time (btrfs
    // frees space late), with generous slack; sparse, so slack costs nothing.
    let biggest = shapes.iter().map(Shape::bytes).max().unwrap_or(0);
    let size = (3 * biggest + (1 << 30)).next_multiple_of(1 << 30);
    for (on, kind, label) in [
        (opts.xfs, LoopFsKind::Xfs, "xfs (loop, reflink=1)"),
        (opts.btrfs, LoopFsKind::Btrfs, "btrfs (loop)"),
    ] {
        if on {
            let r = bench_loop(&ctx, kind, label, &work, size, progress)?;
            report.filesystems.push(r);
        }
    }
    if opts.default_fs {
        let fs_type = crate::fs_type_name(&work).unwrap_or_else(|_| "unknown".into());
        let label = format!("{fs_type} (work dir)");
        let scratch = tempfile::Builder::new()
            .prefix("zygote-treeclone-bench-")
            .tempdir_in(&work)
            .map_err(io_err("create scratch dir in", &work))?;
        let res = bench_fs(&ctx, &label, scratch.path(), progress)?;
        report.filesystems.push(res);
    }
    Ok(report)
}

/// The selected sides in run order, the baseline always first.
fn select_sides(methods: &[String]) -> Result<Vec<SideKind>, BenchError> {
    let mut wanted = vec![SideKind::Baseline];
    for m in methods.iter().flat_map(|m| m.split(',')) {
        let m = m.trim();
        if m.is_empty() {
            continue;
        }
        wanted.push(SideKind::parse(m).ok_or_else(|| BenchError::UnknownMethod(m.into()))?);
    }
    if methods.is_empty() {
        wanted = SideKind::ALL.to_vec();
    }
    Ok(SideKind::ALL
        .into_iter()
        .filter(|k| wanted.contains(k))
        .collect())
}

fn describe(side: SideKind, threads: usize) -> String {
    match side {
        SideKind::Baseline => {
            "sequential per-file read-whole-file + write(2), like cp -r without reflink".into()
        }
        SideKind::PerFile => format!(
            "materialize, Method::Auto on the plain tree: per file (reflink where possible), \
             {threads} threads"
        ),
        SideKind::Floor => {
            format!("create the same directories and empty files only, {threads} threads")
        }
        SideKind::Cp => {
            "GNU cp -r --reflink=never (outside reference, process start included)".into()
        }
        SideKind::CpReflink => {
            "GNU cp -r --reflink=always (outside reference, process start included)".into()
        }
        SideKind::Subvolume => {
            "materialize, Method::Subvolume: writable snapshot of the tree sealed once \
             (untimed) as a read-only btrfs subvolume"
                .into()
        }
        SideKind::Overlay => "materialize, Method::Overlay: overlayfs mount over the tree \
                              sealed once (untimed), private upper dir beside it (root only)"
            .into(),
    }
}

/// What every filesystem's part shares.
struct Run<'a> {
    shapes: &'a [Shape],
    sides: &'a [SideKind],
    runs: usize,
    topts: &'a Options,
}

fn bench_loop(
    ctx: &Run,
    kind: LoopFsKind,
    label: &str,
    work: &Path,
    size: u64,
    progress: &mut dyn FnMut(&str),
) -> Result<FsResult, BenchError> {
    progress(&format!(
        "{label}: creating a {} GiB sparse image in {}",
        size >> 30,
        work.display()
    ));
    match LoopFs::create_kind(work, size, kind) {
        Ok(lfs) => {
            progress(&format!(
                "{label}: mounted {} at {}",
                lfs.device().unwrap_or("?"),
                lfs.path().display()
            ));
            let res = bench_fs(ctx, label, lfs.path(), progress);
            drop(lfs);
            progress(&format!("{label}: unmounted and removed"));
            res
        }
        Err(e) => {
            progress(&format!("{label}: skipped: {e}"));
            Ok(skipped(label.into(), e.to_string()))
        }
    }
}

fn skipped(label: String, reason: String) -> FsResult {
    FsResult {
        label,
        fs_type: None,
        path: None,
        skipped: Some(reason),
        shapes: Vec::new(),
    }
}

fn bench_fs(
    ctx: &Run,
    label: &str,
    root: &Path,
    progress: &mut dyn FnMut(&str),
) -> Result<FsResult, BenchError> {
    let fs_type = crate::fs_type_name(root).ok();
    let caps = Caps::probe(root);
    let mut results = Vec::new();
    for (k, shape) in ctx.shapes.iter().enumerate() {
        let src = root.join(format!("src-{}", shape.name));
        progress(&format!(
            "{label}: generating {} ({} x {} KiB, {:.1} MiB)",
            shape.name,
            shape.files,
            shape.file_size / 1024,
            shape.bytes() as f64 / (1 << 20) as f64
        ));
        generate(shape, &src, 0x5eed + k as u64).map_err(io_err("generate", &src))?;
        let sctx = ShapeCtx {
            label,
            root,
            src: &src,
            shape,
            runs: ctx.runs,
            topts: ctx.topts,
        };
        let r = bench_shape(&sctx, ctx.sides, &caps, progress);
        // Free the space before the next shape whatever happened.
        let _ = fs::remove_dir_all(&src);
        results.push(r?);
    }
    Ok(FsResult {
        label: label.into(),
        fs_type,
        path: Some(root.into()),
        skipped: None,
        shapes: results,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rejects_too_few_runs_and_unknown_shapes() {
        let mut opts = BenchOptions {
            runs: 4,
            ..Default::default()
        };
        assert!(matches!(
            run_bench(&opts, &mut |_| {}),
            Err(BenchError::TooFewRuns(4))
        ));
        opts.runs = 5;
        opts.shapes = vec!["nope".into()];
        assert!(matches!(
            run_bench(&opts, &mut |_| {}),
            Err(BenchError::UnknownShape(_))
        ));
    }

    #[test]
    fn method_selection_keeps_run_order_and_the_baseline() {
        assert_eq!(select_sides(&[]).unwrap(), SideKind::ALL.to_vec());
        let picked = select_sides(&["overlay,per_file".into(), "cp".into()]).unwrap();
        assert_eq!(
            picked,
            [
                SideKind::Baseline,
                SideKind::PerFile,
                SideKind::Cp,
                SideKind::Overlay
            ]
        );
        assert!(matches!(
            select_sides(&["reflink".into()]),
            Err(BenchError::UnknownMethod(_))
        ));
    }

    /// The whole pipeline on the smallest shape and the default filesystem:
    /// the report must hold real, consistent measurements.
    #[test]
    fn small_run_on_default_fs() {
        let work = tempfile::tempdir().unwrap();
        let opts = BenchOptions {
            runs: 5,
            work_dir: Some(work.path().into()),
            shapes: vec!["small_flat".into()],
            xfs: false,
            btrfs: false,
            ..Default::default()
        };
        let mut lines = Vec::new();
        let rep = run_bench(&opts, &mut |l| lines.push(l.to_string())).unwrap();
        assert_eq!(rep.filesystems.len(), 1);
        let s = &rep.filesystems[0].shapes[0];
        assert_eq!(
            (s.shape.as_str(), s.files, s.bytes),
            ("small_flat", 64, 64 * 1024)
        );
        let (treatment, floor) = (s.treatment.as_ref().unwrap(), s.floor.as_ref().unwrap());
        for side in [&s.baseline, treatment, floor] {
            assert_eq!((side.visible_ms.len(), side.complete_ms.len()), (5, 5));
            // Both clocks start together; complete also waited for syncfs.
            for (v, c) in side.visible_ms.iter().zip(&side.complete_ms) {
                assert!(*v > 0.0 && c >= v, "visible {v} ms, complete {c} ms");
            }
        }
        let ratio = |a: &SideTimes, b: &SideTimes| a.visible_median_ms / b.visible_median_ms;
        let speedup = s.speedup_visible.unwrap();
        assert!((speedup - ratio(&s.baseline, treatment)).abs() < 1e-9);
        assert!((s.ceiling_visible.unwrap() - ratio(&s.baseline, floor)).abs() < 1e-9);
        let complete = s.baseline.complete_median_ms / treatment.complete_median_ms;
        assert!((s.speedup_complete.unwrap() - complete).abs() < 1e-9);
        // The cp reference runs every time GNU cp is installed (it is on Debian).
        let cp_here = gnu_cp_available();
        assert_eq!(s.cp.is_some(), cp_here);
        assert_eq!(s.cp_speedup.is_some(), cp_here);
        if let Some(cp) = &s.cp {
            assert_eq!((cp.visible_ms.len(), cp.complete_ms.len()), (5, 5));
        }
        let counted = s.treatment_methods.reflink
            + s.treatment_methods.copy_file_range
            + s.treatment_methods.copy;
        assert_eq!(counted, 5 * 64);
        // Every side is listed, measured or skipped with a reason; speedups
        // are against the baseline on the same clock.
        let kinds: Vec<_> = s.sides.iter().map(|x| x.side).collect();
        assert_eq!(kinds, SideKind::ALL.to_vec());
        for side in &s.sides {
            match (&side.times, &side.skipped) {
                (Some(t), None) => {
                    assert_eq!(t.visible_ms.len(), 5);
                    let v = s.baseline.visible_median_ms / t.visible_median_ms;
                    assert!((side.speedup_visible.unwrap() - v).abs() < 1e-9);
                }
                (None, Some(why)) => assert!(!why.is_empty()),
                other => panic!("{:?}: {other:?}", side.side),
            }
        }
        let subvolume = s.side(SideKind::Subvolume).unwrap();
        assert_eq!(
            subvolume.skipped.is_none(),
            crate::btrfs::is_btrfs(work.path())
        );
        // As root the overlay side runs here too (its seal is reported).
        let overlay = s.side(SideKind::Overlay).unwrap();
        if crate::overlay_availability().is_ok() {
            assert!(overlay.times.is_some(), "{:?}", overlay.skipped);
            assert!(overlay.prepare_ms.is_some());
            assert_eq!(overlay.how.as_deref(), Some("overlay"));
        }
        assert!(lines.iter().any(|l| l.contains("run 5/5 per_file")));
        // Scratch trees, sealed trees and overlay mounts are cleaned up.
        let left: Vec<_> = fs::read_dir(work.path()).unwrap().collect();
        assert!(left.is_empty(), "bench left {left:?} behind");
        assert!(rep.to_string().contains("small_flat"));
    }
}
