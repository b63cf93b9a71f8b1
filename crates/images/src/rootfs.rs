//! Building ext4 root filesystems from recipes, without mounting any image:
//! the tree is assembled in a staging directory and packed by `mkfs.ext4 -d`.
//! A debootstrap base is staged as an overlay on the cached tree where the
//! host allows it (root, overlayfs), else hard-linked (see `overlay.rs`).
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use crate::agent::build_agent;
use crate::debootstrap::{ensure_tree, host_mirror, TreeSpec};
use crate::error::{ImageError, IoContext, Result};
use crate::exec::{run_quiet, Progress};
use crate::pack::{
    add_guest_essentials, add_minimal_accounts, mkfs_ext4, put_file, resolve_parent, scratch_dir,
    store_image, Ext4Spec, ScratchPath,
};
use crate::paths::{images_dir, prebuilt_only};
use crate::recipe::{find_recipe, Base, Recipe};
use crate::store::{
    locate_image, lookup_by_recipe_key, mark_current, sha256_file, FileLock, ImageInfo,
};

/// Bumped whenever this builder's output changes for the same inputs, so that
/// old cached images stop matching.
const BUILDER_VERSION: &str = "zygote-rootfs v2";
/// Where the agent lives in every image (the kernel's `init=`).
pub const AGENT_GUEST_PATH: &str = "/sbin/zygote-agent";
const BUSYBOX: &str = "/bin/busybox";

#[derive(Debug, Clone, Default)]
pub struct BuildOptions {
    /// Build even if an image with the same recipe key exists.
    pub force: bool,
    /// Re-run debootstrap instead of reusing the cached tree.
    pub refresh_base: bool,
}

/// Builds (or finds in the cache) the image for a recipe name or `.recipe` path.
pub fn build_image(name: &str, progress: Progress) -> Result<ImageInfo> {
    build_image_with(name, &BuildOptions::default(), progress)
}

/// With `ZYGOTE_PREBUILT` set, returns the newest built image of that name and never
/// builds (see [`crate::paths::prebuilt_only`]).
pub fn build_image_with(name: &str, opts: &BuildOptions, progress: Progress) -> Result<ImageInfo> {
    if prebuilt_only() {
        let info = locate_image(name).map_err(|e| match e {
            ImageError::ImageNotFound(_) => ImageError::NotPrebuilt {
                what: format!("image {name:?}"),
                dir: images_dir(),
            },
            e => e,
        })?;
        progress(&format!("ZYGOTE_PREBUILT: using {}", info.path.display()));
        return Ok(info);
    }
    let recipe = find_recipe(name)?;
    progress(&format!("recipe {}", recipe.path.display()));
    progress("building zygote-agent (musl, release)");
    let agent = build_agent(progress)?;
    let agent_sha = sha256_file(&agent)?;
    let base = resolve_base(&recipe)?;
    let key = recipe_key(&recipe, &agent_sha, &base.key_material)?;
    let dir = images_dir();
    if !opts.force && !opts.refresh_base {
        if let Some(info) = lookup_by_recipe_key(&dir, &recipe.name, &key) {
            progress(&format!("cached: {}", info.path.display()));
            mark_current(&dir, &info)?;
            return Ok(info);
        }
    }
    let _lock = FileLock::acquire(&dir.join(format!(".lock-{}", recipe.name)), progress)?;
    if !opts.force && !opts.refresh_base {
        if let Some(info) = lookup_by_recipe_key(&dir, &recipe.name, &key) {
            mark_current(&dir, &info)?;
            return Ok(info);
        }
    }
    let tmp_dir = scratch_dir()?;
    let started = Instant::now();
    let stamp = format!("{}-{}", recipe.name, std::process::id());
    let staging = ScratchPath(tmp_dir.join(format!("{stamp}.root")));
    let raw = ScratchPath(tmp_dir.join(format!("{stamp}.ext4")));
    staging.clear()?;
    raw.clear()?;
    // Declared after the paths above so that it drops first: the overlay is
    // unmounted before they are removed, on every return.
    let mut staging_overlay = None;

    match &base.kind {
        BaseKind::Busybox => {
            std::fs::create_dir_all(&staging.0).ctx(|| "creating the staging tree".into())?;
            add_busybox(&staging.0, progress)?;
        }
        BaseKind::Debootstrap(spec) => {
            let tree = ensure_tree(&spec.as_spec(), opts.refresh_base, progress)?;
            staging_overlay = crate::overlay::stage_cached_tree(&tree, &staging.0, progress)?;
        }
    }
    add_guest_essentials(&staging.0, &recipe.hostname, &agent, progress)?;
    add_recipe_files(&staging.0, &recipe)?;
    progress(&format!("mkfs.ext4 -d ({} MiB, sparse)", recipe.size_mib));
    let spec = Ext4Spec {
        size_mib: recipe.size_mib,
        label: &recipe.name,
        key: &key,
        inodes: None,
    };
    mkfs_ext4(&staging.0, &raw.0, &spec)?;
    // The image holds the tree now: unmount before hashing.
    drop(staging_overlay);
    let info = ImageInfo {
        name: recipe.name.clone(),
        sha256: String::new(),
        path: PathBuf::new(),
        size_bytes: 0,
        disk_bytes: 0,
        recipe_key: key,
        recipe_path: recipe.path.clone(),
        description: recipe.description.clone(),
        base: base.label,
        agent_sha256: agent_sha,
        built_at: 0,
        build_secs: started.elapsed().as_secs_f64(),
        oci: None,
    };
    store_image(&raw.0, info, progress)
}

