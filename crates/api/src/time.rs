//! The API's clock: every timestamp it carries (`created_at`, `expires_at`, ...) is
//! whole unix seconds.

/// Now, in unix seconds.
pub fn now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
        .as_secs()
}
