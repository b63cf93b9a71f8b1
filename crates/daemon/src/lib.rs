//! zygoted: the zygote daemon.
//!
//! A REST API (under `/v1`, described by `/v1/openapi.json`) over sandbox
//! lifecycles on one of two runtimes: `qemu` (QEMU microvm; branch by
//! migrating state to a file and starting children from it on qcow2
//! overlays) or `kvm` (zygote's VMM; fork-based branch). State lives in
//! SQLite so a restarted daemon re-attaches to its VMs; each VM is a
//! supervised process in its own cgroup.
//!
//! The API's types and its clients are the `zygote-api` crate (the CLI links that,
//! not this one), sandbox networking the `zygote-net` crate; both are re-exported
//! here under their old names ([`model`], [`client`], [`network`]).
pub mod agent_key;
pub mod api;
pub mod cgroup;
pub mod db;
pub mod e2b;
pub mod egress_log;
pub mod error;
pub mod event_log;
pub mod event_stream;
pub mod fault;
pub mod ids;
pub mod lifecycle;
pub mod manager;
pub mod metrics;
pub mod pack_format;
pub mod procs;
pub mod proxy;
pub mod runtime;
pub mod server;
pub mod token;
pub mod ui;

pub use zygote_api::{client, model, pty_client};
pub use zygote_net as network;

pub use error::{Error, Result};
pub use server::{serve, ServeArgs};
