//! The REST API: routes, bearer-token auth ([`auth`]), JSON extractors whose
//! rejections use the API's error format, and the OpenAPI document.
//!
//! Every route is registered through [`Routes::add`], which also records
//! it, so a test can check the router and the OpenAPI document list
//! exactly the same operations.
mod auth;
mod code;
mod console;
mod console_login;
mod doc;
mod egress;
mod events;
mod guest;
mod images;
mod metrics;
mod ndjson;
mod packs;
mod pause;
mod ports;
mod processes;
mod pty;
mod sandboxes;
mod snapshots;
mod system;
mod volumes;
mod watch;

use std::sync::Arc;

use axum::body::Body;
use axum::extract::rejection::QueryRejection;
use axum::extract::{FromRequest, FromRequestParts, Request};
use axum::handler::Handler;
use axum::http::{header, request::Parts, Method};
use axum::routing::MethodFilter;
use axum::Router;
use bytes::{Bytes, BytesMut};
use http_body_util::BodyExt;
use serde::de::DeserializeOwned;

pub(crate) use auth::PUBLIC;
pub use doc::ApiDoc;

use crate::error::Error;
use crate::manager::Manager;
use crate::model::{MAX_FILE_BYTES, MAX_JSON_BODY_BYTES};

#[derive(Clone)]
pub struct AppState {
    pub manager: Arc<Manager>,
    pub token: Arc<String>,
    /// Where the port proxy listens (None: it is off); set once it is bound.
    pub proxy: Option<std::net::SocketAddr>,
    /// The web console's one-time login codes ([`crate::ui`]).
    pub logins: Arc<crate::ui::LoginCodes>,
}

pub struct Routes {
    router: Router<AppState>,
    /// (method, path) of every registered route.
    pub list: Vec<(Method, &'static str)>,
}

impl Routes {
    fn new() -> Routes {
        Routes {
            router: Router::new(),
            list: Vec::new(),
        }
    }

