//! The bench's result types, their table rendering, and the host/date
//! facts recorded with every result.
use std::fmt;
use std::fs;
use std::path::PathBuf;

use serde::Serialize;

use crate::{FileMethod, MethodCounts};

#[derive(Debug, Clone, Serialize)]
pub struct HostInfo {
    pub cores: usize,
    pub kernel: String,
    pub os: String,
    /// /proc/loadavg (1, 5, 15 min) when the bench started: on a shared
    /// machine this says how much the numbers were disturbed.
    pub load_average: String,
}

/// One side's timings over all runs, each measured twice from one start.
#[derive(Debug, Clone, Serialize)]
pub struct SideTimes {
    /// Until the call returned: the tree is complete in the namespace, its
    /// data possibly only in the page cache.
    pub visible_ms: Vec<f64>,
    /// Until a `syncfs` issued right after returned: every byte and inode
    /// the side created is on stable storage (its writeback included).
    pub complete_ms: Vec<f64>,
    pub visible_median_ms: f64,
    pub complete_median_ms: f64,
}

/// Collects one side's (visible, complete) pairs run by run.
#[derive(Default)]
pub(super) struct Samples {
    visible_ms: Vec<f64>,
    complete_ms: Vec<f64>,
}

impl Samples {
    pub(super) fn push(&mut self, (visible, complete): (f64, f64)) {
        self.visible_ms.push(visible);
        self.complete_ms.push(complete);
    }

    pub(super) fn finish(self) -> SideTimes {
        SideTimes {
            visible_median_ms: median(&self.visible_ms),
            complete_median_ms: median(&self.complete_ms),
            visible_ms: self.visible_ms,
            complete_ms: self.complete_ms,
        }
    }
}

pub(super) fn median(xs: &[f64]) -> f64 {
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

/// One compared side, named as `--methods` names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum SideKind {
    /// Sequential per-file read + write(2) copy: what speedups are against.
    Baseline,
    /// `materialize`, `Method::Auto`, on a plain (unsealed) source: per file
    /// (reflink on XFS and btrfs).
    PerFile,
    /// The same directories and empty files only.
    Floor,
    /// GNU `cp -r --reflink=never`.
    Cp,
    /// GNU `cp -r --reflink=always`.
    CpReflink,
    /// `materialize`, `Method::Subvolume`, from a sealed tree (btrfs).
    Subvolume,
    /// `materialize`, `Method::Overlay`, from a sealed tree (root).
    Overlay,
}

impl SideKind {
    /// Every side, in the order each run goes through them.
    pub const ALL: [SideKind; 7] = [
        SideKind::Baseline,
        SideKind::PerFile,
        SideKind::Floor,
        SideKind::Cp,
        SideKind::CpReflink,
        SideKind::Subvolume,
        SideKind::Overlay,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            SideKind::Baseline => "baseline",
            SideKind::PerFile => "per_file",
            SideKind::Floor => "floor",
            SideKind::Cp => "cp",
            SideKind::CpReflink => "cp_reflink",
            SideKind::Subvolume => "subvolume",
            SideKind::Overlay => "overlay",
        }
    }

    pub fn parse(s: &str) -> Option<SideKind> {
        SideKind::ALL.into_iter().find(|k| k.as_str() == s)
    }

    /// Whether it clones from a tree sealed once (untimed) per shape.
    pub fn needs_seal(self) -> bool {
        matches!(self, SideKind::Subvolume | SideKind::Overlay)
    }
}

/// What one side does, stated once per report.
#[derive(Debug, Clone, Serialize)]
pub struct SideDescription {
    pub side: SideKind,
    pub description: String,
}

/// One side on one shape and filesystem.
#[derive(Debug, Clone, Serialize)]
pub struct SideResult {
    pub side: SideKind,
    /// Why it was not measured here; None when it was.
    pub skipped: Option<String>,
    pub times: Option<SideTimes>,
    /// baseline / this side, visible medians.
    pub speedup_visible: Option<f64>,
    /// baseline / this side, complete medians.
    pub speedup_complete: Option<f64>,
    /// Untimed one-time preparation: sealing the generated tree (ms).
    pub prepare_ms: Option<f64>,
    /// How the clone was made: the strategy, or per-file method counts
    /// summed over all runs.
    pub how: Option<String>,
    /// FIEMAP on the first run's first file: all its extents are shared with
    /// the source. None when not checked (not a reflinked or snapshot side).
    pub shared_extents_verified: Option<bool>,
    /// Anything else worth knowing about how this side's trees look.
    pub notes: Vec<String>,
}

