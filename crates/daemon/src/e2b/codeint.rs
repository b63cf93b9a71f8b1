//! E2B's code interpreter server (port 49999 of template `code-interpreter-v1`), served
//! by the daemon on top of the native code interpreter (`manager/code.rs`).
//!
//! The unchanged `e2b-code-interpreter` SDK (PyPI 2.11.x) calls, at `E2B_SANDBOX_URL`
//! with the routing headers `E2b-Sandbox-Id` and `E2b-Sandbox-Port: 49999`
//! (W2:e2b_code_interpreter/code_interpreter_sync.py):
//! - `POST /execute` `{code, context_id, language, env_vars}` with `X-Access-Token`,
//!   answered with JSON lines: `{"type":"stdout"|"stderr","text","timestamp"}` (Unix
//!   nanoseconds), `{"type":"result", "text"|"html"|"markdown"|"svg"|"png"|"jpeg"|
//!   "pdf"|"latex"|"json"|"javascript": ..., "is_main_result"}`, `{"type":"error",
//!   "name","value","traceback"}` (the traceback one string), `{"type":
//!   "number_of_executions","execution_count"}`, then `{"type":"end_of_execution"}`
//!   (W2:models.py `_parse_output`). Its `timeout` is the client's: when it gives up it
//!   closes the connection, which interrupts the kernel here as natively. `env_vars`
//!   (the SDK's `envs=`) must map names to strings; they become the native request's
//!   `envs` (set for that execution only, then restored) with the native bounds.
//! - `POST /contexts` `{language?, cwd?}` -> `{id, language, cwd}`; `GET /contexts` ->
//!   a list of those; `DELETE /contexts/{id}`; `POST /contexts/{id}/restart`. The SDK
//!   sends no access token on these four (it does on `/execute`), so a missing token is
//!   accepted there and a wrong one is not: they cannot run code, and the proxy answers
//!   only on the daemon's own address.
//!
//! Errors are plain text with E2B's statuses as the SDK maps them (W2:models.py
//! `format_exception`): 404 an unknown context (NotFoundException), 400 bad input.
use std::collections::BTreeMap;
use std::sync::Arc;

use axum::extract::Request;
use axum::http::{header, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::{json, Map, Value};
use tokio_stream::wrappers::ReceiverStream;
use tokio_stream::StreamExt;

use crate::error::Error;
use crate::manager::{ContextOp, Manager};
use crate::model::{
    CodeContext, CodeEvent, CodeRequest, CreateContextRequest, MAX_EXEC_TIMEOUT_MS,
    MAX_JSON_BODY_BYTES,
};

/// The port E2B's code interpreter SDKs address.
pub const CODE_INTERPRETER_PORT: u16 = 49999;

/// Whether the request carried the sandbox's envd token.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Token {
    Valid,
    Absent,
}

/// `POST /execute`'s body (W2: `json={"code", "context_id", "language", "env_vars"}`).
#[derive(Debug, Default, Deserialize)]
struct ExecuteBody {
    code: String,
    #[serde(default)]
    context_id: Option<String>,
    #[serde(default)]
    language: Option<String>,
    #[serde(default)]
    env_vars: Option<Map<String, Value>>,
}

#[derive(Debug, Default, Deserialize)]
struct ContextBody {
    #[serde(default)]
    language: Option<String>,
    #[serde(default)]
    cwd: Option<String>,
}

