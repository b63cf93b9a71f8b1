//! The image store: `<cache>/images/`.
//!
//! ```text
//! <name>-<sha256>.ext4     the image; sha256 = sha256 of the file's bytes
//! <name>-<sha256>.json     ImageInfo
//! index/<name>-<recipe key>  one line: the sha256 built from that recipe key
//! index/<name>.current        one line: the sha256 the last build of <name> gave
//! ```
//!
//! A name means the image its last build gave (made or found in the cache), not the
//! newest file: after a rebuild from older inputs (another checkout, a reverted
//! recipe) "minimal" is what that build produced.
//!
//! Images are named by their content so that a VM overlay or snapshot that
//! refers to a base image by hash can never silently get different bytes; the
//! recipe key (a hash of everything that goes into a build) is only an index
//! that turns "build minimal" into "already have it" without rebuilding.
//!
//! A snapshot pack's base image ([`crate::pack::store_pack_base`]) comes from whoever
//! made the pack, so it never gets a name anyone resolves: it is stored as
//! `pack-base-<sha256>` (not a recipe name: those are at most 64 characters; not a
//! reference: no `/`, `:` or `@`), is never what a name means (`.current`), and
//! [`locate_image`] never returns it, whatever the query (name, file stem, hash
//! prefix). Only its content finds it ([`find_by_sha256`], exact), and `prune` keeps
//! it. Its recipe key (`pack-<sha256>`) marks it, also for images earlier versions
//! adopted under the name their pack claimed.
use std::fs::File;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::error::{ImageError, IoContext, Result};
use crate::exec::Progress;
use crate::paths::images_dir;

/// A built root filesystem image.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ImageInfo {
    pub name: String,
    /// sha256 of the image file's bytes (also in its file name).
    pub sha256: String,
    /// Absolute path; recomputed from the store location on load, so a moved
    /// cache directory still works.
    #[serde(skip_deserializing)]
    pub path: PathBuf,
    /// Apparent size of the (sparse) ext4 file.
    pub size_bytes: u64,
    /// Bytes actually allocated on the host.
    pub disk_bytes: u64,
    /// Hash of the build inputs (recipe text, extra files, agent, base).
    pub recipe_key: String,
    pub recipe_path: PathBuf,
    pub description: String,
    /// What the tree was made from, e.g. `busybox 1:1.35.0-4` or `debootstrap bookworm/minbase`.
    pub base: String,
    pub agent_sha256: String,
    /// Unix time of the build.
    pub built_at: u64,
    pub build_secs: f64,
    /// Set for an image converted from an OCI image (pulled or imported): where it came
    /// from and the run configuration it carries.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub oci: Option<OciOrigin>,
}

/// Where an image converted from an OCI image came from, and what of its configuration
/// the sandbox keeps (the image's entrypoint is not run: the agent is PID 1).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct OciOrigin {
    /// The reference as pulled (normalized, e.g. `docker.io/library/alpine:3.20`), or
    /// `oci-archive:PATH` / `docker-archive:PATH` for an import.
    pub reference: String,
    /// Digest of the platform's image manifest (for a docker archive without one: the
    /// config's digest, which is docker's image id).
    pub manifest_digest: String,
    pub config_digest: String,
    /// `os/architecture` of the image, e.g. `linux/amd64`.
    pub platform: String,
    /// Compressed layer digests, bottom first.
    pub layers: Vec<String>,
    pub config: RunConfig,
}

/// The part of an OCI image's config that shapes how commands run in the sandbox.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct RunConfig {
    /// `KEY=value` entries: the default environment of every exec.
    #[serde(default)]
    pub env: Vec<String>,
    /// Default working directory of execs (absolute), if the image sets one.
    #[serde(default)]
    pub working_dir: Option<String>,
    /// `User` as the image wrote it (`name`, `uid`, `uid:gid`, `name:group`).
    #[serde(default)]
    pub user: Option<String>,
    /// `User` resolved against the image's /etc/passwd and /etc/group at conversion.
    #[serde(default)]
    pub uid: Option<u32>,
    #[serde(default)]
    pub gid: Option<u32>,
    #[serde(default)]
    pub entrypoint: Vec<String>,
    #[serde(default)]
    pub cmd: Vec<String>,
}

/// How the recipe key of a snapshot pack's base image starts (see the module doc).
pub(crate) const PACK_BASE_KEY: &str = "pack-";