    fn add<H, T>(mut self, method: Method, path: &'static str, handler: H) -> Routes
    where
        H: Handler<T, AppState>,
        T: 'static,
    {
        let filter = MethodFilter::try_from(method.clone()).expect("standard method");
        self.router = self.router.route(path, axum::routing::on(filter, handler));
        self.list.push((method, path));
        self
    }
}

/// Every route of the API.
pub fn routes() -> Routes {
    Routes::new()
        .add(Method::GET, "/healthz", system::healthz)
        .add(Method::GET, "/metrics", system::metrics)
        .add(Method::GET, "/v1/openapi.json", system::openapi)
        .add(Method::GET, "/v1/info", system::info)
        .add(Method::POST, "/v1/console/login", console_login::login)
        .add(Method::GET, "/v1/images", system::list_images)
        .add(Method::POST, "/v1/images", images::pull)
        .add(Method::POST, "/v1/images/build", system::build_image)
        .add(Method::GET, "/v1/events", events::live)
        .add(Method::GET, "/v1/sandboxes", sandboxes::list)
        .add(Method::POST, "/v1/sandboxes", sandboxes::create)
        .add(Method::GET, "/v1/sandboxes/{id}", sandboxes::get)
        .add(Method::DELETE, "/v1/sandboxes/{id}", sandboxes::delete)
        .add(Method::PUT, "/v1/sandboxes/{id}/ttl", sandboxes::set_ttl)
        .add(
            Method::PUT,
            "/v1/sandboxes/{id}/network",
            sandboxes::set_network,
        )
        .add(Method::POST, "/v1/sandboxes/{id}/branch", sandboxes::branch)
        .add(Method::GET, "/v1/sandboxes/{id}/tree", sandboxes::tree)
        .add(Method::POST, "/v1/sandboxes/{id}/keep", sandboxes::keep)
        .add(Method::GET, "/v1/sandboxes/{id}/diff", sandboxes::diff)
        .add(Method::POST, "/v1/sandboxes/{id}/merge", sandboxes::merge)
        .add(
            Method::POST,
            "/v1/sandboxes/{id}/restore",
            sandboxes::restore,
        )
        .add(Method::GET, "/v1/sandboxes/{id}/logs", sandboxes::logs)
        .add(Method::GET, "/v1/sandboxes/{id}/events", events::events)
        .add(Method::GET, "/v1/sandboxes/{id}/egress", egress::egress)
        .add(Method::GET, "/v1/sandboxes/{id}/metrics", metrics::metrics)
        .add(Method::POST, "/v1/sandboxes/{id}/pause", pause::pause)
        .add(Method::POST, "/v1/sandboxes/{id}/resume", pause::resume)
        .add(Method::POST, "/v1/sandboxes/{id}/ports", ports::expose)
        .add(Method::GET, "/v1/sandboxes/{id}/ports", ports::list)
        .add(
            Method::DELETE,
            "/v1/sandboxes/{id}/ports/{port}",
            ports::unexpose,
        )
        .add(Method::POST, "/v1/sandboxes/{id}/exec", guest::exec)
        .add(
            Method::POST,
            "/v1/sandboxes/{id}/exec/stream",
            guest::exec_stream,
        )
        .add(Method::POST, "/v1/sandboxes/{id}/code", code::run)
        .add(Method::GET, "/v1/sandboxes/{id}/code/contexts", code::list)
        .add(
            Method::POST,
            "/v1/sandboxes/{id}/code/contexts",
            code::create,
        )
        .add(
            Method::POST,
            "/v1/sandboxes/{id}/code/contexts/{context}/restart",
            code::restart,
        )
        .add(
            Method::DELETE,
            "/v1/sandboxes/{id}/code/contexts/{context}",
            code::delete,
        )
        .add(Method::GET, "/v1/sandboxes/{id}/processes", processes::list)
        .add(
            Method::GET,
            "/v1/sandboxes/{id}/processes/{pid}",
            processes::get,
        )
        .add(
            Method::GET,
            "/v1/sandboxes/{id}/processes/{pid}/output",
            processes::output,
        )
        .add(
            Method::POST,
            "/v1/sandboxes/{id}/processes/{pid}/stdin",
            processes::stdin,
        )
        .add(
            Method::POST,
            "/v1/sandboxes/{id}/processes/{pid}/signal",
            processes::signal,
        )
        .add(Method::GET, "/v1/sandboxes/{id}/pty", pty::pty)
        .add(Method::GET, "/v1/sandboxes/{id}/files", guest::read_file)
        .add(Method::PUT, "/v1/sandboxes/{id}/files", guest::write_file)
        .add(
            Method::GET,
            "/v1/sandboxes/{id}/files/list",
            guest::list_dir,
        )
        .add(Method::GET, "/v1/sandboxes/{id}/files/watch", watch::watch)
        .add(Method::GET, "/v1/snapshots", snapshots::list)
        .add(Method::POST, "/v1/snapshots", snapshots::create)
        .add(Method::GET, "/v1/snapshots/{id}", snapshots::get)
        .add(Method::DELETE, "/v1/snapshots/{id}", snapshots::delete)
        .add(Method::GET, "/v1/snapshots/{id}/export", packs::export)
        .add(Method::POST, "/v1/snapshots/import", packs::import)
        .add(Method::POST, "/v1/snapshots/{id}/push", packs::push)
        .add(Method::POST, "/v1/snapshots/pull", packs::pull)
        .add(Method::GET, "/v1/volumes", volumes::list)
        .add(Method::POST, "/v1/volumes", volumes::create)
        .add(Method::GET, "/v1/volumes/{id}", volumes::get)
        .add(Method::DELETE, "/v1/volumes/{id}", volumes::delete)
}

/// The application: routes, auth, error fallbacks, body limit; E2B's control plane
/// under `/e2b`, with its own credential check ([`crate::e2b::control`]); and the web
/// console under `/ui` ([`crate::ui`]: public assets, a login by one-time code).
pub fn app(state: AppState) -> Router {
    let e2b = crate::e2b::control::router(state.clone());
    let console = crate::ui::router(state.clone());
    let api = routes()
        .router
        .fallback(route_not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            auth::auth,
        ))
        // Bounds axum's own body extractors too; ours ([`ApiJson`], [`ApiBytes`]) apply
        // their routes' limits and say which in the 413.
        .layer(axum::extract::DefaultBodyLimit::max(MAX_FILE_BYTES))
        .with_state(state);
    Router::new().nest("/e2b", e2b).merge(console).merge(api)
}

async fn route_not_found(method: Method, uri: axum::http::Uri) -> Error {
    Error::RouteNotFound {
        method: method.to_string(),
        path: uri.path().to_string(),
    }
}

async fn method_not_allowed(method: Method, uri: axum::http::Uri) -> Error {
    Error::MethodNotAllowed {
        method: method.to_string(),
        path: uri.path().to_string(),
    }
}

/// How much of an oversize body is read (and dropped) before its 413 goes out. A
/// client still sending when the server closes the connection gets a reset, often
/// instead of the answer (hyper drains only what has already arrived), so the 413
/// follows the body's end. The largest body any route accepts: refusing costs no
/// more than accepting would. Larger declared bodies are refused without reading.
const MAX_DISCARD_BYTES: usize = MAX_FILE_BYTES;

/// A request body of at most `limit` bytes (`what` names it in the 413). Nothing
/// beyond the limit is kept, so an oversize body is never buffered nor reaches a
/// sandbox; a Content-Length over [`MAX_DISCARD_BYTES`] is refused before any of
/// the body is read.
pub(crate) async fn read_body(
    req: Request,
    limit: usize,
    what: &'static str,
) -> Result<(Parts, Bytes), Error> {
    let too_large = || Error::BodyTooLarge { what, limit };
    let declared = req
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > MAX_DISCARD_BYTES.max(limit) as u64) {
        return Err(too_large());
    }
    let (parts, mut body) = req.into_parts();
    let mut kept = BytesMut::new();
    let mut seen = 0usize;
    while let Some(frame) = body.frame().await {
        let frame = match frame {
            Ok(f) => f,
            Err(_) if seen > limit => break,
            Err(e) => {
                return Err(Error::MalformedBody(format!(
                    "reading the request body: {e}"
                )))
            }
        };
        let Ok(data) = frame.into_data() else {
            continue; // trailers
        };
        seen = seen.saturating_add(data.len());
        if seen <= limit {
            kept.extend_from_slice(&data);
        } else if seen > MAX_DISCARD_BYTES {
            break;
        }
    }
    if seen > limit {
        return Err(too_large());
    }
    Ok((parts, kept.freeze()))
}

