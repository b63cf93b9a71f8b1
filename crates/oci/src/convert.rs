//! An OCI image whose blobs are all local (pulled or imported) turned into a stored
//! zygote image: layers applied bottom first (each checked against the config's diff
//! id), the agent and the guest essentials added, packed with `mkfs.ext4 -d`, owners
//! fixed with debugfs when not converting as root, stored under its content hash.
//! Cached by what goes in (manifest digest, agent, converter version, size): a second
//! pull of an unchanged image converts nothing.
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::Instant;

use zygote_images::pack::{
    add_guest_essentials, add_minimal_accounts, build_lock, cached, find_file, mkfs_ext4,
    scratch_dir, store_image, Ext4Spec, ScratchPath,
};
use zygote_images::{ImageError, ImageInfo, OciOrigin, RunConfig};

use crate::apply::{Applier, Fixup, Ownership};
use crate::budget::ensure_free;
use crate::error::{IoContext, OciError, Result};
use crate::manifest::{Digest, ImageConfig};
use crate::{Event, Limits, Progress};

/// Bumped whenever conversion gives different images for the same inputs.
const CONVERTER_VERSION: &str = "zygote-oci v1";

/// Everything conversion needs, with every blob in the blob store.
pub(crate) struct LocalImage {
    /// The name it is stored under (a normalized reference, or a name given to import).
    pub name: String,
    pub origin: OciOrigin,
    pub config: ImageConfig,
    /// Layer blobs, bottom first, with their digests.
    pub layers: Vec<(Digest, PathBuf)>,
}

/// How to convert.
#[derive(Debug, Clone, Default)]
pub struct ConvertOptions {
    /// The ext4 file's size (sparse); None: what the tree needs plus 1 GiB free.
    pub size_mib: Option<u64>,
    /// Convert even if the cache has this image.
    pub force: bool,
    /// Stage the tree without chown even as root and set owners with debugfs, as an
    /// unprivileged conversion does (for testing that path).
    pub rootless: bool,
}

/// What a conversion's cache key is made of, worked out before anything is fetched
/// (so that a cached image costs no downloads).
pub(crate) struct Prepared {
    key: String,
    agent: PathBuf,
    agent_sha: String,
}

pub(crate) fn prepare(
    manifest_digest: &Digest,
    opts: &ConvertOptions,
    progress: Progress,
) -> Result<Prepared> {
    let agent = zygote_images::build_agent(&mut |l| {
        progress(Event::Step {
            message: l.to_string(),
        })
    })?;
    let agent_sha = zygote_images::sha256_file(&agent)?;
    let key = Digest::of(
        format!(
            "{CONVERTER_VERSION}\nmanifest {manifest_digest}\nagent {agent_sha}\nsize {:?}\nrootless {}\n",
            opts.size_mib, opts.rootless
        )
        .as_bytes(),
    )
    .hex()
    .to_string();
    Ok(Prepared {
        key,
        agent,
        agent_sha,
    })
}

/// The conversion of these inputs, if the store has it (it becomes what `name` means).
pub(crate) fn lookup(
    name: &str,
    prepared: &Prepared,
    opts: &ConvertOptions,
) -> Result<Option<ImageInfo>> {
    if opts.force {
        return Ok(None);
    }
    Ok(cached(name, &prepared.key)?)
}