impl SideResult {
    pub(super) fn skipped(side: SideKind, why: String) -> SideResult {
        SideResult {
            side,
            skipped: Some(why),
            times: None,
            speedup_visible: None,
            speedup_complete: None,
            prepare_ms: None,
            how: None,
            shared_extents_verified: None,
            notes: Vec::new(),
        }
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct ShapeResult {
    pub shape: String,
    pub files: usize,
    pub bytes: u64,
    /// Sequential per-file read + write(2) copy.
    pub baseline: SideTimes,
    /// `materialize` with `Method::Auto` (per file); None when not selected.
    pub treatment: Option<SideTimes>,
    /// Creating the same directories and empty files only (no data, no
    /// metadata copying), with the treatment's thread count.
    pub floor: Option<SideTimes>,
    /// baseline / treatment, visible medians.
    pub speedup_visible: Option<f64>,
    /// baseline / treatment, complete medians.
    pub speedup_complete: Option<f64>,
    /// GNU `cp -r --reflink=never`, timed like the other sides; None
    /// without GNU cp.
    pub cp: Option<SideTimes>,
    /// cp / treatment medians: [visible, complete].
    pub cp_speedup: Option<[f64; 2]>,
    /// baseline / floor, visible medians: no method that creates one inode
    /// per file can beat the baseline by more than this in this comparison.
    pub ceiling_visible: Option<f64>,
    /// The method used for most files in the treatment runs.
    pub treatment_method: Option<FileMethod>,
    /// Per-method file counts summed over all treatment runs.
    pub treatment_methods: MethodCounts,
    /// For reflinked trees: FIEMAP confirmed the clone's first file shares
    /// all its extents with the source. None when not applicable.
    pub shared_extents_verified: Option<bool>,
    /// Every selected side (baseline included), measured or skipped, in run
    /// order.
    pub sides: Vec<SideResult>,
}

impl ShapeResult {
    pub fn side(&self, kind: SideKind) -> Option<&SideResult> {
        self.sides.iter().find(|s| s.side == kind)
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct FsResult {
    pub label: String,
    pub fs_type: Option<String>,
    pub path: Option<PathBuf>,
    /// Why this filesystem was not measured.
    pub skipped: Option<String>,
    pub shapes: Vec<ShapeResult>,
}

#[derive(Debug, Clone, Serialize)]
pub struct BenchReport {
    pub date_utc: String,
    pub host: HostInfo,
    pub runs: usize,
    pub treatment: String,
    pub baseline: String,
    pub floor: String,
    /// Every selected side and what it does.
    pub sides: Vec<SideDescription>,
    pub filesystems: Vec<FsResult>,
}

pub(super) fn host_info() -> HostInfo {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    // SAFETY: uname fills the zeroed struct; release is NUL-terminated.
    let kernel = unsafe {
        let mut u: libc::utsname = std::mem::zeroed();
        if libc::uname(&mut u) == 0 {
            std::ffi::CStr::from_ptr(u.release.as_ptr())
                .to_string_lossy()
                .into_owned()
        } else {
            "unknown".into()
        }
    };
    let os = fs::read_to_string("/etc/os-release")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("PRETTY_NAME="))
                .map(|v| v.trim_matches('"').to_string())
        })
        .unwrap_or_else(|| "unknown".into());
    let load_average = fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|_| "unknown".into());
    HostInfo {
        cores,
        kernel,
        os,
        load_average,
    }
}

/// Current UTC time as `YYYY-MM-DD HH:MM UTC`, without a date crate.
pub(super) fn utc_now() -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let (y, m, d) = civil_from_days((secs / 86_400) as i64);
    let rem = secs % 86_400;
    format!(
        "{y:04}-{m:02}-{d:02} {:02}:{:02} UTC",
        rem / 3600,
        rem % 3600 / 60
    )
}

