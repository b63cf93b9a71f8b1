//! What the guest's code server says, checked line by line before anything of it reaches
//! a client.
//!
//! The server (`zygote_codeint.py` in image `code-interpreter`) answers with JSON lines
//! on the relay's stdout, which the agent hands over in chunks of any size. A sandbox is
//! hostile code, so every line is bounded ([`MAX_LINE_BYTES`]), must be one JSON object
//! of a known type with exactly its fields ([`GuestLine`], unknown fields refused), and
//! results are rebuilt: only known mime types are kept, each with the JSON type it must
//! have, and PNG/JPEG images are base64-decoded and their signatures (and for PNG the
//! IHDR header) checked, so a client saving "a PNG" gets one. A line that breaks these
//! rules ends the stream as a protocol error; an image that fails its check is dropped
//! from its result (the rest of the result stays).
use std::collections::BTreeMap;

use serde::Deserialize;
use serde_json::Value;
use zygote_api::model::{CodeContext, CodeEvent, RESULT_MIME_TYPES};
use zygote_proto::b64;

/// Longest line accepted: a result with a large figure fits, a runaway one does not.
pub const MAX_LINE_BYTES: usize = 16 << 20;
/// Most traceback entries kept from one error.
const MAX_TRACEBACK: usize = 1000;
/// Most characters of a guest-written message put into an API error.
const MAX_MESSAGE_CHARS: usize = 500;
const PNG_SIGNATURE: [u8; 8] = [0x89, b'P', b'N', b'G', 0x0d, 0x0a, 0x1a, 0x0a];

/// Why the code server's output was refused (the guest's fault: a 502).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WireError {
    #[error("the code server sent a line over {MAX_LINE_BYTES} bytes")]
    LineTooLong,
    #[error("the code server sent an invalid line: {0}")]
    Invalid(String),
    #[error("the code server's answer ended early: {0}")]
    Truncated(String),
}

/// One line of the server's answer, as it must look.
#[derive(Debug, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
enum RawLine {
    Started {
        /// The server applies the request's `envs` (servers older than them never say so).
        #[serde(default)]
        envs: bool,
    },
    Stdout {
        text: String,
    },
    Stderr {
        text: String,
    },
    Result {
        main: bool,
        data: serde_json::Map<String, Value>,
    },
    Error {
        name: String,
        value: String,
        traceback: Vec<String>,
    },
    Done {
        execution_count: u64,
    },
    Contexts {
        contexts: Vec<RawContext>,
    },
    Context {
        id: String,
        language: String,
        cwd: String,
    },
    Ok,
    Failure {
        code: String,
        message: String,
    },
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawContext {
    id: String,
    language: String,
    cwd: String,
}

/// A checked line.
#[derive(Debug, Clone, PartialEq)]
pub enum GuestLine {
    /// The context exists and its kernel runs: the execution's events follow. `envs`:
    /// the server said it applies the request's envs.
    Started {
        envs: bool,
    },
    Event(CodeEvent),
    Contexts(Vec<CodeContext>),
    Context(CodeContext),
    Ok,
    /// The server refused the request (`code` is one of its known codes, else
    /// `internal`; the message is cut to a bounded length).
    Failure {
        code: FailureCode,
        message: String,
    },
}

/// The server's reasons for refusing a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FailureCode {
    UnknownContext,
    BadRequest,
    LimitReached,
    KernelFailed,
    Internal,
}

fn bounded(text: &str) -> String {
    let mut out: String = text
        .chars()
        .filter(|c| !c.is_control() || *c == '\n')
        .take(MAX_MESSAGE_CHARS)
        .collect();
    if text.chars().count() > MAX_MESSAGE_CHARS {
        out.push('…');
    }
    out
}

fn context(id: String, language: String, cwd: String) -> Result<CodeContext, WireError> {
    zygote_api::model::validate_context_id(&id)
        .map_err(|_| WireError::Invalid(format!("context id {:?}", bounded(&id))))?;
    Ok(CodeContext {
        id,
        language: bounded(&language),
        cwd: bounded(&cwd),
    })
}

