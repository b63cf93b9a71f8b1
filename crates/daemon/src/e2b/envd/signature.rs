//! Signed `/files` URLs, E2B's `download_url()` / `upload_url()`: instead of the
//! `X-Access-Token` header the query carries `signature=v1_<b64>` (and optionally
//! `signature_expiration`, unix seconds), where `b64` is unpadded standard base64 of
//! `sha256("{path}:{read|write}:{username or ''}:{token}[:{expiration}]")` (the SDK's
//! `get_signature`). Only the holder of the sandbox's token can make one, and it is
//! good for that one path, operation, user and (when given) time.
//!
//! When `E2B_SANDBOX_URL` is set the SDK's URL carries no routing headers, so the
//! sandbox is the one whose token makes the signature match: each live sandbox's is
//! tried (one sha256 each, compared in constant time), and none matching is 401.
use axum::http::{Method, Uri};
use base64::Engine as _;
use serde::Deserialize;
use sha2::{Digest, Sha256};

use crate::token::token_matches;

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum SignatureError {
    #[error("missing signature query parameter")]
    Missing,
    #[error("invalid signature")]
    Invalid,
    #[error("signature is already expired")]
    Expired,
}

/// The query of a signed `/files` request.
#[derive(Debug, Deserialize)]
pub struct Signed {
    #[serde(default)]
    path: String,
    #[serde(default)]
    username: Option<String>,
    #[serde(default)]
    signature: Option<String>,
    #[serde(default)]
    signature_expiration: Option<String>,
}

impl Signed {
    /// The signing fields of `uri`'s query; `None` when it has no signature (or the
    /// query does not parse).
    pub fn of(uri: &Uri) -> Option<Signed> {
        axum::extract::Query::<Signed>::try_from_uri(uri)
            .ok()
            .map(|q| q.0)
            .filter(|s| s.signature.is_some())
    }

    /// Checks the signature against sandbox token `token` for `method` (GET reads,
    /// POST writes) at unix time `now`.
    pub fn check(&self, method: &Method, token: &str, now: u64) -> Result<(), SignatureError> {
        let given = self.signature.as_deref().ok_or(SignatureError::Missing)?;
        let operation = match *method {
            Method::GET => "read",
            Method::POST => "write",
            _ => return Err(SignatureError::Invalid),
        };
        let expiration = match self.signature_expiration.as_deref() {
            None | Some("") => None,
            Some(e) if e.len() <= 20 => {
                Some(e.parse::<u64>().map_err(|_| SignatureError::Invalid)?)
            }
            Some(_) => return Err(SignatureError::Invalid),
        };
        let user = self.username.as_deref().unwrap_or("");
        let expected = sign(&self.path, operation, user, token, expiration);
        if !token_matches(given.as_bytes(), expected.as_bytes()) {
            return Err(SignatureError::Invalid);
        }
        match expiration {
            Some(at) if at < now => Err(SignatureError::Expired),
            _ => Ok(()),
        }
    }
}

/// The v1 signature of (path, operation, user, token, expiration), as the SDK makes it.
pub fn sign(
    path: &str,
    operation: &str,
    user: &str,
    token: &str,
    expiration: Option<u64>,
) -> String {
    let raw = match expiration {
        None => format!("{path}:{operation}:{user}:{token}"),
        Some(e) => format!("{path}:{operation}:{user}:{token}:{e}"),
    };
    let digest = Sha256::digest(raw.as_bytes());
    let b64 = base64::engine::general_purpose::STANDARD_NO_PAD.encode(digest);
    format!("v1_{b64}")
}

pub fn now_unix() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn signed(query: &str) -> Signed {
        Signed::of(&format!("/files?{query}").parse().unwrap()).unwrap()
    }

    #[test]
    fn signatures_bind_path_operation_user_token_and_time() {
        // The SDK's get_signature("/tmp/a b", "read", None, "tok"), computed by Python:
        // base64(sha256(b"/tmp/a b:read::tok")).rstrip("=")
        let sig = sign("/tmp/a b", "read", "", "tok", None);
        assert_eq!(sig, "v1_aYnTea2bOHCvGHpk7sDGBlJHpJso0Kp5V2bOpfVpG8U");
        let q = format!("path=%2Ftmp%2Fa%20b&signature={}", sig.replace('/', "%2F"));
        assert_eq!(signed(&q).check(&Method::GET, "tok", 0), Ok(()));
        assert_eq!(
            signed(&q).check(&Method::POST, "tok", 0),
            Err(SignatureError::Invalid)
        );
        assert_eq!(
            signed(&q).check(&Method::GET, "other", 0),
            Err(SignatureError::Invalid)
        );
        let q2 = format!("{q}&username=root");
        assert_eq!(
            signed(&q2).check(&Method::GET, "tok", 0),
            Err(SignatureError::Invalid)
        );

        let timed = sign("/x", "write", "user", "tok", Some(100));
        let q = format!("path=/x&username=user&signature={timed}&signature_expiration=100");
        assert_eq!(signed(&q).check(&Method::POST, "tok", 100), Ok(()));
        assert_eq!(
            signed(&q).check(&Method::POST, "tok", 101),
            Err(SignatureError::Expired)
        );
        let moved = q.replace("=100", "=999");
        assert_eq!(
            signed(&moved).check(&Method::POST, "tok", 0),
            Err(SignatureError::Invalid)
        );
        assert!(Signed::of(&"/files?path=/x".parse().unwrap()).is_none());
    }
}
