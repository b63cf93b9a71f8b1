//! The web console at `/ui`: static assets built from `console/` (TypeScript, see
//! `console/README.md`) and embedded in the daemon at build time, so the daemon stays one
//! file and nothing is fetched from elsewhere at run time.
//!
//! The assets are public (they hold no data and no secret); everything the console
//! shows comes from the API, with the token. [`login`] is how a browser gets the token
//! without it ever being in a URL. Every answer under `/ui` carries [`SECURITY_HEADERS`]:
//! scripts only from the daemon itself (no inline script, no eval), no framing.
mod login;

use axum::extract::{Path, Request};
use axum::http::{header, HeaderName, HeaderValue, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::{get, post};
use axum::Router;

pub use login::{LoginCodes, CODE_TTL};

use crate::api::AppState;

// `ASSETS: &[(&str, &[u8])]`: each file of `console/dist` by its path there; empty when
// the console was not built before the daemon (see build.rs).
include!(concat!(env!("OUT_DIR"), "/console_assets.rs"));

/// The Content-Security-Policy of every `/ui` answer. Scripts and connections (fetch,
/// the pty WebSocket: `'self'` covers `ws:`/`wss:` to the same host) only to the daemon.
/// Styles allow `'unsafe-inline'` because xterm.js sets its themes and cell sizes in
/// `<style>` elements it creates; no script can be injected that way.
pub const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self' 'unsafe-inline'; \
                       connect-src 'self'; img-src 'self' data: blob:; font-src 'self'; \
                       base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

/// Headers added to every answer under `/ui`.
pub const SECURITY_HEADERS: [(&str, &str); 6] = [
    ("content-security-policy", CSP),
    ("x-frame-options", "DENY"),
    ("x-content-type-options", "nosniff"),
    ("referrer-policy", "no-referrer"),
    ("cross-origin-opener-policy", "same-origin"),
    ("cross-origin-resource-policy", "same-origin"),
];

/// The page served at `/ui/` when the daemon was built without the console: it says so
/// and how to build it (never a console that does not work).
const NOT_BUILT: &str = "<!doctype html><html lang=en><head><meta charset=utf-8>\
<title>zygote console: not built</title></head><body>\
<h1>The web console was not built into this zygoted</h1>\
<p>This daemon binary was compiled without the console's assets (<code>console/dist</code> \
did not exist). Build them and the daemon together from the repository with \
<code>make build</code>, or build the console alone with \
<code>make console</code> (<code>npm ci &amp;&amp; npm run build</code> in \
<code>console/</code>) and then rebuild the daemon \
(<code>cargo build --release -p zygote-daemon -p zygote-cli</code>).</p>\
<p>The REST API works without it: <code>/v1/openapi.json</code>.</p></body></html>";

/// Whether this daemon was built with the console's assets.
pub fn built() -> bool {
    !ASSETS.is_empty()
}

/// The console's routes, merged into the daemon's app beside the API (outside its token
/// check: see the module's description).
pub fn router(state: AppState) -> Router {
    Router::new()
        .route("/ui", get(|| async { Redirect::permanent("/ui/") }))
        .route("/ui/", get(index))
        .route("/ui/login", post(login::exchange))
        .route("/ui/{*path}", get(asset))
        .layer(axum::middleware::from_fn(security_headers))
        .with_state(state)
}

async fn security_headers(req: Request, next: Next) -> Response {
    let mut resp = next.run(req).await;
    let headers = resp.headers_mut();
    for (name, value) in SECURITY_HEADERS {
        headers.insert(
            HeaderName::from_static(name),
            HeaderValue::from_static(value),
        );
    }
    resp
}

async fn index() -> Response {
    if !built() {
        let html = [(header::CONTENT_TYPE, "text/html; charset=utf-8")];
        return (StatusCode::SERVICE_UNAVAILABLE, html, NOT_BUILT).into_response();
    }
    serve("index.html")
}

async fn asset(Path(path): Path<String>) -> Response {
    serve(&path)
}

/// The embedded file at `path`, with its content type; 404 (in the API's error format)
/// for anything else. Only the embedded names match, so no path reaches the filesystem.
fn serve(path: &str) -> Response {
    let Some((_, bytes)) = ASSETS.iter().find(|(p, _)| *p == path) else {
        return crate::error::Error::RouteNotFound {
            method: "GET".into(),
            path: format!("/ui/{path}"),
        }
        .into_response();
    };
    let headers = [
        (header::CONTENT_TYPE, content_type(path)),
        // Names are not content-hashed: ask the daemon each time (a 200 from memory).
        (header::CACHE_CONTROL, "no-cache"),
    ];
    (headers, *bytes).into_response()
}

fn content_type(path: &str) -> &'static str {
    match path.rsplit_once('.').map(|(_, ext)| ext) {
        Some("html") => "text/html; charset=utf-8",
        Some("js") => "text/javascript; charset=utf-8",
        Some("css") => "text/css; charset=utf-8",
        Some("svg") => "image/svg+xml",
        Some("png") => "image/png",
        Some("json" | "map") => "application/json",
        Some("woff2") => "font/woff2",
        Some("txt") => "text/plain; charset=utf-8",
        _ => "application/octet-stream",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn content_types_by_extension() {
        assert_eq!(content_type("index.html"), "text/html; charset=utf-8");
        assert_eq!(content_type("app.js"), "text/javascript; charset=utf-8");
        assert_eq!(content_type("app.css"), "text/css; charset=utf-8");
        assert_eq!(content_type("a/b.svg"), "image/svg+xml");
        assert_eq!(content_type("LICENSE"), "application/octet-stream");
    }

    #[test]
    fn the_policy_allows_no_inline_script_and_no_framing() {
        let script = CSP
            .split(';')
            .map(str::trim)
            .find(|d| d.starts_with("script-src"))
            .expect("a script-src");
        assert_eq!(script, "script-src 'self'");
        assert!(CSP.contains("frame-ancestors 'none'"));
        assert!(!CSP.contains("unsafe-eval"));
    }
}