/// Checks one line (without its newline).
pub fn parse_line(line: &[u8]) -> Result<GuestLine, WireError> {
    if line.len() > MAX_LINE_BYTES {
        return Err(WireError::LineTooLong);
    }
    let raw: RawLine =
        serde_json::from_slice(line).map_err(|e| WireError::Invalid(e.to_string()))?;
    Ok(match raw {
        RawLine::Started { envs } => GuestLine::Started { envs },
        RawLine::Stdout { text } => GuestLine::Event(CodeEvent::Stdout { text }),
        RawLine::Stderr { text } => GuestLine::Event(CodeEvent::Stderr { text }),
        RawLine::Result { main, data } => GuestLine::Event(CodeEvent::Result {
            main,
            data: checked_bundle(data),
        }),
        RawLine::Error {
            name,
            value,
            mut traceback,
        } => {
            traceback.truncate(MAX_TRACEBACK);
            GuestLine::Event(CodeEvent::Error {
                name,
                value,
                traceback,
            })
        }
        RawLine::Done { execution_count } => GuestLine::Event(CodeEvent::Done { execution_count }),
        RawLine::Contexts { contexts } => GuestLine::Contexts(
            contexts
                .into_iter()
                .map(|c| context(c.id, c.language, c.cwd))
                .collect::<Result<_, _>>()?,
        ),
        RawLine::Context { id, language, cwd } => GuestLine::Context(context(id, language, cwd)?),
        RawLine::Ok => GuestLine::Ok,
        RawLine::Failure { code, message } => GuestLine::Failure {
            code: match code.as_str() {
                "unknown_context" => FailureCode::UnknownContext,
                "bad_request" => FailureCode::BadRequest,
                "limit_reached" => FailureCode::LimitReached,
                "kernel_failed" => FailureCode::KernelFailed,
                _ => FailureCode::Internal,
            },
            message: bounded(&message),
        },
    })
}

/// A result's mime bundle with only what a client can trust: known types, each value
/// of its type, images that are what they claim.
fn checked_bundle(data: serde_json::Map<String, Value>) -> BTreeMap<String, Value> {
    let mut out = BTreeMap::new();
    for (mime, value) in data {
        if !RESULT_MIME_TYPES.contains(&mime.as_str()) {
            continue;
        }
        let kept = match (mime.as_str(), value) {
            ("application/json", v) => Some(v),
            ("image/png", Value::String(s)) => checked_image(&s, is_png).map(Value::String),
            ("image/jpeg", Value::String(s)) => checked_image(&s, is_jpeg).map(Value::String),
            ("application/pdf", Value::String(s)) => {
                checked_image(&s, |b| b.starts_with(b"%PDF-")).map(Value::String)
            }
            (_, Value::String(s)) => Some(Value::String(s)),
            _ => None,
        };
        if let Some(v) = kept {
            out.insert(mime, v);
        } else {
            tracing::debug!("code server: dropped a {mime} value that failed its check");
        }
    }
    out
}

/// Canonical base64 of `text` (Jupyter may wrap base64 in lines) if it decodes and
/// `check` accepts the bytes.
fn checked_image(text: &str, check: fn(&[u8]) -> bool) -> Option<String> {
    let compact: String = text.chars().filter(|c| !c.is_ascii_whitespace()).collect();
    let bytes = b64::decode(&compact).ok()?;
    check(&bytes).then_some(compact)
}

/// A PNG signature followed by an IHDR chunk of 13 bytes with a non-zero size.
pub fn is_png(b: &[u8]) -> bool {
    if b.len() < 33 || b[..8] != PNG_SIGNATURE || &b[12..16] != b"IHDR" {
        return false;
    }
    let be = |i: usize| u32::from_be_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
    be(8) == 13 && be(16) > 0 && be(20) > 0
}

fn is_jpeg(b: &[u8]) -> bool {
    b.len() > 3 && b[..3] == [0xff, 0xd8, 0xff]
}

/// Splits the relay's stdout into lines as chunks arrive, refusing an over-long one
/// before it is buffered whole.
#[derive(Default)]
pub struct LineSplitter {
    pending: Vec<u8>,
}

