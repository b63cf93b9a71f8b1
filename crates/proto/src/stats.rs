//! The guest's resource counters (`stats`): what the host samples into a sandbox's
//! metrics time series.
//!
//! The agent reports raw counters, not ratios: cumulative CPU jiffies since boot (so
//! the host computes a CPU percentage between two samples, which needs no sleeping in
//! the guest and no state in the agent), memory from `/proc/meminfo` and the root
//! filesystem's size from `statfs("/")`. Every number is the guest's word only: the host
//! treats each as hostile (saturating arithmetic, ratios clamped to their range).

use serde::{Deserialize, Serialize};

/// The answer to `stats` (`{"type": "stats", ...}`). Bytes unless said otherwise.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct GuestStats {
    /// Online CPUs (the `cpuN` lines of `/proc/stat`).
    pub cpu_count: u32,
    /// Jiffies every CPU spent busy since boot: user, nice, system, irq, softirq, steal.
    pub cpu_busy: u64,
    /// Jiffies every CPU spent in any state since boot: busy plus idle and iowait.
    pub cpu_total: u64,
    /// `MemTotal`.
    pub mem_total: u64,
    /// `MemAvailable`: used memory is `mem_total - mem_available`.
    pub mem_available: u64,
    /// `Cached + Buffers`: the page cache.
    pub mem_cache: u64,
    /// Size of the root filesystem's data blocks (`f_blocks * f_bsize`).
    pub disk_total: u64,
    /// What unprivileged users may still write there (`f_bavail * f_bsize`): used disk
    /// is `disk_total - disk_available`, as `df` counts it.
    pub disk_available: u64,
}