pub(crate) fn convert(
    mut img: LocalImage,
    prepared: &Prepared,
    opts: &ConvertOptions,
    limits: &Limits,
    progress: Progress,
) -> Result<ImageInfo> {
    let say = |s: String| progress(Event::Step { message: s });
    let Prepared {
        key,
        agent,
        agent_sha,
    } = prepared;
    let (key, agent, agent_sha) = (key.clone(), agent.clone(), agent_sha.clone());
    let _lock = build_lock(&img.name, &mut |l| say(l.to_string()))?;
    if let Some(info) = lookup(&img.name, prepared, opts)? {
        say(format!("cached: {}", info.path.display()));
        return Ok(info);
    }
    let started = Instant::now();
    let tmp = scratch_dir()?;
    // Unique per call, not only per process: a conversion whose client went away may
    // still be running its mkfs when the next one of the same image starts (the pid
    // stays last, for `scratch_dir`'s clean-up of dead processes' leftovers).
    let stamp = format!(
        "oci-{}-{}-{}",
        &key[..12],
        zygote_images::pack::scratch_nonce(),
        std::process::id()
    );
    let staging = ScratchPath(tmp.join(format!("{stamp}.root")));
    let raw = ScratchPath(tmp.join(format!("{stamp}.ext4")));
    staging.clear()?;
    raw.clear()?;
    std::fs::create_dir(&staging.0).ctx(|| format!("creating {}", staging.0.display()))?;
    let root = &staging.0;

    let diff_ids = &img.config.rootfs.diff_ids;
    if diff_ids.len() != img.layers.len() {
        return Err(OciError::BadImage {
            what: img.name.clone(),
            message: format!(
                "the manifest has {} layers but the config lists {} diff ids",
                img.layers.len(),
                diff_ids.len()
            ),
        });
    }
    let ownership = if opts.rootless {
        Ownership::Record
    } else {
        Ownership::for_this_process()
    };
    let mut applier = Applier::new(root, ownership, limits.unpack)?;
    for (i, (digest, blob)) in img.layers.iter().enumerate() {
        say(format!(
            "applying layer {}/{} ({digest})",
            i + 1,
            img.layers.len()
        ));
        let done = applier.apply_blob(i, digest.as_str(), blob)?;
        if done.diff_id != diff_ids[i] {
            return Err(OciError::DigestMismatch {
                what: format!("layer {i} ({digest}) uncompressed, against the config's diff id"),
                expected: diff_ids[i].clone(),
                actual: done.diff_id,
            });
        }
    }
    let run = run_config(root, &img.config)?;
    say("adding the agent and the guest essentials".into());
    // The image's tree decides where these land (its symlinks are followed inside
    // it): a path it makes unresolvable (a loop, a file where /etc should be) is the
    // image's fault.
    let tree_error = |e: ImageError| match e {
        ImageError::GuestPath { path, msg } => OciError::BadImage {
            what: format!("{}: its {path}", img.name),
            message: msg,
        },
        e => e.into(),
    };
    add_guest_essentials(root, "zygote", &agent, &mut |l| say(l.to_string()))
        .map_err(tree_error)?;
    // The agent runs commands as root and looks up login shells: an image without
    // account files (`FROM scratch`) gets minimal ones.
    add_minimal_accounts(root, true).map_err(tree_error)?;
    let applied = applier.finish()?;
    say(format!(
        "unpacked {} entries: {} MiB of files, {} MiB of them written (zero blocks are holes)",
        applied.entries,
        applied.file_bytes >> 20,
        applied.disk_bytes >> 20
    ));
    if applied.skipped_devices > 0 {
        say(format!(
            "skipped {} device nodes (the guest's /dev is devtmpfs)",
            applied.skipped_devices
        ));
    }
    if applied.skipped_xattrs > 0 {
        say(format!(
            "warning: {} extended attributes could not be kept",
            applied.skipped_xattrs
        ));
    }
    let (used_bytes, inodes) = usage(root)?;
    let size_mib = opts
        .size_mib
        .unwrap_or_else(|| ((used_bytes * 13 / 10) >> 20) + 1024)
        .max(used_bytes * 11 / 10 / (1 << 20) + 64);
    let spec = Ext4Spec {
        size_mib,
        label: "zygote-oci",
        key: &key,
        inodes: Some((inodes * 2).max(size_mib * 64)),
    };
    // The ext4 copy holds the tree again: room for it (and the reserve) first.
    let ext4_bytes = ext4_write_bound(used_bytes, spec.inodes.unwrap_or(inodes), size_mib);
    ensure_free(
        &tmp,
        ext4_bytes,
        limits.unpack.reserve_bytes,
        "for the ext4 image",
    )?;
    say(format!(
        "mkfs.ext4 -d ({size_mib} MiB, {} MiB used, {inodes} inodes)",
        used_bytes >> 20
    ));
    mkfs_ext4(root, &raw.0, &spec)?;
    if ownership == Ownership::Record {
        let fixups = with_defaults(root, applied.fixups)?;
        say(format!("setting {} owners with debugfs", fixups.len()));
        crate::ext4::apply_fixups(&raw.0, root, &fixups)?;
    }
    img.origin.config = run;
    let info = ImageInfo {
        name: img.name.clone(),
        sha256: String::new(),
        path: PathBuf::new(),
        size_bytes: 0,
        disk_bytes: 0,
        recipe_key: key,
        recipe_path: PathBuf::new(),
        description: format!("OCI image {}", img.origin.reference),
        base: format!("oci {}", img.origin.manifest_digest),
        agent_sha256: agent_sha,
        built_at: 0,
        build_secs: started.elapsed().as_secs_f64(),
        oci: Some(img.origin),
    };
    Ok(store_image(&raw.0, info, &mut |l| say(l.to_string()))?)
}

