//! Prometheus text exposition: sandbox counts by state, latency histograms
//! for branch/exec/boot, and guest memory shared vs private per VM process
//! (from /proc/<pid>/smaps_rollup: with fork-based branching children share
//! their parent's pages; QEMU VMs keep theirs private).
use std::collections::BTreeMap;
use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use crate::db::SandboxRow;
use crate::procs;
use crate::runtime::SpawnerUse;

/// Bucket upper bounds in seconds: from sub-millisecond forks to slow
/// emulated boots.
const BUCKETS: [f64; 14] = [
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
];

#[derive(Default)]
pub struct Histogram {
    counts: [AtomicU64; BUCKETS.len()],
    count: AtomicU64,
    sum_micros: AtomicU64,
}

impl Histogram {
    pub fn observe(&self, d: Duration) {
        let secs = d.as_secs_f64();
        for (i, bound) in BUCKETS.iter().enumerate() {
            if secs <= *bound {
                self.counts[i].fetch_add(1, Ordering::Relaxed);
            }
        }
        self.count.fetch_add(1, Ordering::Relaxed);
        self.sum_micros
            .fetch_add(d.as_micros() as u64, Ordering::Relaxed);
    }

    fn render(&self, out: &mut String, name: &str, help: &str) {
        let _ = writeln!(out, "# HELP {name} {help}");
        let _ = writeln!(out, "# TYPE {name} histogram");
        for (i, bound) in BUCKETS.iter().enumerate() {
            let c = self.counts[i].load(Ordering::Relaxed);
            let _ = writeln!(out, "{name}_bucket{{le=\"{bound}\"}} {c}");
        }
        let count = self.count.load(Ordering::Relaxed);
        let _ = writeln!(out, "{name}_bucket{{le=\"+Inf\"}} {count}");
        let sum = self.sum_micros.load(Ordering::Relaxed) as f64 / 1e6;
        let _ = writeln!(out, "{name}_sum {sum}");
        let _ = writeln!(out, "{name}_count {count}");
    }
}

#[derive(Default)]
pub struct Metrics {
    pub branch: Histogram,
    pub exec: Histogram,
    pub boot: Histogram,
    /// Pause to disk and resume, each from request to done.
    pub pause: Histogram,
    pub resume: Histogram,
    /// Sandboxes the reaper deleted because their TTL ran out.
    pub expired: AtomicU64,
    /// Branch children that did not come up (their siblings did, or the branch failed).
    pub branch_children_failed: AtomicU64,
}

fn render_counter(out: &mut String, name: &str, help: &str, value: &AtomicU64) {
    let _ = writeln!(
        out,
        "# HELP {name} {help}\n# TYPE {name} counter\n{name} {}",
        value.load(Ordering::Relaxed)
    );
}

impl Metrics {
    /// `spawners`: each sandbox's warm spawners (by id; absent: none).
    pub fn render(
        &self,
        sandboxes: &[SandboxRow],
        snapshots: usize,
        spawners: &BTreeMap<String, Vec<SpawnerUse>>,
    ) -> String {
        let mut out = String::new();
        let mut by_state: BTreeMap<&str, u64> = ["creating", "running", "paused", "dead"]
            .into_iter()
            .map(|s| (s, 0))
            .collect();
        for s in sandboxes {
            *by_state.entry(s.state.as_str()).or_default() += 1;
        }
        out.push_str(
            "# HELP zygote_sandboxes Sandboxes by state.\n# TYPE zygote_sandboxes gauge\n",
        );
        for (state, n) in &by_state {
            let _ = writeln!(out, "zygote_sandboxes{{state=\"{state}\"}} {n}");
        }
        let _ = writeln!(
            out,
            "# HELP zygote_snapshots Snapshots (incl. branch points).\n# TYPE zygote_snapshots gauge\nzygote_snapshots {snapshots}"
        );
        render_counter(
            &mut out,
            "zygote_sandboxes_expired_total",
            "Sandboxes deleted because their TTL ran out.",
            &self.expired,
        );
        render_counter(
            &mut out,
            "zygote_branch_children_failed_total",
            "Branch children that did not come up.",
            &self.branch_children_failed,
        );
        self.branch.render(
            &mut out,
            "zygote_branch_duration_seconds",
            "Time to branch a sandbox (pause to all children answering).",
        );
        self.exec.render(
            &mut out,
            "zygote_exec_duration_seconds",
            "Time from an exec request to the program's exit.",
        );
        self.boot.render(
            &mut out,
            "zygote_boot_duration_seconds",
            "Time from create to the guest agent answering.",
        );
        self.pause.render(
            &mut out,
            "zygote_pause_duration_seconds",
            "Time to pause a sandbox to disk (state saved, VM process gone).",
        );
        self.resume.render(
            &mut out,
            "zygote_resume_duration_seconds",
            "Time to resume a paused sandbox (until its agent answers).",
        );
        out.push_str(
            "# HELP zygote_vm_memory_bytes Resident memory of VM processes, shared with other processes or private.\n\
             # TYPE zygote_vm_memory_bytes gauge\n",
        );
        let (mut shared, mut private) = (0u64, 0u64);
        for s in sandboxes {
            let Some(vm) = &s.vm else { continue };
            if !vm.process.is_alive() {
                continue;
            }
            let Some(m) = procs::memory_use(vm.process.pid) else {
                continue;
            };
            shared += m.shared;
            private += m.private;
            let _ = writeln!(
                out,
                "zygote_vm_memory_bytes{{sandbox=\"{}\",kind=\"shared\"}} {}\n\
                 zygote_vm_memory_bytes{{sandbox=\"{}\",kind=\"private\"}} {}",
                s.id, m.shared, s.id, m.private
            );
        }
        let _ = writeln!(
            out,
            "# HELP zygote_vm_memory_total_bytes Sum over VM processes.\n# TYPE zygote_vm_memory_total_bytes gauge\n\
             zygote_vm_memory_total_bytes{{kind=\"shared\"}} {shared}\nzygote_vm_memory_total_bytes{{kind=\"private\"}} {private}"
        );
        render_spawners(&mut out, spawners);
        out
    }
}

