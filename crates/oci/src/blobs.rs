//! The content-addressed blob store: `<cache>/oci/blobs/sha256/<hex>`, shared by every
//! image (a layer two images share is downloaded and kept once).
//!
//! A blob appears under its name only once its bytes hash to it: downloads and copies
//! write `<hex>.partial` and rename it after the check. A download interrupted (a
//! killed process, a dropped connection) leaves its `.partial`, which the next one
//! continues from where it stopped; bytes that turn out wrong are thrown away whole.
use std::collections::HashSet;
use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};

use sha2::{Digest as _, Sha256};

use crate::error::{IoContext, OciError, Result};
use crate::manifest::Digest;

pub struct BlobStore {
    dir: PathBuf,
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
        })
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
            };
            write(&mut w)?;
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
            let n = reader
                .read(&mut buf)
                .ctx(|| format!("reading blob {digest}"))?;
            if n == 0 {
                break;
            }
            w.write(&buf[..n], max_bytes)?;
        }
        w.finish()
    }

    pub fn path(&self, digest: &Digest) -> PathBuf {
        self.dir.join(digest.hex())
    }

    pub fn has(&self, digest: &Digest) -> bool {
        self.path(digest).is_file()
    }

    /// Starts or continues writing `digest`'s bytes (see [`BlobWriter`]).
    pub fn writer(&self, digest: &Digest) -> Result<BlobWriter> {
        let partial = self.dir.join(format!("{}.partial", digest.hex()));
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

/// A writer that hashes what goes through it.
struct HashingWriter<W> {
    inner: W,
    hasher: Sha256,
}

impl<W: Write> Write for HashingWriter<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.hasher.update(&buf[..n]);
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

    /// Appends bytes; more than `max_bytes` in all is an error (and the partial goes).
    pub fn write(&mut self, bytes: &[u8], max_bytes: u64) -> Result<()> {
        self.len += bytes.len() as u64;
        if self.len > max_bytes {
            let _ = std::fs::remove_file(&self.partial);
            return Err(OciError::TooLarge {
                what: format!("blob {}", self.digest),
                size: self.len,
                limit: max_bytes,
            });
        }
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
}