/// The image config's Env, WorkingDir and User, the user resolved to ids in the tree.
fn run_config(root: &Path, config: &ImageConfig) -> Result<RunConfig> {
    let c = config.config.clone().unwrap_or_default();
    let user = c.user.filter(|u| !u.is_empty());
    let (uid, gid) = match &user {
        Some(u) => {
            let (uid, gid) = resolve_user(root, u)?;
            (Some(uid), Some(gid))
        }
        None => (None, None),
    };
    Ok(RunConfig {
        env: c.env.unwrap_or_default(),
        working_dir: c.working_dir.filter(|w| w.starts_with('/')),
        user,
        uid,
        gid,
        entrypoint: c.entrypoint.unwrap_or_default(),
        cmd: c.cmd.unwrap_or_default(),
    })
}

/// `user`, `uid`, `user:group` or `uid:gid` to ids, as a container runtime would:
/// names from the image's /etc/passwd and /etc/group, a lone user's group from its
/// passwd entry (0 for a uid not in it).
pub(crate) fn resolve_user(root: &Path, spec: &str) -> Result<(u32, u32)> {
    let (user, group) = match spec.split_once(':') {
        Some((u, g)) => (u, Some(g)),
        None => (spec, None),
    };
    let passwd = read_guest(root, "/etc/passwd")?;
    let entry = |field: usize, want: &str| {
        passwd
            .lines()
            .map(|l| l.split(':').collect::<Vec<_>>())
            .find(|f| f.len() >= 4 && f[field] == want)
            .map(|f| (f[2].parse::<u32>().ok(), f[3].parse::<u32>().ok()))
    };
    let bad = |what: &str| OciError::BadImage {
        what: format!("the image's User {spec:?}"),
        message: format!("{what} is not in the image's /etc/passwd or /etc/group"),
    };
    let (uid, primary) = match user.parse::<u32>() {
        Ok(uid) => (uid, entry(2, user).and_then(|(_, g)| g).unwrap_or(0)),
        Err(_) => match entry(0, user) {
            Some((Some(uid), Some(gid))) => (uid, gid),
            _ => return Err(bad(&format!("user {user:?}"))),
        },
    };
    let gid = match group {
        None => primary,
        Some(g) => match g.parse::<u32>() {
            Ok(gid) => gid,
            Err(_) => read_guest(root, "/etc/group")?
                .lines()
                .map(|l| l.split(':').collect::<Vec<_>>())
                .find(|f| f.len() >= 3 && f[0] == g)
                .and_then(|f| f[2].parse().ok())
                .ok_or_else(|| bad(&format!("group {g:?}")))?,
        },
    };
    Ok((uid, gid))
}

/// The most an account file (`/etc/passwd`, `/etc/group`) of an image may hold: far
/// more than any real one, little enough to read into memory.
const MAX_ACCOUNT_FILE_BYTES: u64 = 8 << 20;

