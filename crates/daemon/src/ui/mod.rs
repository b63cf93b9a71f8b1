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

/// The embedded files: `(path under dist, contents)`.
type Assets = [(&'static str, &'static [u8])];

async fn index() -> Response {
    index_of(ASSETS)
}

async fn asset(Path(path): Path<String>) -> Response {
    serve(ASSETS, &path)
}

/// The page at `/ui/`: the console's, or [`NOT_BUILT`] when there are no assets.
fn index_of(assets: &Assets) -> Response {
    if assets.is_empty() {
        let html = [(header::CONTENT_TYPE, "text/html; charset=utf-8")];
        return (StatusCode::SERVICE_UNAVAILABLE, html, NOT_BUILT).into_response();
    }
    serve(assets, "index.html")
}

/// The embedded file at `path`, with its content type; 404 (in the API's error format)
/// for anything else. Only the embedded names match, so no path reaches the filesystem.
fn serve(assets: &Assets, path: &str) -> Response {
    let Some((_, bytes)) = assets.iter().find(|(p, _)| *p == path) else {
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

    async fn body(resp: Response) -> String {
        let bytes = axum::body::to_bytes(resp.into_body(), 1 << 20)
            .await
            .unwrap();
        String::from_utf8(bytes.to_vec()).unwrap()
    }

    #[tokio::test]
    async fn without_assets_the_page_says_the_console_was_not_built() {
        let resp = index_of(&[]);
        assert_eq!(resp.status(), StatusCode::SERVICE_UNAVAILABLE);
        let html = body(resp).await;
        assert!(
            html.contains("was not built") && html.contains("make build"),
            "{html}"
        );
        assert!(
            !html.contains("<script"),
            "no console pretending to work: {html}"
        );
        assert_eq!(serve(&[], "app.js").status(), StatusCode::NOT_FOUND);
    }

    #[tokio::test]
    async fn only_embedded_names_are_served() {
        let assets: &Assets = &[("index.html", b"<p>console</p>"), ("app.js", b"1")];
        let resp = index_of(assets);
        assert_eq!(resp.status(), StatusCode::OK);
        assert_eq!(body(resp).await, "<p>console</p>");
        let js = serve(assets, "app.js");
        assert_eq!(
            js.headers()[header::CONTENT_TYPE],
            "text/javascript; charset=utf-8"
        );
        for other in ["app.css", "../app.js", "/app.js", "app.js/", ""] {
            assert_eq!(
                serve(assets, other).status(),
                StatusCode::NOT_FOUND,
                "{other:?}"
            );
        }
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
