//! When a warm branch is worth it: writing the pages a spawner lacks costs time on the
//! branch's path (before and during the pause); a fork-path branch instead costs a
//! fork(2) and the child's VM build. Both are measured on this host as the VMM works
//! (the per-page copy rate from every catch-up, the fork from every spawner's fork,
//! the build from fork to "built"), so the choice follows the host: on this bench
//! machine a page costs ~1.5 us, in the nested lane's L1 far more.
use std::time::Duration;

/// Copies smaller than this say little about the per-page rate.
const MIN_SAMPLE_PAGES: u64 = 32;
/// Weight of a new sample in the running averages.
const WEIGHT: f64 = 0.3;

#[derive(Debug, Clone, Copy, Default)]
pub struct CostModel {
    copy_ns_per_page: Option<f64>,
    fork_ns: Option<f64>,
    build_ns: Option<f64>,
}

fn blend(old: Option<f64>, new: f64) -> Option<f64> {
    Some(old.map_or(new, |o| o + WEIGHT * (new - o)))
}

impl CostModel {
    pub fn copied(&mut self, pages: u64, took: Duration) {
        if pages >= MIN_SAMPLE_PAGES {
            self.copy_ns_per_page =
                blend(self.copy_ns_per_page, took.as_nanos() as f64 / pages as f64);
        }
    }

    pub fn forked(&mut self, took: Duration) {
        self.fork_ns = blend(self.fork_ns, took.as_nanos() as f64);
    }

    pub fn built(&mut self, took: Duration) {
        self.build_ns = blend(self.build_ns, took.as_nanos() as f64);
    }

    /// Writing `pages` would take longer than a fork plus a VM build (None: not
    /// measured yet, so no opinion).
    pub fn fork_is_cheaper(&self, pages: u64) -> Option<bool> {
        let copy = self.copy_ns_per_page? * pages as f64;
        Some(copy > self.fork_ns? + self.build_ns?)
    }

    /// The estimate, for reports: (ns per page copied, fork ns, build ns).
    pub fn estimates(&self) -> (Option<f64>, Option<f64>, Option<f64>) {
        (self.copy_ns_per_page, self.fork_ns, self.build_ns)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cheaper_path_follows_what_was_measured() {
        let mut m = CostModel::default();
        assert_eq!(m.fork_is_cheaper(1_000_000), None, "nothing measured yet");
        m.copied(1000, Duration::from_millis(2)); // 2 us a page
        m.copied(10, Duration::from_secs(1)); // too small to count
        m.forked(Duration::from_millis(3));
        m.built(Duration::from_millis(7));
        // 10 ms of fork + build = 5000 pages at 2 us.
        assert_eq!(m.fork_is_cheaper(4000), Some(false));
        assert_eq!(m.fork_is_cheaper(6000), Some(true));
        // A slower host (copies at 20 us a page) moves the line.
        for _ in 0..20 {
            m.copied(1000, Duration::from_millis(20));
        }
        assert_eq!(m.fork_is_cheaper(1000), Some(true));
        assert_eq!(m.fork_is_cheaper(400), Some(false));
    }
}