fn text(status: StatusCode, message: impl Into<String>) -> Response {
    (
        status,
        [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
        message.into(),
    )
        .into_response()
}

/// A native error in E2B's form: its status, its message as text.
fn failed(e: &Error) -> Response {
    text(e.status_code().0, e.to_string())
}

/// Serves one request for the code interpreter port of sandbox `id`.
pub async fn serve(manager: &Arc<Manager>, id: &str, token: Token, req: Request) -> Response {
    let method = req.method().clone();
    let path = req.uri().path().to_string();
    let segments: Vec<&str> = path.trim_matches('/').split('/').collect();
    let context_route = segments.first() == Some(&"contexts");
    if token == Token::Absent && !context_route && path != "/health" {
        return text(StatusCode::UNAUTHORIZED, "Unauthorized");
    }
    match (method, segments.as_slice()) {
        (Method::GET, ["health"]) => StatusCode::NO_CONTENT.into_response(),
        (Method::POST, ["execute"]) => match body::<ExecuteBody>(req).await {
            Ok(b) => execute(manager, id, b).await,
            Err(r) => r,
        },
        (Method::GET, ["contexts"]) => match manager.code_contexts(id).await {
            Ok(list) => {
                axum::Json(list.iter().map(context_json).collect::<Vec<_>>()).into_response()
            }
            Err(e) => failed(&e),
        },
        (Method::POST, ["contexts"]) => {
            let b = match body::<ContextBody>(req).await {
                Ok(b) => b,
                Err(r) => return r,
            };
            let native = CreateContextRequest {
                language: b.language,
                cwd: b.cwd,
            };
            match manager.create_code_context(id, native).await {
                Ok(ctx) => axum::Json(context_json(&ctx)).into_response(),
                Err(e) => failed(&e),
            }
        }
        (Method::DELETE, ["contexts", ctx]) => {
            context_op(manager, id, ctx, ContextOp::Delete).await
        }
        (Method::POST, ["contexts", ctx, "restart"]) => {
            context_op(manager, id, ctx, ContextOp::Restart).await
        }
        _ => text(StatusCode::NOT_FOUND, "Not Found"),
    }
}

async fn body<T: serde::de::DeserializeOwned + Default>(req: Request) -> Result<T, Response> {
    let (_, bytes) = crate::api::read_body(req, MAX_JSON_BODY_BYTES, "a code request")
        .await
        .map_err(|e| failed(&e))?;
    if bytes.is_empty() {
        return Ok(T::default());
    }
    serde_json::from_slice(&bytes)
        .map_err(|e| text(StatusCode::BAD_REQUEST, format!("malformed JSON body: {e}")))
}

fn context_json(ctx: &CodeContext) -> Value {
    json!({"id": ctx.id, "language": ctx.language, "cwd": ctx.cwd})
}

async fn context_op(manager: &Arc<Manager>, id: &str, ctx: &str, op: ContextOp) -> Response {
    match manager.code_context_op(id, ctx, op).await {
        Ok(()) => StatusCode::NO_CONTENT.into_response(),
        Err(e) => failed(&e),
    }
}

/// `env_vars` as the native `envs`: every value must be a string (else why not).
fn env_vars(vars: Option<Map<String, Value>>) -> Result<Option<BTreeMap<String, String>>, String> {
    let Some(vars) = vars.filter(|v| !v.is_empty()) else {
        return Ok(None);
    };
    vars.into_iter()
        .map(|(k, v)| match v {
            Value::String(s) => Ok((k, s)),
            other => Err(format!(
                "env_vars: the value of {:?} is {}, not a string",
                k.chars().take(80).collect::<String>(),
                json_kind(&other)
            )),
        })
        .collect::<Result<_, _>>()
        .map(Some)
}

fn json_kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

async fn execute(manager: &Arc<Manager>, id: &str, b: ExecuteBody) -> Response {
    let envs = match env_vars(b.env_vars) {
        Ok(envs) => envs,
        Err(why) => return text(StatusCode::BAD_REQUEST, why),
    };
    let req = CodeRequest {
        code: b.code,
        language: b.language,
        context: b.context_id,
        // The SDK's own timeout ends the request; the kernel is interrupted then.
        timeout_ms: Some(MAX_EXEC_TIMEOUT_MS),
        envs,
    };
    let events = match manager.run_code(id, req).await {
        Ok(events) => events,
        Err(e) => return failed(&e),
    };
    let lines = ReceiverStream::new(events).map(|event| {
        let mut out = String::new();
        for line in e2b_lines(event) {
            out.push_str(&line.to_string());
            out.push('\n');
        }
        Ok::<_, std::convert::Infallible>(bytes::Bytes::from(out))
    });
    (
        [(header::CONTENT_TYPE, "application/x-ndjson")],
        axum::body::Body::from_stream(lines),
    )
        .into_response()
}

/// E2B's name of a result's mime type.
fn e2b_key(mime: &str) -> Option<&'static str> {
    Some(match mime {
        "text/plain" => "text",
        "text/html" => "html",
        "text/markdown" => "markdown",
        "text/latex" => "latex",
        "image/png" => "png",
        "image/jpeg" => "jpeg",
        "image/svg+xml" => "svg",
        "application/json" => "json",
        "application/javascript" => "javascript",
        "application/pdf" => "pdf",
        _ => return None,
    })
}

