//! The port proxy: a second listener that serves sandboxes' exposed ports on the host.
//!
//! A guest's address is reachable from the host only (the host's veth address is the
//! one source its nftables rules let in), so the daemon relays: a request names a
//! sandbox port by host name (`<port>-<sandbox>.localhost`) or by path
//! (`/sandboxes/<sandbox>/ports/<port>/...`), and goes to `http://<guest>:<port>` with
//! its body streamed both ways; an HTTP upgrade (WebSocket) becomes a byte pipe.
//! Only exposed ports are served, with the API token unless the exposure is public;
//! whatever the client sends, the token never reaches the guest
//! ([`crate::token::remove_token`]).
//! Which ports are exposed, and where, comes from a [`Lookup`] (the manager, or a
//! closure in tests).
mod forward;
mod route;
mod upgrade;

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::Arc;

use axum::body::Body;
use axum::extract::{ConnectInfo, Request, State};
use axum::http::{header, HeaderValue, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Router;
use tokio::net::TcpListener;

use crate::error::{Error, ErrorBody, ErrorDetail, Result};
use crate::token::presents;

pub use route::Route;

/// Default proxy address (loopback, like the API's).
pub const DEFAULT_PROXY_LISTEN: &str = "127.0.0.1:7421";

/// Where an exposed port is served from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Target {
    /// The guest's address and port.
    pub addr: SocketAddr,
    /// Served without the API token.
    pub public: bool,
}

/// `(sandbox, port)` to where the proxy forwards it; None: not exposed.
pub trait Lookup: Send + Sync + 'static {
    fn lookup(&self, sandbox: &str, port: u16) -> Option<Target>;

    /// Makes the sandbox ready to answer before a request goes to it (a paused one
    /// created with `auto_resume` is resumed); Err says why it cannot answer.
    fn wake<'a>(&'a self, _sandbox: &'a str) -> WakeFuture<'a> {
        Box::pin(async { Ok(()) })
    }
}

/// A first look at every request, before the port rules: E2B's envd
/// ([`crate::e2b::envd::Envd`]) answers the requests that carry E2B's routing headers
/// itself and hands every other one back.
pub trait Gate: Send + Sync + 'static {
    /// The answer to `req` (Ok), or `req` back for the port rules (Err).
    fn serve(&self, req: Request) -> GateFuture<'_>;

    /// Takes the gate's own credentials for `sandbox` out of `headers` of a request the
    /// proxy forwards to it (as it does the API token), so none reaches its guest.
    fn scrub(&self, sandbox: &str, headers: &mut axum::http::HeaderMap);
}

/// What [`Gate::serve`] returns.
pub type GateFuture<'a> = std::pin::Pin<
    Box<dyn std::future::Future<Output = std::result::Result<Response, Request>> + Send + 'a>,
>;

/// What [`Lookup::wake`] returns.
pub type WakeFuture<'a> = std::pin::Pin<
    Box<dyn std::future::Future<Output = std::result::Result<(), String>> + Send + 'a>,
>;

impl<F> Lookup for F
where
    F: Fn(&str, u16) -> Option<Target> + Send + Sync + 'static,
{
    fn lookup(&self, sandbox: &str, port: u16) -> Option<Target> {
        self(sandbox, port)
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ProxyError {
    #[error("missing or wrong bearer token")]
    Unauthorized,
    #[error(
        "{0} names no sandbox port: use http://<port>-<sandbox>.localhost:<proxy port>/ or \
         /sandboxes/<sandbox>/ports/<port>/"
    )]
    NoRoute(String),
    #[error(
        "port {port} of sandbox {sandbox} is not exposed (POST /v1/sandboxes/{sandbox}/ports)"
    )]
    NotExposed { sandbox: String, port: u16 },
    #[error("port {port} of sandbox {sandbox} is not answering: {why}")]
    Unreachable {
        sandbox: String,
        port: u16,
        why: String,
    },
    #[error("port {port} of sandbox {sandbox} gave no usable HTTP answer: {why}")]
    BadResponse {
        sandbox: String,
        port: u16,
        why: String,
    },
}

