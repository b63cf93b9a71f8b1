//! `zygote bench treeclone`: how much faster is materializing a tree with
//! [`crate::materialize`] (`Method::Auto`) than a naive per-file copy?
//!
//! Method, and why:
//! * Trees of random (incompressible) data in the four issue-8 shapes are
//!   generated once per filesystem and shape; both sides copy the same tree.
//! * Runs are interleaved (baseline, treatment, baseline, treatment, ...), so
//!   drift in machine state (other builds on a shared host, writeback) hits
//!   both sides alike. We report medians of `runs` runs of each.
//! * Page cache: we cannot require dropping it, so both sides read a source
//!   that is warm (just generated). That flatters the baseline, if anything.
//! * An outside reference, GNU `cp -r --reflink=never` (when installed), is
//!   timed the same way: the per-file copy people actually run.
//! * Two clocks per run, from one start: *visible* stops when the call
//!   returns (the baseline's bytes may sit in the page cache only), and
//!   *complete* when a `syncfs` issued right after it returns (the side's
//!   writeback included). Without the second, the baseline's dominant cost,
//!   writing its bytes out, would land in the untimed `syncfs` that starts
//!   the next run (it keeps one run's leftovers out of the next).
//! * A third side, the *floor*, creates the same directories and empty
//!   files and nothing else. Every method that gives each file its own
//!   inode pays at least that, so baseline / floor bounds the visible
//!   speedup any such method can reach on this filesystem and machine.
//! * Filesystems: (a) a loop-mounted XFS with reflink, made and torn down
//!   here (skipped with a reason when that is impossible), and (b) whatever
//!   filesystem the work directory is on.
use std::fs;
use std::path::{Path, PathBuf};
use std::time::Instant;

use crate::loopfs::{LoopFsError, LoopXfs};
use crate::{fiemap, materialize, FileMethod, MethodCounts, Options};

