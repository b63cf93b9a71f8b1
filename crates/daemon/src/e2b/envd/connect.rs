//! The Connect protocol (connectrpc.com/docs/protocol), JSON codec only: what E2B's
//! SDKs speak to envd (both send JSON; binary protobuf answers 415).
//!
//! - Unary: `Content-Type: application/json`, body = the bare message; errors are a
//!   non-200 status with `{"code": "not_found", "message": ...}`.
//! - Streams: `Content-Type: application/connect+json`; every message, the request's
//!   one included, is an envelope `[flags u8][length u32 BE][JSON]`. The answer is
//!   always 200; its last envelope has flag 0x02 (end of stream) and holds `{}` or
//!   `{"error": {"code", "message"}}`.
//!
//! Malformed envelopes get connect-go's own messages (E2B's envd is connect-go), as
//! `invalid_argument`.
use axum::body::Body;
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use bytes::{BufMut, Bytes, BytesMut};
use serde::Serialize;

/// Flag of an envelope whose message is compressed.
const FLAG_COMPRESSED: u8 = 0x01;
/// Flag of the server's last envelope (the end-stream message).
const FLAG_END_STREAM: u8 = 0x02;
/// Envelope prefix: flags and a u32 big-endian length.
const PREFIX_LEN: usize = 5;

pub const STREAM_CONTENT_TYPE: &str = "application/connect+json";
const UNARY_CONTENT_TYPE: &str = "application/json";

/// Connect's error codes (the protocol's list) with the HTTP status of a unary error.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Code {
    InvalidArgument,
    DeadlineExceeded,
    NotFound,
    AlreadyExists,
    PermissionDenied,
    ResourceExhausted,
    FailedPrecondition,
    Unimplemented,
    Internal,
    Unavailable,
    Unauthenticated,
}

impl Code {
    fn http_status(self) -> StatusCode {
        use StatusCode as S;
        match self {
            Code::InvalidArgument | Code::FailedPrecondition => S::BAD_REQUEST,
            Code::DeadlineExceeded => S::GATEWAY_TIMEOUT,
            Code::NotFound => S::NOT_FOUND,
            Code::AlreadyExists => S::CONFLICT,
            Code::PermissionDenied => S::FORBIDDEN,
            Code::ResourceExhausted => S::TOO_MANY_REQUESTS,
            Code::Unimplemented => S::NOT_IMPLEMENTED,
            Code::Internal => S::INTERNAL_SERVER_ERROR,
            Code::Unavailable => S::SERVICE_UNAVAILABLE,
            Code::Unauthenticated => S::UNAUTHORIZED,
        }
    }
}

/// A Connect error: its code and message, as the client receives them.
#[derive(Debug, Clone, Serialize, thiserror::Error)]
#[error("{code:?}: {message}")]
pub struct ConnectError {
    pub code: Code,
    pub message: String,
}

impl ConnectError {
    pub fn new(code: Code, message: impl Into<String>) -> ConnectError {
        ConnectError {
            code,
            message: message.into(),
        }
    }

    /// A daemon error, by its HTTP status (as the SDK's own status mapping would).
    pub fn from_zygote(e: &crate::error::Error) -> ConnectError {
        use StatusCode as S;
        let (status, name) = e.status_code();
        match name {
            "guest_already_exists" => return ConnectError::new(Code::AlreadyExists, e.to_string()),
            // The guest answered, with an I/O failure: envd's internal, not unavailable
            // (which the SDK reads as a sandbox gone).
            "guest_error" => return ConnectError::new(Code::Internal, e.to_string()),
            _ => {}
        }
        let code = match status {
            S::BAD_REQUEST | S::UNPROCESSABLE_ENTITY => Code::InvalidArgument,
            S::UNAUTHORIZED => Code::Unauthenticated,
            S::FORBIDDEN => Code::PermissionDenied,
            S::NOT_FOUND => Code::NotFound,
            S::CONFLICT => Code::FailedPrecondition,
            S::PAYLOAD_TOO_LARGE | S::TOO_MANY_REQUESTS | S::INSUFFICIENT_STORAGE => {
                Code::ResourceExhausted
            }
            S::BAD_GATEWAY | S::SERVICE_UNAVAILABLE => Code::Unavailable,
            S::GATEWAY_TIMEOUT => Code::DeadlineExceeded,
            _ => Code::Internal,
        };
        ConnectError::new(code, e.to_string())
    }

