//! The results of `zygote bench net`: each backend's samples, their percentiles, the
//! isolated-versus-user comparison (the JSON object printed last) and the table printed
//! before it.
use std::time::Duration;

use serde::Serialize;

use super::stats::{ms, percentile, Summary};

/// One backend's samples.
#[derive(Default)]
pub(super) struct Samples {
    pub(super) create: Vec<Duration>,
    pub(super) branch: Vec<Duration>,
    pub(super) mib_s: Vec<f64>,
}

#[derive(Serialize)]
pub(super) struct BackendReport {
    pub(super) create_ms_p50: f64,
    pub(super) create_ms_p90: f64,
    pub(super) branch_ms_p50: f64,
    pub(super) branch_ms_p90: f64,
    pub(super) mib_s_p50: f64,
    /// The slowest tenth of the transfers (nearest-rank 10th percentile).
    pub(super) mib_s_p10: f64,
    pub(super) samples: usize,
}

impl BackendReport {
    pub(super) fn of(s: &Samples) -> BackendReport {
        let (create, branch) = (Summary::of(&s.create), Summary::of(&s.branch));
        let mut mib = s.mib_s.clone();
        mib.sort_by(f64::total_cmp);
        BackendReport {
            create_ms_p50: create.p50,
            create_ms_p90: create.p90,
            branch_ms_p50: branch.p50,
            branch_ms_p90: branch.p90,
            mib_s_p50: percentile(&mib, 50.0),
            mib_s_p10: percentile(&mib, 10.0),
            samples: create.n,
        }
    }
}

#[derive(Serialize)]
pub(super) struct NetReport {
    pub(super) rounds: usize,
    pub(super) runtime: String,
    pub(super) mib: u64,
    pub(super) isolated: BackendReport,
    pub(super) user: BackendReport,
    pub(super) create_overhead_ms_p50: f64,
    pub(super) branch_overhead_ms_p50: f64,
    pub(super) throughput_ratio: f64,
    pub(super) method: &'static str,
    pub(super) failures: usize,
    pub(super) errors: Vec<String>,
}

pub(super) fn print_table(r: &NetReport) {
    let f = |v: f64| if v.is_nan() { "-".to_string() } else { ms(v) };
    let rate = |v: f64| {
        if v.is_nan() {
            "-".to_string()
        } else {
            format!("{v:.1}")
        }
    };
    let (i, u) = (&r.isolated, &r.user);
    println!(
        "bench net: {} rounds, {} runtime, {} MiB per transfer ({})",
        r.rounds, r.runtime, r.mib, r.method
    );
    println!(
        "{:<24} {:>12} {:>12} {:>16}",
        "", "isolated", "user", "isolated vs user"
    );
    let rows = [
        ("create ms p50", f(i.create_ms_p50), f(u.create_ms_p50)),
        ("create ms p90", f(i.create_ms_p90), f(u.create_ms_p90)),
        ("branch ms p50", f(i.branch_ms_p50), f(u.branch_ms_p50)),
        ("branch ms p90", f(i.branch_ms_p90), f(u.branch_ms_p90)),
        (
            "guest->remote MiB/s p50",
            rate(i.mib_s_p50),
            rate(u.mib_s_p50),
        ),
        (
            "guest->remote MiB/s p10",
            rate(i.mib_s_p10),
            rate(u.mib_s_p10),
        ),
    ];
    let diff = [
        f(r.create_overhead_ms_p50),
        String::new(),
        f(r.branch_overhead_ms_p50),
        String::new(),
        format!("x{:.2}", r.throughput_ratio),
        String::new(),
    ];
    for ((name, a, b), d) in rows.into_iter().zip(diff) {
        println!("{name:<24} {a:>12} {b:>12} {d:>16}");
    }
}
