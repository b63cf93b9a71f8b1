//! `GET /v1/sandboxes/{id}/events`: a sandbox's event log ([`crate::event_log`]);
//! `GET /v1/events`: every sandbox's events as they happen, as Server-Sent Events
//! ([`crate::event_stream`], the wire in [`crate::model::LiveEvent`]'s module).
use std::convert::Infallible;
use std::time::Duration;

use axum::extract::{Path, State};
use axum::http::HeaderMap;
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::Json;
use futures_util::future::ready;
use futures_util::StreamExt;
use tokio_stream::wrappers::errors::BroadcastStreamRecvError;
use tokio_stream::wrappers::BroadcastStream;

use super::{ApiQuery, AppState};
use crate::error::{ErrorBody, Result};
use crate::model::{
    EventList, EventsQuery, LiveEvent, LiveEventsQuery, StreamLagged, StreamReady, Validate,
    SSE_LAGGED, SSE_READY, SSE_SANDBOX,
};

/// Silence after which a `: keep-alive` comment is sent: writing it is how a client
/// that left without closing is noticed, and it keeps proxies from timing out.
pub const KEEPALIVE: Duration = Duration::from_secs(15);

#[utoipa::path(get, path = "/v1/sandboxes/{id}/events", tag = "sandboxes",
    params(("id" = String, Path, description = "Sandbox id"), EventsQuery),
    responses((status = 200, description = "What happened to the sandbox and in it (started, \
                branched, paused, resumed, commands started and ended, snapshots, network and \
                timeout changes, its VM stopping), oldest first unless `order=desc`. A log \
                keeps about the last 1 MiB of events and goes with its sandbox; a branch \
                child's starts at the branch", body = EventList),
              (status = 400, description = "A bound of the query broken, or an unknown parameter", body = ErrorBody),
              (status = 404, description = "No such sandbox", body = ErrorBody)))]
pub async fn events(
    State(st): State<AppState>,
    Path(id): Path<String>,
    ApiQuery(q): ApiQuery<EventsQuery>,
) -> Result<Json<EventList>> {
    q.validate()?;
    Ok(Json(st.manager.events(&id, &q)?))
}

#[utoipa::path(get, path = "/v1/events", tag = "sandboxes",
    params(LiveEventsQuery,
        ("Last-Event-ID" = Option<String>, Header, description = "The id of the last event \
          a reconnecting client got: the ones after it are sent first if the daemon still \
          holds them (the last 4096), else `lagged` first")),
    responses((status = 200, description = "Server-Sent Events, never ending: `event: ready` \
                (data: `{\"epoch\": N}`) at once, then `event: sandbox` (id `EPOCH-SEQ`, data: \
                a LiveEvent: the sandbox, and the entry its event log got: `sandbox \
                creating`, `sandbox started`, `branched`, `paused`, `resumed`, `snapshot \
                taken`, `restored`, `timeout changed`, `command started`, `command ended`, \
                `sandbox died`, ...; also `sandbox deleted` with its `reason`: deleted, \
                expired, not started), `event: lagged` (data: `{\"missed\": N}`: events were \
                lost, read the state again) and `: keep-alive` comments after 15 s of \
                silence", body = LiveEvent, content_type = "text/event-stream"),
              (status = 400, description = "A bound of the query broken, or an unknown parameter", body = ErrorBody)))]
pub async fn live(
    State(st): State<AppState>,
    headers: HeaderMap,
    ApiQuery(q): ApiQuery<LiveEventsQuery>,
) -> Result<Response> {
    q.validate()?;
    let hub = st.manager.event_hub();
    let last_id = headers.get("last-event-id").and_then(|v| v.to_str().ok());
    let sub = hub.subscribe(last_id);
    let mut first = vec![sse(SSE_READY, &StreamReady { epoch: sub.epoch })];
    if let Some(missed) = sub.lost {
        first.push(sse(SSE_LAGGED, &StreamLagged { missed }));
    }
    first.extend(
        sub.replay
            .iter()
            .filter(|e| q.matches(e))
            .map(|e| sandbox_event(e)),
    );
    let live = BroadcastStream::new(sub.live).filter_map(move |got| {
        ready(match got {
            Ok(e) if q.matches(&e) => Some(sandbox_event(&e)),
            Ok(_) => None,
            Err(BroadcastStreamRecvError::Lagged(missed)) => {
                Some(sse(SSE_LAGGED, &StreamLagged { missed }))
            }
        })
    });
    let stream = futures_util::stream::iter(first)
        .chain(live)
        .map(Ok::<_, Infallible>)
        .take_until(hub.closed());
    Ok(Sse::new(stream)
        .keep_alive(KeepAlive::new().interval(KEEPALIVE).text("keep-alive"))
        .into_response())
}

fn sse(name: &str, data: &impl serde::Serialize) -> Event {
    Event::default()
        .event(name)
        .json_data(data)
        .expect("stream messages serialize")
}

fn sandbox_event(e: &LiveEvent) -> Event {
    sse(SSE_SANDBOX, e).id(e.id.clone())
}