impl ImageInfo {
    pub fn file_stem(&self) -> String {
        format!("{}-{}", fs_name(&self.name), self.sha256)
    }

    /// A snapshot pack's base image: found by its content only (see the module doc).
    pub fn is_pack_base(&self) -> bool {
        self.recipe_key.starts_with(PACK_BASE_KEY)
    }
}

/// An image name as a file name: OCI references contain `/`, which no other name
/// character maps to `+` (a reference cannot contain `+`), so the mapping is one to one.
pub(crate) fn fs_name(name: &str) -> String {
    name.replace('/', "+")
}

pub(crate) fn image_path(dir: &Path, name: &str, sha256: &str) -> PathBuf {
    dir.join(format!("{}-{sha256}.ext4", fs_name(name)))
}

fn metadata_path(dir: &Path, name: &str, sha256: &str) -> PathBuf {
    dir.join(format!("{}-{sha256}.json", fs_name(name)))
}

fn index_path(dir: &Path, name: &str, recipe_key: &str) -> PathBuf {
    dir.join("index")
        .join(format!("{}-{recipe_key}", fs_name(name)))
}

fn current_path(dir: &Path, name: &str) -> PathBuf {
    dir.join("index").join(format!("{}.current", fs_name(name)))
}

/// Records `info` as what its name now means (see the module doc).
pub(crate) fn mark_current(dir: &Path, info: &ImageInfo) -> Result<()> {
    let path = current_path(dir, &info.name);
    std::fs::create_dir_all(path.parent().expect("index has a parent"))
        .ctx(|| "creating the image index".into())?;
    write_atomic(&path, format!("{}\n", info.sha256).as_bytes())
}

/// The sha256 `name` currently means, if a build recorded one.
fn current_sha(dir: &Path, name: &str) -> Option<String> {
    let sha = std::fs::read_to_string(current_path(dir, name)).ok()?;
    Some(sha.trim().to_string())
}

fn load_info(dir: &Path, json_path: &Path) -> Result<ImageInfo> {
    let text =
        std::fs::read_to_string(json_path).ctx(|| format!("reading {}", json_path.display()))?;
    let mut info: ImageInfo =
        serde_json::from_str(&text).map_err(|source| ImageError::Metadata {
            path: json_path.to_path_buf(),
            source,
        })?;
    info.path = image_path(dir, &info.name, &info.sha256);
    Ok(info)
}

/// Records a freshly built image (metadata + index entry).
pub(crate) fn save_info(dir: &Path, info: &ImageInfo) -> Result<()> {
    let json = serde_json::to_string_pretty(info).expect("ImageInfo serializes");
    let path = metadata_path(dir, &info.name, &info.sha256);
    write_atomic(&path, json.as_bytes())?;
    let index = index_path(dir, &info.name, &info.recipe_key);
    std::fs::create_dir_all(index.parent().expect("index has a parent"))
        .ctx(|| "creating the image index".into())?;
    write_atomic(&index, format!("{}\n", info.sha256).as_bytes())
}

/// The image previously built from exactly these inputs, if it is still there.
pub(crate) fn lookup_by_recipe_key(dir: &Path, name: &str, recipe_key: &str) -> Option<ImageInfo> {
    let sha = std::fs::read_to_string(index_path(dir, name, recipe_key)).ok()?;
    let info = load_info(dir, &metadata_path(dir, name, sha.trim())).ok()?;
    info.path.is_file().then_some(info)
}

/// Writes `path` whole or not at all. The temporary file is unique per call, not per
/// process: threads of one process (tests, a daemon building on first use) record the
/// same image at once, and a shared name let one rename the other's file away.
fn write_atomic(path: &Path, data: &[u8]) -> Result<()> {
    use std::io::Write;
    let dir = path.parent().expect("store paths have a parent");
    let mut tmp = tempfile::Builder::new()
        .prefix(".write-")
        .tempfile_in(dir)
        .ctx(|| format!("creating a temporary file in {}", dir.display()))?;
    tmp.write_all(data)
        .ctx(|| format!("writing {}", tmp.path().display()))?;
    tmp.persist(path)
        .map_err(|e| e.error)
        .ctx(|| format!("renaming to {}", path.display()))?;
    Ok(())
}

/// Every image in the store whose file still exists, sorted by name and then
/// newest first.
pub fn list_images() -> Result<Vec<ImageInfo>> {
    list_images_in(&images_dir())
}