impl LineSplitter {
    /// The complete lines `chunk` finishes.
    pub fn push(&mut self, chunk: &[u8]) -> Result<Vec<Vec<u8>>, WireError> {
        let mut lines = Vec::new();
        let mut rest = chunk;
        while let Some(i) = rest.iter().position(|&b| b == b'\n') {
            self.pending.extend_from_slice(&rest[..i]);
            if self.pending.len() > MAX_LINE_BYTES {
                return Err(WireError::LineTooLong);
            }
            lines.push(std::mem::take(&mut self.pending));
            rest = &rest[i + 1..];
        }
        if self.pending.len() + rest.len() > MAX_LINE_BYTES {
            return Err(WireError::LineTooLong);
        }
        self.pending.extend_from_slice(rest);
        Ok(lines)
    }

    /// Bytes after the last newline (a line the server never finished).
    pub fn leftover(&self) -> usize {
        self.pending.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn png() -> Vec<u8> {
        let mut b = PNG_SIGNATURE.to_vec();
        b.extend_from_slice(&13u32.to_be_bytes());
        b.extend_from_slice(b"IHDR");
        b.extend_from_slice(&10u32.to_be_bytes());
        b.extend_from_slice(&20u32.to_be_bytes());
        b.extend_from_slice(&[8, 6, 0, 0, 0, 0, 0, 0, 0]);
        b
    }

    #[test]
    fn known_lines_parse_and_unknown_ones_are_refused() {
        assert_eq!(
            parse_line(br#"{"type":"started"}"#),
            Ok(GuestLine::Started { envs: false })
        );
        assert_eq!(
            parse_line(br#"{"type":"started","envs":true}"#),
            Ok(GuestLine::Started { envs: true })
        );
        assert_eq!(
            parse_line(br#"{"type":"done","execution_count":7}"#),
            Ok(GuestLine::Event(CodeEvent::Done { execution_count: 7 }))
        );
        for bad in [
            &br#"{"type":"shell","cmd":"rm"}"#[..],
            br#"{"type":"done","execution_count":-1}"#,
            br#"{"type":"stdout","text":"x","extra":1}"#,
            br#"{"type":"started","envs":"yes"}"#,
            br#"[1,2]"#,
            b"not json",
            br#"{"type":"context","id":"../etc","language":"python","cwd":"/"}"#,
        ] {
            assert!(parse_line(bad).is_err(), "{}", String::from_utf8_lossy(bad));
        }
        let failure = parse_line(br#"{"type":"failure","code":"whatever","message":"m"}"#);
        assert!(matches!(
            failure,
            Ok(GuestLine::Failure {
                code: FailureCode::Internal,
                ..
            })
        ));
    }

    #[test]
    fn results_keep_only_checked_values() {
        let good = b64::encode(&png());
        let wrapped = format!("{}\n{}", &good[..10], &good[10..]);
        let line = serde_json::json!({"type": "result", "main": false, "data": {
            "text/plain": "fig", "image/png": wrapped, "image/jpeg": b64::encode(b"GIF89a"),
            "application/x-evil": "x", "text/html": 5, "application/json": {"a": [1]}}});
        let GuestLine::Event(CodeEvent::Result { data, .. }) =
            parse_line(line.to_string().as_bytes()).unwrap()
        else {
            panic!("not a result")
        };
        let keys: Vec<&str> = data.keys().map(String::as_str).collect();
        assert_eq!(keys, ["application/json", "image/png", "text/plain"]);
        assert_eq!(data["image/png"], Value::String(good));
        let mut truncated = png();
        truncated.truncate(20);
        assert!(!is_png(&truncated));
    }

    #[test]
    fn splitter_bounds_lines() {
        let mut s = LineSplitter::default();
        assert_eq!(s.push(b"ab").unwrap(), Vec::<Vec<u8>>::new());
        assert_eq!(
            s.push(b"c\nd\ne").unwrap(),
            vec![b"abc".to_vec(), b"d".to_vec()]
        );
        assert_eq!(s.leftover(), 1);
        let mut s = LineSplitter::default();
        let big = vec![b'x'; MAX_LINE_BYTES + 1];
        assert_eq!(s.push(&big), Err(WireError::LineTooLong));
    }
}
