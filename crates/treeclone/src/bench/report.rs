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

#[derive(Debug, Clone, Serialize)]
pub struct ShapeResult {
    pub shape: String,
    pub files: usize,
    pub bytes: u64,
    pub baseline_ms: Vec<f64>,
    pub treatment_ms: Vec<f64>,
    pub baseline_median_ms: f64,
    pub treatment_median_ms: f64,
    /// baseline median / treatment median.
    pub speedup: f64,
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
    pub durable: bool,
    pub treatment: String,
    pub baseline: String,
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
            "treatment: {}\nbaseline:  {}\nmedian of {} interleaved runs per side; {}",
            self.treatment,
            self.baseline,
            self.runs,
            if self.durable {
                "each timed run ends with syncfs"
            } else {
                "no fsync inside the timed region (syncfs before each run, untimed)"
            }
        )?;
        for fsr in &self.filesystems {
            writeln!(f)?;
            if let Some(why) = &fsr.skipped {
                writeln!(f, "{}: skipped: {why}", fsr.label)?;
                continue;
            }
            writeln!(f, "{}:", fsr.label)?;
            writeln!(
                f,
                "  {:<12} {:>6} {:>9} {:>13} {:>14} {:>9}  {:<16} shared extents",
                "shape", "files", "MiB", "baseline ms", "treatment ms", "speedup", "method"
            )?;
            for s in &fsr.shapes {
                writeln!(
                    f,
                    "  {:<12} {:>6} {:>9.1} {:>13.1} {:>14.1} {:>8.1}x  {:<16} {}",
                    s.shape,
                    s.files,
                    s.bytes as f64 / (1 << 20) as f64,
                    s.baseline_median_ms,
                    s.treatment_median_ms,
                    s.speedup,
                    s.treatment_method.map_or("-", FileMethod::as_str),
                    match s.shared_extents_verified {
                        Some(true) => "yes (FIEMAP)",
                        Some(false) => "NO",
                        None => "n/a",
                    }
                )?;
            }
        }
        Ok(())
    }
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
}
