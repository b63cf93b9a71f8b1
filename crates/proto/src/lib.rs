//! # zygote agent protocol
//!
//! How the zygote host (daemon, CLI, SDKs) talks to `zygote-agent`, the
//! process that runs inside every guest VM. This crate holds the wire format,
//! the shared request/response types and a blocking [`client::AgentClient`].
//! `PROTOCOL.md` next to this crate is the language-neutral specification;
//! this summary matches it.
//!
//! ## Transport
//! Any reliable byte stream: AF_VSOCK (guest port [`DEFAULT_VSOCK_PORT`], or a
//! hybrid-vsock Unix socket on the host after a `CONNECT <port>\n` / `OK <n>\n`
//! handshake), TCP (guest port [`DEFAULT_TCP_PORT`], e.g. through QEMU's
//! `hostfwd`), or a Unix socket (host tests).
//!
//! ## Framing
//! Each message is a 4-byte big-endian length followed by that many bytes of
//! UTF-8 JSON (one object). Both sides refuse frames longer than
//! [`MAX_FRAME_LEN`] (16 MiB). Binary data (file contents, stdin, output,
//! entropy) is standard padded base64 inside JSON strings, so one frame
//! carries at most [`MAX_DATA_CHUNK`] (8 MiB) of raw data; larger files are
//! moved in chunks.
//!
//! ## Requests and responses
//! Host → agent frames are [`RequestFrame`]s: `{"id": N, "type": "...", ...fields}`.
//! `id` is chosen by the client, non-zero and unique among the connection's
//! unfinished requests (keep it below 2^53 for JavaScript clients). Requests
//! run concurrently; every agent → host frame is a [`ResponseFrame`] carrying
//! the id it answers. A request ends with exactly one *terminal* frame; only
//! `exec`, `pty_open` and `watch` have non-terminal events before it:
//!
//! | request `type` | fields | terminal response `type` |
//! |---|---|---|
//! | `health` | — | `health` ([`HealthInfo`]) |
//! | `exec` | [`ExecRequest`] | `exec_started`, `output`*, then `exit` ([`ExecResult`]) |
//! | `kill` | [`KillRequest`] | `ok` |
//! | `pty_open` | [`PtyOpenRequest`] | `pty_started`, `output`*, then `exit` ([`ExecResult`]) |
//! | `pty_input` | [`PtyInputRequest`] | `ok` |
//! | `pty_resize` | [`PtyResizeRequest`] | `ok` |
//! | `read_file` | [`ReadFileRequest`] | `file_data` ([`FileChunk`]) |
//! | `write_file` | [`WriteFileRequest`] | `written` |
//! | `list_dir` | [`PathRequest`] | `dir_listing` |
//! | `stat` | [`StatRequest`] | `stat` ([`Metadata`]) |
//! | `rename` | [`RenameRequest`] | `ok` |
//! | `remove` | [`RemoveRequest`] | `ok` |
//! | `reidentify` | [`ReidentifyRequest`] | `reidentified` ([`ReidentifyReport`]) |
//! | `spawn` | [`ExecRequest`] | `spawned` ([`process::ProcessInfo`]) |
//! | `processes` | — | `processes` |
//! | `process_output` | [`process::ProcessOutputRequest`] | `process_output` ([`process::ProcessOutput`]) |
//! | `process_stdin` | [`process::ProcessStdinRequest`] | `ok` |
//! | `process_signal` | [`process::ProcessSignalRequest`] | `ok` |
//! | `watch` | [`watch::WatchRequest`] | `watch_started`, `watch_events`*, then `ok` (after `unwatch`) |
//! | `unwatch` | [`watch::UnwatchRequest`] | `ok` |
//! | `stats` | — | `stats` ([`stats::GuestStats`]) |
//! | `shutdown` | — | `ok`, then the VM powers off |
//!
//! Any request may instead end with `{"id": N, "type": "error", "code": ...,
//! "message": ..., "errno": ...}` ([`ErrorBody`], codes in [`ErrorCode`]).
//! Errors not attributable to a request (unparsable JSON without an id,
//! oversize frame) carry id 0. After `malformed_frame`, `unknown_request`,
//! `bad_request` the connection stays usable; after `frame_too_large` and
//! `truncated_frame` the agent closes it because the byte stream can no longer
//! be trusted to be at a frame boundary.
//!
//! File paths must be absolute. Unknown JSON fields are ignored, for forward
//! compatibility.

pub mod b64;
pub mod client;
mod error;
pub mod frame;
pub mod process;
pub mod stats;
mod types;
pub mod watch;

pub use error::{ErrorBody, ErrorCode};
pub use frame::MAX_FRAME_LEN;
pub use types::*;

/// Bumped on incompatible changes; reported by `health`.
pub const PROTOCOL_VERSION: u32 = 1;

/// Largest raw payload in one `read_file`/`write_file` frame: after base64
/// (4/3) and JSON overhead it still fits [`MAX_FRAME_LEN`].
pub const MAX_DATA_CHUNK: usize = 8 * 1024 * 1024;

/// Guest vsock port the agent listens on by default.
pub const DEFAULT_VSOCK_PORT: u32 = 1024;

/// Guest TCP port the agent listens on by default (on all addresses).
pub const DEFAULT_TCP_PORT: u16 = 10240;

/// Kernel command-line key overriding the agent's TCP port (`off` disables).
pub const CMDLINE_TCP_KEY: &str = "zygote.agent.tcp";

/// Kernel command-line key overriding the agent's vsock port (`off` disables).
pub const CMDLINE_VSOCK_KEY: &str = "zygote.agent.vsock";

/// Kernel command-line key naming a virtio-serial port the agent serves
/// (`zygote.agent.port=NAME`). Its host end is a Unix socket (a QEMU chardev)
/// that carries one connection at a time: the qemu runtime's agent channel.
pub const CMDLINE_PORT_KEY: &str = "zygote.agent.port";

/// The name of the agent's virtio-serial port.
pub const AGENT_PORT_NAME: &str = "org.zygote.agent";
