//! Waiting for the agent without trusting it to answer.
//!
//! Every wait for a response has either a deadline (a request's timeout, or an exec's
//! own `timeout_ms` plus [`EXEC_GRACE`]) or none (an exec without a timeout, a pty: they
//! may rightly run for days). Either way a silent agent must not hold the caller
//! forever, and a slow request must not be mistaken for a dead agent, because giving up
//! on the agent closes the connection, and with it every exec still running on it.
//!
//! So silence is checked, not assumed: after [`LIVENESS_INTERVAL`] without any frame on
//! the connection, or when a deadline passes, the waiter sends `health` (answered by the
//! agent's reader thread at once, whatever else it runs) and waits up to
//! [`PROBE_TIMEOUT`]. An answer, or any other frame heard meanwhile, means the agent is
//! alive: an open-ended wait goes on, an expired one fails with
//! [`ClientError::Timeout`] and the connection stays. No answer means it is not: the
//! connection is closed as [`CloseCause::Unresponsive`] and the wait fails with
//! [`ClientError::Unresponsive`]; the next request needs a new connection.
//!
//! The check is off for a handle made with `with_liveness(None)` (a booting guest's
//! agent answers nothing, health included, until it runs); [`Liveness`] holds its
//! timings (shorter ones in tests).
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::time::{Duration, Instant};

use super::{AgentClient, ClientError, CloseCause};
use crate::{Request, Response};

/// Slack on top of an exec's own `timeout_ms` before the client stops waiting for its
/// end: the agent enforces the timeout (kills the group, drains its output, answers);
/// this covers that and the way back. A health check ([`PROBE_TIMEOUT`]) follows, so a
/// caller hears about a dead agent at most `timeout_ms` + grace + probe after the start.
pub const EXEC_GRACE: Duration = Duration::from_secs(10);

/// Silence on a connection after which a waiting caller checks that the agent lives.
pub const LIVENESS_INTERVAL: Duration = Duration::from_secs(20);

/// How long the agent has to answer that check.
pub const PROBE_TIMEOUT: Duration = Duration::from_secs(10);

/// The timings of the liveness check (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Liveness {
    /// Silence after which the agent is checked ([`LIVENESS_INTERVAL`]).
    pub interval: Duration,
    /// How long the check waits for an answer ([`PROBE_TIMEOUT`]).
    pub probe_timeout: Duration,
    /// Slack after an exec's own timeout ([`EXEC_GRACE`]).
    pub exec_grace: Duration,
}

impl Default for Liveness {
    fn default() -> Self {
        Liveness {
            interval: LIVENESS_INTERVAL,
            probe_timeout: PROBE_TIMEOUT,
            exec_grace: EXEC_GRACE,
        }
    }
}

impl AgentClient {
    /// The next response to request `id` on `rx`, waiting until `deadline` (None: as
    /// long as the agent lives). See the module docs.
    pub(super) fn recv(
        &self,
        id: u64,
        rx: &Receiver<Response>,
        deadline: Option<Instant>,
        what: &'static str,
    ) -> Result<Response, ClientError> {
        let started = Instant::now();
        let interval = self.liveness.map(|l| l.interval);
        loop {
            let left = deadline.map(|d| d.saturating_duration_since(Instant::now()));
            let slice = match (left, interval) {
                (Some(l), Some(i)) => Some(l.min(i)),
                (l, i) => l.or(i),
            };
            let got = match slice {
                Some(t) => rx.recv_timeout(t),
                None => rx.recv().map_err(|_| RecvTimeoutError::Disconnected),
            };
            match got {
                Ok(Response::Error(body)) => return Err(ClientError::Agent(body)),
                Ok(r) => return Ok(r),
                Err(RecvTimeoutError::Disconnected) => return Err(self.closed_error()),
                Err(RecvTimeoutError::Timeout) => {}
            }
            let expired = deadline.is_some_and(|d| Instant::now() >= d);
            if !expired && interval.is_some_and(|i| self.conn.shared.heard_within(i)) {
                continue;
            }
            let alive = match self.liveness {
                Some(l) => self.is_alive(l.probe_timeout),
                None => true,
            };
            if alive && !expired {
                continue;
            }
            self.forget(id);
            if self.is_closed() {
                return Err(self.closed_error());
            }
            let after = started.elapsed();
            if alive {
                return Err(ClientError::Timeout { what, after });
            }
            let probe = self.liveness.map(|l| l.probe_timeout).unwrap_or_default();
            let why = format!(
                "no answer to {what} for {after:.1?}, nor to a health check within {probe:?}"
            );
            self.close_with(CloseCause::Unresponsive(why.clone()));
            return Err(ClientError::Unresponsive(why));
        }
    }

    /// Whether the agent answers anything: a frame heard just now, or a `health` answered
    /// within `probe_timeout` (an error answer proves life too).
    fn is_alive(&self, probe_timeout: Duration) -> bool {
        if self.conn.shared.heard_within(Duration::from_millis(500)) {
            return true;
        }
        let Ok((id, rx)) = self.send(Request::Health) else {
            return false;
        };
        let answered = rx.recv_timeout(probe_timeout).is_ok();
        self.forget(id);
        answered || self.conn.shared.heard_within(probe_timeout)
    }
}