impl ProxyError {
    pub fn status_code(&self) -> (StatusCode, &'static str) {
        match self {
            ProxyError::Unauthorized => Error::Unauthorized.status_code(),
            ProxyError::NoRoute(_) => (StatusCode::NOT_FOUND, "route_not_found"),
            ProxyError::NotExposed { .. } => (StatusCode::NOT_FOUND, "not_found"),
            ProxyError::Unreachable { .. } => (StatusCode::BAD_GATEWAY, "upstream_unreachable"),
            ProxyError::BadResponse { .. } => (StatusCode::BAD_GATEWAY, "upstream_error"),
        }
    }
}

/// The API's error format, so clients handle both listeners' errors alike.
impl IntoResponse for ProxyError {
    fn into_response(self) -> Response {
        let (status, code) = self.status_code();
        tracing::debug!("proxy: {status}: {self}");
        let body = ErrorBody {
            error: ErrorDetail {
                code: code.into(),
                message: self.to_string(),
                fit: None,
            },
        };
        let mut resp = (status, axum::Json(body)).into_response();
        if status == StatusCode::UNAUTHORIZED {
            resp.headers_mut()
                .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        }
        resp
    }
}

/// The proxy's state: where exposed ports are, and the API token.
#[derive(Clone)]
pub struct Proxy {
    lookup: Arc<dyn Lookup>,
    token: Arc<String>,
    gate: Option<Arc<dyn Gate>>,
}

impl Proxy {
    pub fn new(lookup: Arc<dyn Lookup>, token: Arc<String>) -> Proxy {
        Proxy {
            lookup,
            token,
            gate: None,
        }
    }

    /// The proxy with `gate` looking at every request first.
    pub fn with_gate(mut self, gate: Arc<dyn Gate>) -> Proxy {
        self.gate = Some(gate);
        self
    }

    /// Every request, whatever its method and path, is the proxy's. Served with
    /// [`serve`] (which records the client's address for `X-Forwarded-For`).
    pub fn router(self) -> Router {
        Router::new().fallback(handle).with_state(self)
    }

    async fn handle(&self, peer: Option<SocketAddr>, req: Request) -> Result<Response, ProxyError> {
        if req.method() == Method::CONNECT {
            return Err(ProxyError::NoRoute("CONNECT".into()));
        }
        let mut req = match &self.gate {
            Some(gate) => match gate.serve(req).await {
                Ok(answer) => return Ok(answer),
                Err(req) => req,
            },
            None => req,
        };
        let route = Route::of(&req)
            .ok_or_else(|| ProxyError::NoRoute(format!("{} {}", req.method(), req.uri().path())))?;
        // `Authorization: Bearer` only: a private port is for API clients (a browser
        // cannot add the header to a page load); what a browser opens is public.
        let authorized = presents(req.headers(), &self.token, false);
        // Without the token a client learns nothing, not even whether the port is
        // exposed: only a public exposure answers it.
        let target = match self.lookup.lookup(&route.sandbox, route.port) {
            Some(t) if t.public || authorized => t,
            _ if !authorized => return Err(ProxyError::Unauthorized),
            _ => {
                return Err(ProxyError::NotExposed {
                    sandbox: route.sandbox,
                    port: route.port,
                })
            }
        };
        // Only for a client allowed to reach the port: nobody else wakes a sandbox.
        if let Err(why) = self.lookup.wake(&route.sandbox).await {
            return Err(ProxyError::Unreachable {
                sandbox: route.sandbox,
                port: route.port,
                why,
            });
        }
        // A resume may have given the guest a new namespace (and address): ask again.
        let target = self
            .lookup
            .lookup(&route.sandbox, route.port)
            .unwrap_or(target);
        if let Some(location) = route.redirect() {
            // `/sandboxes/<id>/ports/<port>` without its slash: relative links in what
            // the guest serves would resolve outside the prefix.
            return Ok((
                StatusCode::PERMANENT_REDIRECT,
                [(header::LOCATION, location)],
                Body::empty(),
            )
                .into_response());
        }
        if let Some(gate) = &self.gate {
            gate.scrub(&route.sandbox, req.headers_mut());
        }
        forward::forward(forward::Upstream {
            target: target.addr,
            route,
            peer,
            token: &self.token,
            req,
        })
        .await
    }
}

