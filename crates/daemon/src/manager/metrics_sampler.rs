//! Per-sandbox metrics as a time series: one sampler task per daemon asks every running
//! sandbox's agent for its counters (`stats`) each interval and keeps the results in an
//! in-memory ring per sandbox, which `GET /v1/sandboxes/{id}/metrics` (and E2B's
//! `get_metrics`) reads.
//!
//! Why this shape:
//! - The agent reports raw cumulative counters; the CPU percentage is computed here
//!   between two samples of the same ring, so the guest keeps no state and never
//!   sleeps. Every number is the guest's word only: sums saturate, used amounts are
//!   capped by their totals, the CPU count and memory total by what the sandbox was
//!   given, and the percentage is clamped to 0..=100 ([`sample_from`]).
//! - Only `running` sandboxes are sampled, through a path that never wakes a paused
//!   one (a sampler must not resume what its owner paused): a paused sandbox keeps the
//!   history it had and gets no samples until it runs again.
//! - Each sample is its own task with a deadline ([`SAMPLE_TIMEOUT`]) and at most one
//!   is in flight per sandbox, so one slow or dead agent never delays the others.
//! - Rings are bounded ([`RING_POINTS`]) and live in memory only: the history is lost
//!   when the daemon restarts. A sandbox's ring goes with it when it is deleted (and a
//!   sweep each tick drops any whose sandbox is gone); a branch child, a new sandbox,
//!   starts its own.
use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use zygote_proto::client::ClientError;
use zygote_proto::stats::GuestStats;

use super::{now, Manager, STATE_RUNNING};
use crate::e2b::time::rfc3339;
use crate::error::{Error, Result};
use crate::model::{MetricSample, MetricsList, MetricsQuery, Validate};

/// The sampling interval when the daemon is given none (`--metrics-interval`).
pub const DEFAULT_INTERVAL: Duration = Duration::from_secs(5);

/// Samples kept per sandbox: an hour at the default interval.
pub const RING_POINTS: usize = 720;

/// How long one sample may take (connecting included) before it is dropped.
pub const SAMPLE_TIMEOUT: Duration = Duration::from_secs(5);

/// Largest figure reported (E2B's schema says int64).
const MAX_FIGURE: u64 = i64::MAX as u64;

#[derive(Default)]
struct Ring {
    points: VecDeque<MetricSample>,
    /// The counters of the newest sample, for the next one's CPU percentage.
    last: Option<GuestStats>,
}

/// Every sandbox's ring, and which sandboxes have a sample in flight.
#[derive(Default)]
pub(crate) struct MetricRings {
    rings: Mutex<HashMap<String, Ring>>,
    in_flight: Mutex<HashSet<String>>,
}

impl MetricRings {
    fn rings(&self) -> std::sync::MutexGuard<'_, HashMap<String, Ring>> {
        self.rings.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Drops a deleted sandbox's history.
    pub(crate) fn forget(&self, id: &str) {
        self.rings().remove(id);
    }

    fn last_stats(&self, id: &str) -> Option<GuestStats> {
        self.rings().get(id).and_then(|r| r.last)
    }

    fn record(&self, id: &str, stats: GuestStats, sample: MetricSample) {
        let mut rings = self.rings();
        let ring = rings.entry(id.to_string()).or_default();
        if ring.points.len() >= RING_POINTS {
            ring.points.pop_front();
        }
        ring.points.push_back(sample);
        ring.last = Some(stats);
    }

    /// Marks a sample of `id` in flight; None if one already is.
    fn start(self: &Arc<Self>, id: &str) -> Option<InFlight> {
        let mut set = self.in_flight.lock().unwrap_or_else(|p| p.into_inner());
        set.insert(id.to_string()).then(|| InFlight {
            rings: self.clone(),
            id: id.to_string(),
        })
    }
}

/// Clears a sandbox's in-flight mark however its sample task ends.
struct InFlight {
    rings: Arc<MetricRings>,
    id: String,
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.rings
            .in_flight
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&self.id);
    }
}

/// What the sandbox was given, the bounds of what its guest may report.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Given {
    pub vcpus: u32,
    pub mem_mib: u64,
}

/// The percentage of all CPUs busy between `prev` and `now` (since boot without a usable
/// `prev`: none, or counters that went backwards as after a restore), 0..=100 with two
/// decimals, as E2B's envd rounds it.
pub(crate) fn cpu_used_pct(prev: Option<&GuestStats>, now: &GuestStats) -> f64 {
    let (busy, total) = match prev {
        Some(p) if now.cpu_total > p.cpu_total => (
            now.cpu_busy.saturating_sub(p.cpu_busy),
            now.cpu_total - p.cpu_total,
        ),
        Some(p) if now.cpu_total == p.cpu_total => return 0.0,
        _ => (now.cpu_busy, now.cpu_total),
    };
    if total == 0 {
        return 0.0;
    }
    let pct = (busy as f64 / total as f64 * 100.0).clamp(0.0, 100.0);
    (pct * 100.0).round() / 100.0
}

