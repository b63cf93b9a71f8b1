//! Building ext4 root filesystems from recipes, without mounting any image:
//! the tree is assembled in a staging directory and packed by `mkfs.ext4 -d`.
//! A debootstrap base is staged as an overlay on the cached tree where the
//! host allows it (root, overlayfs), else hard-linked (see [`overlay`]).
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use crate::agent::build_agent;
use crate::debootstrap::{ensure_tree, host_mirror, TreeSpec};
use crate::error::{ImageError, IoContext, Result};
use crate::exec::{run_quiet, Progress};
use crate::paths::{images_dir, prebuilt_only};
use crate::recipe::{find_recipe, Base, Recipe};
use crate::store::{
    image_path, locate_image, lookup_by_recipe_key, mark_current, save_info, sha256_file, FileLock,
    ImageInfo,
};

#[path = "overlay.rs"]
mod overlay;

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
    let tmp_dir = dir.join("tmp");
    std::fs::create_dir_all(&tmp_dir).ctx(|| format!("creating {}", tmp_dir.display()))?;
    let _lock = FileLock::acquire(&dir.join(format!(".lock-{}", recipe.name)), progress)?;
    if !opts.force && !opts.refresh_base {
        if let Some(info) = lookup_by_recipe_key(&dir, &recipe.name, &key) {
            mark_current(&dir, &info)?;
            return Ok(info);
        }
    }
    remove_stale_staging(&tmp_dir);
    let started = Instant::now();
    let stamp = format!("{}-{}", recipe.name, std::process::id());
    let staging = TempPath(tmp_dir.join(format!("{stamp}.root")));
    let raw = TempPath(tmp_dir.join(format!("{stamp}.ext4")));
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
            staging_overlay = overlay::stage_cached_tree(&tree, &staging.0, progress)?;
        }
    }
    add_common_files(&staging.0, &recipe, &agent, progress)?;
    progress(&format!("mkfs.ext4 -d ({} MiB, sparse)", recipe.size_mib));
    mkfs(&staging.0, &raw.0, &recipe, &key)?;
    // The image holds the tree now: unmount before hashing.
    drop(staging_overlay);
    progress("hashing the image");
    let sha = sha256_file(&raw.0)?;
    let final_path = image_path(&dir, &recipe.name, &sha);
    std::fs::rename(&raw.0, &final_path).ctx(|| format!("storing {}", final_path.display()))?;
    // Bases are shared by every VM through CoW overlays: make accidental
    // writes fail instead of corrupting them.
    set_mode(&final_path, 0o444)?;
    let meta = std::fs::metadata(&final_path).ctx(|| "stat of the image".into())?;
    let info = ImageInfo {
        name: recipe.name.clone(),
        sha256: sha,
        path: final_path,
        size_bytes: meta.len(),
        disk_bytes: std::os::unix::fs::MetadataExt::blocks(&meta) * 512,
        recipe_key: key,
        recipe_path: recipe.path.clone(),
        description: recipe.description.clone(),
        base: base.label,
        agent_sha256: agent_sha,
        built_at: SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0),
        build_secs: started.elapsed().as_secs_f64(),
    };
    save_info(&dir, &info)?;
    mark_current(&dir, &info)?;
    progress(&format!("built {}", info.path.display()));
    Ok(info)
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
    mirror: String,
}