    /// A unary call's error answer.
    pub fn unary_response(&self) -> Response {
        let mut resp = (self.code.http_status(), axum::Json(self)).into_response();
        resp.headers_mut().insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static(UNARY_CONTENT_TYPE),
        );
        resp
    }

    /// A streaming call that ends with this error before any message.
    pub fn stream_response(&self) -> Response {
        stream_response(Body::from(self.end_stream()))
    }

    /// The end-stream envelope that carries this error.
    pub fn end_stream(&self) -> Bytes {
        #[derive(Serialize)]
        struct EndStream<'a> {
            error: &'a ConnectError,
        }
        envelope(FLAG_END_STREAM, &EndStream { error: self })
    }
}

/// Which Connect form a request's `Content-Type` asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Form {
    Unary,
    Stream,
}

/// The form of a request, or None for a codec other than JSON (or no Connect at all):
/// the caller answers 415.
pub fn form(headers: &HeaderMap) -> Option<Form> {
    let ct = headers.get(header::CONTENT_TYPE)?.to_str().ok()?;
    let essence = ct.split(';').next().unwrap_or("").trim();
    if essence.eq_ignore_ascii_case(STREAM_CONTENT_TYPE) {
        Some(Form::Stream)
    } else if essence.eq_ignore_ascii_case(UNARY_CONTENT_TYPE) {
        Some(Form::Unary)
    } else {
        None
    }
}

/// 415 for a content type this server cannot decode (connect-go's answer).
pub fn unsupported_media_type() -> Response {
    (
        StatusCode::UNSUPPORTED_MEDIA_TYPE,
        [("accept-post", "application/json, application/connect+json")],
    )
        .into_response()
}

/// `message` in an envelope with `flags`.
pub fn envelope<T: Serialize>(flags: u8, message: &T) -> Bytes {
    let json = serde_json::to_vec(message).expect("envd messages serialize");
    let mut out = BytesMut::with_capacity(PREFIX_LEN + json.len());
    out.put_u8(flags);
    out.put_u32(json.len() as u32);
    out.put_slice(&json);
    out.freeze()
}

/// A stream message envelope.
pub fn message<T: Serialize>(message: &T) -> Bytes {
    envelope(0, message)
}

/// A unary call's answer: 200 with the bare response message.
pub fn unary_ok<T: Serialize>(message: &T) -> Response {
    let mut resp = (StatusCode::OK, axum::Json(message)).into_response();
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static(UNARY_CONTENT_TYPE),
    );
    resp
}

/// The end-stream envelope of a stream that succeeded.
pub fn end_stream_ok() -> Bytes {
    envelope(FLAG_END_STREAM, &serde_json::json!({}))
}

/// A 200 streaming answer with `body` (envelopes).
pub fn stream_response(body: Body) -> Response {
    (
        StatusCode::OK,
        [(header::CONTENT_TYPE, STREAM_CONTENT_TYPE)],
        body,
    )
        .into_response()
}

/// The one request message of a server-streaming call: exactly one uncompressed
/// envelope, nothing after it.
pub fn single_message(body: &[u8]) -> Result<&[u8], ConnectError> {
    let bad = |m: String| ConnectError::new(Code::InvalidArgument, m);
    if body.len() < PREFIX_LEN {
        return Err(bad("protocol error: incomplete envelope".into()));
    }
    let flags = body[0];
    let len = u32::from_be_bytes([body[1], body[2], body[3], body[4]]) as usize;
    let rest = &body[PREFIX_LEN..];
    if rest.len() < len {
        return Err(bad(format!(
            "protocol error: promised {len} bytes in enveloped message, got {} bytes",
            rest.len()
        )));
    }
    check_flags(flags)?;
    if rest.len() > len {
        return Err(bad(
            "protocol error: a server-streaming call takes exactly one request message".into(),
        ));
    }
    Ok(&rest[..len])
}

/// A client's envelope carries no flags: no compression here, and end-of-stream is the
/// server's.
fn check_flags(flags: u8) -> Result<(), ConnectError> {
    let bad = |m: String| ConnectError::new(Code::InvalidArgument, m);
    if flags & FLAG_COMPRESSED != 0 {
        return Err(bad(
            "protocol error: sent compressed message without compression support".into(),
        ));
    }
    if flags != 0 {
        return Err(bad(format!(
            "protocol error: invalid envelope flags {flags}"
        )));
    }
    Ok(())
}

/// The next whole message of a client stream, taken off the front of `buf`; `None`
/// until `buf` holds all of it. A message past `max` bytes is `resource_exhausted`.
pub fn next_message(buf: &mut BytesMut, max: usize) -> Result<Option<Bytes>, ConnectError> {
    if buf.len() < PREFIX_LEN {
        return Ok(None);
    }
    check_flags(buf[0])?;
    let len = u32::from_be_bytes([buf[1], buf[2], buf[3], buf[4]]) as usize;
    if len > max {
        return Err(ConnectError::new(
            Code::ResourceExhausted,
            format!("message size {len} is larger than configured max {max}"),
        ));
    }
    if buf.len() < PREFIX_LEN + len {
        return Ok(None);
    }
    let _ = buf.split_to(PREFIX_LEN);
    Ok(Some(buf.split_to(len).freeze()))
}

