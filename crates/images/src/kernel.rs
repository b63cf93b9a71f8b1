//! The guest kernel: built by `guest/kernel/build.sh`, which owns the cache key
//! (sha256 of source package version + config fragment + script) so that the
//! shell and Rust paths cannot disagree about it.
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::error::{ImageError, IoContext, Result};
use crate::exec::{run_streaming, Progress};
use crate::paths::{cache_dir, kernel_cache_dir, prebuilt_only, repo_root};

/// A built kernel and what `build.sh` recorded about it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct KernelInfo {
    /// Uncompressed ELF with a PVH entry note (what QEMU microvm and our VMM load).
    pub vmlinux: PathBuf,
    pub bzimage: PathBuf,
    /// `make kernelrelease`: what `uname -r` prints in the guest.
    pub release: String,
    /// `make kernelversion`.
    pub version: String,
    /// Version of the Debian `linux-source-6.1` package it was built from.
    pub package_version: String,
    /// Cache key: the name of the directory holding the files.
    pub key: String,
}

/// Builds the kernel, or returns the cached one (a cache hit takes a moment:
/// the script only hashes its inputs). Progress lines come from the script.
/// With `ZYGOTE_PREBUILT` set, returns the newest cached kernel and never builds.
pub fn build_kernel(progress: Progress<'_>) -> Result<KernelInfo> {
    if prebuilt_only() {
        let kernel = newest_cached_kernel(&kernel_cache_dir())?;
        progress(&format!(
            "ZYGOTE_PREBUILT: using {}",
            kernel.vmlinux.display()
        ));
        return Ok(kernel);
    }
    let repo = repo_root("building the guest kernel")?;
    let script = repo.join("guest/kernel/build.sh");
    let stdout = run_streaming(
        Command::new("bash")
            .arg(&script)
            .env("ZYGOTE_CACHE_DIR", cache_dir()),
        "guest/kernel/build.sh",
        true,
        progress,
    )?;
    let vmlinux = stdout
        .iter()
        .rev()
        .find(|l| !l.trim().is_empty())
        .map(|l| PathBuf::from(l.trim()))
        .ok_or_else(|| ImageError::BadOutput {
            what: "guest/kernel/build.sh".into(),
            detail: "no vmlinux path on stdout".into(),
        })?;
    kernel_info(&vmlinux)
}

/// The most recently built kernel in `dir` (one `<key>/` directory per build).
fn newest_cached_kernel(dir: &Path) -> Result<KernelInfo> {
    let built = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path())
        .filter(|d| d.join("vmlinux").is_file() && d.join("info").is_file())
        .max_by_key(|d| {
            std::fs::metadata(d.join("info"))
                .and_then(|m| m.modified())
                .ok()
        });
    match built {
        Some(d) => kernel_info(&d.join("vmlinux")),
        None => Err(ImageError::NotPrebuilt {
            what: "a guest kernel".into(),
            dir: dir.to_path_buf(),
        }),
    }
}

/// Reads the `info` file written next to a built `vmlinux`.
pub fn kernel_info(vmlinux: &Path) -> Result<KernelInfo> {
    let dir = vmlinux.parent().unwrap_or(Path::new("."));
    let info_path = dir.join("info");
    let text =
        std::fs::read_to_string(&info_path).ctx(|| format!("reading {}", info_path.display()))?;
    let fields = parse_info(&text);
    let field = |k: &str| {
        fields.get(k).cloned().ok_or_else(|| ImageError::BadOutput {
            what: info_path.display().to_string(),
            detail: format!("missing {k}="),
        })
    };
    Ok(KernelInfo {
        vmlinux: vmlinux.to_path_buf(),
        bzimage: dir.join("bzImage"),
        release: field("kernelrelease")?,
        version: field("kernelversion")?,
        package_version: field("package_version")?,
        key: field("key")?,
    })
}

fn parse_info(text: &str) -> BTreeMap<String, String> {
    text.lines()
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_info_file() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join("info"),
            "package=linux-source-6.1\npackage_version=6.1.1-1\nkernelversion=6.1.1\n\
             kernelrelease=6.1.1\nkey=abc\n",
        )
        .unwrap();
        let info = kernel_info(&dir.path().join("vmlinux")).unwrap();
        assert_eq!(info.release, "6.1.1");
        assert_eq!(info.package_version, "6.1.1-1");
        assert_eq!(info.key, "abc");
        assert_eq!(info.bzimage, dir.path().join("bzImage"));
    }

    #[test]
    fn newest_cached_kernel_skips_incomplete_directories() {
        let dir = tempfile::tempdir().unwrap();
        let info = |key: &str| {
            format!(
                "package=p\npackage_version=1\nkernelversion=6.1\nkernelrelease=6.1\nkey={key}\n"
            )
        };
        assert!(matches!(
            newest_cached_kernel(dir.path()),
            Err(ImageError::NotPrebuilt { .. })
        ));
        for key in ["old", "new"] {
            let d = dir.path().join(key);
            std::fs::create_dir_all(&d).unwrap();
            std::fs::write(d.join("vmlinux"), b"elf").unwrap();
            std::fs::write(d.join("info"), info(key)).unwrap();
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        // Source and object directories have no info file.
        std::fs::create_dir_all(dir.path().join("build")).unwrap();
        assert_eq!(newest_cached_kernel(dir.path()).unwrap().key, "new");
    }

    #[test]
    fn missing_field_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("info"), "key=abc\n").unwrap();
        let err = kernel_info(&dir.path().join("vmlinux")).unwrap_err();
        assert!(err.to_string().contains("kernelrelease"), "{err}");
    }

    /// The cache key is computed by build.sh itself (`--key`): check that it is
    /// stable and changes with the fragment and with the script.
    #[test]
    fn cache_key_depends_on_fragment_and_script() {
        let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
        let key_of = |dir: &Path| -> String {
            let out = Command::new("bash")
                .arg(dir.join("build.sh"))
                .arg("--key")
                .output()
                .unwrap();
            assert!(
                out.status.success(),
                "{}",
                String::from_utf8_lossy(&out.stderr)
            );
            let key = String::from_utf8(out.stdout).unwrap().trim().to_string();
            assert_eq!(key.len(), 64, "{key}");
            key
        };
        let tmp = tempfile::tempdir().unwrap();
        let copy = |f: &str| {
            std::fs::copy(repo.join("guest/kernel").join(f), tmp.path().join(f)).unwrap();
        };
        copy("zygote.config");
        copy("build.sh");
        let base = key_of(tmp.path());
        assert_eq!(
            base,
            key_of(&repo.join("guest/kernel")),
            "key depends on location"
        );
        let append = |f: &str, extra: &str| {
            let mut text = std::fs::read_to_string(tmp.path().join(f)).unwrap();
            text.push_str(extra);
            std::fs::write(tmp.path().join(f), text).unwrap();
        };
        append("zygote.config", "CONFIG_IPV6=y\n");
        let with_fragment = key_of(tmp.path());
        assert_ne!(base, with_fragment);
        append("build.sh", "# edited\n");
        assert_ne!(with_fragment, key_of(tmp.path()));
    }
}