pub(crate) fn list_images_in(dir: &Path) -> Result<Vec<ImageInfo>> {
    let entries = match std::fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e).ctx(|| format!("listing {}", dir.display())),
    };
    let mut images = Vec::new();
    for entry in entries.flatten() {
        let path = entry.path();
        if path.extension().is_some_and(|e| e == "json") {
            let info = load_info(dir, &path)?;
            if info.path.is_file() {
                images.push(info);
            }
        }
    }
    images.sort_by(|a, b| a.name.cmp(&b.name).then(b.built_at.cmp(&a.built_at)));
    Ok(images)
}

/// Finds a built image without building: by name (what its last build gave, else the
/// newest of that name), by sha256 or a unique prefix of at least 8 hex digits, or by `name-sha256`.
/// Never a snapshot pack's base image (see the module doc).
pub fn locate_image(query: &str) -> Result<ImageInfo> {
    locate_image_in(&images_dir(), query)
}

pub(crate) fn locate_image_in(dir: &Path, query: &str) -> Result<ImageInfo> {
    let mut images = list_images_in(dir)?;
    images.retain(|i| !i.is_pack_base());
    let current = current_sha(dir, query);
    let by_name = images
        .iter()
        .find(|i| i.name == query && current.as_deref() == Some(i.sha256.as_str()))
        .or_else(|| {
            images.iter().find(|i| {
                i.name == query
                    || i.file_stem() == query
                    || format!("{}-{}", i.name, i.sha256) == query
            })
        });
    if let Some(found) = by_name {
        return Ok(found.clone());
    }
    let is_hex = query.len() >= 8 && query.chars().all(|c| c.is_ascii_hexdigit());
    if is_hex {
        let matches: Vec<_> = images
            .iter()
            .filter(|i| i.sha256.starts_with(&query.to_ascii_lowercase()))
            .collect();
        if matches.len() == 1 {
            return Ok(matches[0].clone());
        }
    }
    Err(ImageError::ImageNotFound(query.to_string()))
}

/// Any stored image whose bytes hash to `sha256` (all 64 digits), snapshot pack bases
/// included: the same bytes whatever the image is called.
pub fn find_by_sha256(sha256: &str) -> Result<Option<ImageInfo>> {
    find_by_sha256_in(&images_dir(), sha256)
}

pub(crate) fn find_by_sha256_in(dir: &Path, sha256: &str) -> Result<Option<ImageInfo>> {
    if sha256.len() != 64 {
        return Ok(None);
    }
    Ok(list_images_in(dir)?
        .into_iter()
        .find(|i| i.sha256 == sha256))
}

/// Deletes one image (as found by [`locate_image`], or a snapshot pack's base by its
/// whole name) with its metadata and the index entries pointing at it. Running VMs
/// keep working: their overlay holds the base open.
pub fn remove_image(query: &str) -> Result<ImageInfo> {
    let dir = images_dir();
    let info = match locate_image_in(&dir, query) {
        Err(ImageError::ImageNotFound(_)) => list_images_in(&dir)?
            .into_iter()
            .find(|i| i.is_pack_base() && i.name == query)
            .ok_or_else(|| ImageError::ImageNotFound(query.to_string()))?,
        found => found?,
    };
    remove_in(&dir, &info)?;
    Ok(info)
}

/// Deletes every image but the one each name means ([`locate_image`]) and snapshot pack
/// bases (named by their content: each is the only one of its name); returns what was
/// removed.
pub fn prune_images() -> Result<Vec<ImageInfo>> {
    prune_in(&images_dir())
}

pub(crate) fn prune_in(dir: &Path) -> Result<Vec<ImageInfo>> {
    let mut removed = Vec::new();
    for info in list_images_in(dir)? {
        if info.is_pack_base() {
            continue;
        }
        if locate_image_in(dir, &info.name)?.sha256 != info.sha256 {
            remove_in(dir, &info)?;
            removed.push(info);
        }
    }
    Ok(removed)
}

fn remove_in(dir: &Path, info: &ImageInfo) -> Result<()> {
    if current_sha(dir, &info.name).as_deref() == Some(info.sha256.as_str()) {
        let _ = std::fs::remove_file(current_path(dir, &info.name));
    }
    let index_dir = dir.join("index");
    if let Ok(entries) = std::fs::read_dir(&index_dir) {
        let prefix = format!("{}-", fs_name(&info.name));
        for entry in entries.flatten() {
            let named = entry.file_name().to_string_lossy().starts_with(&prefix);
            let points_here =
                std::fs::read_to_string(entry.path()).is_ok_and(|sha| sha.trim() == info.sha256);
            if named && points_here {
                let _ = std::fs::remove_file(entry.path());
            }
        }
    }
    for path in [
        metadata_path(dir, &info.name, &info.sha256),
        image_path(dir, &info.name, &info.sha256),
    ] {
        match std::fs::remove_file(&path) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                return Err(e).ctx(|| format!("removing {}", path.display()))
            }
            _ => {}
        }
    }
    Ok(())
}

