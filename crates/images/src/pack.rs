//! Packing a staged guest tree into a stored image: the files every guest needs, the
//! ext4 file (`mkfs.ext4 -d`, no mount), and its registration in the store. Shared by
//! recipe builds ([`crate::build_image`]) and images converted from OCI images.
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{SystemTime, UNIX_EPOCH};

use crate::error::{ImageError, IoContext, Result};
use crate::exec::{run_quiet, Progress};
use crate::paths::images_dir;
use crate::store::{
    fs_name, image_path, lookup_by_recipe_key, mark_current, save_info, sha256_file, FileLock,
    ImageInfo, PACK_BASE_KEY,
};
use crate::AGENT_GUEST_PATH;

/// The files every image gets, whatever its base: the mount points and scratch space
/// the agent (as PID 1) expects, the agent itself, and the guest's name and resolver.
pub fn add_guest_essentials(
    root: &Path,
    hostname: &str,
    agent: &Path,
    progress: Progress,
) -> Result<()> {
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
        format!("{hostname}\n").as_bytes(),
        0o644,
    )?;
    let hosts = format!("127.0.0.1 localhost\n127.0.1.1 {hostname}\n");
    put_file(root, "/etc/hosts", hosts.as_bytes(), 0o644)?;
    // QEMU user networking's DNS forwarder (and the address the daemon's isolated
    // networking answers DNS on); a base's own file would name the build host's.
    put_file(root, "/etc/resolv.conf", b"nameserver 10.0.2.3\n", 0o644)?;
    Ok(())
}

/// The smallest account files a guest needs (root for the agent's commands, nobody);
/// `missing_only` keeps files a base already has.
pub fn add_minimal_accounts(root: &Path, missing_only: bool) -> Result<()> {
    const PASSWD: &[u8] =
        b"root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\n";
    const GROUP: &[u8] = b"root:x:0:\nnogroup:x:65534:\n";
    for (guest, data) in [("/etc/passwd", PASSWD), ("/etc/group", GROUP)] {
        // Followed inside the tree (never to the host's own files); a symlink loop or
        // a dangling link is no file, and is replaced.
        let exists = || match find_file(root, guest) {
            Ok(Some(path)) => {
                std::fs::symlink_metadata(path).is_ok_and(|m| m.is_file() && m.len() > 0)
            }
            Ok(None) | Err(_) => false,
        };
        if !missing_only || !exists() {
            put_file(root, guest, data, 0o644)?;
        }
    }
    Ok(())
}

/// How to lay out the ext4 file.
pub struct Ext4Spec<'a> {
    /// Apparent size (the file is sparse).
    pub size_mib: u64,
    /// Volume label (at most 16 bytes are kept).
    pub label: &'a str,
    /// At least 32 hex digits: the UUID and directory-hash seed are derived from it
    /// instead of random ones, so two builds of the same inputs differ less.
    pub key: &'a str,
    /// Inode count; None: mkfs's default ratio.
    pub inodes: Option<u64>,
}

/// Packs `staging` into a new ext4 file at `image` with `mkfs.ext4 -d` (no mount).
/// Owners, modes, times, hard links and extended attributes come from the staged tree.
pub fn mkfs_ext4(staging: &Path, image: &Path, spec: &Ext4Spec) -> Result<()> {
    let key = spec.key;
    if key.len() < 32 {
        return Err(ImageError::BadOutput {
            what: "mkfs.ext4".into(),
            detail: format!("key {key:?} is shorter than 32 hex digits"),
        });
    }
    let uuid = format!(
        "{}-{}-{}-{}-{}",
        &key[0..8],
        &key[8..12],
        &key[12..16],
        &key[16..20],
        &key[20..32]
    );
    let label: String = spec.label.chars().take(16).collect();
    let mut cmd = Command::new("mkfs.ext4");
    cmd.args([
        "-q", "-F", "-b", "4096", "-m", "0", "-L", &label, "-U", &uuid,
    ])
    .arg("-E")
    .arg(format!("root_owner=0:0,hash_seed={uuid}"));
    if let Some(n) = spec.inodes {
        cmd.arg("-N").arg(n.to_string());
    }
    cmd.arg("-d")
        .arg(staging)
        .arg(image)
        .arg(format!("{}M", spec.size_mib));
    run_quiet(&mut cmd, "mkfs.ext4 -d")?;
    Ok(())
}