fn now_ns() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos())
}

/// A native event as E2B's lines.
fn e2b_lines(event: CodeEvent) -> Vec<Value> {
    match event {
        CodeEvent::Stdout { text } => {
            vec![json!({"type": "stdout", "text": text, "timestamp": now_ns() as u64})]
        }
        CodeEvent::Stderr { text } => {
            vec![json!({"type": "stderr", "text": text, "timestamp": now_ns() as u64})]
        }
        CodeEvent::Result { main, data } => {
            let mut out = Map::new();
            out.insert("type".into(), "result".into());
            for (mime, value) in data {
                if let Some(key) = e2b_key(&mime) {
                    out.insert(key.into(), value);
                }
            }
            out.insert("is_main_result".into(), main.into());
            vec![Value::Object(out)]
        }
        CodeEvent::Error {
            name,
            value,
            traceback,
        } => vec![json!({"type": "error", "name": name, "value": value,
                         "traceback": traceback.join("\n")})],
        CodeEvent::Done { execution_count } => vec![
            json!({"type": "number_of_executions", "execution_count": execution_count}),
            json!({"type": "end_of_execution"}),
        ],
        // The stream broke after it started: the SDK shows it as the cell's error.
        CodeEvent::Failure { code, message } => vec![
            json!({"type": "error", "name": "SandboxError", "value": format!("{message} ({code})"),
                   "traceback": ""}),
            json!({"type": "end_of_execution"}),
        ],
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn env_vars_must_be_strings() {
        let map = |v: Value| v.as_object().cloned();
        assert_eq!(env_vars(None).unwrap(), None);
        assert_eq!(env_vars(map(json!({}))).unwrap(), None);
        let got = env_vars(map(json!({"A": "1", "B": ""}))).unwrap().unwrap();
        assert_eq!(got["A"], "1");
        assert_eq!(got["B"], "");
        for (bad, kind) in [
            (json!({"A": 1}), "a number"),
            (json!({"A": null}), "null"),
            (json!({"A": ["x"]}), "an array"),
        ] {
            let why = env_vars(map(bad)).unwrap_err();
            assert_eq!(
                why,
                format!("env_vars: the value of \"A\" is {kind}, not a string")
            );
        }
    }

    #[test]
    fn native_events_become_e2b_lines() {
        let mut data = BTreeMap::new();
        data.insert("text/plain".to_string(), Value::from("2"));
        data.insert("image/png".to_string(), Value::from("iVBO"));
        let lines = e2b_lines(CodeEvent::Result { main: true, data });
        assert_eq!(
            lines,
            [json!({"type": "result", "text": "2", "png": "iVBO", "is_main_result": true})]
        );
        let err = e2b_lines(CodeEvent::Error {
            name: "E".into(),
            value: "v".into(),
            traceback: vec!["a".into(), "b".into()],
        });
        assert_eq!(err[0]["traceback"], "a\nb");
        let done = e2b_lines(CodeEvent::Done { execution_count: 4 });
        assert_eq!(done[0]["execution_count"], 4);
        assert_eq!(done[1]["type"], "end_of_execution");
        let out = e2b_lines(CodeEvent::Stdout { text: "x".into() });
        assert!(out[0]["timestamp"].as_u64().unwrap() > 1_600_000_000_000_000_000);
    }
}
