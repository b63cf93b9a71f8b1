//! The web console's login: `POST /v1/console/login` gives a one-time code that a
//! browser exchanges (once, within a minute) for the API token, so the token itself is
//! never put in a URL (`zygote ui`).
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// `POST /v1/console/login`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct ConsoleLogin {
    /// 64 hex digits; valid once, for `expires_in_secs`.
    pub code: String,
    pub expires_in_secs: u64,
    /// What to open on the daemon's address: `/ui/#login=<code>`. The code is in the
    /// fragment, which browsers never send to a server, so no access log records it.
    pub path: String,
}
