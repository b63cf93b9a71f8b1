//! Small statistics for benchmarks: medians and percentiles of durations, in ms.
use std::time::Duration;

#[derive(Debug, Clone, serde::Serialize)]
pub struct Summary {
    pub p50: f64,
    pub p90: f64,
    pub min: f64,
    pub max: f64,
    pub n: usize,
}

impl Summary {
    pub fn of(samples: &[Duration]) -> Self {
        let mut v: Vec<f64> = samples.iter().map(|d| d.as_secs_f64() * 1e3).collect();
        v.sort_by(|a, b| a.total_cmp(b));
        Self {
            p50: percentile(&v, 50.0),
            p90: percentile(&v, 90.0),
            min: v.first().copied().unwrap_or(f64::NAN),
            max: v.last().copied().unwrap_or(f64::NAN),
            n: v.len(),
        }
    }
}

/// Nearest-rank percentile of sorted values (NaN when empty).
pub fn percentile(sorted: &[f64], pct: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let rank = ((pct / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

pub fn ms(v: f64) -> String {
    if v < 10.0 {
        format!("{v:.3}")
    } else {
        format!("{v:.1}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank_percentiles() {
        let v: Vec<f64> = (1..=10).map(f64::from).collect();
        assert_eq!(percentile(&v, 50.0), 5.0);
        assert_eq!(percentile(&v, 90.0), 9.0);
        assert_eq!(percentile(&v, 100.0), 10.0);
        assert_eq!(percentile(&[3.0], 50.0), 3.0);
        assert!(percentile(&[], 50.0).is_nan());
        let s = Summary::of(&[Duration::from_millis(2), Duration::from_millis(1)]);
        assert_eq!((s.p50, s.min, s.max, s.n), (1.0, 1.0, 2.0, 2));
    }
}
