//! The client side of `GET /v1/sandboxes/{id}/pty` (the CLI's `zygote shell`, the
//! tests): the WebSocket upgrade goes through [`Client`], so http, https and unix
//! URLs and the token work as for every other request; the upgraded connection is
//! then spoken to with tungstenite.
use bytes::Bytes;
use futures_util::stream::{SplitSink, SplitStream};
use futures_util::{SinkExt, StreamExt};
use http_body_util::Full;
use hyper::header;
use hyper::upgrade::Upgraded;
use hyper_util::rt::TokioIo;
use tokio_tungstenite::tungstenite::handshake::client::generate_key;
use tokio_tungstenite::tungstenite::handshake::derive_accept_key;
use tokio_tungstenite::tungstenite::protocol::Role;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::WebSocketStream;

use crate::client::{Client, ClientError, Method};
use crate::model::{PtyClientMessage, PtyServerMessage, PTY_PROTOCOL};

type Socket = WebSocketStream<TokioIo<Upgraded>>;

/// What to run and how large the terminal is.
#[derive(Debug, Clone, Default)]
pub struct PtyOptions {
    pub cols: u16,
    pub rows: u16,
    /// Program and arguments; empty: the guest user's login shell.
    pub cmd: Vec<String>,
    pub env: Vec<(String, String)>,
    pub cwd: Option<String>,
}

impl PtyOptions {
    /// The route's query string.
    pub fn query(&self) -> String {
        let mut q = form_urlencoded::Serializer::new(String::new());
        q.append_pair("cols", &self.cols.to_string());
        q.append_pair("rows", &self.rows.to_string());
        for c in &self.cmd {
            q.append_pair("cmd", c);
        }
        for (k, v) in &self.env {
            q.append_pair("env", &format!("{k}={v}"));
        }
        if let Some(cwd) = &self.cwd {
            q.append_pair("cwd", cwd);
        }
        q.finish()
    }
}

/// One thing the terminal said.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PtyEvent {
    /// Terminal output.
    Output(Vec<u8>),
    /// The program ended; the daemon closes the socket next.
    Exit {
        exit_code: Option<i32>,
        signal: Option<i32>,
    },
    /// A refused control message (the session goes on) or a failed session.
    Error { code: String, message: String },
    /// The socket closed.
    Closed,
}

/// Opens a terminal in sandbox `id`; an HTTP error (bad size, unknown sandbox, a
/// program that cannot start) comes back as [`ClientError::Api`].
pub async fn open(
    client: &Client,
    id: &str,
    opts: &PtyOptions,
) -> Result<(PtyWriter, PtyReader), ClientError> {
    let key = generate_key();
    let path = format!("/v1/sandboxes/{id}/pty?{}", opts.query());
    let req = client
        .request(Method::GET, &path)
        .header(header::CONNECTION, "Upgrade")
        .header(header::UPGRADE, "websocket")
        .header(header::SEC_WEBSOCKET_VERSION, "13")
        .header(header::SEC_WEBSOCKET_KEY, &key)
        .header(header::SEC_WEBSOCKET_PROTOCOL, PTY_PROTOCOL)
        .body(Full::new(Bytes::new()))
        .map_err(|e| ClientError::Decode(e.to_string()))?;
    let (headers, upgraded) = client.upgrade(req).await?;
    let accept = headers
        .get(header::SEC_WEBSOCKET_ACCEPT)
        .and_then(|v| v.to_str().ok());
    if accept != Some(derive_accept_key(key.as_bytes()).as_str()) {
        return Err(ClientError::Decode(
            "the WebSocket handshake answer does not match its key".into(),
        ));
    }
    let ws = WebSocketStream::from_raw_socket(TokioIo::new(upgraded), Role::Client, None).await;
    let (sink, stream) = ws.split();
    Ok((PtyWriter(sink), PtyReader(stream)))
}

fn ws_error(e: impl std::fmt::Display) -> ClientError {
    ClientError::Decode(format!("WebSocket: {e}"))
}

/// Sends keystrokes and resizes.
pub struct PtyWriter(SplitSink<Socket, Message>);

impl PtyWriter {
    pub async fn input(&mut self, data: &[u8]) -> Result<(), ClientError> {
        let msg = Message::Binary(Bytes::copy_from_slice(data));
        self.0.send(msg).await.map_err(ws_error)
    }

    /// Asks for a new size (the daemon answers a bad one with an error event).
    pub async fn resize(&mut self, cols: u16, rows: u16) -> Result<(), ClientError> {
        let msg = serde_json::to_string(&PtyClientMessage::Resize { cols, rows })
            .expect("control messages serialize");
        self.send_text(msg).await
    }

    /// A raw text message (for tests of the daemon's checks).
    pub async fn send_text(&mut self, text: String) -> Result<(), ClientError> {
        self.0
            .send(Message::Text(text.into()))
            .await
            .map_err(ws_error)
    }

    /// Close the socket: the program is killed.
    pub async fn close(mut self) -> Result<(), ClientError> {
        self.0.close().await.map_err(ws_error)
    }
}

/// Receives the terminal's output and control messages.
pub struct PtyReader(SplitStream<Socket>);

impl PtyReader {
    pub async fn next(&mut self) -> Result<PtyEvent, ClientError> {
        loop {
            let msg = match self.0.next().await {
                None => return Ok(PtyEvent::Closed),
                Some(m) => m.map_err(ws_error)?,
            };
            return Ok(match msg {
                Message::Binary(data) => PtyEvent::Output(data.to_vec()),
                Message::Text(t) => match serde_json::from_str(t.as_str()) {
                    Ok(PtyServerMessage::Exit { exit_code, signal }) => {
                        PtyEvent::Exit { exit_code, signal }
                    }
                    Ok(PtyServerMessage::Error { code, message }) => {
                        PtyEvent::Error { code, message }
                    }
                    Err(e) => return Err(ClientError::Decode(format!("control message: {e}"))),
                },
                Message::Close(_) => PtyEvent::Closed,
                _ => continue, // ping/pong
            });
        }
    }
}
