//! The client of the daemon-wide event stream (`GET /v1/events`, Server-Sent Events):
//! [`SseParser`] cuts the body into messages as the SSE spec says (fields `event`,
//! `data`, `id`; comments; LF, CRLF or CR line ends; a blank line ends a message), and
//! [`Client::follow_events`] hands each decoded [`StreamMessage`] to a callback,
//! reconnecting with `Last-Event-ID` when the connection drops, so a follower misses
//! nothing the daemon still holds.
use std::time::Duration;

use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper::{Method, StatusCode};

use crate::client::{Client, ClientError};
use crate::model::{
    LiveEvent, LiveEventsQuery, StreamLagged, StreamReady, SSE_LAGGED, SSE_READY, SSE_SANDBOX,
};

/// Bytes one message may hold before the stream is called malformed (the daemon's are
/// a few KiB: texts are cut to 1 KiB each).
pub const MAX_MESSAGE_BYTES: usize = 1 << 20;

/// One message of an SSE body.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SseMessage {
    pub event: String,
    pub data: String,
    pub id: Option<String>,
}

/// Incremental SSE parser: feed it the body's chunks as they come.
#[derive(Default)]
pub struct SseParser {
    line: Vec<u8>,
    /// The last byte was a CR: an LF right after it ends nothing more.
    after_cr: bool,
    current: SseMessage,
    data_lines: usize,
}

impl SseParser {
    /// The messages `chunk` completes, in order. Err: a line or message past
    /// [`MAX_MESSAGE_BYTES`].
    pub fn push(&mut self, chunk: &[u8]) -> Result<Vec<SseMessage>, String> {
        let mut done = Vec::new();
        for &b in chunk {
            let was_cr = std::mem::replace(&mut self.after_cr, b == b'\r');
            match b {
                b'\n' if was_cr => {}
                b'\n' | b'\r' => {
                    let line = std::mem::take(&mut self.line);
                    if let Some(m) = self.end_line(&line) {
                        done.push(m);
                    }
                }
                _ => {
                    self.line.push(b);
                    if self.line.len() + self.current.data.len() > MAX_MESSAGE_BYTES {
                        return Err(format!("an event stream message over {MAX_MESSAGE_BYTES} bytes"));
                    }
                }
            }
        }
        Ok(done)
    }

    fn end_line(&mut self, line: &[u8]) -> Option<SseMessage> {
        if line.is_empty() {
            let m = std::mem::take(&mut self.current);
            let had_data = std::mem::take(&mut self.data_lines) > 0;
            return had_data.then_some(m);
        }
        let line = String::from_utf8_lossy(line);
        let (field, value) = match line.split_once(':') {
            Some(("", _)) => return None, // a comment (keep-alive)
            Some((f, v)) => (f, v.strip_prefix(' ').unwrap_or(v)),
            None => (line.as_ref(), ""),
        };
        match field {
            "event" => self.current.event = value.to_string(),
            "data" => {
                if self.data_lines > 0 {
                    self.current.data.push('\n');
                }
                self.current.data.push_str(value);
                self.data_lines += 1;
            }
            "id" if !value.contains('\0') => self.current.id = Some(value.to_string()),
            _ => {} // `retry` and unknown fields are ignored, as the spec says
        }
        None
    }
}

/// A decoded message of `GET /v1/events`.
#[derive(Debug, Clone, PartialEq)]
pub enum StreamMessage {
    Ready(StreamReady),
    Event(LiveEvent),
    Lagged(StreamLagged),
}

impl StreamMessage {
    /// None for a message kind this client does not know (a newer daemon's).
    pub fn decode(m: &SseMessage) -> Result<Option<StreamMessage>, ClientError> {
        let bad = |e: serde_json::Error| ClientError::Decode(format!("{} message: {e}", m.event));
        Ok(Some(match m.event.as_str() {
            SSE_READY => StreamMessage::Ready(serde_json::from_str(&m.data).map_err(bad)?),
            SSE_SANDBOX => StreamMessage::Event(serde_json::from_str(&m.data).map_err(bad)?),
            SSE_LAGGED => StreamMessage::Lagged(serde_json::from_str(&m.data).map_err(bad)?),
            _ => return Ok(None),
        }))
    }
}

/// Waits between reconnects after the stream dropped (the daemon restarting).
const RECONNECT_DELAYS: [Duration; 4] = [
    Duration::from_millis(200),
    Duration::from_millis(500),
    Duration::from_secs(1),
    Duration::from_secs(2),
];

impl Client {
    /// Follows `GET /v1/events`: each message goes to `on_message` as it arrives until it
    /// answers false. A dropped connection is reopened (with the last id seen, so what
    /// the daemon still holds is replayed; a `Lagged` says when it was not) as long as
    /// the daemon keeps answering; an API error (a bad query, a wrong token) ends it.
    pub async fn follow_events(
        &self,
        q: &LiveEventsQuery,
        mut on_message: impl FnMut(StreamMessage) -> bool,
    ) -> Result<(), ClientError> {
        let path = events_path(q);
        let mut last_id: Option<String> = None;
        let mut failures = 0usize;
        loop {
            match self.events_once(&path, &mut last_id, &mut on_message).await {
                Ok(Flow::Stop) => return Ok(()),
                Ok(Flow::Dropped) => failures = 0,
                Err(e @ ClientError::Api { .. }) => return Err(e),
                Err(e) if failures >= RECONNECT_DELAYS.len() => return Err(e),
                Err(_) => failures += 1,
            }
            tokio::time::sleep(RECONNECT_DELAYS[failures.min(RECONNECT_DELAYS.len() - 1)]).await;
        }
    }

