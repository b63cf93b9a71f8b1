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

impl ImageInfo {
    pub fn file_stem(&self) -> String {
        format!("{}-{}", fs_name(&self.name), self.sha256)
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

fn write_atomic(path: &Path, data: &[u8]) -> Result<()> {
    let tmp = path.with_extension(format!("tmp-{}", std::process::id()));
    std::fs::write(&tmp, data).ctx(|| format!("writing {}", tmp.display()))?;
    std::fs::rename(&tmp, path).ctx(|| format!("renaming to {}", path.display()))
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
pub fn locate_image(query: &str) -> Result<ImageInfo> {
    locate_image_in(&images_dir(), query)
}

pub(crate) fn locate_image_in(dir: &Path, query: &str) -> Result<ImageInfo> {
    let images = list_images_in(dir)?;
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

/// Deletes one image (as found by [`locate_image`]) with its metadata and
/// the index entries pointing at it. Running VMs keep working: their overlay
/// holds the base open.
pub fn remove_image(query: &str) -> Result<ImageInfo> {
    let dir = images_dir();
    let info = locate_image_in(&dir, query)?;
    remove_in(&dir, &info)?;
    Ok(info)
}

/// Deletes every image but the one each name means ([`locate_image`]); returns what was
/// removed.
pub fn prune_images() -> Result<Vec<ImageInfo>> {
    prune_in(&images_dir())
}

pub(crate) fn prune_in(dir: &Path) -> Result<Vec<ImageInfo>> {
    let mut removed = Vec::new();
    for info in list_images_in(dir)? {
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
mod tests {
    use super::*;

    #[test]
    fn a_lock_in_a_directory_not_yet_made_creates_it() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("cache/images/.lock-minimal");
        let lock = FileLock::acquire(&path, &mut |_| {}).unwrap();
        assert!(path.is_file(), "{} was not created", path.display());
        drop(lock);
    }

    #[test]
    fn sha256_of_a_sparse_file_is_that_of_its_bytes() {
        use sha2::Digest;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sparse");
        let f = File::create(&path).unwrap();
        f.set_len(10 << 20).unwrap();
        use std::os::unix::fs::FileExt;
        f.write_all_at(b"in the middle", 5 << 20).unwrap();
        f.write_all_at(b"at the end", (10 << 20) - 10).unwrap();
        f.write_all_at(&[7u8; 70_000], 4096).unwrap();
        drop(f);
        let bytes = std::fs::read(&path).unwrap();
        assert_eq!(
            sha256_file(&path).unwrap(),
            hex::encode(sha2::Sha256::digest(&bytes))
        );
        let empty = dir.path().join("empty");
        File::create(&empty).unwrap().set_len(3 << 20).unwrap();
        let zeros = vec![0u8; 3 << 20];
        assert_eq!(
            sha256_file(&empty).unwrap(),
            hex::encode(sha2::Sha256::digest(&zeros))
        );
    }

    #[test]
    fn sha256_of_file_matches_known_vector() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        std::fs::write(&path, b"abc").unwrap();
        assert_eq!(
            sha256_file(&path).unwrap(),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
    }

    fn info(name: &str, sha: &str, key: &str, built_at: u64) -> ImageInfo {
        ImageInfo {
            name: name.into(),
            sha256: sha.into(),
            path: PathBuf::new(),
            size_bytes: 1,
            disk_bytes: 1,
            recipe_key: key.into(),
            recipe_path: "/r".into(),
            description: String::new(),
            base: "busybox".into(),
            agent_sha256: "0".into(),
            built_at,
            build_secs: 0.0,
            oci: None,
        }
    }

    #[test]
    fn save_lookup_list_locate() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        let old = info("mini", &"a".repeat(64), "k1", 10);
        let new = info("mini", &format!("ab{}", "0".repeat(62)), "k2", 20);
        let other = info("py", &"c".repeat(64), "k3", 5);
        for i in [&old, &new, &other] {
            save_info(d, i).unwrap();
        }
        // Metadata without its image file does not count as built.
        assert!(list_images_in(d).unwrap().is_empty());
        assert!(lookup_by_recipe_key(d, "mini", "k1").is_none());
        for i in [&old, &new, &other] {
            std::fs::write(image_path(d, &i.name, &i.sha256), b"x").unwrap();
        }
        let listed: Vec<_> = list_images_in(d)
            .unwrap()
            .into_iter()
            .map(|i| i.built_at)
            .collect();
        assert_eq!(listed, vec![20, 10, 5], "by name, newest first");
        let hit = lookup_by_recipe_key(d, "mini", "k1").unwrap();
        assert_eq!(hit.sha256, old.sha256);
        assert_eq!(hit.path, d.join(format!("mini-{}.ext4", old.sha256)));
        assert!(lookup_by_recipe_key(d, "mini", "k9").is_none());
        assert_eq!(locate_image_in(d, "mini").unwrap().built_at, 20);
        assert_eq!(locate_image_in(d, "cccccccc").unwrap().name, "py");
        assert_eq!(
            locate_image_in(d, &format!("mini-{}", old.sha256))
                .unwrap()
                .built_at,
            10
        );
        // "a" prefixes: aaaa... and ab00...: ambiguous below 2 digits, too short anyway.
        assert!(matches!(locate_image_in(d, "aaaaaaaa"), Ok(i) if i.built_at == 10));
        assert!(matches!(
            locate_image_in(d, "nope"),
            Err(ImageError::ImageNotFound(_))
        ));
        assert!(matches!(
            locate_image_in(d, "ccc"),
            Err(ImageError::ImageNotFound(_))
        ));

        // Pruning keeps the newest of each name and drops the old one's files
        // and index entry.
        let removed = prune_in(d).unwrap();
        assert_eq!(removed.len(), 1);
        assert_eq!(removed[0].sha256, old.sha256);
        assert!(!image_path(d, "mini", &old.sha256).exists());
        assert!(lookup_by_recipe_key(d, "mini", "k1").is_none());
        assert!(lookup_by_recipe_key(d, "mini", "k2").is_some());
        let names: Vec<_> = list_images_in(d)
            .unwrap()
            .into_iter()
            .map(|i| i.name)
            .collect();
        assert_eq!(names, vec!["mini", "py"]);
    }

    #[test]
    fn a_name_means_its_last_build_not_the_newest_file() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        let old = info("mini", &"a".repeat(64), "k1", 10);
        let new = info("mini", &"b".repeat(64), "k2", 20);
        for i in [&old, &new] {
            save_info(d, i).unwrap();
            std::fs::write(image_path(d, &i.name, &i.sha256), b"x").unwrap();
        }
        assert_eq!(locate_image_in(d, "mini").unwrap().sha256, new.sha256);
        // A build resolved the older inputs again (cache hit): the name follows it.
        mark_current(d, &old).unwrap();
        assert_eq!(locate_image_in(d, "mini").unwrap().sha256, old.sha256);
        // Pruning keeps what the name means.
        let removed = prune_in(d).unwrap();
        assert_eq!(removed.len(), 1);
        assert_eq!(removed[0].sha256, new.sha256);
        assert_eq!(locate_image_in(d, "mini").unwrap().sha256, old.sha256);
        // Removing it drops the pointer; the name falls back to the newest left.
        mark_current(d, &old).unwrap();
        save_info(d, &new).unwrap();
        std::fs::write(image_path(d, &new.name, &new.sha256), b"x").unwrap();
        remove_in(d, &old).unwrap();
        assert!(current_sha(d, "mini").is_none());
        assert_eq!(locate_image_in(d, "mini").unwrap().sha256, new.sha256);
    }
}
