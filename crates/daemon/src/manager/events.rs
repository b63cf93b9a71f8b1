//! The client of a streamed fan-out (branch, create), if there is one.
use std::time::Instant;

use tokio::sync::mpsc::UnboundedSender;

/// Where a streamed request's events go: nowhere without a streaming client, and sends
/// to a client that went away are dropped (the work goes on without it).
pub(super) struct Events<E> {
    pub(super) tx: Option<UnboundedSender<E>>,
    /// When the daemon took the request: every event's `ms` counts from here.
    pub(super) started: Instant,
}

impl<E> Events<E> {
    pub(super) fn emit(&self, ev: E) {
        if let Some(tx) = &self.tx {
            let _ = tx.send(ev);
        }
    }

    pub(super) fn ms(&self) -> u64 {
        self.started.elapsed().as_millis() as u64
    }

    pub(super) fn streaming(&self) -> bool {
        self.tx.is_some()
    }
}
