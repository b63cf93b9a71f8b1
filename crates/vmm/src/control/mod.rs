//! Control of one VMM process over a Unix socket: JSON lines, one request per line, one
//! reply per request. A supervisor (the daemon's kvm runtime, tests) starts
//! `zygote vm serve --api-sock PATH ...` and drives the VM through it: status,
//! pause/resume, branch (each child serves its own socket), snapshot, memory access for
//! probe guests, stop. See `CONTROL.md` in this crate for the wire format.
pub mod checks;
pub mod client;
pub mod conn;
pub mod protocol;
pub mod server;
mod warm;

pub use client::ControlClient;
pub use protocol::{Reply, Request};