/// What a recipe adds over the essentials: busybox's account files, the recipe's files.
fn add_recipe_files(root: &Path, recipe: &Recipe) -> Result<()> {
    if matches!(recipe.base, Base::Busybox) {
        add_minimal_accounts(root, false)?;
    }
    for file in &recipe.files {
        let data = std::fs::read(&file.src).ctx(|| format!("reading {}", file.src.display()))?;
        let meta = std::fs::metadata(&file.src).ctx(|| format!("stat {}", file.src.display()))?;
        let mode = std::os::unix::fs::PermissionsExt::mode(&meta.permissions()) & 0o7777;
        put_file(root, &file.dest, &data, mode)?;
    }
    crate::accounts::add_users(root, &recipe.users)?;
    Ok(())
}

struct ResolvedBase {
    kind: BaseKind,
    label: String,
    /// What identifies the base in the recipe key.
    key_material: String,
}

enum BaseKind {
    Busybox,
    Debootstrap(OwnedSpec),
}

struct OwnedSpec {
    suite: String,
    variant: String,
    packages: Vec<String>,
    apt_packages: Vec<String>,
    mirror: String,
}

impl OwnedSpec {
    fn as_spec(&self) -> TreeSpec<'_> {
        TreeSpec {
            suite: &self.suite,
            variant: &self.variant,
            packages: &self.packages,
            apt_packages: &self.apt_packages,
            mirror: &self.mirror,
        }
    }
}

fn resolve_base(recipe: &Recipe) -> Result<ResolvedBase> {
    Ok(match &recipe.base {
        Base::Busybox => {
            let version = run_quiet(
                Command::new("dpkg-query").args(["-W", "-f=${Version}", "busybox-static"]),
                "dpkg-query busybox-static",
            )
            .unwrap_or_else(|_| "unknown".into());
            ResolvedBase {
                kind: BaseKind::Busybox,
                label: format!("busybox-static {version}"),
                key_material: format!("busybox sha256={}", sha256_file(Path::new(BUSYBOX))?),
            }
        }
        Base::Debootstrap {
            suite,
            variant,
            packages,
            apt_packages,
            mirror,
        } => {
            let mirror = match mirror {
                Some(m) => m.clone(),
                None => host_mirror(suite)?,
            };
            let spec = OwnedSpec {
                suite: suite.clone(),
                variant: variant.clone(),
                packages: packages.clone(),
                apt_packages: apt_packages.clone(),
                mirror,
            };
            let tree_key = spec.as_spec().key();
            ResolvedBase {
                label: format!("debootstrap {suite}/{variant}"),
                key_material: format!("debootstrap tree={tree_key}"),
                kind: BaseKind::Debootstrap(spec),
            }
        }
    })
}

