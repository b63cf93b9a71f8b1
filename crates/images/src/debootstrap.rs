//! Cached debootstrap trees. Downloading and unpacking Debian takes minutes;
//! the tree is kept under `<cache>/debootstrap/<key>/rootfs` so rebuilding an
//! image (new agent, new extra files) only repacks it.
//!
//! Packages that debootstrap's own dependency resolver cannot install (it follows
//! neither virtual packages nor alternatives: Debian's `npm` is one) are installed
//! afterwards by the tree's own apt-get in a chroot, the way debootstrap's second stage
//! runs the tree's maintainer scripts: Debian's signed packages, on the build host.
//!
//! The key covers suite, variant, package lists, mirror and architecture. It
//! does not cover the mirror's contents changing over time: delete the
//! directory (or pass `refresh_base`) to pick up newer packages.
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::error::{ImageError, IoContext, Result};
use crate::exec::{run_streaming, Progress};
use crate::paths::debootstrap_dir;
use crate::store::FileLock;

/// Bumped when the way trees are prepared changes, to invalidate old trees.
const TREE_FORMAT: &str = "zygote-debootstrap-tree v1";

pub(crate) struct TreeSpec<'a> {
    pub suite: &'a str,
    pub variant: &'a str,
    pub packages: &'a [String],
    /// Installed by apt-get in the tree after debootstrap.
    pub apt_packages: &'a [String],
    pub mirror: &'a str,
}

impl TreeSpec<'_> {
    pub fn key(&self) -> String {
        let sorted = |list: &[String]| {
            let mut list = list.to_vec();
            list.sort();
            list.dedup();
            list.join(",")
        };
        let mut text = format!(
            "{TREE_FORMAT}\nsuite={}\nvariant={}\npackages={}\nmirror={}\narch=amd64\n",
            self.suite,
            self.variant,
            sorted(self.packages),
            self.mirror
        );
        // Only when present, so the trees of recipes without it keep their keys.
        if !self.apt_packages.is_empty() {
            text.push_str(&format!("apt-packages={}\n", sorted(self.apt_packages)));
        }
        crate::sha256_hex(text.as_bytes())
    }
}

/// Returns the path of the cached tree for `spec`, running debootstrap first
/// if needed (or if `refresh`).
pub(crate) fn ensure_tree(spec: &TreeSpec, refresh: bool, progress: Progress) -> Result<PathBuf> {
    let key = spec.key();
    let dir = debootstrap_dir().join(&key);
    let tree = dir.join("rootfs");
    let done = dir.join("complete");
    if done.is_file() && !refresh {
        progress(&format!("debootstrap tree cached: {}", tree.display()));
        return Ok(tree);
    }
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Err(ImageError::NeedsRoot);
    }
    let _lock = FileLock::acquire(&debootstrap_dir().join(format!(".lock-{key}")), progress)?;
    if done.is_file() && !refresh {
        return Ok(tree);
    }
    let tmp = debootstrap_dir().join(format!("{key}.tmp-{}", std::process::id()));
    remove_tree(&tmp)?;
    std::fs::create_dir_all(&tmp).ctx(|| format!("creating {}", tmp.display()))?;
    let mut cmd = Command::new("debootstrap");
    cmd.arg(format!("--variant={}", spec.variant))
        .arg("--arch=amd64")
        .arg("--components=main");
    if !spec.packages.is_empty() {
        cmd.arg(format!("--include={}", spec.packages.join(",")));
    }
    cmd.arg(spec.suite).arg(tmp.join("rootfs")).arg(spec.mirror);
    progress(&format!(
        "debootstrap {} ({}) from {} + {}",
        spec.suite,
        spec.variant,
        spec.mirror,
        if spec.packages.is_empty() {
            "-".into()
        } else {
            spec.packages.join(" ")
        }
    ));
    let result = run_streaming(&mut cmd, "debootstrap", false, progress)
        .and_then(|_| apt_install(&tmp.join("rootfs"), spec.apt_packages, progress));
    if let Err(e) = result {
        let _ = remove_tree(&tmp);
        return Err(e);
    }
    trim_tree(&tmp.join("rootfs"))?;
    std::fs::write(tmp.join("complete"), format!("{TREE_FORMAT}\n"))
        .ctx(|| "marking the tree complete".into())?;
    remove_tree(&dir)?;
    std::fs::rename(&tmp, &dir).ctx(|| format!("moving the tree to {}", dir.display()))?;
    Ok(tree)
}