/// What is left of a client stream that ended: nothing, or a torn envelope.
pub fn finished(buf: &[u8]) -> Result<(), ConnectError> {
    if buf.is_empty() {
        return Ok(());
    }
    single_message(buf).map(|_| ())
}

/// Silence before a keepalive when the client names no interval (envd's default).
const DEFAULT_KEEPALIVE_SECS: u64 = 90;

/// `Keepalive-Ping-Interval` (seconds, 1..=3600), else envd's default: the keepalive
/// period of every server stream (Start, Connect, WatchDir).
pub fn keepalive_interval(headers: &HeaderMap) -> std::time::Duration {
    let secs = headers
        .get("keepalive-ping-interval")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok())
        .filter(|s| (1..=3600).contains(s))
        .unwrap_or(DEFAULT_KEEPALIVE_SECS);
    std::time::Duration::from_secs(secs)
}

/// `Connect-Timeout-Ms`: at most 10 ASCII digits (the protocol's bound); None: absent.
pub fn timeout_ms(headers: &HeaderMap) -> Result<Option<u64>, ConnectError> {
    let Some(v) = headers.get("connect-timeout-ms") else {
        return Ok(None);
    };
    let s = v.to_str().unwrap_or("");
    if s.is_empty() || s.len() > 10 || !s.bytes().all(|b| b.is_ascii_digit()) {
        return Err(ConnectError::new(
            Code::InvalidArgument,
            format!("protocol error: invalid timeout {s:?} (1 to 10 digits of milliseconds)"),
        ));
    }
    Ok(s.parse().ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn envelopes_round_trip_and_bad_ones_are_named() {
        let env = message(&serde_json::json!({"a": 1}));
        assert_eq!(&env[..5], &[0, 0, 0, 0, 7]);
        assert_eq!(single_message(&env).unwrap(), br#"{"a":1}"#);
        let err = |b: &[u8]| single_message(b).unwrap_err().message;
        assert_eq!(err(&env[..3]), "protocol error: incomplete envelope");
        assert_eq!(
            err(&env[..8]),
            "protocol error: promised 7 bytes in enveloped message, got 3 bytes"
        );
        let mut compressed = env.to_vec();
        compressed[0] = 1;
        assert!(err(&compressed).contains("compressed"));
        let mut two = env.to_vec();
        two.extend_from_slice(&env);
        assert!(err(&two).contains("exactly one"));
        assert_eq!(end_stream_ok()[0], FLAG_END_STREAM);
    }

    #[test]
    fn client_streams_are_cut_into_messages_as_they_come() {
        let env = message(&serde_json::json!({"a": 1}));
        let mut buf = BytesMut::new();
        buf.extend_from_slice(&env[..3]);
        assert_eq!(next_message(&mut buf, 64).unwrap(), None);
        buf.extend_from_slice(&env[3..]);
        buf.extend_from_slice(&env[..6]);
        let first = next_message(&mut buf, 64).unwrap().unwrap();
        assert_eq!(&first[..], br#"{"a":1}"#);
        assert_eq!(next_message(&mut buf, 64).unwrap(), None);
        assert!(finished(&buf)
            .unwrap_err()
            .message
            .contains("promised 7 bytes"));
        assert_eq!(
            next_message(&mut buf, 6).unwrap_err().code,
            Code::ResourceExhausted
        );
        let mut flagged = BytesMut::from(&end_stream_ok()[..]);
        assert_eq!(
            next_message(&mut flagged, 64).unwrap_err().code,
            Code::InvalidArgument
        );
        assert!(finished(&[]).is_ok());
    }

    #[test]
    fn content_types_pick_the_form() {
        let mut h = HeaderMap::new();
        assert_eq!(form(&h), None);
        h.insert(
            header::CONTENT_TYPE,
            "application/connect+json".parse().unwrap(),
        );
        assert_eq!(form(&h), Some(Form::Stream));
        h.insert(
            header::CONTENT_TYPE,
            "application/json; charset=utf-8".parse().unwrap(),
        );
        assert_eq!(form(&h), Some(Form::Unary));
        h.insert(
            header::CONTENT_TYPE,
            "application/connect+proto".parse().unwrap(),
        );
        assert_eq!(form(&h), None);
    }
}