/// A sample from the guest's counters taken at `at` (unix seconds), every figure bounded.
pub(crate) fn sample_from(
    stats: &GuestStats,
    prev: Option<&GuestStats>,
    given: Given,
    at: u64,
) -> MetricSample {
    let mem_total = stats
        .mem_total
        .min(given.mem_mib.saturating_mul(1 << 20))
        .min(MAX_FIGURE);
    let disk_total = stats.disk_total.min(MAX_FIGURE);
    MetricSample {
        timestamp: rfc3339(at),
        timestamp_unix: at.min(MAX_FIGURE),
        cpu_count: stats.cpu_count.clamp(1, given.vcpus.max(1)),
        cpu_used_pct: cpu_used_pct(prev, stats),
        mem_total,
        mem_used: mem_total.saturating_sub(stats.mem_available),
        mem_cache: stats.mem_cache.min(mem_total),
        disk_total,
        disk_used: disk_total.saturating_sub(stats.disk_available),
    }
}

impl Manager {
    /// The sampler: runs for the daemon's lifetime, one tick each `interval`.
    pub async fn sample_metrics(self: Arc<Self>, interval: Duration) {
        let mut tick = tokio::time::interval(interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            if let Err(e) = self.sample_all() {
                tracing::warn!("sampling metrics: {e}");
            }
        }
    }

    /// Starts a sample of every running sandbox that has none in flight, and drops the
    /// rings of sandboxes that are gone.
    fn sample_all(self: &Arc<Self>) -> Result<()> {
        let rows = self.db.sandboxes()?;
        let known: HashSet<&str> = rows.iter().map(|r| r.id.as_str()).collect();
        self.metric_rings
            .rings()
            .retain(|id, _| known.contains(id.as_str()));
        for row in &rows {
            if row.state != STATE_RUNNING || row.vm.is_none() {
                continue;
            }
            let Some(flight) = self.metric_rings.start(&row.id) else {
                continue;
            };
            let this = self.clone();
            let id = row.id.clone();
            tokio::spawn(async move {
                let _flight = flight;
                match tokio::time::timeout(SAMPLE_TIMEOUT, this.take_sample(&id)).await {
                    Ok(Ok((stats, sample))) => this.record_sample(&id, stats, sample),
                    Ok(Err(e)) => tracing::debug!(sandbox = %id, "metrics sample: {e}"),
                    Err(_) => tracing::debug!(sandbox = %id, "metrics sample timed out"),
                }
            });
        }
        Ok(())
    }

    /// Keeps a sample unless its sandbox was deleted or stopped running meanwhile.
    fn record_sample(&self, id: &str, stats: GuestStats, sample: MetricSample) {
        if matches!(self.db.sandbox(id), Ok(Some(r)) if r.state == STATE_RUNNING) {
            self.metric_rings.record(id, stats, sample);
        }
    }

    /// A sample of running sandbox `id` now (never waking a paused one), against its
    /// ring's newest counters; recorded by the caller if it wants.
    async fn take_sample(&self, id: &str) -> Result<(GuestStats, MetricSample)> {
        let row = self.sandbox_row(id)?;
        let given = Given {
            vcpus: row.vcpus,
            mem_mib: u64::from(row.mem_mib),
        };
        let client = self
            .agent_if_awake(id)
            .await?
            .with_request_timeout(Some(SAMPLE_TIMEOUT));
        let stats = self
            .blocking(move || client.stats())
            .await?
            .map_err(Error::agent)?;
        let prev = self.metric_rings.last_stats(id);
        Ok((stats, sample_from(&stats, prev.as_ref(), given, now())))
    }

    /// The samples of sandbox `id` that `q` asks for, oldest first (none while it never
    /// ran since the daemon started).
    pub fn metrics(&self, id: &str, q: &MetricsQuery) -> Result<MetricsList> {
        q.validate()?;
        self.sandbox_row(id)?;
        let rings = self.metric_rings.rings();
        let metrics = rings
            .get(id)
            .map(|r| {
                r.points
                    .iter()
                    .filter(|s| q.covers(s.timestamp_unix))
                    .cloned()
                    .collect()
            })
            .unwrap_or_default();
        Ok(MetricsList { metrics })
    }

    /// The newest sample of each of `ids` that has one.
    pub fn latest_metrics<'a>(
        &self,
        ids: impl IntoIterator<Item = &'a str>,
    ) -> HashMap<String, MetricSample> {
        let rings = self.metric_rings.rings();
        ids.into_iter()
            .filter_map(|id| {
                let last = rings.get(id)?.points.back()?;
                Some((id.to_string(), last.clone()))
            })
            .collect()
    }

    /// A sample of running sandbox `id` taken now (E2B's envd `/metrics`), its CPU
    /// percentage since the ring's newest sample; not recorded.
    pub async fn metrics_now(&self, id: &str) -> Result<MetricSample> {
        match tokio::time::timeout(SAMPLE_TIMEOUT, self.take_sample(id)).await {
            Ok(r) => r.map(|(_, sample)| sample),
            Err(_) => Err(Error::AgentTimeout(ClientError::Timeout {
                what: "stats",
                after: SAMPLE_TIMEOUT,
            })),
        }
    }
}

#[cfg(test)]
#[path = "metrics_sampler_tests.rs"]
mod tests;
