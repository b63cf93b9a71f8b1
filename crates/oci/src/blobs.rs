//! The content-addressed blob store: `<cache>/oci/blobs/sha256/<hex>`, shared by every
//! image (a layer two images share is downloaded and kept once).
//!
//! A blob appears under its name only once its bytes hash to it: downloads and copies
//! write `<hex>.partial` and rename it after the check. A download interrupted (a
//! killed process, a dropped connection) leaves its `.partial`, which the next one
//! continues from where it stopped; bytes that turn out wrong are thrown away whole.
//!
//! Blobs come from registries and archives, and can be large (a layer up to 16 GiB,
//! a snapshot's memory): the store keeps a reserve of free space on its filesystem
//! for everything else. An operation that knows what it will write checks up front
//! that it fits ([`BlobStore::make_room`]: a pull from the manifest's declared sizes,
//! an import from the archive's files), and every writer checks the reserve again
//! when it starts and every [`CHECK_EVERY_BYTES`] it writes: other pulls, builds and
//! sandboxes use the same disk meanwhile. Both refusals are [`OciError::NoSpace`].
use std::collections::HashSet;
use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};

use sha2::{Digest as _, Sha256};

use crate::budget::{ensure_free, CHECK_EVERY_BYTES, DEFAULT_RESERVE_BYTES};
use crate::error::{IoContext, OciError, Result};
use crate::manifest::Digest;

pub struct BlobStore {
    dir: PathBuf,
    /// Free space its filesystem keeps while blobs are written.
    reserve: u64,
}

impl BlobStore {
    /// The store under zygote's cache directory.
    pub fn open() -> Result<BlobStore> {
        BlobStore::at(&zygote_images::cache_dir().join("oci/blobs/sha256"))
    }

    pub fn at(dir: &Path) -> Result<BlobStore> {
        std::fs::create_dir_all(dir).ctx(|| format!("creating {}", dir.display()))?;
        Ok(BlobStore {
            dir: dir.to_path_buf(),
            reserve: DEFAULT_RESERVE_BYTES,
        })
    }

    /// The same store, keeping `bytes` free (the operation's limits say how much).
    pub fn with_reserve(mut self, bytes: u64) -> BlobStore {
        self.set_reserve(bytes);
        self
    }

    /// Keeps `bytes` free from now on.
    pub fn set_reserve(&mut self, bytes: u64) {
        self.reserve = bytes;
    }

    /// Refuses unless `bytes` more fit on the store's filesystem beyond the reserve;
    /// `during` says what for.
    pub fn make_room(&self, bytes: u64, during: &str) -> Result<()> {
        ensure_free(&self.dir, bytes, self.reserve, during)
    }

    /// Bytes an interrupted download or copy of `digest` left to resume from.
    pub fn partial_len(&self, digest: &Digest) -> u64 {
        std::fs::metadata(self.partial_path(digest)).map_or(0, |m| m.len())
    }

    fn partial_path(&self, digest: &Digest) -> PathBuf {
        self.dir.join(format!("{}.partial", digest.hex()))
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Stores what `write` produces, under its digest (computed as it is written).
    pub fn put_with(&self, write: impl FnOnce(&mut dyn Write) -> Result<()>) -> Result<Digest> {
        let tmp = self.dir.join(format!(
            "tmp-{}-{:x}.partial",
            std::process::id(),
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos())
                .unwrap_or(0)
        ));
        let result = (|| {
            let file = File::create(&tmp).ctx(|| format!("creating {}", tmp.display()))?;
            let mut w = HashingWriter {
                inner: std::io::BufWriter::with_capacity(1 << 20, file),
                hasher: Sha256::new(),
                written: 0,
                room: self.room(),
            };
            write(&mut w).map_err(|e| w.room.take_error().unwrap_or(e))?;
            let file = w
                .inner
                .into_inner()
                .map_err(|e| e.into_error())
                .ctx(|| format!("writing {}", tmp.display()))?;
            file.sync_data()
                .ctx(|| format!("syncing {}", tmp.display()))?;
            let digest = Digest::parse(&format!("sha256:{}", hex::encode(w.hasher.finalize())))?;
            std::fs::rename(&tmp, self.path(&digest))
                .ctx(|| format!("storing {}", tmp.display()))?;
            Ok(digest)
        })();
        if result.is_err() {
            let _ = std::fs::remove_file(&tmp);
        }
        result
    }

