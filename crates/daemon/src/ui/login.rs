//! One-time login codes for the web console.
//!
//! `zygote ui` asks for a code (`POST /v1/console/login`, with the token) and opens
//! `/ui/#login=<code>`; the page posts the code to `/ui/login` and gets the token back.
//! So the token never appears in a URL (server or proxy logs, browser history), and the
//! URL that does carry a code is worth nothing after its first use or after
//! [`CODE_TTL`]. A code is 256 random bits, so guessing one is not a concern; the
//! comparison is still constant-time, like the token's.
use std::sync::Mutex;
use std::time::{Duration, Instant};

use axum::extract::{Request, State};
use axum::http::header;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::{Deserialize, Serialize};

/// The largest login body read: `{"code": "<64 hex digits>"}` and some slack. Anyone
/// may post here, so nothing bigger is ever buffered.
const MAX_LOGIN_BODY: usize = 1024;

use crate::api::AppState;
use crate::error::Error;
use crate::token::token_matches;

/// How long a code may wait for its browser: enough to open it, short enough that a
/// code left in a terminal's scrollback is stale.
pub const CODE_TTL: Duration = Duration::from_secs(60);

/// Codes kept at once; issuing more forgets the oldest (a token holder could otherwise
/// grow the daemon's memory by asking in a loop).
const MAX_PENDING: usize = 32;

struct Pending {
    code: String,
    expires: Instant,
}

/// The codes issued and not yet used or expired.
pub struct LoginCodes {
    ttl: Duration,
    pending: Mutex<Vec<Pending>>,
}

impl Default for LoginCodes {
    fn default() -> Self {
        LoginCodes::with_ttl(CODE_TTL)
    }
}

impl LoginCodes {
    pub fn with_ttl(ttl: Duration) -> LoginCodes {
        LoginCodes {
            ttl,
            pending: Mutex::new(Vec::new()),
        }
    }

    pub fn ttl(&self) -> Duration {
        self.ttl
    }

    /// A new code, valid once for [`LoginCodes::ttl`].
    pub fn issue(&self) -> String {
        let code = crate::ids::random_hex(32);
        let now = Instant::now();
        let mut pending = self.pending.lock().expect("login codes lock");
        pending.retain(|p| p.expires > now);
        if pending.len() >= MAX_PENDING {
            pending.remove(0);
        }
        pending.push(Pending {
            code: code.clone(),
            expires: now + self.ttl,
        });
        code
    }

    /// Whether `given` is a live code; if so it is used up.
    pub fn redeem(&self, given: &str) -> bool {
        let now = Instant::now();
        let mut pending = self.pending.lock().expect("login codes lock");
        pending.retain(|p| p.expires > now);
        // Every pending code is compared, so the time taken says nothing about which
        // (or how much of one) matched.
        let mut found = None;
        for (i, p) in pending.iter().enumerate() {
            if token_matches(given.as_bytes(), p.code.as_bytes()) {
                found = Some(i);
            }
        }
        found.map(|i| pending.remove(i)).is_some()
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Exchange {
    code: String,
}

#[derive(Serialize)]
struct Session {
    /// The API token: the page keeps it in `sessionStorage` (this tab only) and sends it
    /// as `Authorization`, never in a URL.
    token: String,
}

/// `POST /ui/login {"code"}`: the token for a live code, else 401. Not an API route
/// (no token can be asked for it), so not in the OpenAPI document.
pub async fn exchange(State(st): State<AppState>, req: Request) -> Response {
    let code = match read_code(req).await {
        Ok(code) => code,
        Err(e) => return e.into_response(),
    };
    if !st.logins.redeem(&code) {
        tracing::info!("console login refused (unknown, used or expired code)");
        return Error::Unauthorized.into_response();
    }
    tracing::info!("console login");
    let session = Session {
        token: st.token.as_str().to_owned(),
    };
    ([(header::CACHE_CONTROL, "no-store")], Json(session)).into_response()
}

async fn read_code(req: Request) -> Result<String, Error> {
    let (_, body) = crate::api::read_body(req, MAX_LOGIN_BODY, "a console login").await?;
    let exchange: Exchange = serde_json::from_slice(&body)
        .map_err(|e| Error::MalformedBody(format!("a console login is {{\"code\"}}: {e}")))?;
    Ok(exchange.code)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_code_works_once_and_others_never() {
        let codes = LoginCodes::default();
        let a = codes.issue();
        let b = codes.issue();
        assert_eq!(a.len(), 64);
        assert_ne!(a, b);
        assert!(!codes.redeem("wrong"));
        assert!(!codes.redeem(""));
        assert!(!codes.redeem(&a[..63]), "a prefix is not the code");
        assert!(codes.redeem(&a));
        assert!(!codes.redeem(&a), "used up");
        assert!(codes.redeem(&b), "the other code is still good");
    }

    #[test]
    fn codes_expire() {
        let codes = LoginCodes::with_ttl(Duration::from_millis(50));
        let a = codes.issue();
        std::thread::sleep(Duration::from_millis(80));
        assert!(!codes.redeem(&a));
    }

    #[test]
    fn only_the_newest_codes_are_kept() {
        let codes = LoginCodes::default();
        let first = codes.issue();
        let rest: Vec<String> = (0..MAX_PENDING).map(|_| codes.issue()).collect();
        assert!(!codes.redeem(&first), "pushed out");
        assert!(rest.iter().all(|c| codes.redeem(c)));
    }
}