/// sha256 of a file's bytes, hex (what `sha256sum FILE` prints).
///
/// Images are GiB-sized sparse files: holes (found with SEEK_DATA/SEEK_HOLE) are hashed
/// as the zeros they read as without reading them, and the workspace builds `sha2`
/// optimized even in dev profiles (Cargo.toml), where it uses the CPU's SHA extensions.
pub fn sha256_file(path: &Path) -> Result<String> {
    use sha2::Digest;
    use std::io::{Read, Seek, SeekFrom};
    use std::os::fd::AsRawFd;
    static ZEROS: [u8; 1 << 16] = [0; 1 << 16];
    let mut file = File::open(path).ctx(|| format!("opening {} to hash it", path.display()))?;
    let len = file
        .metadata()
        .ctx(|| format!("stat {}", path.display()))?
        .len();
    let mut hasher = sha2::Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    let mut pos = 0u64;
    let fd = file.as_raw_fd();
    while pos < len {
        // SAFETY: fd is open for the life of `file`; lseek has no memory effects.
        let data = unsafe { libc::lseek(fd, pos as libc::off_t, libc::SEEK_DATA) };
        // No more data (ENXIO), or no SEEK_DATA here: the rest is a hole, or read it all.
        let data = if data < 0 {
            match std::io::Error::last_os_error().raw_os_error() {
                Some(libc::ENXIO) => len,
                _ => pos,
            }
        } else {
            data as u64
        };
        let mut zeros = data - pos;
        while zeros > 0 {
            let n = zeros.min(ZEROS.len() as u64) as usize;
            hasher.update(&ZEROS[..n]);
            zeros -= n as u64;
        }
        pos = data;
        if pos >= len {
            break;
        }
        // SAFETY: as above.
        let hole = unsafe { libc::lseek(fd, pos as libc::off_t, libc::SEEK_HOLE) };
        let end = if hole < 0 {
            len
        } else {
            (hole as u64).min(len)
        };
        file.seek(SeekFrom::Start(pos))
            .ctx(|| format!("seeking in {}", path.display()))?;
        let mut left = end - pos;
        while left > 0 {
            let want = left.min(buf.len() as u64) as usize;
            match file.read(&mut buf[..want]) {
                Ok(0) => break,
                Ok(n) => {
                    hasher.update(&buf[..n]);
                    left -= n as u64;
                }
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e).ctx(|| format!("reading {}", path.display())),
            }
        }
        pos = end - left;
        if left > 0 {
            // The file shrank while being read: hash what is there, as sha256sum would.
            break;
        }
    }
    Ok(hex::encode(hasher.finalize()))
}

/// An exclusive `flock` on a file, released on drop: serializes builds of the
/// same thing across threads and processes (tests run in parallel, and a user
/// may run `zygote image build` twice).
pub struct FileLock {
    _file: File,
}

impl FileLock {
    /// Locks `path`, creating it and its directory first: a lock is often the first
    /// thing taken in a cache directory, and on a new machine nothing exists yet.
    pub fn acquire(path: &Path, progress: Progress) -> Result<FileLock> {
        use std::os::fd::AsRawFd;
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).ctx(|| format!("creating {}", dir.display()))?;
        }
        let file = File::options()
            .create(true)
            .truncate(false)
            .write(true)
            .open(path)
            .ctx(|| format!("opening lock {}", path.display()))?;
        let fd = file.as_raw_fd();
        // SAFETY: fd is a valid open descriptor owned by `file`.
        if unsafe { libc::flock(fd, libc::LOCK_EX | libc::LOCK_NB) } != 0 {
            progress(&format!("waiting for another build ({})", path.display()));
            // SAFETY: as above.
            if unsafe { libc::flock(fd, libc::LOCK_EX) } != 0 {
                return Err(std::io::Error::last_os_error())
                    .ctx(|| format!("locking {}", path.display()));
            }
        }
        Ok(FileLock { _file: file })
    }
}

#[cfg(test)]
#[path = "store_tests.rs"]
mod tests;