    /// Stores what `reader` yields as `digest`, checking it.
    pub fn put_with_digest(
        &self,
        digest: &Digest,
        reader: &mut dyn Read,
        max_bytes: u64,
    ) -> Result<PathBuf> {
        let mut w = self.writer(digest)?;
        w.restart()?;
        let mut buf = vec![0u8; 1 << 20];
        loop {
            let n = match reader.read(&mut buf) {
                Ok(n) => n,
                Err(e) => {
                    w.discard();
                    return Err(e).ctx(|| format!("reading blob {digest}"));
                }
            };
            if n == 0 {
                break;
            }
            if let Err(e) = w.write(&buf[..n], max_bytes) {
                // Nothing to resume from a local copy: its partial goes.
                let _ = std::fs::remove_file(self.partial_path(digest));
                return Err(e);
            }
        }
        w.finish()
    }

    /// What checks the reserve while a blob is written.
    fn room(&self) -> Room {
        Room {
            dir: self.dir.clone(),
            reserve: self.reserve,
            next_check_at: 0,
            error: None,
        }
    }

    pub fn path(&self, digest: &Digest) -> PathBuf {
        self.dir.join(digest.hex())
    }

    pub fn has(&self, digest: &Digest) -> bool {
        self.path(digest).is_file()
    }

    /// Starts or continues writing `digest`'s bytes (see [`BlobWriter`]).
    pub fn writer(&self, digest: &Digest) -> Result<BlobWriter> {
        let partial = self.partial_path(digest);
        let mut file = OpenOptions::new()
            .create(true)
            .truncate(false)
            .read(true)
            .append(true)
            .open(&partial)
            .ctx(|| format!("opening {}", partial.display()))?;
        // What an earlier attempt wrote is hashed again: the digest covers it too.
        let mut hasher = Sha256::new();
        let mut buf = vec![0u8; 1 << 20];
        let mut len = 0u64;
        loop {
            let n = file
                .read(&mut buf)
                .ctx(|| format!("reading {}", partial.display()))?;
            if n == 0 {
                break;
            }
            hasher.update(&buf[..n]);
            len += n as u64;
        }
        Ok(BlobWriter {
            digest: digest.clone(),
            dest: self.path(digest),
            partial,
            file,
            hasher,
            len,
            room: self.room(),
        })
    }

    /// Copies a local file into the store, checking it hashes to `digest`.
    pub fn put_file(&self, digest: &Digest, src: &Path, max_bytes: u64) -> Result<PathBuf> {
        if self.has(digest) {
            return Ok(self.path(digest));
        }
        let mut f = File::open(src).ctx(|| format!("opening {}", src.display()))?;
        self.put_with_digest(digest, &mut f, max_bytes)
    }

    /// Deletes every blob (and leftover partial) not in `keep`; returns bytes freed.
    pub fn retain(&self, keep: &HashSet<String>) -> Result<u64> {
        let mut freed = 0;
        let entries =
            std::fs::read_dir(&self.dir).ctx(|| format!("listing {}", self.dir.display()))?;
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            let hex = name.strip_suffix(".partial").unwrap_or(&name);
            if keep.contains(hex) {
                continue;
            }
            // A partial written in the last day may be a download or pack in progress
            // (or one to resume): kept.
            let young = entry
                .metadata()
                .and_then(|m| m.modified())
                .is_ok_and(|t| t.elapsed().is_ok_and(|age| age.as_secs() < 86_400));
            if name.ends_with(".partial") && young {
                continue;
            }
            freed += entry.metadata().map(|m| m.len()).unwrap_or(0);
            let _ = std::fs::remove_file(entry.path());
        }
        Ok(freed)
    }
}

