//! Keyset pagination of E2B's lists (`GET /v2/sandboxes`, `GET /snapshots`): items are
//! ordered by (creation second, id), a page is at most `limit` of them, and when more
//! follow the answer carries `X-Next-Token`, an opaque token naming the last item
//! served (absent on the last page). Keyset rather than offset: items created or
//! deleted between two calls neither repeat nor shift the next page.
//!
//! The token is URL-safe base64 of `<unix second>__<id>`, with `__asc` for the
//! ascending order (E2B's own layout, with a unix second for its RFC 3339 time). A token
//! that does not decode, or was made for the other order, is E2B's 400 `Invalid next
//! token`: replayed under the other order it would serve rows already seen.
use axum::http::HeaderValue;
use axum::response::{IntoResponse, Response};
use axum::Json;
use base64::engine::general_purpose::URL_SAFE;
use base64::Engine;
use serde::Serialize;

use super::ControlError;

/// E2B's default and largest page.
pub const MAX_LIMIT: usize = 100;

/// A token is at most this long: an id and a timestamp, base64-encoded.
const MAX_TOKEN_LEN: usize = 1024;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Order {
    Asc,
    Desc,
}

/// Where a page starts and how long it is.
#[derive(Debug)]
pub struct Page {
    pub limit: usize,
    pub order: Order,
    after: Option<(u64, String)>,
}

/// E2B's message for a query parameter its OpenAPI validator refuses.
pub fn bad_param(name: &str, why: &str) -> ControlError {
    ControlError::BadRequest(format!(
        "validation error: error in openapi3filter.RequestError: parameter \"{name}\" in query \
         has an error: {why}"
    ))
}

/// `order=asc|desc` (default: newest first).
pub fn order(raw: Option<&str>) -> Result<Order, ControlError> {
    match raw {
        None | Some("desc") => Ok(Order::Desc),
        Some("asc") => Ok(Order::Asc),
        Some(_) => Err(bad_param(
            "order",
            "value is not one of the allowed values [\"asc\",\"desc\"]",
        )),
    }
}

impl Page {
    /// A page from the query's `limit` (1..=100, default 100) and `nextToken`.
    pub fn new(
        limit: Option<&str>,
        token: Option<&str>,
        order: Order,
    ) -> Result<Page, ControlError> {
        let limit = match limit {
            None => MAX_LIMIT,
            Some(raw) => {
                let n: i64 = raw.parse().map_err(|_| {
                    bad_param(
                        "limit",
                        &format!("value {raw}: an invalid integer: invalid syntax"),
                    )
                })?;
                if n < 1 {
                    return Err(bad_param("limit", "number must be at least 1"));
                }
                if n > MAX_LIMIT as i64 {
                    return Err(bad_param("limit", "number must be at most 100"));
                }
                n as usize
            }
        };
        let after = match token.filter(|t| !t.is_empty()) {
            None => None,
            Some(t) => Some(
                parse_token(t, order)
                    .ok_or_else(|| ControlError::BadRequest("Invalid next token".into()))?,
            ),
        };
        Ok(Page {
            limit,
            order,
            after,
        })
    }

    /// This page of `items` (in any order) and the next page's token, if any follows.
    pub fn take<T>(
        &self,
        mut items: Vec<T>,
        key: impl Fn(&T) -> (u64, &str),
    ) -> (Vec<T>, Option<String>) {
        items.sort_by(|a, b| {
            let by = key(a).cmp(&key(b));
            match self.order {
                Order::Asc => by,
                Order::Desc => by.reverse(),
            }
        });
        if let Some((at, id)) = &self.after {
            let cursor = (*at, id.as_str());
            items.retain(|i| match self.order {
                Order::Asc => key(i) > cursor,
                Order::Desc => key(i) < cursor,
            });
        }
        let next = (items.len() > self.limit).then(|| {
            let (at, id) = key(&items[self.limit - 1]);
            token(at, id, self.order)
        });
        items.truncate(self.limit);
        (items, next)
    }
}

fn token(at: u64, id: &str, order: Order) -> String {
    let suffix = if order == Order::Asc { "__asc" } else { "" };
    URL_SAFE.encode(format!("{at}__{id}{suffix}"))
}

fn parse_token(t: &str, order: Order) -> Option<(u64, String)> {
    if t.len() > MAX_TOKEN_LEN {
        return None;
    }
    let text = String::from_utf8(URL_SAFE.decode(t).ok()?).ok()?;
    let parts: Vec<&str> = text.split("__").collect();
    let (at, id, made_for) = match parts.as_slice() {
        [at, id] => (at, id, Order::Desc),
        [at, id, "asc"] => (at, id, Order::Asc),
        _ => return None,
    };
    (made_for == order).then_some(())?;
    Some((at.parse().ok()?, id.to_string()))
}

/// A page as E2B answers it: 200, the items, and `X-Next-Token` when more follow.
pub fn answer<T: Serialize>(items: Vec<T>, next: Option<String>) -> Response {
    let mut resp = Json(items).into_response();
    if let Some(v) = next.and_then(|n| HeaderValue::from_str(&n).ok()) {
        resp.headers_mut().insert("x-next-token", v);
    }
    resp
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pages_follow_each_other_without_repeats() {
        let items: Vec<(u64, String)> = (0..7).map(|i| (i / 2, format!("sb-{i}"))).collect();
        for order in [Order::Asc, Order::Desc] {
            let mut seen = Vec::new();
            let mut token: Option<String> = None;
            loop {
                let page = Page::new(Some("3"), token.as_deref(), order).unwrap();
                let (got, next) = page.take(items.clone(), |(t, id)| (*t, id.as_str()));
                assert!(got.len() <= 3);
                seen.extend(got);
                match next {
                    Some(n) => token = Some(n),
                    None => break,
                }
            }
            let mut want = items.clone();
            if order == Order::Desc {
                want.reverse();
            }
            assert_eq!(seen, want, "{order:?}");
        }
    }

    #[test]
    fn bad_limits_and_tokens_are_refused() {
        for (limit, why) in [
            ("0", "at least 1"),
            ("101", "at most 100"),
            ("x", "invalid integer"),
        ] {
            let e = Page::new(Some(limit), None, Order::Desc).unwrap_err();
            assert!(e.to_string().contains(why), "{e}");
        }
        let asc = token(5, "sb-1", Order::Asc);
        assert!(Page::new(None, Some(&asc), Order::Asc).is_ok());
        for bad in [asc.as_str(), "!!", "Zm9v", &"A".repeat(2000)] {
            let e = Page::new(None, Some(bad), Order::Desc).unwrap_err();
            assert_eq!(e.to_string(), "Invalid next token");
        }
        assert!(order(Some("up")).is_err());
    }
}
