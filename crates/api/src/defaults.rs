//! Where a local daemon is found: the address it listens on and the state directory
//! holding its token, unless told otherwise. The daemon and its clients must agree on
//! both, so they are decided here only.
use std::path::{Path, PathBuf};

/// Default TCP address (loopback only: the token is the only protection).
pub const DEFAULT_LISTEN: &str = "127.0.0.1:7420";

/// The API token's file in the state directory.
pub const TOKEN_FILE: &str = "token";

/// The state directory a daemon (and a client looking for its token) uses: `explicit`,
/// else `$ZYGOTE_STATE_DIR`, else `$XDG_STATE_HOME/zygote`, else
/// `~/.local/state/zygote`.
pub fn state_dir(explicit: Option<&Path>) -> PathBuf {
    if let Some(d) = explicit {
        return d.to_path_buf();
    }
    let env = |k: &str| {
        std::env::var_os(k)
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
    };
    if let Some(d) = env("ZYGOTE_STATE_DIR") {
        return d;
    }
    if let Some(d) = env("XDG_STATE_HOME") {
        return d.join("zygote");
    }
    env("HOME")
        .unwrap_or_else(|| PathBuf::from("/root"))
        .join(".local/state/zygote")
}
