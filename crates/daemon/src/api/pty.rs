//! `GET /v1/sandboxes/{id}/pty`: an interactive terminal over a WebSocket.
//!
//! The request is checked and the program started *before* the upgrade, so a bad
//! query, an unknown or stopped sandbox, or a program that cannot start is an
//! ordinary HTTP error; only a running program gets a `101`. Then binary messages
//! carry raw terminal bytes both ways and text messages carry JSON control
//! ([`PtyClientMessage`] in, [`PtyServerMessage`] out). When the program ends the
//! daemon sends `exit` and closes the socket; when the client goes away the program
//! (and its session in the guest) is killed.
//!
//! Authentication: the bearer token in `Authorization` as on every route. Browsers
//! cannot set that header on a WebSocket, so an upgrade request to this route (and
//! no other: [`super::auth`]) may instead offer the token as a subprotocol,
//! `Sec-WebSocket-Protocol: zygote.pty.v1, zygote.bearer.<token>` (the scheme
//! Kubernetes uses for the same problem). Unlike a `?token=` query parameter it does
//! not end up in URLs, proxy logs or browser history; the daemon only ever selects
//! `zygote.pty.v1`, never echoes the token.
use axum::extract::ws::{CloseFrame, Message, WebSocket, WebSocketUpgrade};
use axum::extract::{Path, RawQuery, State};
use axum::response::Response;

use super::AppState;
use crate::error::{Error, ErrorBody, Result};
use crate::manager::{PtyInput, PtyOutput, PtySession};
use crate::model::{check_pty_size, PtyClientMessage, PtyQuery, PtyServerMessage, PTY_PROTOCOL};

/// Largest WebSocket message taken from a client (keystrokes are tiny; a paste is
/// forwarded in pieces).
const MAX_MESSAGE: usize = 1 << 20;

#[utoipa::path(get, path = "/v1/sandboxes/{id}/pty", tag = "exec",
    params(("id" = String, Path, description = "Sandbox id"),
           ("cols" = u16, Query, minimum = 1, maximum = 1000, description = "Terminal width"),
           ("rows" = u16, Query, minimum = 1, maximum = 1000, description = "Terminal height"),
           ("cmd" = Option<Vec<String>>, Query, explode = true,
            description = "Program and arguments, one per `cmd` in order (default: the guest \
                           user's login shell, `-l`)"),
           ("env" = Option<Vec<String>>, Query, explode = true,
            description = "`KEY=VALUE`, repeatable; over the sandbox's envs and secrets. \
                           TERM defaults to xterm-256color"),
           ("cwd" = Option<String>, Query, pattern = "^/[^\\u0000]*$",
            description = "Working directory (default: the user's home)")),
    responses((status = 101, description = "WebSocket (subprotocol zygote.pty.v1). Binary \
                messages: raw terminal bytes both ways. Text messages: JSON control; client → \
                daemon `{\"type\":\"resize\",\"cols\":C,\"rows\":R}`, daemon → client \
                `{\"type\":\"error\",\"code\",\"message\"}` (a refused control message: nothing \
                changed, the session goes on) and, when the program ends, \
                `{\"type\":\"exit\",\"exit_code\":N,\"signal\":S}` followed by a close. The \
                program (and its session) is killed when the client disconnects. Browsers, \
                which cannot set Authorization on a WebSocket, may offer the token as the \
                subprotocol `zygote.bearer.<token>` next to `zygote.pty.v1`.",
                body = PtyServerMessage),
              (status = 400, description = "Bad cols/rows/cmd/env/cwd, an unknown parameter, or \
                not a WebSocket upgrade request", body = ErrorBody),
              (status = 404, description = "No such sandbox", body = ErrorBody),
              (status = 409, description = "Sandbox not running", body = ErrorBody),
              (status = 422, description = "The program could not start (guest_spawn_failed)", body = ErrorBody),
              (status = 429, description = "The guest has as many terminals open as it may (256, or \
                its agent's file descriptors would run short): guest_limit_reached", body = ErrorBody),
              (status = 502, description = "The sandbox's agent cannot be reached \
                (agent_unreachable) or sent a malformed reply (agent_malformed_reply)", body = ErrorBody)))]