/// The reserve, checked before a blob's first byte and every [`CHECK_EVERY_BYTES`].
struct Room {
    dir: PathBuf,
    reserve: u64,
    /// Bytes written when the next check is due.
    next_check_at: u64,
    /// A refusal met under an `io::Write`, to give back as itself.
    error: Option<OciError>,
}

impl Room {
    /// `written` bytes so far, more about to be written: refused if the reserve is hit.
    fn check(&mut self, written: u64, digest: &dyn std::fmt::Display) -> Result<()> {
        if written < self.next_check_at {
            return Ok(());
        }
        self.next_check_at = written.saturating_add(CHECK_EVERY_BYTES);
        ensure_free(
            &self.dir,
            0,
            self.reserve,
            &format!("while storing blob {digest} (after {} MiB)", written >> 20),
        )
    }

    fn take_error(&mut self) -> Option<OciError> {
        self.error.take()
    }
}

/// A writer that hashes what goes through it (and checks the reserve).
struct HashingWriter<W> {
    inner: W,
    hasher: Sha256,
    written: u64,
    room: Room,
}

impl<W: Write> Write for HashingWriter<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if let Err(e) = self.room.check(self.written, &"being packed") {
            let message = e.to_string();
            self.room.error = Some(e);
            return Err(std::io::Error::other(message));
        }
        let n = self.inner.write(buf)?;
        self.hasher.update(&buf[..n]);
        self.written += n as u64;
        Ok(n)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
}

/// A blob being written: appends bytes, then [`BlobWriter::finish`] checks the digest
/// and publishes it. Not finished (dropped): the partial file stays, to resume from.
pub struct BlobWriter {
    digest: Digest,
    dest: PathBuf,
    partial: PathBuf,
    file: File,
    hasher: Sha256,
    len: u64,
    room: Room,
}

