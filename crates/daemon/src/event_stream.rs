//! The daemon-wide event stream behind `GET /v1/events`: every event any sandbox's
//! log records ([`crate::event_log`]), plus the ones no log can hold (`sandbox
//! deleted`), handed to every subscriber as it happens.
//!
//! Why this shape:
//! - Publishing never waits for a subscriber: events go through a bounded
//!   `tokio::sync::broadcast` channel, and a subscriber that falls more than
//!   [`CHANNEL_EVENTS`] behind is told how many it lost (`lagged`) instead of slowing
//!   the operation that published them (a branch, a delete).
//! - The newest [`REPLAY_EVENTS`] stay in a ring, so a client that reconnects with
//!   `Last-Event-ID` misses nothing it could still be given. Ids are `EPOCH-SEQ`: an id
//!   of an earlier daemon run is never mistaken for one of this run.
//! - Subscribing takes the ring's lock, as publishing does: the replay and the live
//!   channel meet with no event lost or given twice.
use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use tokio::sync::{broadcast, watch};

use crate::model::{parse_stream_id, stream_id, LiveEvent, SandboxEvent, REPLAY_EVENTS};

/// Events a subscriber may fall behind the newest before it is told it lagged.
pub const CHANNEL_EVENTS: usize = 1024;

pub struct EventHub {
    epoch: u64,
    ring: Mutex<Ring>,
    tx: broadcast::Sender<Arc<LiveEvent>>,
    /// Set when the daemon shuts down: streams end, so they do not hold its graceful
    /// shutdown open forever.
    closing: watch::Sender<bool>,
}

#[derive(Default)]
struct Ring {
    /// The number of the newest event published (0: none yet).
    seq: u64,
    events: VecDeque<(u64, Arc<LiveEvent>)>,
}

/// A new subscriber's start: what it missed (or how many it lost), then the live channel.
pub struct Subscription {
    pub epoch: u64,
    /// Events after the client's `Last-Event-ID` still held, oldest first.
    pub replay: Vec<Arc<LiveEvent>>,
    /// Some(n): the client's `Last-Event-ID` is older than anything held (n lost), or of
    /// another daemon run (n = 0, unknown).
    pub lost: Option<u64>,
    pub live: broadcast::Receiver<Arc<LiveEvent>>,
}

impl Default for EventHub {
    fn default() -> Self {
        EventHub::new(crate::event_log::now_ms())
    }
}

impl EventHub {
    pub fn new(epoch: u64) -> EventHub {
        EventHub {
            epoch,
            ring: Mutex::new(Ring::default()),
            tx: broadcast::channel(CHANNEL_EVENTS).0,
            closing: watch::channel(false).0,
        }
    }

    fn ring(&self) -> std::sync::MutexGuard<'_, Ring> {
        self.ring.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Hands `event` of `sandbox` to every subscriber (none: it is only kept for replay).
    pub fn publish(&self, sandbox: &str, event: SandboxEvent) {
        let mut ring = self.ring();
        ring.seq += 1;
        let seq = ring.seq;
        let live = Arc::new(LiveEvent {
            id: stream_id(self.epoch, seq),
            sandbox: sandbox.to_string(),
            event,
        });
        if ring.events.len() >= REPLAY_EVENTS {
            ring.events.pop_front();
        }
        ring.events.push_back((seq, live.clone()));
        // No receiver is not an error: nobody is watching.
        let _ = self.tx.send(live);
    }

    /// Ends every stream (the daemon is shutting down).
    pub fn close(&self) {
        self.closing.send_replace(true);
    }