/// An account file of the guest tree, symlinks followed inside it (a bounded number:
/// a loop is a bad image), or "" if it is not there or not a regular file (a FIFO
/// would block the read forever). Bounded in size: the image may hold anything there.
fn read_guest(root: &Path, guest: &str) -> Result<String> {
    use std::io::Read;
    use std::os::unix::fs::OpenOptionsExt;
    let bad = |message: String| OciError::BadImage {
        what: format!("the image's {guest}"),
        message,
    };
    let path = match find_file(root, guest) {
        Ok(Some(path)) => path,
        Ok(None) => return Ok(String::new()),
        Err(ImageError::GuestPath { msg, .. }) => return Err(bad(msg)),
        Err(e) => return Err(e.into()),
    };
    // Not following a final symlink (there is none left) and not waiting on a FIFO.
    let Ok(file) = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(&path)
    else {
        return Ok(String::new());
    };
    if !file.metadata().is_ok_and(|m| m.is_file()) {
        return Ok(String::new());
    }
    let mut bytes = Vec::new();
    file.take(MAX_ACCOUNT_FILE_BYTES + 1)
        .read_to_end(&mut bytes)
        .ctx(|| format!("reading {}", path.display()))?;
    if bytes.len() as u64 > MAX_ACCOUNT_FILE_BYTES {
        return Err(bad(format!(
            "over {MAX_ACCOUNT_FILE_BYTES} bytes, the limit for an account file"
        )));
    }
    Ok(String::from_utf8_lossy(&bytes).into_owned())
}

/// The most `mkfs.ext4 -d` writes for a tree of `used_bytes` allocated and `inodes`
/// inodes into a file of `size_mib`: the data again (it leaves all-zero blocks out, as
/// the staged tree does), inode tables, a journal (mke2fs sizes it by the filesystem,
/// at most 1 GiB) and bitmaps and descriptors; never more than the file's size.
fn ext4_write_bound(used_bytes: u64, inodes: u64, size_mib: u64) -> u64 {
    let size = size_mib.saturating_mul(1 << 20);
    let journal = (size / 32).min(1 << 30);
    used_bytes
        .saturating_add(inodes.saturating_mul(256))
        .saturating_add(journal)
        .saturating_add(64 << 20)
        .min(size)
}

/// Bytes allocated and inodes used by the staged tree.
fn usage(root: &Path) -> Result<(u64, u64)> {
    let mut bytes = 0;
    let mut inodes = 0;
    let mut seen = std::collections::HashSet::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).ctx(|| format!("listing {}", dir.display()))? {
            let entry = entry.ctx(|| format!("listing {}", dir.display()))?;
            let m = entry
                .metadata()
                .ctx(|| format!("stat {}", entry.path().display()))?;
            if !seen.insert(m.ino()) {
                continue;
            }
            inodes += 1;
            bytes += m.blocks() * 512;
            if m.is_dir() {
                stack.push(entry.path());
            }
        }
    }
    Ok((bytes.max(1 << 20), inodes + 1))
}

/// Unprivileged conversion: every path the layers did not describe (the agent, the
/// essentials, parents made on the way) belongs to root.
fn with_defaults(root: &Path, mut fixups: Vec<Fixup>) -> Result<Vec<Fixup>> {
    let known: std::collections::HashSet<String> = fixups.iter().map(|f| f.guest.clone()).collect();
    let mut stack = vec![(root.to_path_buf(), String::new())];
    let mut extra = Vec::new();
    while let Some((dir, guest_dir)) = stack.pop() {
        for entry in std::fs::read_dir(&dir).ctx(|| format!("listing {}", dir.display()))? {
            let entry = entry.ctx(|| format!("listing {}", dir.display()))?;
            let guest = format!("{guest_dir}/{}", entry.file_name().to_string_lossy());
            let m = entry
                .metadata()
                .ctx(|| format!("stat {}", entry.path().display()))?;
            if !known.contains(&guest) {
                extra.push(Fixup {
                    guest: guest.clone(),
                    uid: 0,
                    gid: 0,
                    mode: (!m.file_type().is_symlink()).then_some(m.mode() & 0o7777),
                    xattrs: Vec::new(),
                });
            }
            if m.is_dir() {
                stack.push((entry.path(), guest));
            }
        }
    }
    fixups.extend(extra);
    Ok(fixups)
}

#[cfg(test)]
mod tests {
    use std::os::unix::ffi::OsStrExt;

    use super::*;

