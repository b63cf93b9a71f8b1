//! The REST API: routes, bearer-token auth, JSON extractors whose
//! rejections use the API's error format, and the OpenAPI document.
//!
//! Every route is registered through [`Routes::add`], which also records
//! it, so a test can check the router and the OpenAPI document list
//! exactly the same operations.
mod guest;
mod sandboxes;
mod snapshots;
mod system;

use std::sync::Arc;

use axum::extract::rejection::{BytesRejection, JsonRejection, QueryRejection};
use axum::extract::{FromRequest, FromRequestParts, Request, State};
use axum::handler::Handler;
use axum::http::{header, request::Parts, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::MethodFilter;
use axum::Router;
use serde::de::DeserializeOwned;
use utoipa::OpenApi;

use crate::error::Error;
use crate::manager::Manager;
use crate::model::MAX_FILE_BYTES;

#[derive(Clone)]
pub struct AppState {
    pub manager: Arc<Manager>,
    pub token: Arc<String>,
}

/// Paths answered without a token: liveness probes and the API description.
const PUBLIC: [&str; 2] = ["/healthz", "/v1/openapi.json"];

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
        .add(Method::GET, "/v1/images", system::list_images)
        .add(Method::POST, "/v1/images/build", system::build_image)
        .add(Method::GET, "/v1/sandboxes", sandboxes::list)
        .add(Method::POST, "/v1/sandboxes", sandboxes::create)
        .add(Method::GET, "/v1/sandboxes/{id}", sandboxes::get)
        .add(Method::DELETE, "/v1/sandboxes/{id}", sandboxes::delete)
        .add(Method::PUT, "/v1/sandboxes/{id}/ttl", sandboxes::set_ttl)
        .add(Method::POST, "/v1/sandboxes/{id}/branch", sandboxes::branch)
        .add(
            Method::POST,
            "/v1/sandboxes/{id}/restore",
            sandboxes::restore,
        )
        .add(Method::GET, "/v1/sandboxes/{id}/logs", sandboxes::logs)
        .add(Method::POST, "/v1/sandboxes/{id}/exec", guest::exec)
        .add(
            Method::POST,
            "/v1/sandboxes/{id}/exec/stream",
            guest::exec_stream,
        )
        .add(Method::GET, "/v1/sandboxes/{id}/files", guest::read_file)
        .add(Method::PUT, "/v1/sandboxes/{id}/files", guest::write_file)
        .add(
            Method::GET,
            "/v1/sandboxes/{id}/files/list",
            guest::list_dir,
        )
        .add(Method::GET, "/v1/snapshots", snapshots::list)
        .add(Method::POST, "/v1/snapshots", snapshots::create)
        .add(Method::GET, "/v1/snapshots/{id}", snapshots::get)
        .add(Method::DELETE, "/v1/snapshots/{id}", snapshots::delete)
}

/// The application: routes, auth, error fallbacks, body limit.
pub fn app(state: AppState) -> Router {
    routes()
        .router
        .fallback(route_not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(axum::middleware::from_fn_with_state(state.clone(), auth))
        // File uploads are the largest bodies.
        .layer(axum::extract::DefaultBodyLimit::max(MAX_FILE_BYTES))
        .with_state(state)
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

/// Constant-time comparison, so response timing does not leak the token.
fn token_matches(given: &[u8], expected: &[u8]) -> bool {
    given.len() == expected.len()
        && given
            .iter()
            .zip(expected)
            .fold(0u8, |acc, (a, b)| acc | (a ^ b))
            == 0
}

async fn auth(State(state): State<AppState>, req: Request, next: Next) -> Response {
    if PUBLIC.contains(&req.uri().path()) {
        return next.run(req).await;
    }
    let given = req
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .unwrap_or("");
    if !token_matches(given.as_bytes(), state.token.as_bytes()) {
        let mut resp = Error::Unauthorized.into_response();
        resp.headers_mut().insert(
            header::WWW_AUTHENTICATE,
            header::HeaderValue::from_static("Bearer"),
        );
        return resp;
    }
    next.run(req).await
}

/// `axum::Json` with rejections in the API's error format.
pub struct ApiJson<T>(pub T);

impl<T: DeserializeOwned, S: Send + Sync> FromRequest<S> for ApiJson<T> {
    type Rejection = Error;

    async fn from_request(req: Request, state: &S) -> Result<Self, Error> {
        match axum::Json::<T>::from_request(req, state).await {
            Ok(axum::Json(v)) => Ok(ApiJson(v)),
            Err(JsonRejection::BytesRejection(b)) => Err(bytes_error(b)),
            Err(e) => Err(Error::MalformedBody(e.body_text())),
        }
    }
}

fn bytes_error(b: BytesRejection) -> Error {
    if b.status() == StatusCode::PAYLOAD_TOO_LARGE {
        Error::PayloadTooLarge {
            limit: MAX_FILE_BYTES,
        }
    } else {
        Error::MalformedBody(b.body_text())
    }
}

/// A raw request body with the API's error format.
pub struct ApiBytes(pub bytes::Bytes);

impl<S: Send + Sync> FromRequest<S> for ApiBytes {
    type Rejection = Error;

    async fn from_request(req: Request, state: &S) -> Result<Self, Error> {
        bytes::Bytes::from_request(req, state)
            .await
            .map(ApiBytes)
            .map_err(bytes_error)
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
            .map_err(|e: QueryRejection| Error::InvalidArgument(e.body_text()))
    }
}

struct BearerAuth;

impl utoipa::Modify for BearerAuth {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
        let components = openapi.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "bearer",
            SecurityScheme::Http(HttpBuilder::new().scheme(HttpAuthScheme::Bearer).build()),
        );
    }
}

#[derive(OpenApi)]
#[openapi(
    info(
        title = "zygoted",
        description = "zygote daemon: copy-on-write microVM sandboxes. Every route except \
                       /healthz and /v1/openapi.json needs `Authorization: Bearer <token>` \
                       (the token is in <state dir>/token). Errors are \
                       `{\"error\": {\"code\", \"message\"}}` with stable codes."
    ),
    paths(
        system::healthz, system::metrics, system::openapi, system::info,
        system::list_images, system::build_image,
        sandboxes::list, sandboxes::create, sandboxes::get, sandboxes::delete,
        sandboxes::set_ttl, sandboxes::branch, sandboxes::restore, sandboxes::logs,
        guest::exec, guest::exec_stream, guest::read_file, guest::write_file, guest::list_dir,
        snapshots::list, snapshots::create, snapshots::get, snapshots::delete,
    ),
    modifiers(&BearerAuth),
    security(("bearer" = [])),
)]
pub struct ApiDoc;

#[cfg(test)]
mod tests {
    use super::*;
    use utoipa::openapi::path::HttpMethod;

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

    #[test]
    fn token_comparison() {
        assert!(token_matches(b"abc", b"abc"));
        assert!(!token_matches(b"abd", b"abc"));
        assert!(!token_matches(b"ab", b"abc"));
        assert!(!token_matches(b"", b"abc"));
    }
}
