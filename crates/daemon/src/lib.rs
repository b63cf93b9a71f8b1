//! zygoted: the zygote daemon.
//!
//! A REST API (under `/v1`, described by `/v1/openapi.json`) over sandbox
//! lifecycles on one of two runtimes: `qemu` (QEMU microvm; branch by
//! migrating state to a file and starting children from it on qcow2
//! overlays) or `kvm` (zygote's VMM; fork-based branch). State lives in
//! SQLite so a restarted daemon re-attaches to its VMs; each VM is a
//! supervised process in its own cgroup. [`client`] is the matching HTTP
//! client used by the CLI and the tests.
pub mod agent_key;
pub mod api;
pub mod cgroup;
pub mod client;
pub mod db;
pub mod error;
pub mod fault;
pub mod manager;
pub mod metrics;
pub mod model;
pub mod network;
pub mod procs;
pub mod proxy;
pub mod pty_client;
pub mod runtime;
pub mod server;

pub use error::{Error, Result};
pub use server::{serve, ServeArgs};