/// Days since 1970-01-01 to a proleptic Gregorian date, by counting in
/// 400-year eras (146097 days each) that start on March 1st, so the leap
/// day falls at the end of each year.
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468; // shift the epoch to 0000-03-01
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097; // day of era, 0..=146096
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365; // year of era
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100); // day of March-based year
    let mp = (5 * doy + 2) / 153; // March-based month, 0..=11
    let day = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let month = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let year = yoe + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

impl fmt::Display for BenchReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "treeclone bench, {}: {} cores, Linux {}, {}, load average at start {}",
            self.date_utc, self.host.cores, self.host.kernel, self.host.os, self.host.load_average
        )?;
        for s in &self.sides {
            writeln!(f, "  {:<11} {}", s.side.as_str(), s.description)?;
        }
        writeln!(
            f,
            "median of {} interleaved runs per side; syncfs (untimed) before every run.\n\
             visible = until the call returns (data may be in page cache only);\n\
             complete = until a syncfs right after it returns (that side's writeback included).\n\
             speedup = baseline median / side median on the same clock; for the floor that is\n\
             the ceiling of any one-inode-per-file method.",
            self.runs,
        )?;
        for fsr in &self.filesystems {
            writeln!(f)?;
            if let Some(why) = &fsr.skipped {
                writeln!(f, "{}: skipped: {why}", fsr.label)?;
                continue;
            }
            write_table(f, &fsr.label, &fsr.shapes)?;
        }
        Ok(())
    }
}

fn ratio(x: Option<f64>) -> String {
    x.map_or_else(|| "-".into(), |r| format!("{r:.1}x"))
}

/// One table per filesystem: a row per shape and side, both clocks.
fn write_table(f: &mut fmt::Formatter<'_>, label: &str, shapes: &[ShapeResult]) -> fmt::Result {
    writeln!(f, "{label}:")?;
    writeln!(
        f,
        "  {:<12} {:>5} {:>6}  {:<11} {:>10} {:>8} {:>11} {:>8}  notes",
        "shape", "files", "MiB", "side", "visible ms", "speedup", "complete ms", "speedup"
    )?;
    for s in shapes {
        for (i, side) in s.sides.iter().enumerate() {
            let (name, files, mib) = if i == 0 {
                (
                    s.shape.clone(),
                    s.files.to_string(),
                    format!("{:.1}", s.bytes as f64 / (1 << 20) as f64),
                )
            } else {
                Default::default()
            };
            write!(
                f,
                "  {name:<12} {files:>5} {mib:>6}  {:<11}",
                side.side.as_str()
            )?;
            match (&side.skipped, &side.times) {
                (Some(why), _) => writeln!(f, " skipped: {why}")?,
                (None, Some(t)) => {
                    write!(
                        f,
                        " {:>10.1} {:>8} {:>11.1} {:>8} ",
                        t.visible_median_ms,
                        ratio(side.speedup_visible),
                        t.complete_median_ms,
                        ratio(side.speedup_complete)
                    )?;
                    let mut notes = Vec::new();
                    if let Some(how) = &side.how {
                        notes.push(how.clone());
                    }
                    if let Some(ms) = side.prepare_ms {
                        notes.push(format!("seal {ms:.0} ms untimed"));
                    }
                    match side.shared_extents_verified {
                        Some(true) => notes.push("shared extents (FIEMAP)".into()),
                        Some(false) => notes.push("extents NOT shared".into()),
                        None => {}
                    }
                    notes.extend(side.notes.iter().cloned());
                    writeln!(f, " {}", notes.join("; "))?;
                }
                (None, None) => writeln!(f, " -")?,
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn civil_dates() {
        assert_eq!(civil_from_days(0), (1970, 1, 1));
        assert_eq!(civil_from_days(59), (1970, 3, 1));
        assert_eq!(civil_from_days(11_016), (2000, 2, 29));
        assert_eq!(civil_from_days(19_782), (2024, 2, 29));
        assert_eq!(civil_from_days(-1), (1969, 12, 31));
    }

    #[test]
    fn medians() {
        assert_eq!(median(&[5.0, 1.0, 3.0]), 3.0);
        assert_eq!(median(&[4.0, 1.0, 3.0, 2.0]), 2.5);
        assert!(median(&[]).is_nan());
    }
}