impl BlobWriter {
    /// Bytes already there (from an earlier, interrupted attempt).
    pub fn len(&self) -> u64 {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Throws away what an earlier attempt wrote (the source sent the whole blob).
    pub fn restart(&mut self) -> Result<()> {
        self.file
            .set_len(0)
            .ctx(|| format!("truncating {}", self.partial.display()))?;
        self.hasher = Sha256::new();
        self.len = 0;
        Ok(())
    }

    /// Gives up on this blob: what was written is deleted, not resumed.
    pub fn discard(self) {
        let _ = std::fs::remove_file(&self.partial);
    }

    /// Appends bytes; more than `max_bytes` in all is an error (and the partial goes),
    /// and so is the filesystem's free space down to the store's reserve (checked at
    /// the first write and every [`CHECK_EVERY_BYTES`]; the partial stays, to resume).
    pub fn write(&mut self, bytes: &[u8], max_bytes: u64) -> Result<()> {
        let len = self.len + bytes.len() as u64;
        if len > max_bytes {
            let _ = std::fs::remove_file(&self.partial);
            return Err(OciError::TooLarge {
                what: format!("blob {}", self.digest),
                size: len,
                limit: max_bytes,
            });
        }
        self.room.check(self.len, &self.digest)?;
        self.len = len;
        self.hasher.update(bytes);
        self.file
            .write_all(bytes)
            .ctx(|| format!("writing {}", self.partial.display()))
    }

    /// Checks the digest and moves the blob into place; on a mismatch the partial is
    /// deleted (a retry starts over).
    pub fn finish(self) -> Result<PathBuf> {
        self.file
            .sync_data()
            .ctx(|| format!("syncing {}", self.partial.display()))?;
        let actual = format!("sha256:{}", hex::encode(self.hasher.finalize()));
        if actual != self.digest.as_str() {
            let _ = std::fs::remove_file(&self.partial);
            return Err(OciError::DigestMismatch {
                what: format!("blob {} ({} bytes)", self.digest, self.len),
                expected: self.digest.to_string(),
                actual,
            });
        }
        std::fs::rename(&self.partial, &self.dest)
            .ctx(|| format!("storing {}", self.dest.display()))?;
        Ok(self.dest)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_blob_is_published_only_once_it_hashes_right_and_resumes() {
        let dir = tempfile::tempdir().unwrap();
        let store = BlobStore::at(dir.path()).unwrap();
        let data = b"0123456789".repeat(1000);
        let d = Digest::of(&data);
        let mut w = store.writer(&d).unwrap();
        w.write(&data[..4000], u64::MAX).unwrap();
        drop(w); // interrupted
        assert!(!store.has(&d));
        let mut w = store.writer(&d).unwrap();
        assert_eq!(w.len(), 4000, "resumes after what was written");
        w.write(&data[4000..], u64::MAX).unwrap();
        let path = w.finish().unwrap();
        assert_eq!(std::fs::read(path).unwrap(), data);
        assert!(store.has(&d));

        let wrong = Digest::of(b"other");
        let mut w = store.writer(&wrong).unwrap();
        w.write(b"not it", u64::MAX).unwrap();
        assert!(matches!(w.finish(), Err(OciError::DigestMismatch { .. })));
        assert!(!store.has(&wrong));
        assert_eq!(
            store.writer(&wrong).unwrap().len(),
            0,
            "bad bytes are not resumed"
        );

        let mut w = store.writer(&wrong).unwrap();
        assert!(matches!(
            w.write(&[0; 100], 50),
            Err(OciError::TooLarge { .. })
        ));

        let keep: HashSet<String> = [d.hex().to_string()].into();
        store.retain(&keep).unwrap();
        assert!(store.has(&d));
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
    }

    #[test]
    fn the_reserve_is_checked_when_a_blob_starts_and_while_it_is_written() {
        let dir = tempfile::tempdir().unwrap();
        let free = zygote_images::space::free_bytes(dir.path()).unwrap();
        let data = vec![7u8; 1 << 20];
        let d = Digest::of(&data);
        // A reserve beyond what is free: refused before the first byte, every way in.
        let full = BlobStore::at(dir.path())
            .unwrap()
            .with_reserve(free + (1 << 30));
        let mut w = full.writer(&d).unwrap();
        let err = w.write(&data, u64::MAX).unwrap_err();
        assert!(matches!(err, OciError::NoSpace { .. }), "{err}");
        assert!(err.to_string().contains("while storing blob"), "{err}");
        assert_eq!(full.partial_len(&d), 0, "nothing written");
        let err = full
            .put_with(|w| w.write_all(&data).ctx(|| "packing".into()))
            .unwrap_err();
        assert!(matches!(err, OciError::NoSpace { .. }), "{err}");
        let err = full
            .put_with_digest(&d, &mut &data[..], u64::MAX)
            .unwrap_err();
        assert!(matches!(err, OciError::NoSpace { .. }), "{err}");
        assert_eq!(
            std::fs::read_dir(dir.path()).unwrap().count(),
            0,
            "no partials"
        );
        assert!(full.make_room(0, "for nothing").is_err());
        // 32 MiB of room: the first check passes, a later one (every 64 MiB) stops it.
        let store = BlobStore::at(dir.path())
            .unwrap()
            .with_reserve(free.saturating_sub(32 << 20));
        assert!(store.make_room(16 << 20, "for 16 MiB").is_ok());
        assert!(store.make_room(64 << 20, "for 64 MiB").is_err());
        let mut w = store.writer(&d).unwrap();
        let stopped = (0..256).find_map(|_| w.write(&data, u64::MAX).err());
        let err = stopped.expect("refused within 256 MiB");
        assert!(matches!(err, OciError::NoSpace { .. }), "{err}");
        assert!(
            w.len() >= CHECK_EVERY_BYTES,
            "after the first check: {}",
            w.len()
        );
        w.discard();
    }
}