/// Installs `packages` with the tree's own apt-get, in a chroot (see the module doc).
/// The tree's `/etc/resolv.conf` is debootstrap's copy of the host's, so apt resolves
/// the mirror as the host does.
fn apt_install(root: &Path, packages: &[String], progress: Progress) -> Result<()> {
    if packages.is_empty() {
        return Ok(());
    }
    progress(&format!(
        "apt-get install in the tree: {}",
        packages.join(" ")
    ));
    let apt = |args: &[&str]| {
        let mut cmd = Command::new("chroot");
        cmd.arg(root)
            .args(["env", "DEBIAN_FRONTEND=noninteractive", "LC_ALL=C"])
            .args(["apt-get", "-q", "-y", "-o", "Dpkg::Use-Pty=0"])
            .args(args);
        cmd
    };
    run_streaming(
        &mut apt(&["update"]),
        "apt-get update (in the tree)",
        false,
        progress,
    )?;
    let mut install = apt(&["install", "--no-install-recommends"]);
    install.args(packages);
    run_streaming(
        &mut install,
        "apt-get install (in the tree)",
        false,
        progress,
    )?;
    run_streaming(
        &mut apt(&["clean"]),
        "apt-get clean (in the tree)",
        false,
        progress,
    )?;
    Ok(())
}

/// Drops what an image does not need: downloaded .debs and apt lists are
/// tens of MiB and are fetched again by `apt-get update` if ever needed.
fn trim_tree(root: &Path) -> Result<()> {
    for dir in ["var/cache/apt/archives", "var/lib/apt/lists"] {
        let Ok(entries) = std::fs::read_dir(root.join(dir)) else {
            continue;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            if path.is_file() && path.file_name().is_some_and(|n| n != "lock") {
                std::fs::remove_file(&path).ctx(|| format!("removing {}", path.display()))?;
            }
        }
    }
    Ok(())
}

fn remove_tree(path: &Path) -> Result<()> {
    match std::fs::remove_dir_all(path) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
            Err(e).ctx(|| format!("removing {}", path.display()))
        }
        _ => Ok(()),
    }
}

/// The Debian mirror the host's apt already uses for `suite`: only package
/// registries are reachable from build machines, so reuse what apt points at.
pub(crate) fn host_mirror(suite: &str) -> Result<String> {
    let mut texts = Vec::new();
    if let Ok(t) = std::fs::read_to_string("/etc/apt/sources.list") {
        texts.push((false, t));
    }
    if let Ok(entries) = std::fs::read_dir("/etc/apt/sources.list.d") {
        let mut paths: Vec<PathBuf> = entries.flatten().map(|e| e.path()).collect();
        paths.sort();
        for path in paths {
            let deb822 = path.extension().is_some_and(|e| e == "sources");
            let list = path.extension().is_some_and(|e| e == "list");
            if deb822 || list {
                if let Ok(t) = std::fs::read_to_string(&path) {
                    texts.push((deb822, t));
                }
            }
        }
    }
    texts
        .iter()
        .find_map(|(deb822, text)| {
            if *deb822 {
                mirror_from_deb822(text, suite)
            } else {
                mirror_from_list(text, suite)
            }
        })
        .ok_or_else(|| ImageError::NoMirror(suite.to_string()))
}