async fn handle(State(proxy): State<Proxy>, req: Request) -> Response {
    let peer = req
        .extensions()
        .get::<ConnectInfo<SocketAddr>>()
        .map(|ConnectInfo(a)| *a);
    proxy
        .handle(peer, req)
        .await
        .unwrap_or_else(IntoResponse::into_response)
}

/// Serves the proxy on `listener` until the process ends. Not drained on shutdown: a
/// proxied WebSocket may stay open for hours, and the API's graceful stop must not
/// wait for it.
pub async fn serve(listener: TcpListener, proxy: Proxy) -> std::io::Result<()> {
    let app = proxy
        .router()
        .into_make_service_with_connect_info::<SocketAddr>();
    axum::serve(listener, app).await
}

/// The address clients use for a proxy bound to `addr`: a wildcard bind is reached
/// on loopback.
pub fn base_url(addr: SocketAddr) -> String {
    let ip = match addr.ip() {
        IpAddr::V4(ip) if ip.is_unspecified() => IpAddr::V4(Ipv4Addr::LOCALHOST),
        IpAddr::V6(ip) if ip.is_unspecified() => IpAddr::V6(Ipv6Addr::LOCALHOST),
        ip => ip,
    };
    format!("http://{}", SocketAddr::new(ip, addr.port()))
}

/// `(url, path_url)` of port `port` of `sandbox` on a proxy bound to `addr`.
pub fn urls(addr: SocketAddr, sandbox: &str, port: u16) -> (String, String) {
    (
        format!("http://{port}-{sandbox}.localhost:{}", addr.port()),
        format!("{}/sandboxes/{sandbox}/ports/{port}/", base_url(addr)),
    )
}

/// Binds the proxy (`listen`: an address, `none`, or None for
/// [`DEFAULT_PROXY_LISTEN`]), announces it and serves it in the background; its
/// address, or None when it is off.
///
/// A taken default address only turns the proxy off (with a warning), so a second
/// daemon on the same host (a test, a private daemon of a script) still starts; an
/// address given explicitly must work.
pub async fn start(
    listen: Option<&str>,
    lookup: Arc<dyn Lookup>,
    token: Arc<String>,
    gate: Option<Arc<dyn Gate>>,
) -> Result<Option<SocketAddr>> {
    let addr = match listen {
        Some(a) if a.eq_ignore_ascii_case("none") => {
            tracing::info!("port proxy off (--proxy-listen none): ports cannot be exposed");
            return Ok(None);
        }
        Some(a) => a,
        None => DEFAULT_PROXY_LISTEN,
    };
    let listener = match TcpListener::bind(addr).await {
        Ok(l) => l,
        Err(e) if listen.is_none() => {
            tracing::warn!(
                "port proxy off: binding {addr}: {e} (choose an address with --proxy-listen); \
                 ports cannot be exposed"
            );
            return Ok(None);
        }
        Err(e) => return Err(Error::io(format!("binding the port proxy to {addr}"))(e)),
    };
    let bound = listener
        .local_addr()
        .map_err(Error::io("the port proxy's address"))?;
    let url = base_url(bound);
    {
        use std::io::Write;
        // Like the API's line: scripts find a proxy on port 0 here (or in GET /v1/info).
        println!("zygoted proxy listening on {url}");
        let _ = std::io::stdout().flush();
    }
    tracing::info!("port proxy listening on {url}");
    let mut proxy = Proxy::new(lookup, token);
    if let Some(gate) = gate {
        proxy = proxy.with_gate(gate);
    }
    tokio::spawn(async move {
        if let Err(e) = serve(listener, proxy).await {
            tracing::error!("port proxy stopped: {e}");
        }
    });
    Ok(Some(bound))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_use_the_bound_port_and_loopback_for_a_wildcard() {
        let (url, path) = urls("0.0.0.0:7421".parse().unwrap(), "sb-1", 8080);
        assert_eq!(url, "http://8080-sb-1.localhost:7421");
        assert_eq!(path, "http://127.0.0.1:7421/sandboxes/sb-1/ports/8080/");
        let (_, path) = urls("[::]:9".parse().unwrap(), "sb-1", 80);
        assert_eq!(path, "http://[::1]:9/sandboxes/sb-1/ports/80/");
        assert_eq!(base_url("10.1.2.3:5".parse().unwrap()), "http://10.1.2.3:5");
    }
}