/// `axum::Json` with the JSON body limit and rejections in the API's error format.
pub struct ApiJson<T>(pub T);

impl<T: DeserializeOwned, S: Send + Sync> FromRequest<S> for ApiJson<T> {
    type Rejection = Error;

    async fn from_request(req: Request, state: &S) -> Result<Self, Error> {
        let (parts, bytes) = read_body(req, MAX_JSON_BODY_BYTES, "a JSON request body").await?;
        let req = Request::from_parts(parts, Body::from(bytes));
        // The bytes are in memory now: only content-type and JSON errors remain.
        axum::Json::<T>::from_request(req, state)
            .await
            .map(|axum::Json(v)| ApiJson(v))
            .map_err(|e| Error::MalformedBody(e.body_text()))
    }
}

/// A raw request body (a file upload) with the API's error format.
pub struct ApiBytes(pub Bytes);

impl<S: Send + Sync> FromRequest<S> for ApiBytes {
    type Rejection = Error;

    async fn from_request(req: Request, _state: &S) -> Result<Self, Error> {
        let (_, bytes) = read_body(req, MAX_FILE_BYTES, "a file upload").await?;
        Ok(ApiBytes(bytes))
    }
}

/// `axum::extract::Query` with rejections in the API's error format.
pub struct ApiQuery<T>(pub T);

impl<T: DeserializeOwned, S: Send + Sync> FromRequestParts<S> for ApiQuery<T> {
    type Rejection = Error;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Error> {
        axum::extract::Query::<T>::from_request_parts(parts, state)
            .await
            .map(|q| ApiQuery(q.0))
            .map_err(|e: QueryRejection| Error::invalid(e.body_text()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use utoipa::openapi::path::HttpMethod;
    use utoipa::OpenApi;

    fn http_method(m: &Method) -> HttpMethod {
        match *m {
            Method::GET => HttpMethod::Get,
            Method::POST => HttpMethod::Post,
            Method::PUT => HttpMethod::Put,
            Method::DELETE => HttpMethod::Delete,
            _ => panic!("unexpected method {m}"),
        }
    }

    fn operations(item: &utoipa::openapi::PathItem) -> Vec<HttpMethod> {
        [
            (HttpMethod::Get, item.get.is_some()),
            (HttpMethod::Post, item.post.is_some()),
            (HttpMethod::Put, item.put.is_some()),
            (HttpMethod::Delete, item.delete.is_some()),
            (HttpMethod::Patch, item.patch.is_some()),
        ]
        .into_iter()
        .filter(|(_, present)| *present)
        .map(|(m, _)| m)
        .collect()
    }

    #[test]
    fn every_route_is_documented_and_every_documented_route_exists() {
        let doc = ApiDoc::openapi();
        let registered = routes().list;
        for (method, path) in &registered {
            let item = doc
                .paths
                .paths
                .get(*path)
                .unwrap_or_else(|| panic!("{path} is routed but not in the OpenAPI document"));
            assert!(
                operations(item).contains(&http_method(method)),
                "{method} {path} is routed but not documented"
            );
        }
        let mut documented = 0;
        for (path, item) in &doc.paths.paths {
            for op in operations(item) {
                documented += 1;
                assert!(
                    registered
                        .iter()
                        .any(|(m, p)| p == path && http_method(m) == op),
                    "an operation on {path} is documented but not routed"
                );
            }
        }
        assert_eq!(documented, registered.len());
    }
}
