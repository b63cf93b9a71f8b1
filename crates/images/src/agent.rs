//! The in-guest agent binary that every image carries as `/sbin/zygote-agent`.
use std::path::PathBuf;
use std::process::Command;

use crate::error::{ImageError, Result};
use crate::exec::{run_streaming, Progress};
use crate::paths::repo_root;

/// The agent is static (musl) so that it runs on any root filesystem,
/// including busybox-only ones without a libc.
pub const AGENT_TARGET: &str = "x86_64-unknown-linux-musl";

/// Path of a static `zygote-agent`: `$ZYGOTE_AGENT_BIN` if set (for installs
/// without a source tree), else built with cargo from the source tree (an
/// up-to-date build costs about a second).
pub fn build_agent(progress: Progress<'_>) -> Result<PathBuf> {
    if let Some(bin) = std::env::var_os("ZYGOTE_AGENT_BIN").filter(|b| !b.is_empty()) {
        return Ok(PathBuf::from(bin));
    }
    cargo_build_bin(
        "zygote-agent",
        "zygote-agent",
        Some(AGENT_TARGET),
        true,
        progress,
    )
}

/// Builds one binary of the workspace and returns its path, which cargo
/// reports in its JSON messages (so CARGO_TARGET_DIR and friends are honoured).
pub fn cargo_build_bin(
    package: &str,
    bin: &str,
    target: Option<&str>,
    release: bool,
    progress: Progress<'_>,
) -> Result<PathBuf> {
    let repo = repo_root("building workspace binaries")?;
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut cmd = Command::new(cargo);
    cmd.current_dir(&repo).args([
        "build",
        "--message-format=json-render-diagnostics",
        "-p",
        package,
        "--bin",
        bin,
    ]);
    if release {
        cmd.arg("--release");
    }
    if let Some(t) = target {
        cmd.args(["--target", t]);
    }
    let what = format!("cargo build -p {package}");
    let stdout = run_streaming(&mut cmd, &what, true, progress)?;
    stdout
        .iter()
        .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
        .filter(|msg| msg["reason"] == "compiler-artifact" && msg["target"]["name"] == bin)
        .filter_map(|msg| msg["executable"].as_str().map(PathBuf::from))
        .next_back()
        .ok_or_else(|| ImageError::BadOutput {
            what,
            detail: format!("cargo reported no executable for {bin}"),
        })
}