    #[test]
    fn the_ext4_copy_is_bounded_by_the_data_and_by_the_image_size() {
        const MIB: u64 = 1 << 20;
        // 100 MiB of data in a 1.2 GiB image: the data, 1000 inodes, a journal.
        let bound = ext4_write_bound(100 * MIB, 1000, 1200);
        assert!(bound >= 100 * MIB + 1000 * 256, "{bound}");
        assert!(bound <= 100 * MIB + 256 * MIB, "{bound}");
        // Never more than the file can hold.
        assert_eq!(ext4_write_bound(100 * MIB, 1 << 30, 64), 64 * MIB);
    }

    #[test]
    fn users_resolve_like_a_container_runtime() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        std::fs::create_dir_all(root.join("etc")).unwrap();
        std::fs::create_dir_all(root.join("usr/lib")).unwrap();
        std::fs::write(
            root.join("usr/lib/passwd"),
            "root:x:0:0::/root:/bin/sh\napp:x:1000:1001::/home/app:/bin/sh\n",
        )
        .unwrap();
        std::os::unix::fs::symlink("../usr/lib/passwd", root.join("etc/passwd")).unwrap();
        std::fs::write(root.join("etc/group"), "root:x:0:\nstaff:x:50:\n").unwrap();
        assert_eq!(resolve_user(root, "app").unwrap(), (1000, 1001));
        assert_eq!(resolve_user(root, "1000").unwrap(), (1000, 1001));
        assert_eq!(resolve_user(root, "4242").unwrap(), (4242, 0));
        assert_eq!(resolve_user(root, "app:staff").unwrap(), (1000, 50));
        assert_eq!(resolve_user(root, "7:8").unwrap(), (7, 8));
        let err = resolve_user(root, "ghost").unwrap_err().to_string();
        assert!(err.contains("\"ghost\""), "{err}");
        assert!(resolve_user(root, "app:nogroup").is_err());
    }

    #[test]
    fn account_files_in_a_symlink_loop_are_a_bad_image_not_a_crash() {
        let link = |root: &Path, target: &str, at: &str| {
            std::os::unix::fs::symlink(target, root.join(at)).unwrap();
        };
        let refused = |root: &Path, spec: &str, file: &str| {
            let err = resolve_user(root, spec).unwrap_err();
            let msg = err.to_string();
            assert!(matches!(err, OciError::BadImage { .. }), "{spec}: {msg}");
            assert!(msg.contains(file), "{msg}");
            assert!(msg.contains("too many levels of symbolic links"), "{msg}");
            assert!(
                !msg.contains(&root.display().to_string()),
                "no host path: {msg}"
            );
        };
        // /etc/passwd names itself.
        let one = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(one.path().join("etc")).unwrap();
        link(one.path(), "./passwd", "etc/passwd");
        refused(one.path(), "app", "/etc/passwd");
        // /etc/group is one half of a two-link cycle (one relative, one absolute).
        let two = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(two.path().join("etc")).unwrap();
        std::fs::write(two.path().join("etc/passwd"), "root:x:0:0::/root:/bin/sh\n").unwrap();
        link(two.path(), "../etc/other", "etc/group");
        link(two.path(), "/etc/group", "etc/other");
        refused(two.path(), "0:staff", "/etc/group");
    }

    #[test]
    fn a_fifo_or_a_huge_account_file_neither_blocks_nor_fills_memory() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        std::fs::create_dir_all(root.join("etc")).unwrap();
        let fifo = std::ffi::CString::new(root.join("etc/passwd").as_os_str().as_bytes()).unwrap();
        // SAFETY: a valid NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o600) }, 0);
        // A FIFO is no account file: a uid with no entry, read without waiting.
        assert_eq!(resolve_user(root, "1000").unwrap(), (1000, 0));
        // A sparse file of 9 MiB: refused by its size, not read into memory.
        let big = std::fs::File::create(root.join("etc/group")).unwrap();
        big.set_len(MAX_ACCOUNT_FILE_BYTES + (1 << 20)).unwrap();
        let err = resolve_user(root, "0:staff").unwrap_err();
        let msg = err.to_string();
        assert!(matches!(err, OciError::BadImage { .. }), "{msg}");
        assert!(msg.contains("the limit for an account file"), "{msg}");
    }
}
