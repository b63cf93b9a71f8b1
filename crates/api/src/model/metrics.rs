//! `GET /v1/sandboxes/{id}/metrics`: a sandbox's resource use as a time series, one
//! [`MetricSample`] per sampling interval while it runs (the daemon's sampler: see the
//! daemon's `manager::metrics_sampler`).
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::Validate;
use crate::error::{RequestError, Result};

/// The query string of the metrics route (`?start=1700000000&end=1700000600`).
#[derive(Debug, Clone, Default, Deserialize, Serialize, ToSchema, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct MetricsQuery {
    /// Only samples taken at or after this time (unix seconds).
    #[serde(default)]
    #[param(minimum = 0)]
    pub start: Option<u64>,
    /// Only samples taken at or before this time (unix seconds); not before `start`.
    #[serde(default)]
    #[param(minimum = 0)]
    pub end: Option<u64>,
}

impl MetricsQuery {
    /// Whether a sample taken at `unix` seconds is asked for.
    pub fn covers(&self, unix: u64) -> bool {
        self.start.is_none_or(|s| unix >= s) && self.end.is_none_or(|e| unix <= e)
    }
}

impl Validate for MetricsQuery {
    fn validate(&self) -> Result<()> {
        match (self.start, self.end) {
            (Some(s), Some(e)) if s > e => Err(RequestError::invalid(format!(
                "start ({s}) must not be after end ({e})"
            ))),
            _ => Ok(()),
        }
    }
}

/// One sample of a running sandbox. Bytes unless said otherwise; every figure is the
/// guest's own report, bounded by the daemon (a used amount never exceeds its total).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct MetricSample {
    /// When it was taken (RFC 3339, UTC, whole seconds).
    pub timestamp: String,
    /// The same, in unix seconds.
    pub timestamp_unix: u64,
    /// CPUs the guest has online.
    pub cpu_count: u32,
    /// Percent of all the guest's CPUs busy since the previous sample (0..=100, two
    /// decimals); the first sample of a sandbox covers the time since its guest booted.
    pub cpu_used_pct: f64,
    pub mem_total: u64,
    /// Memory in use: total minus what the guest kernel counts as available.
    pub mem_used: u64,
    /// Page cache (Cached + Buffers).
    pub mem_cache: u64,
    /// Size of the guest's root filesystem.
    pub disk_total: u64,
    /// Used there, as `df` counts it (total minus what users may still write).
    pub disk_used: u64,
}

/// The samples a query asked for, oldest first.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct MetricsList {
    pub metrics: Vec<MetricSample>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_query_covers_its_inclusive_range_and_start_after_end_is_refused() {
        let q = MetricsQuery {
            start: Some(10),
            end: Some(20),
        };
        assert!(q.validate().is_ok());
        assert!(q.covers(10) && q.covers(20) && !q.covers(9) && !q.covers(21));
        assert!(MetricsQuery::default().covers(0));
        let bad = MetricsQuery {
            start: Some(21),
            end: Some(20),
        };
        let e = bad.validate().unwrap_err().to_string();
        assert!(e.contains("start (21) must not be after end (20)"), "{e}");
    }
}