/// What warm spawners cost, per sandbox that keeps any: how many, the pages a branch
/// through them would copy, and the host memory they hold alone.
fn render_spawners(out: &mut String, spawners: &BTreeMap<String, Vec<SpawnerUse>>) {
    out.push_str(
        "# HELP zygote_warm_spawners Warm spawners a sandbox's VMM keeps for its next branch (ready ones have their VM built).\n\
         # TYPE zygote_warm_spawners gauge\n\
         # HELP zygote_warm_spawner_stale_pages Pages the sandbox wrote since its spawners last caught up (what a branch would copy).\n\
         # TYPE zygote_warm_spawner_stale_pages gauge\n\
         # HELP zygote_warm_spawner_private_bytes Host memory the spawners hold alone (old page copies, their VMs).\n\
         # TYPE zygote_warm_spawner_private_bytes gauge\n",
    );
    for (id, list) in spawners.iter().filter(|(_, l)| !l.is_empty()) {
        let ready = list.iter().filter(|s| s.ready).count();
        let stale: u64 = list.iter().map(|s| s.stale_pages).sum();
        let private: u64 = list.iter().map(|s| s.private_bytes).sum();
        let _ = writeln!(
            out,
            "zygote_warm_spawners{{sandbox=\"{id}\",ready=\"true\"}} {ready}\n\
             zygote_warm_spawners{{sandbox=\"{id}\",ready=\"false\"}} {}\n\
             zygote_warm_spawner_stale_pages{{sandbox=\"{id}\"}} {stale}\n\
             zygote_warm_spawner_private_bytes{{sandbox=\"{id}\"}} {private}",
            list.len() - ready
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histogram_is_cumulative() {
        let h = Histogram::default();
        h.observe(Duration::from_millis(3));
        h.observe(Duration::from_secs(2));
        let mut out = String::new();
        h.render(&mut out, "x", "help");
        assert!(out.contains("x_bucket{le=\"0.001\"} 0"));
        assert!(out.contains("x_bucket{le=\"0.005\"} 1"));
        assert!(out.contains("x_bucket{le=\"2.5\"} 2"));
        assert!(out.contains("x_bucket{le=\"+Inf\"} 2"));
        assert!(out.contains("x_count 2"));
    }

    #[test]
    fn expired_sandboxes_are_counted() {
        let m = Metrics::default();
        assert!(m
            .render(&[], 0, &BTreeMap::new())
            .contains("\nzygote_sandboxes_expired_total 0\n"));
        m.expired.fetch_add(2, Ordering::Relaxed);
        let out = m.render(&[], 0, &BTreeMap::new());
        assert!(out.contains("# TYPE zygote_sandboxes_expired_total counter\n"));
        assert!(
            out.contains("\nzygote_sandboxes_expired_total 2\n"),
            "{out}"
        );
        m.branch_children_failed.fetch_add(1, Ordering::Relaxed);
        assert!(m
            .render(&[], 0, &BTreeMap::new())
            .contains("# TYPE zygote_branch_children_failed_total counter\nzygote_branch_children_failed_total 1\n"));
    }

    #[test]
    fn warm_spawners_are_reported_per_sandbox() {
        let spawner = |pid, ready, stale_pages| SpawnerUse {
            pid,
            ready,
            stale_pages,
            private_bytes: 4096 * stale_pages,
        };
        let spawners = BTreeMap::from([
            (
                "sb-a".to_string(),
                vec![spawner(7, true, 3), spawner(8, false, 0)],
            ),
            ("sb-none".to_string(), vec![]),
        ]);
        let out = Metrics::default().render(&[], 0, &spawners);
        for line in [
            "zygote_warm_spawners{sandbox=\"sb-a\",ready=\"true\"} 1\n",
            "zygote_warm_spawners{sandbox=\"sb-a\",ready=\"false\"} 1\n",
            "zygote_warm_spawner_stale_pages{sandbox=\"sb-a\"} 3\n",
            "zygote_warm_spawner_private_bytes{sandbox=\"sb-a\"} 12288\n",
            "# TYPE zygote_warm_spawners gauge\n",
        ] {
            assert!(out.contains(line), "missing {line:?} in:\n{out}");
        }
        assert!(
            !out.contains("sb-none"),
            "a sandbox without spawners has no series"
        );
    }
}