pub async fn pty(
    State(st): State<AppState>,
    Path(id): Path<String>,
    RawQuery(query): RawQuery,
    ws: std::result::Result<
        WebSocketUpgrade,
        axum::extract::ws::rejection::WebSocketUpgradeRejection,
    >,
) -> Result<Response> {
    let q = PtyQuery::parse(query.as_deref())?;
    let ws = ws.map_err(|e| {
        Error::invalid(format!(
            "this route needs a WebSocket upgrade request ({})",
            e.body_text()
        ))
    })?;
    let session = st.manager.pty_open(&id, q).await?;
    tracing::info!(sandbox = %id, pid = session.pid, "pty opened");
    Ok(ws
        .protocols([PTY_PROTOCOL])
        .max_message_size(MAX_MESSAGE)
        .max_frame_size(MAX_MESSAGE)
        // If the upgrade fails the session is dropped unused, which kills the program.
        .on_upgrade(move |socket| bridge(socket, session)))
}

fn text(m: &PtyServerMessage) -> Message {
    Message::Text(
        serde_json::to_string(m)
            .expect("control messages serialize")
            .into(),
    )
}

fn close(code: u16, reason: &'static str) -> Message {
    Message::Close(Some(CloseFrame {
        code,
        reason: reason.into(),
    }))
}

/// A refused control message as the client sees it.
fn refusal(e: &Error) -> Message {
    let body = e.body();
    text(&PtyServerMessage::Error {
        code: body.error.code,
        message: body.error.message,
    })
}

/// Moves bytes and control messages between the socket and the session until the
/// program ends or the client leaves.
async fn bridge(mut socket: WebSocket, mut session: PtySession) {
    loop {
        tokio::select! {
            out = session.output.recv() => {
                let (last, code, reason) = match out {
                    Some(PtyOutput::Data(data)) => {
                        if socket.send(Message::Binary(data.into())).await.is_err() {
                            return;
                        }
                        continue;
                    }
                    Some(PtyOutput::Exit { exit_code, signal }) => {
                        (text(&PtyServerMessage::Exit { exit_code, signal }), 1000, "exited")
                    }
                    Some(PtyOutput::Failed(e)) => (refusal(&e), 1011, "session failed"),
                    None => (refusal(&Error::Internal("pty output ended early".into())), 1011, "session failed"),
                };
                let _ = socket.send(last).await;
                let _ = socket.send(close(code, reason)).await;
                return;
            }
            msg = socket.recv() => {
                let input = match msg {
                    None | Some(Err(_)) | Some(Ok(Message::Close(_))) => return,
                    Some(Ok(Message::Binary(data))) => PtyInput::Data(data.to_vec()),
                    Some(Ok(Message::Text(t))) => match control(t.as_str()) {
                        Ok(input) => input,
                        Err(e) => {
                            if socket.send(refusal(&e)).await.is_err() {
                                return;
                            }
                            continue;
                        }
                    },
                    Some(Ok(_)) => continue, // ping/pong: answered by the library
                };
                // Fails only once the program has ended: its exit is on the way.
                let _ = session.input.send(input).await;
            }
        }
    }
}

/// A client's text message as input for the session, or why it is refused.
fn control(text: &str) -> Result<PtyInput> {
    let msg: PtyClientMessage = serde_json::from_str(text).map_err(|e| {
        Error::invalid(format!(
            "control messages are {{\"type\":\"resize\",\"cols\":C,\"rows\":R}}: {e}"
        ))
    })?;
    match msg {
        PtyClientMessage::Resize { cols, rows } => {
            check_pty_size(cols, rows)?;
            Ok(PtyInput::Resize { cols, rows })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn control_messages_are_checked() {
        assert!(matches!(
            control(r#"{"type":"resize","cols":100,"rows":40}"#),
            Ok(PtyInput::Resize {
                cols: 100,
                rows: 40
            })
        ));
        for bad in [
            r#"{"type":"resize","cols":0,"rows":40}"#,
            r#"{"type":"resize","cols":100,"rows":1001}"#,
            r#"{"type":"resize","cols":-1,"rows":1}"#,
            r#"{"type":"resize"}"#,
            r#"{"type":"other"}"#,
            "not json",
        ] {
            assert!(control(bad).is_err(), "{bad}");
        }
    }
}
