//! The daemon's connection to each running sandbox's guest agent, and its health.
//!
//! One cached [`AgentClient`] per sandbox carries every call (the qemu runtime's
//! virtio-serial channel takes one connection at a time). The client does not trust the
//! agent (see `zygote_proto::client`): every wait has a deadline or a liveness check,
//! and a silent or garbling agent gets its connection closed with the cause recorded.
//! Here that cause becomes the sandbox's `agent` health ([`AgentHealth`]), shown in
//! its JSON while it stays `running`, and the next call connects again: after a short
//! pause ([`RECONNECT_PAUSE`]) that lets the guest see the old connection end (on a
//! virtio-serial port it ends the old session, and after a broken frame the agent skips
//! what is left of it), with a bounded `hello` ([`HELLO_TIMEOUT`] in the runtime). The
//! watcher retries such sandboxes in the background, so their health recovers without
//! a call.
use std::sync::Arc;
use std::time::Duration;

use zygote_proto::client::{AgentClient, ClientError, CloseCause};

use super::{now, Manager};
use crate::error::{Error, Result};
use crate::model::{AgentHealth, AgentState};

/// Pause before a new connection replaces one closed because of the agent: longer than
/// the agent's wait for a reconnecting host on a virtio-serial port (500 ms), so it sees
/// the old connection end.
pub(crate) const RECONNECT_PAUSE: Duration = Duration::from_secs(1);

/// What is known about a sandbox's agent beyond its cached client.
#[derive(Debug, Clone, Default)]
pub(crate) struct HealthRecord {
    /// A new connection is being made after a failure.
    reconnecting: bool,
    /// The last failure: its state, message and time; `current` while no connection
    /// has succeeded since.
    failure: Option<Failure>,
}

#[derive(Debug, Clone)]
struct Failure {
    state: AgentState,
    message: String,
    at: u64,
    current: bool,
}

/// The health state a closed connection's cause means (None: closed on purpose).
fn state_of(cause: &CloseCause) -> Option<(AgentState, String)> {
    match cause {
        CloseCause::Client => None,
        CloseCause::Lost(m) => Some((AgentState::Unreachable, m.clone())),
        CloseCause::Unresponsive(m) => Some((AgentState::Unresponsive, m.clone())),
        CloseCause::Malformed(m) => Some((AgentState::MalformedReply, m.clone())),
    }
}

/// Clears a sandbox's `reconnecting` health when dropped.
struct ReconnectingShown<'a> {
    manager: &'a Manager,
    id: &'a str,
}

impl Drop for ReconnectingShown<'_> {
    fn drop(&mut self) {
        self.manager
            .with_health(self.id, |h| h.reconnecting = false);
    }
}

/// The state a failed connection attempt leaves.
fn state_of_error(e: &Error) -> AgentState {
    match e {
        Error::AgentTimeout(_) => AgentState::Unresponsive,
        Error::AgentMalformed(_) => AgentState::MalformedReply,
        _ => AgentState::Unreachable,
    }
}

/// The health shown for a record and the cause of the cached connection's end, if it
/// ended (a connection the agent broke is news the record has not seen yet).
pub(crate) fn health_view(record: &HealthRecord, closed: Option<&CloseCause>) -> AgentHealth {
    let fresh = closed.and_then(state_of);
    let last = record.failure.as_ref();
    let state = if record.reconnecting {
        AgentState::Reconnecting
    } else if let Some((state, _)) = &fresh {
        *state
    } else {
        match last {
            Some(f) if f.current => f.state,
            _ => AgentState::Ok,
        }
    };
    let (last_error, last_error_at) = match (fresh, last) {
        (Some((_, message)), _) => (Some(message), Some(now())),
        (None, Some(f)) => (Some(f.message.clone()), Some(f.at)),
        (None, None) => (None, None),
    };
    AgentHealth {
        state,
        last_error,
        last_error_at,
    }
}

impl Manager {
    fn with_health<T>(&self, id: &str, f: impl FnOnce(&mut HealthRecord) -> T) -> T {
        let mut all = self.agent_health.lock().unwrap_or_else(|p| p.into_inner());
        f(all.entry(id.to_string()).or_default())
    }

    fn cached_agent(&self, id: &str) -> Option<AgentClient> {
        self.agents
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(id)
            .cloned()
    }

    /// The `agent` field of a running sandbox.
    pub(crate) fn agent_health(&self, id: &str) -> AgentHealth {
        let closed = self.cached_agent(id).and_then(|c| c.close_cause());
        let all = self.agent_health.lock().unwrap_or_else(|p| p.into_inner());
        let record = all.get(id).cloned().unwrap_or_default();
        health_view(&record, closed.as_ref())
    }

    /// Whether the agent of `id` is known to be in trouble and nobody is connecting to
    /// it now.
    pub(super) fn agent_needs_healing(&self, id: &str) -> bool {
        !matches!(
            self.agent_health(id).state,
            AgentState::Ok | AgentState::Reconnecting
        )
    }

    /// Drops the cached agent connection (the VM changed or went away).
    pub(crate) fn forget_agent(&self, id: &str) {
        if let Some(c) = self
            .agents
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(id)
        {
            c.close();
        }
    }

    /// Forgets the health of a sandbox that is gone.
    pub(super) fn forget_agent_health(&self, id: &str) {
        self.agent_health
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(id);
    }

    /// A connected agent client for a running sandbox (cached); a paused one with
    /// auto-resume is resumed first.
    pub(crate) async fn agent(&self, id: &str) -> Result<AgentClient> {
        self.wake(id).await?;
        self.agent_if_awake(id).await
    }

