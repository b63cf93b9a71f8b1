//! envd's `GET /metrics` (S:spec/envd/envd.yaml; I:packages/envd/internal/host/metrics.go):
//! the sandbox's resource use now, a sample taken from its agent for this request (the
//! CPU percentage since the daemon's newest sample of it, or since boot), with envd's
//! field names, including the deprecated MiB figures envd still sends.
use axum::response::{IntoResponse, Response};
use serde::Serialize;

use super::EnvdError;
use crate::manager::Manager;
use crate::model::MetricSample;

/// envd's `Metrics` JSON.
#[derive(Debug, Serialize)]
struct EnvdMetrics {
    /// Unix seconds.
    ts: u64,
    cpu_count: u32,
    cpu_used_pct: f64,
    mem_total_mib: u64,
    mem_used_mib: u64,
    mem_total: u64,
    mem_used: u64,
    mem_cache: u64,
    disk_used: u64,
    disk_total: u64,
}

impl From<&MetricSample> for EnvdMetrics {
    fn from(s: &MetricSample) -> Self {
        EnvdMetrics {
            ts: s.timestamp_unix,
            cpu_count: s.cpu_count,
            cpu_used_pct: s.cpu_used_pct,
            mem_total_mib: s.mem_total >> 20,
            mem_used_mib: s.mem_used >> 20,
            mem_total: s.mem_total,
            mem_used: s.mem_used,
            mem_cache: s.mem_cache,
            disk_used: s.disk_used,
            disk_total: s.disk_total,
        }
    }
}

/// `GET /metrics` for sandbox `id` (resumed first if it is paused with auto-resume, as
/// any envd call).
pub(super) async fn metrics(manager: &Manager, id: &str) -> Result<Response, EnvdError> {
    let zygote = |e: crate::error::Error| EnvdError::Zygote(e.status_code().0, e.to_string());
    manager.wake(id).await.map_err(zygote)?;
    let sample = manager.metrics_now(id).await.map_err(zygote)?;
    Ok(axum::Json(EnvdMetrics::from(&sample)).into_response())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn envd_field_names_and_mib_figures() {
        let s = MetricSample {
            timestamp: "2026-01-01T00:00:00Z".into(),
            timestamp_unix: 1_767_225_600,
            cpu_count: 2,
            cpu_used_pct: 3.25,
            mem_total: 512 << 20,
            mem_used: (100 << 20) + 5,
            mem_cache: 7,
            disk_total: 9,
            disk_used: 8,
        };
        let v = serde_json::to_value(EnvdMetrics::from(&s)).unwrap();
        assert_eq!(
            v,
            serde_json::json!({"ts": 1_767_225_600u64, "cpu_count": 2, "cpu_used_pct": 3.25,
                "mem_total_mib": 512, "mem_used_mib": 100, "mem_total": 512u64 << 20,
                "mem_used": (100u64 << 20) + 5, "mem_cache": 7, "disk_used": 8, "disk_total": 9})
        );
    }
}