/// Moves a packed ext4 file into the store under its content hash, read-only, and
/// records `info` (whose name, keys and origin the caller filled in) as what its name
/// now means. Returns the stored image's full metadata.
pub fn store_image(raw: &Path, mut info: ImageInfo, progress: Progress) -> Result<ImageInfo> {
    progress("hashing the image");
    info.sha256 = sha256_file(raw)?;
    info.built_at = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let info = place(raw, info, true)?;
    progress(&format!("built {}", info.path.display()));
    Ok(info)
}

/// Moves `raw` into the store as `info` (whose sha256 is its hash), read-only, records
/// it, and makes it what its name means when `current`.
fn place(raw: &Path, mut info: ImageInfo, current: bool) -> Result<ImageInfo> {
    let dir = images_dir();
    let final_path = image_path(&dir, &info.name, &info.sha256);
    std::fs::rename(raw, &final_path).ctx(|| format!("storing {}", final_path.display()))?;
    // Bases are shared by every VM through CoW overlays: make accidental
    // writes fail instead of corrupting them.
    set_mode(&final_path, 0o444)?;
    let meta = std::fs::metadata(&final_path).ctx(|| "stat of the image".into())?;
    info.path = final_path;
    info.size_bytes = meta.len();
    info.disk_bytes = std::os::unix::fs::MetadataExt::blocks(&meta) * 512;
    save_info(&dir, &info)?;
    if current {
        mark_current(&dir, &info)?;
    }
    Ok(info)
}

/// The name a snapshot pack's base image is stored under: its content, never anything
/// the pack claims (see the store's module doc).
pub fn pack_base_name(sha256: &str) -> String {
    format!("pack-base-{sha256}")
}

/// Where [`store_pack_base`] puts the image whose bytes hash to `sha256` (through the
/// store directory's real path: a disk layer names it as its backing file).
pub fn pack_base_path(sha256: &str) -> Result<PathBuf> {
    let dir = images_dir();
    std::fs::create_dir_all(&dir).ctx(|| format!("creating {}", dir.display()))?;
    let dir = dir
        .canonicalize()
        .ctx(|| format!("resolving {}", dir.display()))?;
    Ok(image_path(&dir, &pack_base_name(sha256), sha256))
}

/// Stores a snapshot pack's base image at [`pack_base_path`], read-only, under
/// [`pack_base_name`], never as what any name means. `raw` must hash to `sha256` (the
/// caller checked it: the file is then named for what it holds). A copy already there
/// (the same bytes) is replaced.
pub fn store_pack_base(raw: &Path, sha256: &str, description: String) -> Result<ImageInfo> {
    let info = ImageInfo {
        name: pack_base_name(sha256),
        sha256: sha256.to_string(),
        path: PathBuf::new(),
        size_bytes: 0,
        disk_bytes: 0,
        recipe_key: format!("{PACK_BASE_KEY}{sha256}"),
        recipe_path: PathBuf::new(),
        description,
        base: "snapshot pack".into(),
        agent_sha256: String::new(),
        built_at: SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0),
        build_secs: 0.0,
        oci: None,
    };
    place(raw, info, false)
}

/// The image `name` built from inputs hashing to `key`, if the store has it; it
/// becomes what `name` means, as a build would make it.
pub fn cached(name: &str, key: &str) -> Result<Option<ImageInfo>> {
    let dir = images_dir();
    match lookup_by_recipe_key(&dir, name, key) {
        Some(info) => {
            mark_current(&dir, &info)?;
            Ok(Some(info))
        }
        None => Ok(None),
    }
}

/// Serializes builds of `what` (an image name, a blob digest) across threads and
/// processes; released on drop.
pub fn build_lock(what: &str, progress: Progress) -> Result<FileLock> {
    FileLock::acquire(
        &images_dir().join(format!(".lock-{}", fs_name(what))),
        progress,
    )
}

/// A number no other call of this process gets: with the pid, it makes a scratch name
/// unique per call (`<what>-<nonce>-<pid>.<ext>`), so that two builds in one process
/// never share a staging path.
pub fn scratch_nonce() -> u64 {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
}

/// The store's scratch directory (staging trees and unfinished ext4 files), created
/// if needed, with what killed builds left there removed.
pub fn scratch_dir() -> Result<PathBuf> {
    let tmp_dir = images_dir().join("tmp");
    std::fs::create_dir_all(&tmp_dir).ctx(|| format!("creating {}", tmp_dir.display()))?;
    remove_stale_staging(&tmp_dir);
    Ok(tmp_dir)
}