    /// Resolves once [`EventHub::close`] was called.
    pub fn closed(&self) -> impl std::future::Future<Output = ()> + Send + 'static {
        let mut closing = self.closing.subscribe();
        async move {
            let _ = closing.wait_for(|c| *c).await;
        }
    }

    /// A subscription from now, or from after `last_id` (a reconnecting client's
    /// `Last-Event-ID`) as far as the ring still reaches.
    pub fn subscribe(&self, last_id: Option<&str>) -> Subscription {
        let ring = self.ring();
        let live = self.tx.subscribe();
        let (replay, lost) = match last_id.map(parse_stream_id) {
            None => (Vec::new(), None),
            Some(Some((epoch, seen))) if epoch == self.epoch && seen <= ring.seq => {
                let oldest_held = ring.events.front().map_or(ring.seq + 1, |(s, _)| *s);
                let lost = oldest_held.saturating_sub(seen + 1);
                let replay = ring
                    .events
                    .iter()
                    .filter(|(s, _)| *s > seen)
                    .map(|(_, e)| e.clone())
                    .collect();
                (replay, (lost > 0).then_some(lost))
            }
            // Another run's id, one from the future, or not one of ours at all.
            Some(_) => (Vec::new(), Some(0)),
        };
        Subscription {
            epoch: self.epoch,
            replay,
            lost,
            live,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::model::EventLevel;

    fn event(message: &str) -> SandboxEvent {
        SandboxEvent {
            ts_ms: 1,
            level: EventLevel::Info,
            message: message.into(),
            fields: BTreeMap::new(),
        }
    }

    fn messages(events: &[Arc<LiveEvent>]) -> Vec<&str> {
        events.iter().map(|e| e.event.message.as_str()).collect()
    }

    #[tokio::test]
    async fn subscribers_get_what_is_published_after_they_subscribe() {
        let hub = EventHub::new(7);
        hub.publish("a", event("before"));
        let mut sub = hub.subscribe(None);
        assert!(sub.replay.is_empty() && sub.lost.is_none());
        hub.publish("b", event("after"));
        let got = sub.live.recv().await.unwrap();
        assert_eq!((got.sandbox.as_str(), got.id.as_str()), ("b", "7-2"));
        assert_eq!(got.event.message, "after");
    }

    #[test]
    fn a_reconnect_gets_exactly_what_it_missed() {
        let hub = EventHub::new(7);
        for m in ["one", "two", "three"] {
            hub.publish("a", event(m));
        }
        let sub = hub.subscribe(Some("7-1"));
        assert_eq!(messages(&sub.replay), ["two", "three"]);
        assert_eq!(sub.lost, None);
        let sub = hub.subscribe(Some("7-3"));
        assert!(sub.replay.is_empty() && sub.lost.is_none());
    }

    #[test]
    fn ids_out_of_reach_of_another_run_or_not_ours_say_lagged() {
        let hub = EventHub::new(7);
        for i in 0..REPLAY_EVENTS + 10 {
            hub.publish("a", event(&i.to_string()));
        }
        // The ring holds 11..=4106; after 5, six (6..=10) are gone.
        let sub = hub.subscribe(Some("7-5"));
        assert_eq!(sub.lost, Some(5));
        assert_eq!(sub.replay.len(), REPLAY_EVENTS);
        assert_eq!(sub.replay[0].id, "7-11");
        for stranger in ["6-5", "7-999999", "garbage", ""] {
            let sub = hub.subscribe(Some(stranger));
            assert_eq!(sub.lost, Some(0), "{stranger:?}");
            assert!(sub.replay.is_empty());
        }
    }

    #[tokio::test]
    async fn a_slow_subscriber_is_told_how_many_it_lost_and_never_blocks_publishing() {
        let hub = EventHub::new(7);
        let mut sub = hub.subscribe(None);
        for i in 0..CHANNEL_EVENTS + 5 {
            hub.publish("a", event(&i.to_string()));
        }
        match sub.live.recv().await {
            Err(broadcast::error::RecvError::Lagged(n)) => assert_eq!(n, 5),
            other => panic!("expected a lag, got {other:?}"),
        }
        assert_eq!(sub.live.recv().await.unwrap().event.message, "5");
    }

    #[tokio::test]
    async fn closing_resolves_what_waits_for_it() {
        let hub = EventHub::new(7);
        let closed = hub.closed();
        hub.close();
        tokio::time::timeout(std::time::Duration::from_secs(5), closed)
            .await
            .expect("closed() resolves after close()");
    }
}
