//! Which sandbox port a proxy request is for: by host name
//! (`<port>-<sandbox>.localhost[:any]`) or by path (`/sandboxes/<sandbox>/ports/<port>/...`).
use axum::extract::Request;
use axum::http::uri::Authority;
use axum::http::{header, Uri};

/// A request's sandbox port, and what the guest is asked for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Route {
    pub sandbox: String,
    pub port: u16,
    /// The path and query the guest sees (the path form's prefix stripped).
    pub upstream: String,
    /// The stripped prefix (path form), for `X-Forwarded-Prefix`.
    pub prefix: Option<String>,
    /// The path form named the port without a slash after it (and maybe a query).
    bare: Option<String>,
}

impl Route {
    pub fn of(req: &Request) -> Option<Route> {
        // An absolute-form request line carries the host; otherwise the Host header.
        let host = req.uri().host().map(str::to_string).or_else(|| {
            let value = req.headers().get(header::HOST)?.to_str().ok()?;
            Some(value.parse::<Authority>().ok()?.host().to_string())
        });
        Route::parse(host.as_deref(), req.uri())
    }

    /// The host form wins: under it the whole path is the guest's, even one that looks
    /// like the path form.
    pub fn parse(host: Option<&str>, uri: &Uri) -> Option<Route> {
        let query = uri.query().map(|q| format!("?{q}")).unwrap_or_default();
        if let Some((sandbox, port)) = host.and_then(by_host) {
            let path = match uri.path() {
                "" => "/",
                p => p,
            };
            return Some(Route {
                sandbox,
                port,
                upstream: format!("{path}{query}"),
                prefix: None,
                bare: None,
            });
        }
        let rest = uri.path().strip_prefix("/sandboxes/")?;
        let (sandbox, rest) = rest.split_once('/')?;
        let rest = rest.strip_prefix("ports/")?;
        let (port, tail) = rest.find('/').map_or((rest, ""), |i| rest.split_at(i));
        let (sandbox, port) = (valid_id(sandbox)?, valid_port(port)?);
        let prefix = format!("/sandboxes/{sandbox}/ports/{port}");
        Some(Route {
            upstream: format!("{}{query}", if tail.is_empty() { "/" } else { tail }),
            bare: tail.is_empty().then(|| format!("{prefix}/{query}")),
            prefix: Some(prefix),
            sandbox,
            port,
        })
    }

    /// Where a request for the bare path-form prefix is sent instead.
    pub fn redirect(&self) -> Option<&str> {
        self.bare.as_deref()
    }
}

/// `8080-sb-3c5a0327bd9f.localhost` (any case, a final dot allowed).
fn by_host(host: &str) -> Option<(String, u16)> {
    let host = host.trim_end_matches('.').to_ascii_lowercase();
    let label = host.strip_suffix(".localhost")?;
    let (port, sandbox) = label.split_once('-')?;
    Some((valid_id(sandbox)?, valid_port(port)?))
}

fn valid_port(s: &str) -> Option<u16> {
    // Digits only: `u16::from_str` would take a leading `+`.
    if s.is_empty() || s.len() > 5 || !s.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    s.parse().ok().filter(|&p| p != 0)
}

/// Sandbox ids are `sb-` and hex; anything else cannot name one.
fn valid_id(s: &str) -> Option<String> {
    let ok =
        !s.is_empty() && s.len() <= 64 && s.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-');
    ok.then(|| s.to_ascii_lowercase())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(host: Option<&str>, uri: &str) -> Option<Route> {
        Route::parse(host, &uri.parse().unwrap())
    }

    #[test]
    fn host_form() {
        let r = parse(Some("8080-sb-3c5a0327bd9f.localhost"), "/a/b?x=1&y").unwrap();
        assert_eq!((r.sandbox.as_str(), r.port), ("sb-3c5a0327bd9f", 8080));
        assert_eq!(
            (r.upstream.as_str(), r.prefix.as_deref(), r.redirect()),
            ("/a/b?x=1&y", None, None)
        );
        let r = parse(Some("80-SB-AB.LocalHost."), "/sandboxes/sb-x/ports/1/").unwrap();
        assert_eq!((r.sandbox.as_str(), r.port), ("sb-ab", 80));
        assert_eq!(
            r.upstream, "/sandboxes/sb-x/ports/1/",
            "the guest's own path"
        );
        for bad in [
            "localhost",
            "8080.localhost",
            "0-sb-a.localhost",
            "65536-sb-a.localhost",
            "+80-sb-a.localhost",
            "80-.localhost",
            "80-sb-a.localhost.evil",
            "80-sb_a.localhost",
            "80-sb-a.example",
        ] {
            assert_eq!(parse(Some(bad), "/"), None, "{bad}");
        }
    }

    #[test]
    fn path_form() {
        let r = parse(Some("127.0.0.1"), "/sandboxes/sb-1/ports/3000/api/x?q=2").unwrap();
        assert_eq!((r.sandbox.as_str(), r.port), ("sb-1", 3000));
        assert_eq!(r.upstream, "/api/x?q=2");
        assert_eq!(r.prefix.as_deref(), Some("/sandboxes/sb-1/ports/3000"));
        assert_eq!(r.redirect(), None);
        let r = parse(None, "/sandboxes/sb-1/ports/3000/").unwrap();
        assert_eq!((r.upstream.as_str(), r.redirect()), ("/", None));
        let r = parse(None, "/sandboxes/sb-1/ports/3000?q").unwrap();
        assert_eq!(r.upstream, "/?q");
        assert_eq!(r.redirect(), Some("/sandboxes/sb-1/ports/3000/?q"));
        for bad in [
            "/",
            "/sandboxes/sb-1",
            "/sandboxes/sb-1/ports/",
            "/sandboxes/sb-1/ports/x/",
            "/sandboxes/sb-1/ports/0/",
            "/sandboxes//ports/80/",
            "/sandboxes/sb%2F1/ports/80/",
            "/v1/sandboxes/sb-1/ports/80/",
        ] {
            assert_eq!(parse(Some("localhost:7421"), bad), None, "{bad}");
        }
    }
}