/// Writes a file inside the guest tree at `root`, never through the old inode
/// (it may be a hard link into the cached debootstrap tree) and never outside
/// `root` (symlinks are resolved as if `root` were `/`).
pub fn put_file(root: &Path, guest: &str, data: &[u8], mode: u32) -> Result<()> {
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

/// At most this many symlinks are followed resolving one guest path: the kernel's
/// limit (ELOOP), so a loop in a hostile tree (`a -> b -> a`, `passwd -> ./passwd`) is
/// refused after a bounded walk instead of followed forever.
pub const MAX_SYMLINK_HOPS: u32 = 40;

/// The error a walk gives after [`MAX_SYMLINK_HOPS`] symlinks.
pub const SYMLINK_LOOP: &str = "too many levels of symbolic links";

/// Host directory holding `guest`'s final component, created as needed,
/// following symlinks inside the tree chroot-style.
pub fn resolve_parent(root: &Path, guest: &str) -> Result<PathBuf> {
    Ok(walk(root, guest, Walk::CreateParents)?.expect("created as needed"))
}

/// Host directory holding `guest`'s final component, following symlinks inside the
/// tree chroot-style; None when a component is missing or not a directory.
pub fn find_parent(root: &Path, guest: &str) -> Result<Option<PathBuf>> {
    walk(root, guest, Walk::FindParent)
}

/// Host path of what `guest` names, every symlink on the way followed inside the tree
/// chroot-style, the final one too (as `open` would in the guest); None when it is
/// missing or a parent is not a directory. Reading what it returns still needs care:
/// it may be any kind of file (a FIFO, a directory).
pub fn find_file(root: &Path, guest: &str) -> Result<Option<PathBuf>> {
    walk(root, guest, Walk::FindFile)
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Walk {
    CreateParents,
    FindParent,
    FindFile,
}

/// The one chroot-style resolution every guest path goes through: components are
/// walked one at a time from `root`, `..` never climbs above it, and a symlink's
/// target is walked in place of the link (absolute targets from `root`), at most
/// [`MAX_SYMLINK_HOPS`] of them for the whole path.
fn walk(root: &Path, guest: &str, mode: Walk) -> Result<Option<PathBuf>> {
    let err = |msg: &str| ImageError::GuestPath {
        path: guest.into(),
        msg: msg.into(),
    };
    let create = mode == Walk::CreateParents;
    let walked = if mode == Walk::FindFile {
        Path::new(guest)
    } else {
        Path::new(guest).parent().ok_or_else(|| err("no parent"))?
    };
    // Components still to walk, reversed so that pop() yields the next one.
    let mut pending: Vec<String> = walked
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
                if hops > MAX_SYMLINK_HOPS {
                    return Err(err(SYMLINK_LOOP));
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
            // The final component, not a directory: the file asked for.
            Ok(_) if mode == Walk::FindFile && pending.is_empty() => return Ok(Some(host)),
            Ok(_) if !create => return Ok(None),
            Ok(_) => return Err(err("a parent is not a directory")),
            Err(_) if !create => return Ok(None),
            Err(_) => {
                std::fs::create_dir(&host).ctx(|| format!("creating {}", host.display()))?;
                set_mode(&host, 0o755)?;
                resolved.push(comp);
            }
        }
    }
    Ok(Some(
        resolved.iter().fold(root.to_path_buf(), |p, c| p.join(c)),
    ))
}

/// Removes `<name>-<pid>.<ext>` scratch entries of builds whose process is gone
/// (killed mid-build, so their Drop never ran), unmounting a staging overlay left on
/// `.root` and removing its upper layer.
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
        let _ = ScratchPath(path).clear();
    }
}

pub(crate) fn set_mode(path: &Path, mode: u32) -> Result<()> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
        .ctx(|| format!("chmod {}", path.display()))
}

/// A scratch path removed (file or tree) on drop, so failed builds leave nothing.
/// Name it `<anything>-<pid>.<ext>` inside [`scratch_dir`] so that a build killed
/// before its drop ran is cleaned up by the next one.
pub struct ScratchPath(pub PathBuf);

