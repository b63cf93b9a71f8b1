//! Where an incoming snapshot pack's blobs wait until the pack is accepted:
//! `<cache>/oci/staging/<name>/blobs/`, beside the shared blob store (same filesystem,
//! so committing is a rename).
//!
//! A pack is hostile until every check passed (digests, its config, each decoded file,
//! the runtime's look at its disk and state), and a refused one must leave nothing: its
//! blobs live here, never in the shared store, and [`Staging::commit`] moves the ones
//! the pack uses into the store only once the snapshot is registered. Dropped without a
//! commit (refused, failed, cancelled), the directory goes with everything in it.
//!
//! A process killed mid-import never runs that drop, so each staging directory has a
//! lock file (`<name>.lock`, an `flock` its owner holds for the directory's life):
//! [`sweep`] (at daemon start-up, and before each new staging) removes every directory
//! whose lock no process holds. The cache may be shared by several daemons; a lock,
//! unlike a pid, cannot be mistaken for a live owner after pid reuse, and a daemon
//! never removes another live daemon's staging.
use std::fs::File;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};

use crate::blobs::BlobStore;
use crate::error::{IoContext, Result};
use crate::manifest::Digest;

/// Staging directories of packs being imported, sharing a filesystem with the store.
pub fn staging_root() -> PathBuf {
    zygote_images::cache_dir().join("oci/staging")
}

/// An incoming pack's blobs, removed on drop unless committed.
pub struct Staging {
    dir: PathBuf,
    lock_path: PathBuf,
    blobs: BlobStore,
    /// Held (flock) for as long as this value lives.
    _lock: File,
}

impl Staging {
    /// A new staging directory under [`staging_root`] (stale ones are swept first).
    pub fn new() -> Result<Staging> {
        Staging::under(&staging_root())
    }

    /// A new staging directory under `root`.
    pub fn under(root: &Path) -> Result<Staging> {
        std::fs::create_dir_all(root).ctx(|| format!("creating {}", root.display()))?;
        sweep_in(root);
        let (name, lock_path, lock) = new_lock(root)?;
        let dir = root.join(&name);
        let blobs = BlobStore::at(&dir.join("blobs"));
        let blobs = match blobs {
            Ok(b) => b,
            Err(e) => {
                let _ = std::fs::remove_dir_all(&dir);
                let _ = std::fs::remove_file(&lock_path);
                return Err(e);
            }
        };
        Ok(Staging {
            dir,
            lock_path,
            blobs,
            _lock: lock,
        })
    }

    /// Keeps `bytes` free on the staging filesystem while blobs are written (instead of
    /// the blob store's default reserve): the importer decides what it leaves free, and
    /// the store's checks while writing must agree with the room it measured up front.
    pub fn with_reserve(mut self, bytes: u64) -> Staging {
        self.blobs.set_reserve(bytes);
        self
    }