    async fn events_once(
        &self,
        path: &str,
        last_id: &mut Option<String>,
        on_message: &mut impl FnMut(StreamMessage) -> bool,
    ) -> Result<Flow, ClientError> {
        let mut req = self
            .request(Method::GET, path)
            .header(hyper::header::ACCEPT, "text/event-stream");
        if let Some(id) = last_id.as_deref() {
            req = req.header("last-event-id", id);
        }
        let req = req
            .body(Full::new(Bytes::new()))
            .map_err(|e| ClientError::Decode(e.to_string()))?;
        let resp = self.open().await?.send_request(req).await?;
        let status = resp.status();
        let mut body = resp.into_body();
        if status != StatusCode::OK {
            let bytes = body.collect().await?.to_bytes();
            crate::client::check(status, &bytes)?;
            return Err(ClientError::Decode(format!("HTTP {status}")));
        }
        let mut parser = SseParser::default();
        while let Some(frame) = body.frame().await {
            let Some(data) = frame?.data_ref().cloned() else {
                continue;
            };
            for m in parser.push(&data).map_err(ClientError::Decode)? {
                if let Some(id) = &m.id {
                    *last_id = Some(id.clone());
                }
                if let Some(msg) = StreamMessage::decode(&m)? {
                    if !on_message(msg) {
                        return Ok(Flow::Stop);
                    }
                }
            }
        }
        Ok(Flow::Dropped)
    }
}

fn events_path(q: &LiveEventsQuery) -> String {
    let mut query = form_urlencoded::Serializer::new(String::new());
    if let Some(s) = &q.sandbox {
        query.append_pair("sandbox", s);
    }
    if let Some(l) = q.level {
        query.append_pair("level", l.as_str());
    }
    format!("/v1/events?{}", query.finish())
}

enum Flow {
    Stop,
    Dropped,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse_in_pieces(body: &[u8], piece: usize) -> Vec<SseMessage> {
        let mut p = SseParser::default();
        body.chunks(piece)
            .flat_map(|c| p.push(c).unwrap())
            .collect()
    }

    #[test]
    fn messages_come_out_whole_however_the_body_is_cut() {
        let body = b": keep-alive\n\nevent: ready\ndata: {\"epoch\":5}\n\n\
                     id: 5-1\r\nevent: sandbox\r\ndata: a\r\ndata: b\r\n\r\n\
                     event:lagged\rdata:{\"missed\":2}\r\rdata\n\n";
        let want = vec![
            SseMessage {
                event: "ready".into(),
                data: "{\"epoch\":5}".into(),
                id: None,
            },
            SseMessage {
                event: "sandbox".into(),
                data: "a\nb".into(),
                id: Some("5-1".into()),
            },
            SseMessage {
                event: "lagged".into(),
                data: "{\"missed\":2}".into(),
                id: None,
            },
            SseMessage::default(),
        ];
        for piece in [1, 2, 3, 7, body.len()] {
            assert_eq!(parse_in_pieces(body, piece), want, "pieces of {piece}");
        }
    }

    #[test]
    fn an_endless_line_is_refused_not_buffered() {
        let mut p = SseParser::default();
        let chunk = vec![b'x'; 64 * 1024];
        let mut refused = false;
        for _ in 0..(MAX_MESSAGE_BYTES / chunk.len() + 2) {
            if p.push(&chunk).is_err() {
                refused = true;
                break;
            }
        }
        assert!(refused);
    }

    #[test]
    fn known_messages_decode_and_unknown_ones_are_skipped() {
        let m = |event: &str, data: &str| SseMessage {
            event: event.into(),
            data: data.into(),
            id: None,
        };
        assert_eq!(
            StreamMessage::decode(&m("lagged", "{\"missed\":3}")).unwrap(),
            Some(StreamMessage::Lagged(StreamLagged { missed: 3 }))
        );
        let ev = "{\"id\":\"1-1\",\"sandbox\":\"sb-1\",\"ts_ms\":2,\"level\":\"warn\",\
                  \"message\":\"sandbox died\",\"fields\":{\"reason\":\"oom\"}}";
        match StreamMessage::decode(&m("sandbox", ev)).unwrap() {
            Some(StreamMessage::Event(e)) => {
                assert_eq!((e.sandbox.as_str(), e.event.fields["reason"].as_str()), ("sb-1", "oom"))
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(StreamMessage::decode(&m("future", "{}")).unwrap(), None);
        assert!(StreamMessage::decode(&m("ready", "not json")).is_err());
    }
}
