//! Sandbox time-to-live: changing it, and the reaper that deletes sandboxes
//! whose deadline passed (agents crash without deleting what they made).
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tokio::time::MissedTickBehavior;

use super::{now, Manager, STATE_RUNNING};
use crate::db::SandboxRow;
use crate::error::{Error, Result};
use crate::model::{EventLevel, Sandbox, SetTtlRequest, TtlAction, Validate};

/// How often the reaper looks: deadlines are whole seconds, so a sandbox
/// outlives its deadline by at most about this.
const REAP_INTERVAL: Duration = Duration::from_secs(1);

/// The deadline (unix second) of a sandbox whose TTL starts running now: when it
/// starts, is branched, gets a new TTL, or is resumed with `left` seconds set aside at
/// pause ([`ttl_on_resume`]). The one place a deadline is computed. Rounded up, so
/// that a sandbox never lives less than its TTL.
pub(crate) fn deadline(ttl_secs: Option<u64>, left: Option<u64>) -> Option<u64> {
    let since_epoch = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    deadline_from(ttl_secs, left, since_epoch)
}

fn deadline_from(ttl_secs: Option<u64>, left: Option<u64>, since_epoch: Duration) -> Option<u64> {
    let now = since_epoch.as_secs() + u64::from(since_epoch.subsec_nanos() > 0);
    ttl_on_resume(ttl_secs, left).map(|t| now + t)
}

/// The TTL seconds left at `now` of a sandbox whose deadline is `expires_at`: what a
/// pause sets aside (0 once due: it was paused by its TTL).
pub(crate) fn ttl_left(expires_at: Option<u64>, now: u64) -> Option<u64> {
    expires_at.map(|deadline| deadline.saturating_sub(now))
}

/// The TTL seconds a sandbox gets when its TTL starts running: the time it had left
/// when paused, or a whole `ttl_secs` if none was left (its TTL paused it), nothing was
/// set aside (a start, a branch, a TTL set while paused) or its TTL was shortened.
pub(crate) fn ttl_on_resume(ttl_secs: Option<u64>, left: Option<u64>) -> Option<u64> {
    let ttl = ttl_secs?;
    match left {
        Some(l) if l > 0 => Some(l.min(ttl)),
        _ => Some(ttl),
    }
}

fn is_due(row: &SandboxRow, now: u64) -> bool {
    row.expires_at.is_some_and(|deadline| deadline <= now)
}

impl Manager {
    /// Sets (deadline = now + `ttl_secs`) or removes a sandbox's TTL.
    pub async fn set_ttl(&self, id: &str, req: SetTtlRequest) -> Result<Sandbox> {
        req.validate()?;
        // The sandbox lock orders this against the reaper's delete: either
        // the delete happens first (404 here) or the reaper sees the new deadline.
        let _guard = self.lock(id).await;
        let mut row = self.sandbox_row(id)?;
        row.ttl_secs = req.ttl_secs;
        if let Some(action) = req.ttl_action {
            row.lifecycle.ttl_action = action;
        }
        let parked = super::pause::is_parked(&row);
        match row.lifecycle.park.as_mut() {
            // Paused: the TTL does not run; the new one starts whole at resume.
            Some(park) if parked => {
                park.ttl_left_secs = None;
                row.expires_at = None;
            }
            _ => row.expires_at = deadline(req.ttl_secs, None),
        }
        self.db.put_sandbox(&row)?;
        tracing::info!(
            sandbox = %row.id,
            ttl_secs = ?row.ttl_secs,
            expires_at = ?row.expires_at,
            "TTL changed"
        );
        let ttl = row.ttl_secs.map_or("none".into(), |s| s.to_string());
        self.event_log.record(
            &row.id,
            EventLevel::Info,
            "timeout changed",
            &[
                ("ttl_secs", ttl),
                ("on_timeout", row.lifecycle.ttl_action.as_str().into()),
            ],
        );
        Ok(self.view(&row))
    }

