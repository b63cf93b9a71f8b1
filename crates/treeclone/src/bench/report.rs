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

#[derive(Debug, Clone, Serialize)]
pub struct ShapeResult {
    pub shape: String,
    pub files: usize,
    pub bytes: u64,
    /// Sequential per-file read + write(2) copy.
    pub baseline: SideTimes,
    /// `materialize` with `Method::Auto`.
    pub treatment: SideTimes,
    /// Creating the same directories and empty files only (no data, no
    /// metadata copying), with the treatment's thread count.
    pub floor: SideTimes,
    /// baseline / treatment, visible medians.
    pub speedup_visible: f64,
    /// baseline / treatment, complete medians.
    pub speedup_complete: f64,
    /// GNU `cp -r --reflink=never`, timed like the other sides; None
    /// without GNU cp.
    pub cp: Option<SideTimes>,
    /// cp / treatment medians: [visible, complete].
    pub cp_speedup: Option<[f64; 2]>,
    /// baseline / floor, visible medians: no method that creates one inode
    /// per file can beat the baseline by more than this in this comparison.
    pub ceiling_visible: f64,
    /// The method used for most files in the treatment runs.
    pub treatment_method: Option<FileMethod>,
    /// Per-method file counts summed over all treatment runs.
    pub treatment_methods: MethodCounts,
    /// For reflinked trees: FIEMAP confirmed the clone's first file shares
    /// all its extents with the source. None when not applicable.
    pub shared_extents_verified: Option<bool>,
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
        writeln!(
            f,
            "treatment: {}\nbaseline:  {}\nfloor:     {}\ncp -r:     GNU cp -r --reflink=never (outside reference)\n\
             median of {} interleaved runs per side; syncfs (untimed) before every run.\n\
             visible = until the call returns (data may be in page cache only);\n\
             complete = until a syncfs right after it returns (that side's writeback included).\n\
             ceiling = baseline / floor (visible): the most any one-inode-per-file method can reach.",
            self.treatment, self.baseline, self.floor, self.runs,
        )?;
        for fsr in &self.filesystems {
            writeln!(f)?;
            if let Some(why) = &fsr.skipped {
                writeln!(f, "{}: skipped: {why}", fsr.label)?;
                continue;
            }
            for clock in [Clock::Visible, Clock::Complete] {
                write_table(f, &fsr.label, &fsr.shapes, clock)?;
            }
        }
        Ok(())
    }
}

#[derive(Clone, Copy, PartialEq)]
enum Clock {
    Visible,
    Complete,
}

impl Clock {
    fn median(self, side: &SideTimes) -> f64 {
        match self {
            Clock::Visible => side.visible_median_ms,
            Clock::Complete => side.complete_median_ms,
        }
    }
}

/// One table per filesystem and clock. Only the visible table has the
/// ceiling, method and FIEMAP columns (they do not depend on the clock).
fn write_table(
    f: &mut fmt::Formatter<'_>,
    label: &str,
    shapes: &[ShapeResult],
    clock: Clock,
) -> fmt::Result {
    let visible = clock == Clock::Visible;
    let title = if visible {
        "until visible"
    } else {
        "until complete (synced)"
    };
    writeln!(f, "{label}, {title}:")?;
    write!(
        f,
        "  {:<12} {:>6} {:>7} {:>12} {:>13} {:>8} {:>9} {:>9} {:>7}",
        "shape",
        "files",
        "MiB",
        "baseline ms",
        "treatment ms",
        "speedup",
        "floor ms",
        "cp -r ms",
        "vs cp"
    )?;
    if visible {
        write!(f, " {:>8}  {:<16} shared extents", "ceiling", "method")?;
    }
    writeln!(f)?;
    for s in shapes {
        let (cp_ms, vs_cp) = match (&s.cp, s.cp_speedup) {
            (Some(cp), Some([v, c])) => (
                format!("{:.1}", clock.median(cp)),
                format!("{:.1}x", if visible { v } else { c }),
            ),
            _ => ("n/a".into(), "n/a".into()),
        };
        let speedup = if visible {
            s.speedup_visible
        } else {
            s.speedup_complete
        };
        write!(
            f,
            "  {:<12} {:>6} {:>7.1} {:>12.1} {:>13.1} {:>7.1}x {:>9.1} {:>9} {:>7}",
            s.shape,
            s.files,
            s.bytes as f64 / (1 << 20) as f64,
            clock.median(&s.baseline),
            clock.median(&s.treatment),
            speedup,
            clock.median(&s.floor),
            cp_ms,
            vs_cp,
        )?;
        if visible {
            write!(
                f,
                " {:>7.1}x  {:<16} {}",
                s.ceiling_visible,
                s.treatment_method.map_or("-", FileMethod::as_str),
                match s.shared_extents_verified {
                    Some(true) => "yes (FIEMAP)",
                    Some(false) => "NO",
                    None => "n/a",
                }
            )?;
        }
        writeln!(f)?;
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