mod report;
mod shapes;
use report::{host_info, utc_now, Samples};
pub use report::{BenchReport, FsResult, HostInfo, ShapeResult, SideTimes};
pub use shapes::{
    cp_reference, create_empty_tree, generate, gnu_cp_available, naive_copy, Shape, SHAPES,
};

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
    let work = opts.work_dir.clone().unwrap_or_else(std::env::temp_dir);
    let treatment_opts = Options {
        threads: opts.threads,
        ..Options::default()
    };
    let mut report = BenchReport {
        date_utc: utc_now(),
        host: host_info(),
        runs: opts.runs,
        treatment: format!(
            "zygote_treeclone::materialize, Method::Auto, {} threads",
            treatment_opts.effective_threads()
        ),
        baseline: "sequential per-file read-whole-file + write(2), like cp -r without reflink"
            .into(),
        floor: format!(
            "create the same directories and empty files only, {} threads",
            treatment_opts.effective_threads()
        ),
        filesystems: Vec::new(),
    };

    if opts.xfs {
        let label = "xfs (loop, reflink=1)".to_string();
        // Room for one shape's source plus one full baseline copy at a time,
        // with generous slack; the image is sparse so slack costs nothing.
        let biggest = shapes.iter().map(Shape::bytes).max().unwrap_or(0);
        let size = (2 * biggest + (1 << 30)).next_multiple_of(1 << 30);
        progress(&format!(
            "{label}: creating a {} GiB sparse image in {}",
            size >> 30,
            work.display()
        ));
        match LoopXfs::create(&work, size) {
            Ok(xfs) => {
                progress(&format!(
                    "{label}: mounted {} at {}",
                    xfs.device().unwrap_or("?"),
                    xfs.path().display()
                ));
                let res = bench_fs(&label, xfs.path(), &shapes, opts, &treatment_opts, progress);
                drop(xfs);
                progress(&format!("{label}: unmounted and removed"));
                report.filesystems.push(res?);
            }
            Err(e) => {
                progress(&format!("{label}: skipped: {e}"));
                report.filesystems.push(skipped(label, e.to_string()));
            }
        }
    }
    if opts.default_fs {
        let fs_type = crate::fs_type_name(&work).unwrap_or_else(|_| "unknown".into());
        let label = format!("{fs_type} (work dir)");
        let scratch = tempfile::Builder::new()
            .prefix("zygote-treeclone-bench-")
            .tempdir_in(&work)
            .map_err(io_err("create scratch dir in", &work))?;
        let res = bench_fs(
            &label,
            scratch.path(),
            &shapes,
            opts,
            &treatment_opts,
            progress,
        )?;
        report.filesystems.push(res);
    }
    Ok(report)
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
    label: &str,
    root: &Path,
    shapes: &[Shape],
    opts: &BenchOptions,
    topts: &Options,
    progress: &mut dyn FnMut(&str),
) -> Result<FsResult, BenchError> {
    let fs_type = crate::fs_type_name(root).ok();
    let mut results = Vec::new();
    for (k, shape) in shapes.iter().enumerate() {
        let src = root.join(format!("src-{}", shape.name));
        progress(&format!(
            "{label}: generating {} ({} x {} KiB, {:.1} MiB)",
            shape.name,
            shape.files,
            shape.file_size / 1024,
            shape.bytes() as f64 / (1 << 20) as f64
        ));
        generate(shape, &src, 0x5eed + k as u64).map_err(io_err("generate", &src))?;
        let r = bench_shape(label, root, &src, shape, opts, topts, progress);
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

fn bench_shape(
    label: &str,
    root: &Path,
    src: &Path,
    shape: &Shape,
    opts: &BenchOptions,
    topts: &Options,
    progress: &mut dyn FnMut(&str),
) -> Result<ShapeResult, BenchError> {
    let remove = |p: &Path| fs::remove_dir_all(p).map_err(io_err("remove", p));
    let threads = topts.effective_threads();
    // Probed once, outside every timer.
    let have_cp = gnu_cp_available();
    let (mut base, mut treat, mut floor, mut cp) = (
        Samples::default(),
        Samples::default(),
        Samples::default(),
        Samples::default(),
    );
    let mut methods = MethodCounts::default();
    let mut shared = None;
    for run in 0..opts.runs {
        let dst = root.join(format!("baseline-{}-{run}", shape.name));
        let (copied, b) = timed(root, || {
            naive_copy(src, &dst).map_err(io_err("naive copy to", &dst))
        })?;
        remove(&dst)?;
        if copied != shape.bytes() {
            return Err(BenchError::Verify(format!(
                "baseline copied {copied} bytes, expected {}",
                shape.bytes()
            )));
        }

        let dst = root.join(format!("treatment-{}-{run}", shape.name));
        let (rep, tr) = timed(root, || Ok(materialize(src, &dst, topts)?))?;
        let check = verify_treatment(&rep, shape, src, &dst, run == 0);
        remove(&dst)?;
        if let Some(s) = check? {
            shared = Some(s);
        }
        for m in rep.per_file.iter().map(|f| f.method) {
            methods.add(m);
        }

        let dst = root.join(format!("floor-{}-{run}", shape.name));
        let (made, fl) = timed(root, || {
            create_empty_tree(src, &dst, threads).map_err(io_err("create empty tree", &dst))
        })?;
        remove(&dst)?;
        if made != shape.files {
            return Err(BenchError::Verify(format!(
                "floor created {made} files, expected {}",
                shape.files
            )));
        }

        let cp_note = if have_cp {
            let dst = root.join(format!("cp-{}-{run}", shape.name));
            let ((), c) = timed(root, || {
                cp_reference(src, &dst).map_err(io_err("cp -r --reflink=never to", &dst))
            })?;
            remove(&dst)?;
            cp.push(c);
            format!("{:.1}/{:.1}", c.0, c.1)
        } else {
            "n/a (no GNU cp)".into()
        };

        progress(&format!(
            "{label}: {} run {}/{}: visible/complete ms: baseline {:.1}/{:.1}, \
             treatment {:.1}/{:.1} ({}), floor {:.1}/{:.1}, cp -r {cp_note}",
            shape.name,
            run + 1,
            opts.runs,
            b.0,
            b.1,
            tr.0,
            tr.1,
            rep.by_method,
            fl.0,
            fl.1,
        ));
        base.push(b);
        treat.push(tr);
        floor.push(fl);
    }
    let (baseline, treatment, floor) = (base.finish(), treat.finish(), floor.finish());
    let cp = have_cp.then(|| cp.finish());
    Ok(ShapeResult {
        shape: shape.name.into(),
        files: shape.files,
        bytes: shape.bytes(),
        speedup_visible: baseline.visible_median_ms / treatment.visible_median_ms,
        speedup_complete: baseline.complete_median_ms / treatment.complete_median_ms,
        ceiling_visible: baseline.visible_median_ms / floor.visible_median_ms,
        cp_speedup: cp.as_ref().map(|c| {
            [
                c.visible_median_ms / treatment.visible_median_ms,
                c.complete_median_ms / treatment.complete_median_ms,
            ]
        }),
        cp,
        baseline,
        treatment,
        floor,
        treatment_method: methods.dominant(),
        treatment_methods: methods,
        shared_extents_verified: shared,
    })
}

/// Runs `op` after syncing `root` (untimed), returning its value and
/// (visible, complete) in ms: complete also waits for a `syncfs` right
/// after `op` returned. See the module docs.
fn timed<T>(
    root: &Path,
    op: impl FnOnce() -> Result<T, BenchError>,
) -> Result<(T, (f64, f64)), BenchError> {
    let sync = || crate::syncfs(root).map_err(io_err("syncfs", root));
    sync()?;
    let t = Instant::now();
    let value = op()?;
    let visible = t.elapsed().as_secs_f64() * 1e3;
    sync()?;
    Ok((value, (visible, t.elapsed().as_secs_f64() * 1e3)))
}

/// Make sure the treatment really produced the tree (a fast wrong answer is
/// not a speedup). On the first run also compare one file's bytes and, when
/// it was reflinked, confirm with FIEMAP that its extents are shared.
fn verify_treatment(
    rep: &crate::Report,
    shape: &Shape,
    src: &Path,
    dst: &Path,
    deep: bool,
) -> Result<Option<bool>, BenchError> {
    if rep.files != shape.files as u64 || rep.bytes != shape.bytes() {
        return Err(BenchError::Verify(format!(
            "treatment made {} files / {} bytes, expected {} / {}",
            rep.files,
            rep.bytes,
            shape.files,
            shape.bytes()
        )));
    }
    if !deep {
        return Ok(None);
    }
    let Some(first) = rep.per_file.first() else {
        return Ok(None);
    };
    let (a, b) = (src.join(&first.path), dst.join(&first.path));
    let same =
        fs::read(&a).map_err(io_err("read", &a))? == fs::read(&b).map_err(io_err("read", &b))?;
    if !same {
        return Err(BenchError::Verify(format!(
            "{} differs from its source",
            b.display()
        )));
    }
    if first.method != FileMethod::Reflink {
        return Ok(None);
    }
    let shared = fiemap::fully_shared(&b).map_err(io_err("FIEMAP", &b))?;
    Ok(Some(shared))
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
        for side in [&s.baseline, &s.treatment, &s.floor] {
            assert_eq!((side.visible_ms.len(), side.complete_ms.len()), (5, 5));
            // Both clocks start together; complete also waited for syncfs.
            for (v, c) in side.visible_ms.iter().zip(&side.complete_ms) {
                assert!(*v > 0.0 && c >= v, "visible {v} ms, complete {c} ms");
            }
        }
        let ratio = |a: &SideTimes, b: &SideTimes| a.visible_median_ms / b.visible_median_ms;
        assert!((s.speedup_visible - ratio(&s.baseline, &s.treatment)).abs() < 1e-9);
        assert!((s.ceiling_visible - ratio(&s.baseline, &s.floor)).abs() < 1e-9);
        let complete = s.baseline.complete_median_ms / s.treatment.complete_median_ms;
        assert!((s.speedup_complete - complete).abs() < 1e-9);
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
        assert!(lines.iter().any(|l| l.contains("run 5/5")));
        // Scratch trees are cleaned up.
        let left: Vec<_> = fs::read_dir(work.path()).unwrap().collect();
        assert!(left.is_empty(), "bench left {left:?} behind");
        assert!(rep.to_string().contains("small_flat"));
    }
}
