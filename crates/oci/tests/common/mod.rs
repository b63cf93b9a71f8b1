//! Shared fixture for zygote-oci's integration tests: a throwaway local registry (anonymous,
//! htpasswd or bearer-token auth), layer tarballs and OCI layouts built from a spec, and
//! skopeo-driven pushes, multi-platform indexes and docker archives.
//!
//! Everything listens on 127.0.0.1 only; every process is killed and every temp dir removed
//! on drop. A missing tool is reported as an `Err` starting with [`MISSING`]: use
//! [`or_skip!`] so such tests print `skipping <test>: <reason>` and pass (set
//! `ZYGOTE_OCI_REQUIRE_TOOLS=1` to make them fail instead); any other error panics.
//!
//! Side effect outside temp dirs: skopeo run as root keeps its blob-info cache in
//! /var/lib/containers/cache (see [`skopeo::push_zstd`] for why that matters).
#![allow(dead_code)]

pub mod fake;
pub mod http;
pub mod layers;
pub mod registry;
pub mod skopeo;
mod token;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

// Re-exports for test files; each uses a different subset.
#[allow(unused_imports)]
pub use http::Response;
#[allow(unused_imports)]
pub use layers::{build_layout, layer_tar, sample_spec, Config, Entry, ImageSpec, LayoutRef};
#[allow(unused_imports)]
pub use registry::{Auth, Registry};
#[allow(unused_imports)]
pub use skopeo::{docker_archive, push, push_index, push_zstd, skopeo_inspect, Format, Platform};

/// Prefix of errors that mean "tool not installed", so callers can skip rather than fail.
pub const MISSING: &str = "missing tool";

/// Unwraps a fixture result; a missing tool makes the calling test print why and return.
#[allow(unused_macros)]
macro_rules! or_skip {
    ($e:expr) => {
        match $e {
            Ok(v) => v,
            Err(e) => {
                $crate::common::skip_or_panic(e);
                return;
            }
        }
    };
}
#[allow(unused_imports)]
pub(crate) use or_skip;

/// Decides between skip and failure for [`or_skip!`]; returns only when the test should skip.
#[doc(hidden)]
pub fn skip_or_panic(err: String) {
    let strict = std::env::var_os("ZYGOTE_OCI_REQUIRE_TOOLS").is_some_and(|v| v == "1");
    if !err.starts_with(MISSING) || strict {
        panic!("fixture failed: {err}");
    }
    let test = std::thread::current().name().unwrap_or("test").to_owned();
    eprintln!("skipping {test}: {err}");
}

/// Finds a tool in PATH, so a test can skip with a reason instead of failing obscurely.
pub fn which(tool: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|d| d.join(tool))
        .find(|p| p.is_file())
}

/// Checks that every tool is installed; the error names the first missing one.
pub fn require_tools(tools: &[&str]) -> Result<(), String> {
    match tools.iter().find(|t| which(t).is_none()) {
        Some(t) => Err(format!("{MISSING}: `{t}` is not in PATH")),
        None => Ok(()),
    }
}

/// Runs a command to completion; the error carries the command line and its stderr.
pub fn run(cmd: &mut Command) -> Result<Output, String> {
    let line = format!("{cmd:?}");
    let out = cmd.output().map_err(|e| format!("{line}: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "{line} failed ({}): {}{}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim(),
            String::from_utf8_lossy(&out.stdout).trim()
        ));
    }
    Ok(out)
}

/// `sha256:<hex>` of some bytes, the digest form registries and layouts use.
pub fn sha256_digest(data: &[u8]) -> String {
    use sha2::Digest;
    format!("sha256:{}", hex::encode(sha2::Sha256::digest(data)))
}

/// Reads a JSON file into a value, with the path in the error.
pub fn read_json(path: &Path) -> Result<serde_json::Value, String> {
    let text = std::fs::read(path).map_err(|e| format!("{}: {e}", path.display()))?;
    serde_json::from_slice(&text).map_err(|e| format!("{}: {e}", path.display()))
}

const B64: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

/// Standard padded base64 (Basic auth headers); no dev-dependency needed for this.
pub fn base64(data: &[u8]) -> String {
    let mut out = String::with_capacity(data.len().div_ceil(3) * 4);
    for chunk in data.chunks(3) {
        let n = chunk
            .iter()
            .enumerate()
            .fold(0u32, |n, (i, b)| n | ((*b as u32) << (16 - 8 * i)));
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(B64[((n >> (18 - 6 * i)) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

/// Unpadded URL-safe base64, as JWT segments require.
pub fn base64url(data: &[u8]) -> String {
    base64(data)
        .trim_end_matches('=')
        .replace('+', "-")
        .replace('/', "_")
}

/// Decodes standard or URL-safe base64 (padding optional); `None` on bad input.
pub fn base64_decode(text: &str) -> Option<Vec<u8>> {
    let mut out = Vec::new();
    let (mut acc, mut bits) = (0u32, 0);
    for c in text.trim_end_matches('=').bytes() {
        let v = match c {
            b'-' => 62,
            b'_' => 63,
            _ => B64.iter().position(|&b| b == c)? as u32,
        };
        acc = (acc << 6) | v;
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            out.push((acc >> bits) as u8);
        }
    }
    Some(out)
}
