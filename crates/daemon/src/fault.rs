//! Fault injection for crash-consistency tests: with `ZYGOTE_FAULT=<point>` in its
//! environment, the daemon kills itself with SIGKILL the first time it reaches the named
//! point, exactly as a crash there would. Multi-step operations (branch, snapshot,
//! restore, delete) call [`point`] between their steps; the tests start a daemon with
//! each point in turn, restart it without one and check that start-up finished or
//! rolled back the interrupted work (`crates/daemon/tests/crash.rs`).
//!
//! Unset (always, outside tests), a point costs one comparison.
use std::sync::OnceLock;

/// The environment variable naming the point to die at.
pub const ENV: &str = "ZYGOTE_FAULT";

fn armed() -> Option<&'static str> {
    static ARMED: OnceLock<Option<String>> = OnceLock::new();
    ARMED
        .get_or_init(|| std::env::var(ENV).ok().filter(|s| !s.is_empty()))
        .as_deref()
}

/// Dies here with SIGKILL if `ZYGOTE_FAULT` names this point.
pub fn point(name: &str) {
    if armed() != Some(name) {
        return;
    }
    // Written directly (not through tracing) so the line is out before the signal.
    eprintln!("zygoted: fault injection: killed at {name} ({ENV})");
    // SAFETY: raise(3) has no memory-safety preconditions; SIGKILL ends the process here.
    unsafe { libc::raise(libc::SIGKILL) };
}
