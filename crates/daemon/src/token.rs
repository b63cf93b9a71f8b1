//! The API token: the forms in which a request presents it, and the removal of every
//! form of it from a request on its way to a guest. A module of its own because two
//! servers check it: the API (`crate::api`, which also decides which routes take
//! which form) and the port proxy (`crate::proxy`).
//!
//! Forms: `Authorization: Bearer <token>` (every route, and the port proxy); and, on
//! the pty route only, a WebSocket subprotocol `zygote.bearer.<token>`, because a
//! browser cannot set `Authorization` on a WebSocket (see `crate::api::pty`). Anywhere
//! else that subprotocol means nothing: a credential is taken only where it is needed.
//!
//! The port proxy forwards clients' requests to guests, which are hostile: before one
//! leaves, [`remove_token`] takes out every copy of the token, in any of these forms or
//! in any other header, so no guest ever sees it, whatever the client sent.
use axum::http::header::{self, HeaderMap, HeaderName, HeaderValue};
use base64::Engine;

/// Prefix of a subprotocol entry carrying the bearer token.
const TOKEN_PROTOCOL_PREFIX: &str = "zygote.bearer.";

/// Constant-time comparison, so response timing does not leak the token.
pub(crate) fn token_matches(given: &[u8], expected: &[u8]) -> bool {
    given.len() == expected.len()
        && given
            .iter()
            .zip(expected)
            .fold(0u8, |acc, (a, b)| acc | (a ^ b))
            == 0
}

/// The token of an `Authorization: Bearer <token>` header value. The scheme name
/// is case-insensitive (RFC 7235 section 2.1: `bearer`, `BEARER` work too) and
/// may be followed by several spaces; the token itself is compared exactly.
fn bearer_token(value: &str) -> Option<&str> {
    let (scheme, token) = value.split_once(' ')?;
    scheme
        .eq_ignore_ascii_case("bearer")
        .then(|| token.trim_start_matches(' '))
}

/// The token offered as a `zygote.bearer.<token>` subprotocol of a WebSocket
/// upgrade request, if any.
fn protocol_token(headers: &HeaderMap) -> Option<&str> {
    let upgrade = headers.get(header::UPGRADE)?.to_str().ok()?;
    if !upgrade.eq_ignore_ascii_case("websocket") {
        return None;
    }
    headers
        .get_all(header::SEC_WEBSOCKET_PROTOCOL)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .find_map(|p| p.trim().strip_prefix(TOKEN_PROTOCOL_PREFIX))
}

/// Whether `headers` present `token`: in the first `Authorization` header, or, when
/// there is none and `subprotocol` allows it, as a token subprotocol.
pub(crate) fn presents(headers: &HeaderMap, token: &str, subprotocol: bool) -> bool {
    let given = match headers.get(header::AUTHORIZATION) {
        Some(v) => v.to_str().ok().and_then(bearer_token),
        None if subprotocol => protocol_token(headers),
        None => None,
    };
    given.is_some_and(|g| token_matches(g.as_bytes(), token.as_bytes()))
}

/// Removes every copy of `token` from `headers`, for a request on its way to a guest:
/// `Proxy-Authorization` (credentials for a proxy, never for what is behind it), each
/// `zygote.bearer.*` entry of `Sec-WebSocket-Protocol` (whoever's token it carries: the
/// form is ours), and any header value that contains the token, an `Authorization:
/// Basic` value's decoded credentials included (the guest's own `Authorization`
/// headers stay). Values are dropped whole: a value with the token in it has nothing a
/// guest should get.
pub(crate) fn remove_token(headers: &mut HeaderMap, token: &str) {
    headers.remove(header::PROXY_AUTHORIZATION);
    let mut current: Option<HeaderName> = None;
    for (name, value) in std::mem::take(headers) {
        // A name's further values come without it.
        if name.is_some() {
            current = name;
        }
        let Some(name) = current.as_ref() else {
            continue;
        };
        let value = if name == header::SEC_WEBSOCKET_PROTOCOL {
            match without_token_protocols(&value) {
                Some(v) => v,
                None => continue,
            }
        } else {
            value
        };
        if !carries(&value, token) {
            headers.append(name.clone(), value);
        }
    }
}

/// A `Sec-WebSocket-Protocol` value without its `zygote.bearer.*` entries (None: none
/// left).
fn without_token_protocols(value: &HeaderValue) -> Option<HeaderValue> {
    let prefix = TOKEN_PROTOCOL_PREFIX.as_bytes();
    let ours = |p: &[u8]| {
        p.get(..prefix.len())
            .is_some_and(|s| s.eq_ignore_ascii_case(prefix))
    };
    let kept: Vec<&[u8]> = value
        .as_bytes()
        .split(|&b| b == b',')
        .map(<[u8]>::trim_ascii)
        .filter(|p| !p.is_empty() && !ours(p))
        .collect();
    if kept.is_empty() {
        return None;
    }
    HeaderValue::from_bytes(&kept.join(&b", "[..])).ok()
}

/// Whether a header value contains `token`, as it is or in the decoded credentials of
/// `Basic <base64>`.
fn carries(value: &HeaderValue, token: &str) -> bool {
    let (value, token) = (value.as_bytes(), token.as_bytes());
    contains(value, token) || basic_credentials(value).is_some_and(|c| contains(&c, token))
}

/// The decoded `user:password` of a `Basic <base64>` value.
fn basic_credentials(value: &[u8]) -> Option<Vec<u8>> {
    let space = value.iter().position(|&b| b == b' ')?;
    let (scheme, rest) = value.split_at(space);
    if !scheme.eq_ignore_ascii_case(b"basic") {
        return None;
    }
    base64::engine::general_purpose::STANDARD
        .decode(rest.trim_ascii())
        .ok()
}

