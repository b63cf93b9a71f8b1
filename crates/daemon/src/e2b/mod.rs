//! E2B compatibility: zygote answers E2B's SDKs, unchanged, as their control plane and
//! as the `envd` daemon inside each sandbox.
//!
//! Two faces, one per listener:
//! - [`control`]: E2B's REST API (`POST /v2/sandboxes`, `GET|DELETE /sandboxes/{id}`,
//!   `POST /v2/sandboxes/{id}/connect`) mounted under `/e2b` on the API listener, so
//!   `E2B_API_URL=http://127.0.0.1:<api port>/e2b`. Its credential is E2B's
//!   `X-API-Key` header, equal to the daemon token.
//! - [`envd`]: E2B's in-sandbox daemon (Connect RPC `process.Process/*`, `/files`,
//!   `/health`), served by the daemon itself on the port proxy for requests that carry
//!   E2B's routing headers (`E2b-Sandbox-Id`, `E2b-Sandbox-Port: 49983`), so
//!   `E2B_SANDBOX_URL=http://127.0.0.1:<proxy port>`. Each call becomes a call of the
//!   sandbox's agent through the [`Manager`](crate::manager::Manager): nothing of E2B's
//!   runs in a guest, and no credential is handed to one.
//!
//! Sandbox ids are zygote's: a sandbox answers on both APIs. E2B's per-sandbox
//! `envdAccessToken` is [`EnvdKeys::access_token`], an HMAC of the sandbox id keyed by
//! the daemon token: no table holds secrets, a daemon restart keeps every token valid,
//! and sandbox A's token never opens sandbox B. The token is checked on every envd
//! request except `/health` and never forwarded into a guest.
//!
//! Wire facts (with their sources in E2B's SDKs and specs) and the plan: `DESIGN.md`.
pub mod codeint;
pub mod control;
pub mod envd;
mod model;
pub(crate) mod time;

use std::sync::Arc;

use hmac::{Hmac, Mac};
use sha2::Sha256;

/// The envd version reported to the SDKs. It selects the SDKs' protocol: from 0.4.0 they
/// send no user name unless the caller gives one, from 0.5.7 they may upload files as
/// `application/octet-stream` (both are served).
pub const ENVD_VERSION: &str = "0.6.4";

/// The port E2B's SDKs address envd on.
pub const ENVD_PORT: u16 = 49983;

/// Derives the E2B tokens of a sandbox from the daemon token.
#[derive(Clone)]
pub struct EnvdKeys {
    daemon_token: Arc<String>,
}

impl std::fmt::Debug for EnvdKeys {
    // The key stays out of logs.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("EnvdKeys(..)")
    }
}

impl EnvdKeys {
    pub fn new(daemon_token: Arc<String>) -> EnvdKeys {
        EnvdKeys { daemon_token }
    }

    /// Sandbox `id`'s envd access token (64 hex digits). The label separates it from
    /// any other use of the same key; HMAC keeps the daemon token out of reach of
    /// whoever holds a sandbox's token.
    pub fn access_token(&self, id: &str) -> String {
        let mut mac = Hmac::<Sha256>::new_from_slice(self.daemon_token.as_bytes())
            .expect("HMAC takes any key length");
        mac.update(b"zygote e2b envd access token\0");
        mac.update(id.as_bytes());
        hex::encode(mac.finalize().into_bytes())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn access_tokens_are_per_sandbox_and_not_the_daemon_token() {
        let keys = EnvdKeys::new(Arc::new("daemon-token".into()));
        let a = keys.access_token("sb-a");
        assert_eq!(a.len(), 64);
        assert_eq!(a, keys.access_token("sb-a"), "stable across calls");
        assert_ne!(a, keys.access_token("sb-b"));
        assert!(!a.contains("daemon-token"));
        let other = EnvdKeys::new(Arc::new("another".into()));
        assert_ne!(a, other.access_token("sb-a"), "keyed by the daemon token");
    }
}
