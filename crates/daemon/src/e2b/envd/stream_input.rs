//! envd's `StreamInput`: a client stream of input for one process, so a client can
//! feed a program (or a terminal) as its data comes, over one request.
//!
//! The request body is read envelope by envelope as it arrives (never whole: the
//! stream lasts as long as the client has input), each message at most
//! [`MAX_MESSAGE_BYTES`]. The first message names the process (`start`), then `data`
//! messages carry `ProcessInput` (as SendInput's) and `keepalive` ones nothing. When
//! the client ends its stream the answer is the empty response message and a clean
//! end-stream; a bad message, an input the process refuses, or the
//! `Connect-Timeout-Ms` deadline ends the call with that error at once.
use axum::body::Body;
use axum::http::HeaderMap;
use axum::response::Response;
use bytes::{Bytes, BytesMut};
use futures_util::StreamExt;
use serde::Deserialize;
use tokio::time::{Duration, Instant};

use super::connect::{self, Code, ConnectError};
use super::process_ctl::{send_input, ProcessInput};
use super::selector::{ProcessSelector, Procs};
use crate::model::MAX_JSON_BODY_BYTES;

/// Largest message of the stream (a chunk of input in base64, in JSON).
pub const MAX_MESSAGE_BYTES: usize = MAX_JSON_BODY_BYTES;

/// `StreamInputRequest`, whose `event` is a oneof: proto3 JSON writes its member as a
/// key of the message itself, `{"start": {...}}`, `{"data": {...}}`, `{"keepalive": {}}`.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "lowercase")]
enum InputEvent {
    Start { process: ProcessSelector },
    Data { input: ProcessInput },
    Keepalive {},
}

/// Serves `StreamInput` for the routed sandbox, reading `body` as it comes.
pub async fn serve(procs: Procs<'_>, headers: &HeaderMap, body: Body) -> Response {
    let deadline = match connect::timeout_ms(headers) {
        Ok(t) => t.filter(|&t| t > 0),
        Err(e) => return e.stream_response(),
    };
    let work = forward(procs, body);
    let done = match deadline {
        Some(ms) => tokio::time::timeout_at(Instant::now() + Duration::from_millis(ms), work)
            .await
            .unwrap_or_else(|_| {
                Err(ConnectError::new(
                    Code::DeadlineExceeded,
                    "the input stream reached its timeout (connect-timeout-ms)",
                ))
            }),
        None => work.await,
    };
    match done {
        Ok(()) => {
            let mut out = BytesMut::new();
            out.extend_from_slice(&connect::message(&serde_json::json!({})));
            out.extend_from_slice(&connect::end_stream_ok());
            connect::stream_response(Body::from(out.freeze()))
        }
        Err(e) => e.stream_response(),
    }
}

/// Reads the stream's messages and sends each input to the process it started with.
async fn forward(procs: Procs<'_>, body: Body) -> Result<(), ConnectError> {
    let mut chunks = body.into_data_stream();
    let mut buf = BytesMut::new();
    let mut pid = None;
    loop {
        while let Some(message) = connect::next_message(&mut buf, MAX_MESSAGE_BYTES)? {
            pid = Some(handle(procs, pid, &message).await?);
        }
        match chunks.next().await {
            Some(Ok(chunk)) => buf.extend_from_slice(&chunk),
            Some(Err(e)) => {
                return Err(ConnectError::new(
                    Code::InvalidArgument,
                    format!("reading the input stream: {e}"),
                ))
            }
            None => return connect::finished(&buf),
        }
    }
}

/// One message: the pid the stream feeds from now on.
async fn handle(procs: Procs<'_>, pid: Option<u32>, message: &Bytes) -> Result<u32, ConnectError> {
    let event: InputEvent = serde_json::from_slice(message).map_err(|e| {
        ConnectError::new(Code::InvalidArgument, format!("StreamInputRequest: {e}"))
    })?;
    match (event, pid) {
        (InputEvent::Start { process }, None) => {
            let pid = procs.pid(&process).await?;
            // envd checks the process exists when the stream starts.
            if !procs.ptys.has(procs.id, pid) {
                procs.running(pid).await?;
            }
            Ok(pid)
        }
        (InputEvent::Start { .. }, Some(_)) => Err(ConnectError::new(
            Code::InvalidArgument,
            "the input stream has already started: one start event only",
        )),
        (_, None) => Err(ConnectError::new(
            Code::InvalidArgument,
            "the first message of an input stream must be a start event",
        )),
        (InputEvent::Data { input }, Some(pid)) => {
            send_input(procs, pid, input).await?;
            Ok(pid)
        }
        (InputEvent::Keepalive {}, Some(pid)) => Ok(pid),
    }
}