impl OwnedSpec {
    fn as_spec(&self) -> TreeSpec<'_> {
        TreeSpec {
            suite: &self.suite,
            variant: &self.variant,
            packages: &self.packages,
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

/// Files every image gets, whatever its base.
fn add_common_files(root: &Path, recipe: &Recipe, agent: &Path, progress: Progress) -> Result<()> {
    // Mount points and scratch space the agent (as PID 1) expects.
    for (dir, mode) in [
        ("/dev", 0o755),
        ("/proc", 0o555),
        ("/sys", 0o555),
        ("/tmp", 0o1777),
        ("/run", 0o755),
        ("/root", 0o700),
        ("/etc", 0o755),
        ("/var/tmp", 0o1777),
    ] {
        let path = resolve_parent(root, &format!("{dir}/x"))?;
        set_mode(&path, mode)?;
    }
    let agent_bytes = std::fs::read(agent).ctx(|| format!("reading {}", agent.display()))?;
    put_file(root, AGENT_GUEST_PATH, &agent_bytes, 0o755)?;
    // The release profile keeps debug info (8 MiB vs 1 MiB stripped); the guest
    // has no use for it, and every byte is read through emulated virtio.
    let staged = resolve_parent(root, AGENT_GUEST_PATH)?.join("zygote-agent");
    if let Err(e) = run_quiet(
        Command::new("strip").arg("--strip-debug").arg(&staged),
        "strip",
    ) {
        progress(&format!("warning: keeping the agent's debug info: {e}"));
    }
    put_file(
        root,
        "/etc/hostname",
        format!("{}\n", recipe.hostname).as_bytes(),
        0o644,
    )?;
    let hosts = format!("127.0.0.1 localhost\n127.0.1.1 {}\n", recipe.hostname);
    put_file(root, "/etc/hosts", hosts.as_bytes(), 0o644)?;
    // QEMU user networking's DNS forwarder; debootstrap copied the host's file.
    put_file(root, "/etc/resolv.conf", b"nameserver 10.0.2.3\n", 0o644)?;
    if matches!(recipe.base, Base::Busybox) {
        put_file(
            root,
            "/etc/passwd",
            b"root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\n",
            0o644,
        )?;
        put_file(root, "/etc/group", b"root:x:0:\nnogroup:x:65534:\n", 0o644)?;
    }
    for file in &recipe.files {
        let data = std::fs::read(&file.src).ctx(|| format!("reading {}", file.src.display()))?;
        let meta = std::fs::metadata(&file.src).ctx(|| format!("stat {}", file.src.display()))?;
        let mode = std::os::unix::fs::PermissionsExt::mode(&meta.permissions()) & 0o7777;
        put_file(root, &file.dest, &data, mode)?;
    }
    Ok(())
}

fn mkfs(staging: &Path, image: &Path, recipe: &Recipe, key: &str) -> Result<()> {
    // A UUID and directory-hash seed derived from the inputs instead of random
    // ones: fewer arbitrary differences between two builds of the same recipe.
    let uuid = format!(
        "{}-{}-{}-{}-{}",
        &key[0..8],
        &key[8..12],
        &key[12..16],
        &key[16..20],
        &key[20..32]
    );
    let label: String = recipe.name.chars().take(16).collect();
    run_quiet(
        Command::new("mkfs.ext4")
            .args([
                "-q", "-F", "-b", "4096", "-m", "0", "-L", &label, "-U", &uuid,
            ])
            .arg("-E")
            .arg(format!("root_owner=0:0,hash_seed={uuid}"))
            .arg("-d")
            .arg(staging)
            .arg(image)
            .arg(format!("{}M", recipe.size_mib)),
        "mkfs.ext4 -d",
    )?;
    Ok(())
}

/// Writes a file inside the guest tree at `root`, never through the old inode
/// (it may be a hard link into the cached debootstrap tree) and never outside
/// `root` (symlinks are resolved as if `root` were `/`).
pub(crate) fn put_file(root: &Path, guest: &str, data: &[u8], mode: u32) -> Result<()> {
    let name = Path::new(guest)
        .file_name()
        .ok_or_else(|| ImageError::GuestPath {
            path: guest.into(),
            msg: "no file name".into(),
        })?;
    let path = resolve_parent(root, guest)?.join(name);
    match std::fs::symlink_metadata(&path) {
        Ok(m) if m.is_dir() => {
            return Err(ImageError::GuestPath {
                path: guest.into(),
                msg: "is a directory".into(),
            })
        }
        Ok(_) => std::fs::remove_file(&path).ctx(|| format!("replacing {}", path.display()))?,
        Err(_) => {}
    }
    std::fs::write(&path, data).ctx(|| format!("writing {}", path.display()))?;
    set_mode(&path, mode)
}

/// Host directory holding `guest`'s final component, created as needed,
/// following symlinks inside the tree chroot-style.
pub(crate) fn resolve_parent(root: &Path, guest: &str) -> Result<PathBuf> {
    let err = |msg: &str| ImageError::GuestPath {
        path: guest.into(),
        msg: msg.into(),
    };
    let parent = Path::new(guest).parent().ok_or_else(|| err("no parent"))?;
    // Components still to walk, reversed so that pop() yields the next one.
    let mut pending: Vec<String> = parent
        .iter()
        .map(|c| c.to_string_lossy().into_owned())
        .rev()
        .collect();
    let mut resolved: Vec<String> = Vec::new();
    let mut hops = 0;
    while let Some(comp) = pending.pop() {
        match comp.as_str() {
            "/" | "." | "" => continue,
            ".." => {
                resolved.pop();
                continue;
            }
            _ => {}
        }
        let host = resolved
            .iter()
            .fold(root.to_path_buf(), |p, c| p.join(c))
            .join(&comp);
        match std::fs::symlink_metadata(&host) {
            Ok(m) if m.file_type().is_symlink() => {
                hops += 1;
                if hops > 40 {
                    return Err(err("too many levels of symbolic links"));
                }
                let target =
                    std::fs::read_link(&host).ctx(|| format!("readlink {}", host.display()))?;
                if target.is_absolute() {
                    resolved.clear();
                }
                pending.extend(
                    target
                        .iter()
                        .map(|c| c.to_string_lossy().into_owned())
                        .collect::<Vec<_>>()
                        .into_iter()
                        .rev(),
                );
            }
            Ok(m) if m.is_dir() => resolved.push(comp),
            Ok(_) => return Err(err("a parent is not a directory")),
            Err(_) => {
                std::fs::create_dir(&host).ctx(|| format!("creating {}", host.display()))?;
                set_mode(&host, 0o755)?;
                resolved.push(comp);
            }
        }
    }
    Ok(resolved.iter().fold(root.to_path_buf(), |p, c| p.join(c)))
}

/// Removes `<name>-<pid>.{root,ext4}` scratch entries of builds whose process
/// is gone (killed mid-build, so their Drop never ran), unmounting a staging
/// overlay left on `.root` and removing its upper layer.
fn remove_stale_staging(tmp_dir: &Path) {
    let Ok(entries) = std::fs::read_dir(tmp_dir) else {
        return;
    };
    let stale: Vec<PathBuf> = entries
        .flatten()
        .filter(|entry| {
            let name = entry.file_name().to_string_lossy().into_owned();
            let pid = name
                .rsplit_once('.')
                .and_then(|(stem, _)| stem.rsplit_once('-'))
                .and_then(|(_, pid)| pid.parse::<u32>().ok());
            pid.is_some_and(|pid| !Path::new(&format!("/proc/{pid}")).exists())
        })
        .map(|entry| entry.path())
        .collect();
    for path in stale {
        let _ = TempPath(path).clear();
    }
}

fn set_mode(path: &Path, mode: u32) -> Result<()> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
        .ctx(|| format!("chmod {}", path.display()))
}

/// A scratch path removed (file or tree) on drop, so failed builds leave nothing.
struct TempPath(PathBuf);

impl TempPath {
    fn clear(&self) -> Result<()> {
        match std::fs::symlink_metadata(&self.0) {
            Ok(m) if m.is_dir() => overlay::remove_dir_tree(&self.0),
            Ok(_) => std::fs::remove_file(&self.0).ctx(|| format!("removing {}", self.0.display())),
            Err(_) => Ok(()),
        }
    }
}

impl Drop for TempPath {
    fn drop(&mut self) {
        let _ = self.clear();
    }
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