    /// [`Manager::agent`] without waking a paused sandbox (an error for it instead):
    /// for the daemon's own background calls, which must not resume what was paused.
    pub(crate) async fn agent_if_awake(&self, id: &str) -> Result<AgentClient> {
        let row = self.sandbox_row(id)?;
        let vm = self.running_vm(&row)?;
        let open = || self.cached_agent(id).filter(|c| !c.is_closed());
        if let Some(c) = open() {
            return Ok(c);
        }
        let slot = self
            .connecting
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .entry(id.to_string())
            .or_default()
            .clone();
        let _connecting = slot.lock().await;
        if let Some(c) = open() {
            return Ok(c);
        }
        // Why the last connection ended, kept before it is let go.
        let broken = self
            .cached_agent(id)
            .and_then(|c| c.close_cause())
            .and_then(|cause| state_of(&cause));
        // A closed client may still hold its end of the channel: let it go first.
        self.forget_agent(id);
        let retrying = self.with_health(id, |h| {
            if let Some((state, message)) = &broken {
                tracing::warn!(
                    sandbox = id,
                    "agent connection dropped ({state:?}): {message}"
                );
                h.failure = Some(Failure {
                    state: *state,
                    message: message.clone(),
                    at: now(),
                    current: true,
                });
            }
            // Shown while connecting after a failure; it also keeps the watcher from
            // queueing more attempts behind this one.
            h.reconnecting = h.failure.as_ref().is_some_and(|f| f.current);
            h.reconnecting
        });
        // Cleared however this ends, even if the caller gives up (drops this future).
        let _shown = ReconnectingShown { manager: self, id };
        if broken.is_some() {
            tokio::time::sleep(RECONNECT_PAUSE).await;
        }
        let rt = self.runtime.clone();
        let token = self.dirs.agent_key.token(id);
        let connected = self
            .blocking(move || rt.connect(&vm, &token))
            .await
            .and_then(|c| c.map_err(Error::runtime));
        if retrying && connected.is_ok() {
            tracing::info!(sandbox = id, "agent reached again");
        }
        self.with_health(id, |h| match &connected {
            Ok(_) => {
                if let Some(f) = &mut h.failure {
                    f.current = false;
                }
            }
            Err(e) => {
                h.failure = Some(Failure {
                    state: state_of_error(e),
                    message: e.to_string(),
                    at: now(),
                    current: true,
                })
            }
        });
        let client = connected?;
        self.agents
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(id.to_string(), client.clone());
        Ok(client)
    }

    /// The agent for `id`; a connection found broken on the first try is replaced once.
    pub(super) async fn agent_call<T: Send + 'static>(
        self: &Arc<Self>,
        id: &str,
        f: impl Fn(&AgentClient) -> Result<T, ClientError> + Send + Sync + 'static,
    ) -> Result<T> {
        let f = Arc::new(f);
        for attempt in 0..2 {
            let client = self.agent(id).await?;
            let g = f.clone();
            let res = self.blocking(move || g(&client)).await?;
            match res {
                Err(ClientError::Closed(_) | ClientError::Io(_)) if attempt == 0 => {
                    self.forget_agent(id);
                }
                other => return other.map_err(Error::agent),
            }
        }
        unreachable!("the loop returns on its second attempt")
    }

    /// For the watcher: connects again to the agent of a running sandbox whose health
    /// is not `ok`, and checks that it answers, in the background.
    pub(super) fn heal_agent(self: &Arc<Self>, id: &str) {
        let this = self.clone();
        let id = id.to_string();
        tokio::spawn(async move {
            let Ok(client) = this.agent(&id).await else {
                return;
            };
            let answered = this.blocking(move || client.health()).await;
            if let Ok(Err(e)) = answered {
                tracing::debug!(sandbox = %id, "agent health check: {e}");
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn failure(state: AgentState, current: bool) -> HealthRecord {
        HealthRecord {
            reconnecting: false,
            failure: Some(Failure {
                state,
                message: "no answer".into(),
                at: 7,
                current,
            }),
        }
    }

    #[test]
    fn health_follows_the_connection() {
        let fine = health_view(&HealthRecord::default(), None);
        assert_eq!((fine.state, fine.last_error), (AgentState::Ok, None));
        // A connection the agent broke shows at once, before any reconnect.
        let silent = CloseCause::Unresponsive("no answer to exec".into());
        let h = health_view(&HealthRecord::default(), Some(&silent));
        assert_eq!(h.state, AgentState::Unresponsive);
        assert_eq!(h.last_error.as_deref(), Some("no answer to exec"));
        let garbage = CloseCause::Malformed("not JSON".into());
        let h = health_view(&HealthRecord::default(), Some(&garbage));
        assert_eq!(h.state, AgentState::MalformedReply);
        // Closed on purpose: nothing wrong.
        let h = health_view(&HealthRecord::default(), Some(&CloseCause::Client));
        assert_eq!(h.state, AgentState::Ok);
        // While reconnecting, and after: the last error stays for the record.
        let mut record = failure(AgentState::Unresponsive, true);
        record.reconnecting = true;
        assert_eq!(health_view(&record, None).state, AgentState::Reconnecting);
        let h = health_view(&failure(AgentState::Unresponsive, true), None);
        assert_eq!(h.state, AgentState::Unresponsive);
        let h = health_view(&failure(AgentState::Unresponsive, false), None);
        assert_eq!(h.state, AgentState::Ok);
        assert_eq!(
            (h.last_error.as_deref(), h.last_error_at),
            (Some("no answer"), Some(7))
        );
    }
}
