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
//! * fsync: not by default. Neither side fsyncs inside the timed region, so
//!   the baseline's time is writing 'bytes' into the page cache, not to disk;
//!   again this favours the baseline. Before every timed run the target
//!   filesystem is `syncfs`ed (untimed) so writeback left over from the
//!   previous run does not land in the next one. `durable: true` instead
//!   ends each timed run with a `syncfs`, measuring time-to-stable-storage.
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
use report::{host_info, utc_now};
pub use report::{BenchReport, FsResult, HostInfo, ShapeResult};
pub use shapes::{generate, naive_copy, Shape, SHAPES};

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
    /// End every timed run with syncfs (see the module docs).
    pub durable: bool,
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
            durable: false,
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
        durable: opts.durable,
        treatment: format!(
            "zygote_treeclone::materialize, Method::Auto, {} threads",
            treatment_opts.effective_threads()
        ),
        baseline: "sequential per-file read-whole-file + write(2), like cp -r without reflink"
            .into(),
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
    let sync = |p: &Path| crate::syncfs(p).map_err(io_err("syncfs", p));
    let mut baseline_ms = Vec::new();
    let mut treatment_ms = Vec::new();
    let mut methods = MethodCounts::default();
    let mut shared = None;
    for run in 0..opts.runs {
        let dst = root.join(format!("baseline-{}-{run}", shape.name));
        sync(root)?;
        let t = Instant::now();
        let copied = naive_copy(src, &dst).map_err(io_err("naive copy to", &dst))?;
        if opts.durable {
            sync(root)?;
        }
        let b = t.elapsed().as_secs_f64() * 1e3;
        fs::remove_dir_all(&dst).map_err(io_err("remove", &dst))?;
        if copied != shape.bytes() {
            return Err(BenchError::Verify(format!(
                "baseline copied {copied} bytes, expected {}",
                shape.bytes()
            )));
        }

        let dst = root.join(format!("treatment-{}-{run}", shape.name));
        sync(root)?;
        let t = Instant::now();
        let rep = materialize(src, &dst, topts)?;
        if opts.durable {
            sync(root)?;
        }
        let tr = t.elapsed().as_secs_f64() * 1e3;
        let check = verify_treatment(&rep, shape, src, &dst, run == 0);
        fs::remove_dir_all(&dst).map_err(io_err("remove", &dst))?;
        if let Some(s) = check? {
            shared = Some(s);
        }
        for m in rep.per_file.iter().map(|f| f.method) {
            methods.add(m);
        }
        progress(&format!(
            "{label}: {} run {}/{}: baseline {b:.1} ms, treatment {tr:.1} ms ({})",
            shape.name,
            run + 1,
            opts.runs,
            rep.by_method
        ));
        baseline_ms.push(b);
        treatment_ms.push(tr);
    }
    let (bm, tm) = (median(&baseline_ms), median(&treatment_ms));
    Ok(ShapeResult {
        shape: shape.name.into(),
        files: shape.files,
        bytes: shape.bytes(),
        baseline_ms,
        treatment_ms,
        baseline_median_ms: bm,
        treatment_median_ms: tm,
        speedup: bm / tm,
        treatment_method: methods.dominant(),
        treatment_methods: methods,
        shared_extents_verified: shared,
    })
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

fn median(xs: &[f64]) -> f64 {
    let mut v = xs.to_vec();
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n == 0 {
        f64::NAN
    } else if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn medians() {
        assert_eq!(median(&[5.0, 1.0, 3.0]), 3.0);
        assert_eq!(median(&[4.0, 1.0, 3.0, 2.0]), 2.5);
        assert!(median(&[]).is_nan());
    }

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
        assert_eq!((s.baseline_ms.len(), s.treatment_ms.len()), (5, 5));
        assert!(s
            .baseline_ms
            .iter()
            .chain(&s.treatment_ms)
            .all(|&x| x > 0.0));
        assert!((s.speedup - s.baseline_median_ms / s.treatment_median_ms).abs() < 1e-9);
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
