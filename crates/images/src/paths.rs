//! Where things live: the cache, the source tree, recipe directories.
use std::path::{Path, PathBuf};

use crate::error::{ImageError, Result};

/// Root of zygote's cache: `$ZYGOTE_CACHE_DIR`, else `~/.cache/zygote`.
pub fn cache_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("ZYGOTE_CACHE_DIR").filter(|d| !d.is_empty()) {
        return PathBuf::from(dir);
    }
    home_dir().join(".cache").join("zygote")
}

/// `ZYGOTE_PREBUILT=1`: use the kernel and images already in the cache and never build
/// them. For hosts that have the artifacts but neither the source tree nor a toolchain
/// (the nested lane's L1 host, an installed zygote fed a copied cache).
pub fn prebuilt_only() -> bool {
    std::env::var_os("ZYGOTE_PREBUILT").is_some_and(|v| !v.is_empty() && v != "0")
}

/// Built kernels, one directory per cache key (see `guest/kernel/build.sh`).
pub fn kernel_cache_dir() -> PathBuf {
    cache_dir().join("kernel")
}

/// Content-addressed root filesystem images and their metadata.
pub fn images_dir() -> PathBuf {
    cache_dir().join("images")
}

/// Cached debootstrap trees, keyed by what went into them.
pub fn debootstrap_dir() -> PathBuf {
    cache_dir().join("debootstrap")
}

fn home_dir() -> PathBuf {
    std::env::var_os("HOME")
        .filter(|h| !h.is_empty())
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/root"))
}

/// The zygote source tree: `$ZYGOTE_REPO`, else the workspace this crate was
/// compiled from. Building kernels and the agent needs the scripts and sources
/// in it, so an installed binary without a checkout must point ZYGOTE_REPO at one.
pub fn repo_root(what: &str) -> Result<PathBuf> {
    let candidate = match std::env::var_os("ZYGOTE_REPO").filter(|r| !r.is_empty()) {
        Some(dir) => PathBuf::from(dir),
        None => Path::new(env!("CARGO_MANIFEST_DIR")).join("../.."),
    };
    if candidate.join("guest/kernel/build.sh").is_file() {
        Ok(candidate.canonicalize().unwrap_or(candidate))
    } else {
        Err(ImageError::RepoNotFound {
            what: what.to_string(),
            tried: candidate,
        })
    }
}

/// Directories searched for `<name>.recipe`, first match wins:
/// `$ZYGOTE_RECIPE_PATH` (colon-separated), `~/.config/zygote/recipes`, then the
/// built-in `guest/rootfs/recipes` of the source tree. User directories come
/// first so a user can shadow a built-in recipe.
pub fn recipe_dirs() -> Vec<PathBuf> {
    let mut dirs = Vec::new();
    if let Some(path) = std::env::var_os("ZYGOTE_RECIPE_PATH") {
        dirs.extend(std::env::split_paths(&path).filter(|p| !p.as_os_str().is_empty()));
    }
    dirs.push(home_dir().join(".config/zygote/recipes"));
    if let Ok(repo) = repo_root("recipes") {
        dirs.push(repo.join("guest/rootfs/recipes"));
    }
    dirs
}
