//! `stats`: the guest's resource counters, read from the kernel as they are now.
//!
//! `/proc/stat` gives cumulative CPU jiffies (the host turns two samples into a
//! percentage, so the agent keeps no state and never sleeps), `/proc/meminfo` the memory
//! figures, `statfs("/")` the root filesystem's size. The parsers are pure functions over
//! the files' text so they can be tested on odd input; a field the kernel did not print
//! counts as 0 rather than failing the whole answer, and sums saturate.

use std::io;

use zygote_proto::stats::GuestStats;
use zygote_proto::{ErrorBody, Response};

type Result<T> = std::result::Result<T, ErrorBody>;

pub(crate) fn stats() -> Result<Response> {
    let read = |path: &str| {
        std::fs::read_to_string(path)
            .map_err(|e| ErrorBody::from_io(&format!("reading {path}"), &e))
    };
    let cpu = parse_proc_stat(&read("/proc/stat")?);
    let mem = parse_meminfo(&read("/proc/meminfo")?);
    let (disk_total, disk_available) =
        statfs_root().map_err(|e| ErrorBody::from_io("statfs /", &e))?;
    Ok(Response::Stats(GuestStats {
        cpu_count: cpu.count,
        cpu_busy: cpu.busy,
        cpu_total: cpu.total,
        mem_total: mem.total,
        mem_available: mem.available,
        mem_cache: mem.cache,
        disk_total,
        disk_available,
    }))
}

#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct CpuTimes {
    pub count: u32,
    pub busy: u64,
    pub total: u64,
}

/// The aggregate `cpu` line's jiffies and the number of `cpuN` lines. Fields (see
/// proc(5)): user nice system idle iowait irq softirq steal [guest guest_nice]; guest
/// time is already counted in user and nice, so it is left out.
pub(crate) fn parse_proc_stat(text: &str) -> CpuTimes {
    let mut out = CpuTimes::default();
    let mut aggregate_seen = false;
    for line in text.lines() {
        let mut fields = line.split_ascii_whitespace();
        let Some(name) = fields.next() else { continue };
        if name == "cpu" && !aggregate_seen {
            aggregate_seen = true;
            let v: Vec<u64> = fields.take(8).map(|f| f.parse().unwrap_or(0)).collect();
            let get = |i: usize| v.get(i).copied().unwrap_or(0);
            let idle = get(3).saturating_add(get(4));
            let busy = [0, 1, 2, 5, 6, 7]
                .iter()
                .fold(0u64, |acc, &i| acc.saturating_add(get(i)));
            out.busy = busy;
            out.total = busy.saturating_add(idle);
        } else if name
            .strip_prefix("cpu")
            .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
        {
            out.count = out.count.saturating_add(1);
        }
    }
    out
}

#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct MemInfo {
    pub total: u64,
    pub available: u64,
    pub cache: u64,
}

/// `MemTotal`, `MemAvailable` and `Cached + Buffers`, in bytes (the file says kB).
pub(crate) fn parse_meminfo(text: &str) -> MemInfo {
    let mut out = MemInfo::default();
    let (mut cached, mut buffers) = (0u64, 0u64);
    for line in text.lines() {
        let Some((key, rest)) = line.split_once(':') else {
            continue;
        };
        let mut parts = rest.split_ascii_whitespace();
        let value: u64 = parts.next().and_then(|v| v.parse().ok()).unwrap_or(0);
        let bytes = match parts.next() {
            Some("kB") => value.saturating_mul(1024),
            _ => value,
        };
        match key {
            "MemTotal" => out.total = bytes,
            "MemAvailable" => out.available = bytes,
            "Cached" => cached = bytes,
            "Buffers" => buffers = bytes,
            _ => {}
        }
    }
    out.cache = cached.saturating_add(buffers);
    out
}

/// The root filesystem's data size and what unprivileged users may still write, bytes.
fn statfs_root() -> io::Result<(u64, u64)> {
    // SAFETY: statvfs writes into the zeroed struct we own; the path is a valid C string.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    let rc = unsafe { libc::statvfs(c"/".as_ptr(), &mut st) };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    let unit = st.f_frsize as u64;
    Ok((
        (st.f_blocks as u64).saturating_mul(unit),
        (st.f_bavail as u64).saturating_mul(unit),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proc_stat_gives_busy_and_total_jiffies_and_the_cpu_count() {
        let text = "cpu  100 5 50 800 20 3 2 1 40 0\n\
                    cpu0 50 2 25 400 10 1 1 0 20 0\n\
                    cpu1 50 3 25 400 10 2 1 1 20 0\n\
                    intr 12345 0 0\nctxt 999\ncpufreq 1\n";
        let t = parse_proc_stat(text);
        assert_eq!(t.count, 2);
        assert_eq!(t.busy, 100 + 5 + 50 + 3 + 2 + 1);
        assert_eq!(t.total, t.busy + 800 + 20);
    }

    #[test]
    fn odd_proc_text_never_panics_or_overflows() {
        let t = parse_proc_stat("cpu 18446744073709551615 18446744073709551615 x -1\ncpu\n");
        assert_eq!((t.busy, t.total), (u64::MAX, u64::MAX));
        assert_eq!(parse_proc_stat(""), CpuTimes::default());
        let m = parse_meminfo("MemTotal: 18446744073709551615 kB\nCached:\nBuffers: 7\nnoise");
        assert_eq!((m.total, m.cache), (u64::MAX, 7));
    }

    #[test]
    fn meminfo_is_read_in_bytes() {
        let text = "MemTotal:        2000 kB\nMemFree:          500 kB\n\
                    MemAvailable:    1500 kB\nBuffers:           10 kB\nCached:           300 kB\n\
                    SwapCached:         5 kB\n";
        let m = parse_meminfo(text);
        assert_eq!(m.total, 2000 * 1024);
        assert_eq!(m.available, 1500 * 1024);
        assert_eq!(m.cache, 310 * 1024);
    }

    #[test]
    fn this_machine_answers() {
        let Response::Stats(s) = stats().expect("stats") else {
            panic!("not a stats answer")
        };
        assert!(s.cpu_count >= 1 && s.cpu_total >= s.cpu_busy);
        assert!(s.mem_total >= s.mem_available && s.mem_total > 0);
        assert!(s.disk_total >= s.disk_available);
    }
}