/// Whether `token` (not empty) occurs in `haystack`; every position is compared in
/// constant time, so how long this takes says nothing about how much of it matched.
fn contains(haystack: &[u8], token: &[u8]) -> bool {
    !token.is_empty()
        && haystack
            .windows(token.len())
            .fold(false, |found, w| found | token_matches(w, token))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bearer_scheme_is_case_insensitive() {
        for v in [
            "Bearer abc",
            "bearer abc",
            "BEARER abc",
            "bEaReR abc",
            "Bearer   abc",
        ] {
            assert_eq!(bearer_token(v), Some("abc"), "{v:?}");
        }
        for v in ["Basic abc", "Bearerabc", "abc", "", "Bear abc"] {
            assert_eq!(bearer_token(v), None, "{v:?}");
        }
    }

    #[test]
    fn token_comparison() {
        assert!(token_matches(b"abc", b"abc"));
        assert!(!token_matches(b"abd", b"abc"));
        assert!(!token_matches(b"ab", b"abc"));
        assert!(!token_matches(b"", b"abc"));
    }

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(
                HeaderName::from_bytes(k.as_bytes()).unwrap(),
                HeaderValue::from_str(v).unwrap(),
            );
        }
        h
    }

    #[test]
    fn the_token_subprotocol_is_read_only_on_websocket_upgrades_and_where_allowed() {
        let mut h = headers(&[(
            "sec-websocket-protocol",
            "zygote.pty.v1, zygote.bearer.abc123",
        )]);
        assert_eq!(protocol_token(&h), None);
        assert!(!presents(&h, "abc123", true));
        h.insert(header::UPGRADE, HeaderValue::from_static("WebSocket"));
        assert_eq!(protocol_token(&h), Some("abc123"));
        assert!(presents(&h, "abc123", true));
        assert!(
            !presents(&h, "abc123", false),
            "only where the route takes it"
        );
        assert!(!presents(&h, "other", true));
        // An Authorization header, right or wrong, is the credential when present.
        h.insert(
            header::AUTHORIZATION,
            HeaderValue::from_static("Bearer nope"),
        );
        assert!(!presents(&h, "abc123", true));
        h.insert(
            header::AUTHORIZATION,
            HeaderValue::from_static("Bearer abc123"),
        );
        assert!(presents(&h, "abc123", false));
        let h = headers(&[
            ("upgrade", "websocket"),
            ("sec-websocket-protocol", "zygote.pty.v1"),
        ]);
        assert_eq!(protocol_token(&h), None);
    }

    const TOKEN: &str = "0123456789abcdef0123456789abcdef";

    /// Every value of `h` as `name: value` lines, sorted (a map keeps no order between
    /// names; a name's values stay in order).
    fn lines(h: &HeaderMap) -> Vec<String> {
        let mut lines: Vec<String> = h
            .iter()
            .map(|(k, v)| format!("{k}: {}", String::from_utf8_lossy(v.as_bytes())))
            .collect();
        lines.sort();
        lines
    }

    #[test]
    fn every_copy_of_the_token_goes_and_nothing_else() {
        let basic = base64::engine::general_purpose::STANDARD.encode(format!("git:{TOKEN}"));
        let mut h = headers(&[
            ("authorization", "Bearer the-guests-own"),
            ("authorization", &format!("Bearer {TOKEN}")),
            ("authorization", &format!("bearer    {TOKEN}")),
            ("authorization", &format!("token {TOKEN}")),
            ("authorization", &format!("Basic {basic}")),
            ("authorization", "Basic dXNlcjpwYXNz"),
            ("authorization", &format!("Bearer {TOKEN}-and-more")),
            ("proxy-authorization", "Basic dXNlcjpwYXNz"),
            (
                "sec-websocket-protocol",
                &format!("chat, zygote.bearer.{TOKEN}"),
            ),
            ("sec-websocket-protocol", &format!("Zygote.Bearer.{TOKEN}")),
            (
                "sec-websocket-protocol",
                "zygote.bearer.someone-else ,v2.chat",
            ),
            ("x-api-key", TOKEN),
            ("cookie", &format!("a=1; t={TOKEN}")),
            ("cookie", "b=2"),
            ("x-app", "kept"),
        ]);
        remove_token(&mut h, TOKEN);
        assert_eq!(
            lines(&h),
            [
                "authorization: Basic dXNlcjpwYXNz",
                "authorization: Bearer the-guests-own",
                "cookie: b=2",
                "sec-websocket-protocol: chat",
                "sec-websocket-protocol: v2.chat",
                "x-app: kept",
            ]
        );
    }

    #[test]
    fn a_header_of_token_subprotocols_only_goes_whole() {
        let mut h = headers(&[("sec-websocket-protocol", &format!("zygote.bearer.{TOKEN}"))]);
        remove_token(&mut h, TOKEN);
        assert!(h.is_empty(), "{h:?}");
        // Nor does an empty token take everything with it.
        let mut h = headers(&[("authorization", "Bearer x"), ("x-app", "1")]);
        remove_token(&mut h, "");
        assert_eq!(h.len(), 2);
    }

    #[test]
    fn opaque_bytes_are_searched_too() {
        let mut h = HeaderMap::new();
        let mut v = b"\xffBearer ".to_vec();
        v.extend_from_slice(TOKEN.as_bytes());
        h.insert(header::AUTHORIZATION, HeaderValue::from_bytes(&v).unwrap());
        h.insert("x-other", HeaderValue::from_bytes(b"\xfe\xff").unwrap());
        remove_token(&mut h, TOKEN);
        assert_eq!(lines(&h), ["x-other: \u{fffd}\u{fffd}"]);
    }
}
