//! The agent's token: a per-sandbox secret the daemon presents in the `hello` that opens
//! every connection. The channel's host end is already private to the daemon (a Unix
//! socket in its 0700 state directory); the token is defence in depth, so that reaching
//! that socket (a mistaken mode, a leaked descriptor) is still not enough to run root
//! commands in the guest.
//!
//! A freshly booted agent has no token and takes the first one it is shown (the daemon's
//! bring-up is the first connection: nothing else can reach the channel before it). From
//! then on every connection must present it. A branch child or a restored snapshot wakes
//! up with its source's token, which the daemon knows, and is given its own at once
//! (`new_token`), so a sandbox's token never opens another's agent.
use std::sync::Mutex;

use zygote_proto::{ErrorBody, ErrorCode, HelloRequest};

/// Longest token accepted: the daemon's are 64 hex digits.
const MAX_TOKEN_LEN: usize = 256;

#[derive(Default)]
pub(crate) struct Token(Mutex<Option<String>>);

impl Token {
    /// Whether connections must authenticate (a token was ever set).
    pub(crate) fn is_set(&self) -> bool {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).is_some()
    }

    /// Checks a `hello`: adopts its token if there is none yet, else requires it to match;
    /// then takes `new_token` if given.
    pub(crate) fn hello(&self, req: &HelloRequest) -> Result<(), ErrorBody> {
        for t in std::iter::once(&req.token).chain(req.new_token.as_ref()) {
            if t.is_empty() || t.len() > MAX_TOKEN_LEN {
                return Err(ErrorBody::new(
                    ErrorCode::BadRequest,
                    format!("a token is 1 to {MAX_TOKEN_LEN} bytes"),
                ));
            }
        }
        let mut current = self.0.lock().unwrap_or_else(|p| p.into_inner());
        match current.as_deref() {
            Some(expected) if !same(expected.as_bytes(), req.token.as_bytes()) => {
                return Err(ErrorBody::new(
                    ErrorCode::Unauthorized,
                    "wrong token for this sandbox's agent",
                ));
            }
            _ => {}
        }
        *current = Some(req.new_token.clone().unwrap_or_else(|| req.token.clone()));
        Ok(())
    }
}

/// Compares in time independent of where the inputs differ (the length is not secret).
fn same(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hello(token: &str, new_token: Option<&str>) -> HelloRequest {
        HelloRequest {
            token: token.into(),
            new_token: new_token.map(Into::into),
        }
    }

    #[test]
    fn the_first_token_is_taken_then_required() {
        let t = Token::default();
        assert!(!t.is_set());
        t.hello(&hello("parent", None)).unwrap();
        assert!(t.is_set());
        t.hello(&hello("parent", None)).unwrap();
        let e = t.hello(&hello("other", None)).unwrap_err();
        assert_eq!(e.code, ErrorCode::Unauthorized);
        // Rotation: only with the current token, and the old one stops working.
        let e = t.hello(&hello("other", Some("child"))).unwrap_err();
        assert_eq!(e.code, ErrorCode::Unauthorized);
        t.hello(&hello("parent", Some("child"))).unwrap();
        assert_eq!(
            t.hello(&hello("parent", None)).unwrap_err().code,
            ErrorCode::Unauthorized
        );
        t.hello(&hello("child", None)).unwrap();
    }

    #[test]
    fn empty_and_huge_tokens_are_refused() {
        let t = Token::default();
        assert_eq!(
            t.hello(&hello("", None)).unwrap_err().code,
            ErrorCode::BadRequest
        );
        let huge = "x".repeat(MAX_TOKEN_LEN + 1);
        assert_eq!(
            t.hello(&hello("ok", Some(&huge))).unwrap_err().code,
            ErrorCode::BadRequest
        );
        assert!(!t.is_set(), "a refused hello sets nothing");
    }

    #[test]
    fn comparison() {
        assert!(same(b"abc", b"abc"));
        assert!(!same(b"abc", b"abd"));
        assert!(!same(b"abc", b"ab"));
    }
}
