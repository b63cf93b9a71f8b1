//! The host-side arithmetic over a guest's counters: a hostile agent's absurd numbers
//! never panic, overflow or produce figures out of their range.
use super::*;

const GIVEN: Given = Given {
    vcpus: 2,
    mem_mib: 512,
};

fn stats(busy: u64, total: u64) -> GuestStats {
    GuestStats {
        cpu_count: 2,
        cpu_busy: busy,
        cpu_total: total,
        mem_total: 500 << 20,
        mem_available: 300 << 20,
        mem_cache: 100 << 20,
        disk_total: 1 << 30,
        disk_available: 700 << 20,
    }
}

#[test]
fn cpu_percentage_is_the_busy_share_between_two_samples() {
    let a = stats(1_000, 10_000);
    let b = stats(1_250, 10_400);
    assert_eq!(cpu_used_pct(Some(&a), &b), 62.5);
    // No previous sample: the share since boot.
    assert_eq!(cpu_used_pct(None, &a), 10.0);
    // Two decimals, as E2B rounds.
    assert_eq!(cpu_used_pct(None, &stats(1, 3)), 33.33);
    // No time passed between the samples.
    assert_eq!(cpu_used_pct(Some(&a), &a), 0.0);
}

#[test]
fn a_sample_has_the_documented_figures() {
    let s = sample_from(&stats(50, 100), None, GIVEN, 1_700_000_000);
    assert_eq!(s.timestamp, "2023-11-14T22:13:20Z");
    assert_eq!(s.timestamp_unix, 1_700_000_000);
    assert_eq!((s.cpu_count, s.cpu_used_pct), (2, 50.0));
    assert_eq!(s.mem_total, 500 << 20);
    assert_eq!(s.mem_used, 200 << 20);
    assert_eq!(s.mem_cache, 100 << 20);
    assert_eq!(s.disk_total, 1 << 30);
    assert_eq!(s.disk_used, (1 << 30) - (700 << 20));
}

#[test]
fn hostile_counters_stay_in_range() {
    let absurd = GuestStats {
        cpu_count: u32::MAX,
        cpu_busy: u64::MAX,
        cpu_total: 1,
        mem_total: u64::MAX,
        mem_available: 0,
        mem_cache: u64::MAX,
        disk_total: u64::MAX,
        disk_available: 0,
    };
    let s = sample_from(&absurd, None, GIVEN, u64::MAX);
    // Busy more than total: clamped, not 1.8e21 %.
    assert_eq!(s.cpu_used_pct, 100.0);
    assert_eq!(s.cpu_count, GIVEN.vcpus);
    assert_eq!(s.mem_total, 512 << 20, "capped by the sandbox's memory");
    assert!(s.mem_used <= s.mem_total && s.mem_cache <= s.mem_total);
    assert_eq!(s.disk_total, i64::MAX as u64);
    assert!(s.disk_used <= s.disk_total);
    assert!(s.timestamp_unix <= i64::MAX as u64);
    // Counters that go backwards (a restore, or lies) and zeros everywhere.
    let zero = GuestStats::default();
    let s = sample_from(&zero, Some(&absurd), GIVEN, 0);
    assert_eq!((s.cpu_count, s.cpu_used_pct), (1, 0.0));
    assert_eq!((s.mem_used, s.disk_used), (0, 0));
    // Available above total: nothing used, never an underflow.
    let mut more_free = stats(0, 0);
    more_free.mem_available = u64::MAX;
    more_free.disk_available = u64::MAX;
    let s = sample_from(&more_free, Some(&stats(5, 5)), GIVEN, 1);
    assert_eq!((s.mem_used, s.disk_used, s.cpu_used_pct), (0, 0, 0.0));
    // Busy that went backwards while total advanced.
    assert_eq!(
        cpu_used_pct(Some(&stats(900, 1_000)), &stats(10, 2_000)),
        0.0
    );
}

#[test]
fn a_ring_keeps_the_newest_points() {
    let rings = MetricRings::default();
    for t in 0..(RING_POINTS as u64 + 5) {
        let st = stats(t, t + 1);
        rings.record("a", st, sample_from(&st, None, GIVEN, t));
    }
    let all = rings.rings();
    let ring = all.get("a").expect("ring");
    assert_eq!(ring.points.len(), RING_POINTS);
    assert_eq!(ring.points.front().map(|s| s.timestamp_unix), Some(5));
    drop(all);
    rings.forget("a");
    assert!(rings.last_stats("a").is_none());
}