/// One-line style: `deb [options] URI SUITE COMPONENTS...`.
pub(crate) fn mirror_from_list(text: &str, suite: &str) -> Option<String> {
    text.lines().find_map(|line| {
        let mut words = line.split_whitespace();
        if words.next() != Some("deb") {
            return None;
        }
        let mut uri = words.next()?;
        if uri.starts_with('[') {
            // Options may contain spaces: skip to the word ending the bracket.
            while !uri.ends_with(']') {
                uri = words.next()?;
            }
            uri = words.next()?;
        }
        (words.next() == Some(suite)).then(|| uri.trim_end_matches('/').to_string())
    })
}

/// deb822 style: paragraphs with `Types:`, `URIs:`, `Suites:` fields.
pub(crate) fn mirror_from_deb822(text: &str, suite: &str) -> Option<String> {
    text.split("\n\n").find_map(|para| {
        let field = |name: &str| {
            para.lines()
                .filter(|l| !l.starts_with('#'))
                .find_map(|l| l.strip_prefix(name).map(str::trim))
        };
        let types = field("Types:")?;
        let suites = field("Suites:")?;
        if !types.split_whitespace().any(|t| t == "deb")
            || !suites.split_whitespace().any(|s| s == suite)
        {
            return None;
        }
        field("URIs:")?
            .split_whitespace()
            .next()
            .map(|u| u.trim_end_matches('/').to_string())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_mirror_in_deb822() {
        let text = "Types: deb\n# http://snapshot.example/x\nURIs: http://deb.debian.org/debian\n\
                    Suites: bookworm bookworm-updates\nComponents: main\n\n\
                    Types: deb\nURIs: https://other.example/apt\nSuites: nodistro\n";
        assert_eq!(
            mirror_from_deb822(text, "bookworm").as_deref(),
            Some("http://deb.debian.org/debian")
        );
        assert_eq!(
            mirror_from_deb822(text, "nodistro").as_deref(),
            Some("https://other.example/apt")
        );
        assert_eq!(mirror_from_deb822(text, "trixie"), None);
    }

    #[test]
    fn finds_mirror_in_one_line_lists() {
        let text = "deb https://packages.cloud.google.com/apt cloud-sdk-bookworm main\n\
                    deb-src http://src.example/debian bookworm main\n\
                    deb [arch=amd64 signed-by=/k.gpg] http://m.example/debian/ bookworm main\n";
        assert_eq!(
            mirror_from_list(text, "bookworm").as_deref(),
            Some("http://m.example/debian")
        );
        assert_eq!(mirror_from_list(text, "bullseye"), None);
    }

    #[test]
    fn tree_key_ignores_package_order_but_not_content() {
        let pk = |p: &[&str]| p.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let spec = |packages: &[String], mirror: &'static str| {
            TreeSpec {
                suite: "bookworm",
                variant: "minbase",
                packages,
                apt_packages: &[],
                mirror,
            }
            .key()
        };
        let (a, b, c) = (
            pk(&["python3", "numpy"]),
            pk(&["numpy", "python3"]),
            pk(&["python3"]),
        );
        assert_eq!(spec(&a, "http://m"), spec(&b, "http://m"));
        assert_ne!(spec(&a, "http://m"), spec(&c, "http://m"));
        assert_ne!(spec(&a, "http://m"), spec(&a, "http://n"));
    }

    #[test]
    fn apt_packages_change_the_key_and_their_absence_keeps_old_keys() {
        let packages = vec!["python3".to_string()];
        let npm = vec!["npm".to_string()];
        let spec = |apt_packages| TreeSpec {
            suite: "bookworm",
            variant: "minbase",
            packages: &packages,
            apt_packages,
            mirror: "http://m",
        };
        // The key a tree without APT_PACKAGES had before the field existed.
        let old = crate::sha256_hex(
            format!(
                "{TREE_FORMAT}\nsuite=bookworm\nvariant=minbase\npackages=python3\n\
                 mirror=http://m\narch=amd64\n"
            )
            .as_bytes(),
        );
        assert_eq!(spec(&[]).key(), old);
        assert_ne!(spec(&npm).key(), old);
    }
}
