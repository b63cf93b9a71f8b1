//! A watched directory as seen by the client: [`AgentClient::watch`] returns once the
//! agent watches it; [`WatchHandle::next`] hands over its events as they come, and
//! dropping the handle ends the watch in the agent (`unwatch`, fire and forget).

use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::time::Duration;

use super::{expect_ok, unexpected, AgentClient, ClientError};
use crate::watch::{UnwatchRequest, WatchEvent, WatchRequest};
use crate::{Request, Response};

/// What [`WatchHandle::next`] saw.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WatchNext {
    /// Changes, in the order they happened.
    Events(Vec<WatchEvent>),
    /// Nothing happened within the wait.
    Idle,
    /// The watch is over (an `unwatch`); no more events come.
    Ended,
}

/// A watch started with [`AgentClient::watch`].
pub struct WatchHandle {
    client: AgentClient,
    id: u64,
    rx: Receiver<Response>,
    finished: bool,
}

impl AgentClient {
    /// Watch the directory `req.path`; returns once the agent watches it (or why it
    /// cannot: not found, not a directory, a limit reached).
    pub fn watch(&self, req: WatchRequest) -> Result<WatchHandle, ClientError> {
        let (id, rx) = self.send(Request::Watch(req))?;
        match self.recv(id, &rx, self.request_deadline(), "watch") {
            Ok(Response::WatchStarted) => Ok(WatchHandle {
                client: self.clone(),
                id,
                rx,
                finished: false,
            }),
            Ok(other) => {
                self.forget(id);
                Err(unexpected("watch", &other))
            }
            Err(e) => Err(e),
        }
    }

    /// End the watch `watch_id` (a [`WatchHandle::id`]) of this connection.
    pub fn unwatch(&self, watch_id: u64) -> Result<(), ClientError> {
        let req = Request::Unwatch(UnwatchRequest { watch_id });
        expect_ok("unwatch", self.call(req, "unwatch")?)
    }
}

impl WatchHandle {
    /// The `watch` request id (what `unwatch` takes).
    pub fn id(&self) -> u64 {
        self.id
    }

    /// The next events, waiting up to `wait` for some.
    pub fn next(&mut self, wait: Duration) -> Result<WatchNext, ClientError> {
        if self.finished {
            return Ok(WatchNext::Ended);
        }
        match self.rx.recv_timeout(wait) {
            Ok(Response::WatchEvents { events }) => Ok(WatchNext::Events(events)),
            Ok(Response::Ok) => {
                self.finished = true;
                Ok(WatchNext::Ended)
            }
            Ok(Response::Error(body)) => {
                self.finished = true;
                Err(ClientError::Agent(body))
            }
            Ok(other) => Err(unexpected("watch", &other)),
            Err(RecvTimeoutError::Timeout) => Ok(WatchNext::Idle),
            Err(RecvTimeoutError::Disconnected) => {
                self.finished = true;
                Err(self.client.closed_error())
            }
        }
    }
}

impl Drop for WatchHandle {
    fn drop(&mut self) {
        if self.finished {
            return;
        }
        self.client.forget(self.id);
        let req = Request::Unwatch(UnwatchRequest { watch_id: self.id });
        if let Ok((unwatch_id, _rx)) = self.client.send(req) {
            self.client.forget(unwatch_id);
        }
    }
}
