//! zygote-api: the REST API of zygoted as types, shared by the daemon that serves it
//! and the clients that call it (the `zygote` CLI, the tests).
//!
//! - [`model`]: every request and response body (one module per resource, as the
//!   daemon's `api/` routes), with the validation each request passes before the
//!   daemon acts on it ([`model::Validate`], failing with [`error::RequestError`]).
//! - [`client`]: an HTTP client over `http://`, `https://` or `unix://`;
//!   [`pty_client`]: the WebSocket side of `GET /v1/sandboxes/{id}/pty`.
//! - [`defaults`]: where a local daemon listens and keeps its token.
//!
//! It knows nothing of how the daemon runs sandboxes: the CLI links this crate, not
//! the daemon.
pub mod client;
pub mod code_client;
pub mod defaults;
pub mod error;
pub mod event_stream_client;
pub mod model;
pub mod pty_client;
pub mod time;

pub use error::{ErrorBody, RequestError};
