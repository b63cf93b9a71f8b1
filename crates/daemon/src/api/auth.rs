//! The API's token check: every route but [`PUBLIC`] needs the token, in the forms
//! `crate::token` reads; only the pty route takes it as a WebSocket subprotocol.
use axum::extract::{MatchedPath, Request, State};
use axum::http::header::{self, HeaderValue};
use axum::http::Method;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use super::AppState;
use crate::error::Error;
use crate::token::presents;

/// Paths answered without a token: liveness probes and the API description. The
/// OpenAPI document marks every other operation as needing the token (and 401).
pub(crate) const PUBLIC: [&str; 2] = ["/healthz", "/v1/openapi.json"];

/// The one route that takes the token as a WebSocket subprotocol (a browser's
/// terminal); its path as registered.
const SUBPROTOCOL_ROUTE: (Method, &str) = (Method::GET, "/v1/sandboxes/{id}/pty");

/// Whether a request for `path` (a route's path as registered, None: no route) with
/// `method` may present the token as a subprotocol.
fn takes_subprotocol(method: &Method, path: Option<&str>) -> bool {
    let (m, p) = &SUBPROTOCOL_ROUTE;
    method == m && path == Some(*p)
}

/// The API's middleware: every route but [`PUBLIC`] needs the token.
pub(super) async fn auth(State(state): State<AppState>, req: Request, next: Next) -> Response {
    if PUBLIC.contains(&req.uri().path()) {
        return next.run(req).await;
    }
    let route = req
        .extensions()
        .get::<MatchedPath>()
        .map(MatchedPath::as_str);
    let subprotocol = takes_subprotocol(req.method(), route);
    if !presents(req.headers(), &state.token, subprotocol) {
        let mut resp = Error::Unauthorized.into_response();
        resp.headers_mut()
            .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        return resp;
    }
    next.run(req).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_pty_route_takes_the_subprotocol() {
        assert!(takes_subprotocol(
            &Method::GET,
            Some("/v1/sandboxes/{id}/pty")
        ));
        assert!(!takes_subprotocol(
            &Method::POST,
            Some("/v1/sandboxes/{id}/pty")
        ));
        assert!(!takes_subprotocol(&Method::GET, Some("/v1/info")));
        assert!(!takes_subprotocol(&Method::GET, Some("/v1/sandboxes/{id}")));
        assert!(!takes_subprotocol(&Method::GET, None), "no route matched");
        // The route exists as named.
        assert!(super::super::routes()
            .list
            .iter()
            .any(|(m, p)| (m, *p) == (&SUBPROTOCOL_ROUTE.0, SUBPROTOCOL_ROUTE.1)));
    }
}