impl ScratchPath {
    /// Removes the file or tree (unmounting a staging overlay on it) if it exists.
    pub fn clear(&self) -> Result<()> {
        match std::fs::symlink_metadata(&self.0) {
            Ok(m) if m.is_dir() => crate::overlay::remove_dir_tree(&self.0),
            Ok(_) => std::fs::remove_file(&self.0).ctx(|| format!("removing {}", self.0.display())),
            Err(_) => Ok(()),
        }
    }
}

impl Drop for ScratchPath {
    fn drop(&mut self) {
        let _ = self.clear();
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::symlink;

    use super::*;

    #[test]
    fn scratch_names_are_unique_per_call_and_a_dead_processes_are_swept() {
        let (a, b) = (scratch_nonce(), scratch_nonce());
        assert_ne!(a, b);
        let dir = tempfile::tempdir().unwrap();
        let me = std::process::id();
        let live = dir.path().join(format!("oci-abc-{a}-{me}.root"));
        // Pid 0 is never a process's: its leftovers are stale.
        let dead = dir.path().join(format!("oci-abc-{b}-0.root"));
        std::fs::create_dir(&live).unwrap();
        std::fs::create_dir(&dead).unwrap();
        remove_stale_staging(dir.path());
        assert!(live.exists() && !dead.exists());
    }

    #[test]
    fn guest_paths_follow_symlinks_inside_the_tree_a_bounded_number_of_times() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        std::fs::create_dir_all(root.join("usr/lib")).unwrap();
        std::fs::create_dir_all(root.join("etc")).unwrap();
        std::fs::write(root.join("usr/lib/passwd"), "root:x:0:0::/:/bin/sh\n").unwrap();
        // Absolute targets resolve from the tree's root, never the host's.
        symlink("/usr/lib/passwd", root.join("etc/passwd")).unwrap();
        symlink("../etc", root.join("usr/etc")).unwrap();
        let found = find_file(root, "/usr/etc/passwd").unwrap();
        assert_eq!(found, Some(root.join("usr/lib/passwd")));
        assert_eq!(find_file(root, "/etc/shadow").unwrap(), None);
        assert_eq!(find_file(root, "/etc/passwd/x").unwrap(), None);
        // A chain of 40 links resolves; 41 is a loop as far as the kernel is concerned.
        for i in 0..41 {
            symlink(format!("l{}", i + 1), root.join(format!("etc/l{i}"))).unwrap();
        }
        std::fs::write(root.join("etc/l41"), "end").unwrap();
        assert_eq!(
            find_file(root, "/etc/l1").unwrap(),
            Some(root.join("etc/l41"))
        );
        let err = find_file(root, "/etc/l0").unwrap_err().to_string();
        assert!(err.contains(SYMLINK_LOOP), "{err}");
        // Loops, through the final component or a parent: refused, not followed forever.
        symlink("./self", root.join("etc/self")).unwrap();
        symlink("b", root.join("a")).unwrap();
        symlink("/a", root.join("b")).unwrap();
        for looped in ["/etc/self", "/a", "/a/x"] {
            let err = find_file(root, looped).unwrap_err().to_string();
            assert!(err.contains(SYMLINK_LOOP), "{looped}: {err}");
        }
        assert!(find_parent(root, "/a/x").is_err());
        assert!(resolve_parent(root, "/a/x").is_err());
    }

    #[test]
    fn minimal_accounts_keep_the_images_own_files_found_inside_the_tree() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        std::fs::create_dir_all(root.join("etc")).unwrap();
        std::fs::create_dir_all(root.join("lib")).unwrap();
        // passwd through an absolute link (the host has no /lib/image-passwd), group a
        // loop: the first is the image's, the second no file at all.
        std::fs::write(root.join("lib/image-passwd"), "app:x:7:7::/:/bin/sh\n").unwrap();
        symlink("/lib/image-passwd", root.join("etc/passwd")).unwrap();
        symlink("group", root.join("etc/group")).unwrap();
        add_minimal_accounts(root, true).unwrap();
        let kept = std::fs::read_link(root.join("etc/passwd"));
        assert_eq!(kept.unwrap(), Path::new("/lib/image-passwd"));
        let passwd = std::fs::read_to_string(root.join("lib/image-passwd")).unwrap();
        assert_eq!(passwd, "app:x:7:7::/:/bin/sh\n");
        let group = std::fs::read_to_string(root.join("etc/group")).unwrap();
        assert!(group.starts_with("root:x:0:"), "{group}");
    }
}
