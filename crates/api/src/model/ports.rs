//! Exposed ports: a sandbox's TCP port served on the host by the daemon's proxy.
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::{in_range, Validate};
use crate::error::Result;

#[derive(Debug, Clone, Default, Deserialize, Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ExposePortRequest {
    /// The guest's TCP port, 1..=65535.
    // Wider than u16 so an out-of-range number is an invalid_argument naming the range,
    // not a malformed_body from the JSON parser.
    #[schema(minimum = 1, maximum = 65535)]
    pub port: i64,
    /// Serve it without the API token (anyone who can reach the proxy can use it);
    /// false by default.
    #[serde(default)]
    pub public: bool,
}

impl Validate for ExposePortRequest {
    fn validate(&self) -> Result<()> {
        in_range("port", self.port, 1, i64::from(u16::MAX))
    }
}

/// One exposed port and where the proxy serves it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct ExposedPort {
    pub port: u16,
    /// Served without the API token.
    pub public: bool,
    /// By host name: `http://<port>-<sandbox>.localhost:<proxy port>` (`*.localhost`
    /// resolves to loopback in browsers and most resolvers). A browser origin of its
    /// own: the URL to open in a browser.
    pub url: String,
    /// By path: `http://<proxy address>/sandboxes/<sandbox>/ports/<port>/`, for clients
    /// that cannot resolve `*.localhost`. Every sandbox's ports share this one origin
    /// (the proxy's), so in a browser a page of one sandbox could script another's.
    pub path_url: String,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct PortList {
    pub ports: Vec<ExposedPort>,
}

/// `GET /v1/info`'s view of the port proxy.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct ProxyInfo {
    /// Where the proxy listens, e.g. `http://127.0.0.1:7421` (a wildcard bind shows
    /// as loopback).
    pub url: String,
}