/// Hash of every input of an image build.
pub(crate) fn recipe_key(recipe: &Recipe, agent_sha: &str, base: &str) -> Result<String> {
    let mut material = format!(
        "{BUILDER_VERSION}\nbase {base}\nagent {agent_sha}\nrecipe {}\n{}\n",
        recipe.name, recipe.text
    );
    for file in &recipe.files {
        let sha = sha256_file(&file.src)?;
        material.push_str(&format!("file {} {sha}\n", file.dest));
    }
    Ok(crate::sha256_hex(material.as_bytes()))
}

fn add_busybox(root: &Path, progress: Progress) -> Result<()> {
    let applets = run_quiet(
        Command::new(BUSYBOX).arg("--list-full"),
        "busybox --list-full (is busybox-static installed?)",
    )?;
    put_file(
        root,
        BUSYBOX,
        &std::fs::read(BUSYBOX).ctx(|| format!("reading {BUSYBOX}"))?,
        0o755,
    )?;
    let mut count = 0;
    for applet in applets.lines().map(str::trim).filter(|a| !a.is_empty()) {
        let guest = format!("/{applet}");
        let parent = resolve_parent(root, &guest)?;
        let name = Path::new(&guest).file_name().expect("applet has a name");
        let link = parent.join(name);
        if link.symlink_metadata().is_err() {
            std::os::unix::fs::symlink(BUSYBOX, &link)
                .ctx(|| format!("linking {}", link.display()))?;
            count += 1;
        }
    }
    progress(&format!("busybox with {count} applet links"));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn put_file_stays_inside_root_and_breaks_hard_links() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("root");
        let outside = dir.path().join("outside");
        std::fs::create_dir_all(root.join("usr/sbin")).unwrap();
        std::fs::create_dir_all(&outside).unwrap();
        std::os::unix::fs::symlink("usr/sbin", root.join("sbin")).unwrap();
        // An absolute link must resolve inside the tree, not on the host.
        std::os::unix::fs::symlink(&outside, root.join("abs")).unwrap();
        put_file(&root, "/sbin/agent", b"A", 0o755).unwrap();
        assert_eq!(std::fs::read(root.join("usr/sbin/agent")).unwrap(), b"A");
        put_file(&root, "/abs/x", b"X", 0o644).unwrap();
        assert!(!outside.join("x").exists());
        let inner = root.join(outside.strip_prefix("/").unwrap()).join("x");
        assert_eq!(std::fs::read(inner).unwrap(), b"X");
        // Replacing a hard-linked file leaves the other link untouched.
        let cached = dir.path().join("cached");
        std::fs::write(&cached, b"old").unwrap();
        std::fs::hard_link(&cached, root.join("usr/sbin/linked")).unwrap();
        put_file(&root, "/sbin/linked", b"new", 0o644).unwrap();
        assert_eq!(std::fs::read(&cached).unwrap(), b"old");
        assert_eq!(std::fs::read(root.join("usr/sbin/linked")).unwrap(), b"new");
        assert!(
            put_file(&root, "/usr", b"", 0o644).is_err(),
            "cannot replace a directory"
        );
    }

    #[test]
    fn recipe_key_covers_every_input() {
        let dir = tempfile::tempdir().unwrap();
        let extra = dir.path().join("motd");
        std::fs::write(&extra, b"hi").unwrap();
        let path = dir.path().join("t.recipe");
        let text = "BASE=busybox\nSIZE_MIB=64\nFILES=motd:/etc/motd\n";
        let recipe = crate::recipe::parse_recipe("t", &path, text).unwrap();
        let key = recipe_key(&recipe, "agent1", "base1").unwrap();
        assert_eq!(key, recipe_key(&recipe, "agent1", "base1").unwrap());
        assert_ne!(key, recipe_key(&recipe, "agent2", "base1").unwrap());
        assert_ne!(key, recipe_key(&recipe, "agent1", "base2").unwrap());
        std::fs::write(&extra, b"changed").unwrap();
        assert_ne!(key, recipe_key(&recipe, "agent1", "base1").unwrap());
        let bigger = text.replace("64", "65");
        let recipe2 = crate::recipe::parse_recipe("t", &path, &bigger).unwrap();
        std::fs::write(&extra, b"hi").unwrap();
        assert_ne!(key, recipe_key(&recipe2, "agent1", "base1").unwrap());
    }
}