    /// The reaper: runs for the daemon's lifetime. Deadlines live in the
    /// database, so a restarted daemon honours those set before it.
    pub async fn reap_expired(self: Arc<Self>) {
        let mut tick = tokio::time::interval(REAP_INTERVAL);
        tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            self.reap_once().await;
        }
    }

    /// Deletes every sandbox that is due. Failures are logged and the
    /// sandbox stays due, so the next tick retries it.
    async fn reap_once(self: &Arc<Self>) {
        let now = now();
        let due = match self.db.expired_sandboxes(now) {
            Ok(due) => due,
            Err(e) => {
                tracing::warn!("reaper: listing expired sandboxes: {e}");
                return;
            }
        };
        for row in due {
            if row.lifecycle.ttl_action == TtlAction::Pause {
                self.pause_expired(&row, now).await;
                continue;
            }
            // Its own task, so that even a panic while deleting one sandbox
            // ends only that attempt, not the reaper.
            let attempt = tokio::spawn({
                let this = self.clone();
                let id = row.id.clone();
                // Re-checked under the sandbox lock: the TTL may have been
                // changed or removed since the query.
                async move { this.delete_if(&id, "expired", |r| is_due(r, now)).await }
            });
            match attempt.await {
                Ok(Ok(true)) => {
                    self.metrics.expired.fetch_add(1, Ordering::Relaxed);
                    tracing::info!(
                        sandbox = %row.id,
                        name = row.name.as_deref().unwrap_or(""),
                        expires_at = ?row.expires_at,
                        "sandbox expired and was deleted"
                    );
                }
                // Given a new TTL, or deleted by someone else meanwhile.
                Ok(Ok(false)) | Ok(Err(Error::NotFound { .. })) => {}
                Ok(Err(e)) => tracing::warn!(
                    sandbox = %row.id,
                    "reaper: deleting the expired sandbox failed (retrying): {e}"
                ),
                Err(e) => tracing::error!(
                    sandbox = %row.id,
                    "reaper: deleting the expired sandbox panicked (retrying): {e}"
                ),
            }
        }
    }
}

impl Manager {
    /// `ttl_action: pause`: a running sandbox whose TTL ran out is paused (its TTL then
    /// starts whole at resume). One that cannot be (dead) loses its deadline instead,
    /// so the reaper does not retry it forever; it stays for inspection or restore.
    async fn pause_expired(self: &Arc<Self>, row: &SandboxRow, now: u64) {
        let attempt = tokio::spawn({
            let this = self.clone();
            let id = row.id.clone();
            async move {
                let running = |r: &SandboxRow| is_due(r, now) && r.state == STATE_RUNNING;
                match this.pause_if(&id, running).await {
                    Ok(false) => this.clear_deadline_if(&id, |r| is_due(r, now)).await,
                    other => other,
                }
            }
        });
        match attempt.await {
            Ok(Ok(true)) => {
                tracing::info!(sandbox = %row.id, "TTL ran out: sandbox paused");
                self.event_log
                    .record(&row.id, EventLevel::Info, "timeout: paused", &[]);
            }
            Ok(Ok(false)) | Ok(Err(Error::NotFound { .. })) => {}
            Ok(Err(e)) => tracing::warn!(
                sandbox = %row.id,
                "reaper: pausing the expired sandbox failed (retrying): {e}"
            ),
            Err(e) => tracing::error!(
                sandbox = %row.id,
                "reaper: pausing the expired sandbox panicked (retrying): {e}"
            ),
        }
    }

    /// Removes the deadline of a sandbox its TTL cannot pause; returns false.
    async fn clear_deadline_if(
        &self,
        id: &str,
        condition: impl FnOnce(&SandboxRow) -> bool,
    ) -> Result<bool> {
        if let Some((_guard, mut row)) = self.locked_if(id, condition).await? {
            tracing::info!(
                sandbox = %id,
                state = %row.state,
                "TTL ran out on a sandbox that is not running: it cannot be paused, kept without a deadline"
            );
            row.expires_at = None;
            self.db.put_sandbox(&row)?;
        }
        Ok(false)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(secs: u64) -> Duration {
        Duration::from_secs(secs)
    }

    #[test]
    fn deadlines_round_up_to_whole_seconds() {
        let before = now();
        let deadline = deadline(Some(5), None).unwrap();
        assert!(
            (before + 5..=before + 7).contains(&deadline),
            "{before} -> {deadline}"
        );
        assert_eq!(deadline_from(Some(5), None, at(10)), Some(15));
        assert_eq!(
            deadline_from(Some(5), None, at(10) + Duration::from_millis(1)),
            Some(16)
        );
    }

    #[test]
    fn paused_time_does_not_count_against_the_ttl() {
        // 100 s TTL, paused 30 s after start (70 s left), resumed an hour later.
        let left = ttl_left(Some(1_100), 1_030);
        assert_eq!(left, Some(70));
        assert_eq!(deadline_from(Some(100), left, at(4_630)), Some(4_700));
    }

    #[test]
    fn a_sandbox_its_ttl_paused_gets_a_whole_ttl_at_resume() {
        let left = ttl_left(Some(1_000), 1_002);
        assert_eq!(left, Some(0));
        assert_eq!(deadline_from(Some(60), left, at(5_000)), Some(5_060));
    }

    #[test]
    fn no_ttl_no_deadline() {
        assert_eq!(ttl_left(None, 10), None);
        assert_eq!(deadline_from(None, Some(5), at(10)), None);
        // A TTL set while paused (nothing was set aside) runs from the resume.
        assert_eq!(deadline_from(Some(30), None, at(10)), Some(40));
        // Shortened while paused: the new TTL bounds what was left.
        assert_eq!(deadline_from(Some(30), Some(500), at(10)), Some(40));
    }
}
