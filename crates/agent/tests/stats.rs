//! `stats` over a real agent process: the counters of the machine it runs on, in the
//! units the protocol states, and CPU jiffies that grow while it works.

mod common;

use std::time::{Duration, Instant};

use common::*;

#[test]
fn stats_reports_this_machines_counters() {
    let agent = TestAgent::start(&[]);
    let client = agent.client();
    let first = client.stats().expect("stats");
    assert!(first.cpu_count >= 1, "{first:?}");
    assert!(
        first.cpu_total >= first.cpu_busy && first.cpu_busy > 0,
        "{first:?}"
    );
    assert!(first.mem_total > first.mem_available && first.mem_available > 0);
    // Bytes, not kB: any machine running this test has more than 16 MiB.
    assert!(first.mem_total > 16 << 20, "{first:?}");
    assert!(first.disk_total >= first.disk_available && first.disk_total > 0);
    // Burn a little CPU in this process; the cumulative counters only grow.
    let until = Instant::now() + Duration::from_millis(300);
    let mut x = 0u64;
    while Instant::now() < until {
        x = x.wrapping_mul(31).wrapping_add(1);
    }
    std::hint::black_box(x);
    let second = client.stats().expect("stats");
    assert!(
        second.cpu_busy > first.cpu_busy,
        "{first:?} then {second:?}"
    );
    assert!(second.cpu_total > first.cpu_total);
}