    /// The staged blobs (digest-checked as they are written, like the shared store's).
    pub fn blobs(&self) -> &BlobStore {
        &self.blobs
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Makes `shared`'s copy of `digest` one of the staged blobs (a hard link: no
    /// copy, and a prune of the shared store cannot take it away mid-import). False
    /// when the store has no such blob or it cannot be linked (then it is fetched).
    pub fn link_existing(&self, shared: &BlobStore, digest: &Digest) -> bool {
        if self.blobs.has(digest) {
            return true;
        }
        shared.has(digest)
            && std::fs::hard_link(shared.path(digest), self.blobs.path(digest)).is_ok()
    }

    /// Moves the staged blobs named in `digests` into `shared` (those it lacks), then
    /// removes the staging directory. Called once the pack is registered.
    pub fn commit(self, digests: &[Digest], shared: &BlobStore) -> Result<()> {
        for d in digests {
            if shared.has(d) || !self.blobs.has(d) {
                continue;
            }
            let staged = self.blobs.path(d);
            if std::fs::rename(&staged, shared.path(d)).is_err() {
                // Another filesystem after all (a symlinked store): copied and checked.
                shared.put_file(d, &staged, u64::MAX)?;
            }
        }
        Ok(())
    }
}

impl Drop for Staging {
    fn drop(&mut self) {
        if let Err(e) = std::fs::remove_dir_all(&self.dir) {
            if e.kind() != std::io::ErrorKind::NotFound {
                tracing::warn!("removing pack staging {}: {e}", self.dir.display());
            }
        }
        let _ = std::fs::remove_file(&self.lock_path);
    }
}

/// Removes the staging directories under [`staging_root`] that no live process holds
/// (imports a killed process left); returns how many.
pub fn sweep() -> usize {
    sweep_in(&staging_root())
}

fn sweep_in(root: &Path) -> usize {
    let Ok(entries) = std::fs::read_dir(root) else {
        return 0;
    };
    let mut removed = 0;
    for entry in entries.flatten() {
        let path = entry.path();
        let name = entry.file_name().to_string_lossy().into_owned();
        if let Some(stem) = name.strip_suffix(".lock") {
            // Held: a live import. Acquired: its owner is gone (the lock goes with it).
            let held = File::options()
                .write(true)
                .open(&path)
                .map(|f| !try_lock(&f))
                .unwrap_or(true);
            if !held {
                let _ = std::fs::remove_dir_all(root.join(stem));
                let _ = std::fs::remove_file(&path);
                removed += 1;
            }
        } else if entry.file_type().is_ok_and(|t| t.is_dir())
            && !root.join(format!("{name}.lock")).exists()
        {
            // A directory whose lock is gone: the rest of a removal that was cut short.
            let _ = std::fs::remove_dir_all(&path);
            removed += 1;
        }
    }
    removed
}

/// A new lock file under `root`, created and locked (the lock first, the directory
/// second: a directory without a held lock is always someone's leftover). A sweep may
/// take a lock file between its creation and our flock and remove it; then the file
/// locked is no longer the one the name points to, and another name is tried.
fn new_lock(root: &Path) -> Result<(String, PathBuf, File)> {
    use std::os::unix::fs::MetadataExt;
    loop {
        let name = format!("import-{}-{}", std::process::id(), random_hex());
        let lock_path = root.join(format!("{name}.lock"));
        let lock = File::options()
            .create_new(true)
            .write(true)
            .open(&lock_path)
            .ctx(|| format!("creating {}", lock_path.display()))?;
        // SAFETY: the descriptor is open for the life of `lock`; flock has no memory
        // effects. Waits only while a sweep holds it (an instant).
        if unsafe { libc::flock(lock.as_raw_fd(), libc::LOCK_EX) } != 0 {
            return Err(std::io::Error::last_os_error())
                .ctx(|| format!("locking {}", lock_path.display()));
        }
        let ours = lock.metadata().map(|m| m.ino()).ok();
        let named = std::fs::metadata(&lock_path).map(|m| m.ino()).ok();
        if ours.is_some() && ours == named {
            return Ok((name, lock_path, lock));
        }
    }
}

/// Takes an exclusive flock without waiting.
fn try_lock(f: &File) -> bool {
    // SAFETY: the descriptor is open for the life of `f`; flock has no memory effects.
    unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) == 0 }
}

fn random_hex() -> String {
    let mut b = [0u8; 6];
    // getrandom(2) into a local buffer; on failure the time below still separates names.
    // SAFETY: writes at most b.len() bytes into b.
    let _ = unsafe { libc::getrandom(b.as_mut_ptr().cast(), b.len(), 0) };
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    format!("{}{t:08x}", hex::encode(b))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn files_under(dir: &Path) -> usize {
        std::fs::read_dir(dir).map(|e| e.count()).unwrap_or(0)
    }

    #[test]
    fn staged_blobs_vanish_unless_committed_and_dead_owners_are_swept() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path().join("staging");
        let shared = BlobStore::at(&tmp.path().join("shared")).unwrap();
        let (a, b) = (b"blob a".to_vec(), b"blob b".to_vec());
        let (da, db) = (Digest::of(&a), Digest::of(&b));

        // Dropped: nothing stays, in the staging root or the store.
        let s = Staging::under(&root).unwrap();
        s.blobs()
            .put_with_digest(&da, &mut &a[..], 1 << 20)
            .unwrap();
        drop(s);
        assert_eq!(files_under(&root), 0);
        assert!(!shared.has(&da));

        // Committed: only the named blobs reach the store.
        let s = Staging::under(&root).unwrap();
        s.blobs()
            .put_with_digest(&da, &mut &a[..], 1 << 20)
            .unwrap();
        s.blobs()
            .put_with_digest(&db, &mut &b[..], 1 << 20)
            .unwrap();
        s.commit(std::slice::from_ref(&da), &shared).unwrap();
        assert!(shared.has(&da) && !shared.has(&db));
        assert_eq!(files_under(&root), 0);

        // A blob the store has is linked, not fetched again.
        let s = Staging::under(&root).unwrap();
        assert!(s.link_existing(&shared, &da));
        assert!(!s.link_existing(&shared, &db));
        assert!(s.blobs().has(&da));

        // A live owner's staging survives a sweep; a dead owner's does not.
        let live = Staging::under(&root).unwrap();
        assert_eq!(sweep_in(&root), 0);
        // As a killed process leaves it: the directory and an unheld lock file.
        let dead = root.join("import-1-dead");
        std::fs::create_dir_all(dead.join("blobs")).unwrap();
        std::fs::write(dead.join("blobs/x.partial"), b"half").unwrap();
        std::fs::write(root.join("import-1-dead.lock"), b"").unwrap();
        std::fs::create_dir_all(root.join("import-2-lockless")).unwrap();
        assert_eq!(sweep_in(&root), 2);
        assert!(!dead.exists() && !root.join("import-2-lockless").exists());
        assert!(live.dir().exists() && s.dir().exists());
        drop((s, live));
        assert_eq!(files_under(&root), 0);
    }
}
