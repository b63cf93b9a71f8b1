//! What unpacking an image may cost, and the accounting that holds it to that.
//!
//! Every layer is hostile, and the bytes it downloads as say little about what it
//! unpacks to: gzip of zeros expands about 1000:1 (zstd far more), and a GNU sparse tar
//! entry of a few hundred bytes can declare a file of a terabyte. So unpacking is
//! bounded on each axis separately, and every refusal names the bound it hit:
//! - **stream**: the uncompressed tar bytes of all layers together (time spent
//!   decompressing and reading);
//! - **expansion ratio**: a layer's uncompressed bytes against the compressed bytes
//!   read for them, once past a floor: a bomb is refused after a few compressed MiB,
//!   long before the stream limit;
//! - **apparent size**: the files' logical sizes, holes included, charged when an
//!   entry starts (before a byte of it is written): what the guest sees, and what the
//!   zero scan of `sparse.rs` reads;
//! - **disk**: the blocks actually written to the staging tree (all-zero blocks stay
//!   holes), by default half of what the staging filesystem has free beyond the
//!   reserve when unpacking starts, because the ext4 copy of the tree needs about as
//!   much again;
//! - **reserve**: free space left on the staging filesystem for everything else,
//!   checked when unpacking starts, every [`CHECK_EVERY_BYTES`] written, every
//!   [`CHECK_EVERY_ENTRIES`] entries (directories and inodes cost space too), and
//!   before the ext4 copy. The budget measured at the start is not enough on its own:
//!   other pulls, builds and sandboxes write to the same disk meanwhile (the same
//!   measurement, `zygote_images::space`, guards snapshots);
//! - **entries**: the tar entries of all layers (each may become an inode).
use std::io::{self, Read};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use zygote_images::space::free_bytes;

use crate::error::{OciError, Result};

/// Free space is measured again after this many bytes written...
pub const CHECK_EVERY_BYTES: u64 = 64 << 20;
/// ...and after this many entries.
pub const CHECK_EVERY_ENTRIES: u64 = 64;
/// What a directory, or a symlink too long to live in its inode, costs on disk.
pub const BLOCK_BYTES: u64 = 4096;
/// The free space kept for everything else, unless the limits say otherwise: while
/// unpacking and packing here, while storing blobs (`blobs.rs`).
pub const DEFAULT_RESERVE_BYTES: u64 = 1 << 30;

/// Bounds on what one image may unpack to (see the module doc for why each exists).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Uncompressed tar bytes of all layers together.
    pub max_stream_bytes: u64,
    /// A layer's uncompressed bytes may be at most this many times the compressed
    /// bytes read for them...
    pub max_expansion_ratio: u64,
    /// ...once it is past this many uncompressed bytes.
    pub expansion_floor_bytes: u64,
    /// Logical sizes of all files written, holes included.
    pub max_apparent_bytes: u64,
    /// Bytes written to the staging tree; None: half of the staging filesystem's free
    /// space beyond [`Limits::reserve_bytes`], measured when unpacking starts.
    pub max_disk_bytes: Option<u64>,
    /// Free space the staging filesystem keeps while unpacking and packing.
    pub reserve_bytes: u64,
    /// Tar entries of all layers together.
    pub max_entries: u64,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_stream_bytes: 64 << 30,
            max_expansion_ratio: 1000,
            expansion_floor_bytes: 64 << 20,
            max_apparent_bytes: 64 << 30,
            max_disk_bytes: None,
            reserve_bytes: DEFAULT_RESERVE_BYTES,
            max_entries: 4_000_000,
        }
    }
}

/// The running totals of one image's unpacking against its [`Limits`].
pub(crate) struct Budget {
    limits: Limits,
    /// Where free space is measured: the staging tree.
    dir: PathBuf,
    disk_limit: u64,
    /// The disk limit came from free space (said so in its error).
    disk_limit_measured: bool,
    stream: u64,
    apparent: u64,
    disk: u64,
    entries: u64,
    next_check_at: u64,
}

impl Budget {
    /// Measures the staging filesystem at `dir`: below the reserve nothing starts, and
    /// the disk limit (unless given) is set from what is free.
    pub fn new(dir: &Path, limits: Limits) -> Result<Budget> {
        let free = measure(dir)?;
        if free < limits.reserve_bytes {
            return Err(no_space(
                "to unpack the image",
                free,
                0,
                limits.reserve_bytes,
            ));
        }
        let (disk_limit, disk_limit_measured) = match limits.max_disk_bytes {
            Some(limit) => (limit, false),
            None => ((free - limits.reserve_bytes) / 2, true),
        };
        Ok(Budget {
            limits,
            dir: dir.to_path_buf(),
            disk_limit,
            disk_limit_measured,
            stream: 0,
            apparent: 0,
            disk: 0,
            entries: 0,
            next_check_at: CHECK_EVERY_BYTES,
        })
    }

    /// One more tar entry.
    pub fn entry(&mut self) -> Result<()> {
        self.entries += 1;
        if self.entries > self.limits.max_entries {
            return Err(OciError::TooLarge {
                what: "entry limit: the count of the image's tar entries".into(),
                size: self.entries,
                limit: self.limits.max_entries,
            });
        }
        if self.entries.is_multiple_of(CHECK_EVERY_ENTRIES) {
            self.check_reserve()?;
        }
        Ok(())
    }

    /// A file of `bytes` logical bytes (holes included) about to be written at `guest`.
    pub fn apparent(&mut self, bytes: u64, guest: &str) -> Result<()> {
        self.apparent = self.apparent.saturating_add(bytes);
        if self.apparent > self.limits.max_apparent_bytes {
            return Err(OciError::TooLarge {
                what: format!(
                    "apparent-size limit: the image's files with their holes (reached at \
                     {guest})"
                ),
                size: self.apparent,
                limit: self.limits.max_apparent_bytes,
            });
        }
        Ok(())
    }

    /// `bytes` about to be written to the staging tree (refused before they are).
    pub fn disk(&mut self, bytes: u64) -> Result<()> {
        self.disk = self.disk.saturating_add(bytes);
        if self.disk > self.disk_limit {
            let what = if self.disk_limit_measured {
                "disk budget (half the free space where images are staged, beyond the \
                 reserve, when unpacking began): the bytes written unpacking the image"
            } else {
                "disk budget: the bytes written unpacking the image"
            };
            return Err(OciError::TooLarge {
                what: what.into(),
                size: self.disk,
                limit: self.disk_limit,
            });
        }
        if self.disk >= self.next_check_at {
            self.next_check_at = self.disk.saturating_add(CHECK_EVERY_BYTES);
            self.check_reserve()?;
        }
        Ok(())
    }

    /// Bytes written so far, and logical bytes of the files so far.
    pub fn written(&self) -> (u64, u64) {
        (self.disk, self.apparent)
    }

    /// A layer's uncompressed stream, counted against the stream limit (with what
    /// earlier layers read) and, when `compressed` counts the blob's bytes read, the
    /// expansion ratio.
    pub fn meter<R: Read>(&self, inner: R, compressed: Option<Arc<AtomicU64>>) -> Metered<R> {
        Metered {
            inner,
            count: self.stream,
            layer_start: self.stream,
            limits: self.limits,
            compressed,
        }
    }

    /// A layer's stream was read to its end.
    pub fn stream_done<R>(&mut self, meter: &Metered<R>) {
        self.stream = meter.count;
    }

    fn check_reserve(&self) -> Result<()> {
        ensure_free(
            &self.dir,
            0,
            self.limits.reserve_bytes,
            "while unpacking the image",
        )
    }
}

/// Refuses to go on unless the filesystem holding `dir` has `needed` bytes free beyond
/// `reserve`; `during` says what for in the error.
pub(crate) fn ensure_free(dir: &Path, needed: u64, reserve: u64, during: &str) -> Result<()> {
    let free = measure(dir)?;
    if free < needed.saturating_add(reserve) {
        return Err(no_space(during, free, needed, reserve));
    }
    Ok(())
}

fn measure(dir: &Path) -> Result<u64> {
    free_bytes(dir).ok_or_else(|| OciError::Io {
        context: "measuring the free disk space of zygote's cache".into(),
        source: io::Error::last_os_error(),
    })
}

fn no_space(during: &str, free: u64, needed: u64, reserve: u64) -> OciError {
    OciError::NoSpace {
        during: during.to_string(),
        free_mib: free >> 20,
        needed_mib: needed.saturating_add(reserve).div_ceil(1 << 20),
        reserve_mib: reserve >> 20,
    }
}

/// A limit hit while reading a layer's stream, carried through the tar reader as the
/// payload of an `io::Error` and turned back into an [`OciError`] by [`limit_hit`].
#[derive(Debug)]
pub(crate) enum Exceeded {
    Stream {
        size: u64,
        limit: u64,
    },
    Ratio {
        size: u64,
        compressed: u64,
        ratio: u64,
    },
}

impl std::fmt::Display for Exceeded {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Exceeded::Stream { size, .. } => write!(f, "over the stream limit at {size} bytes"),
            Exceeded::Ratio { .. } => write!(f, "over the expansion-ratio limit"),
        }
    }
}

impl std::error::Error for Exceeded {}

/// The limit behind a read error, if one was hit; `layer` names the layer.
pub(crate) fn limit_hit(e: &io::Error, layer: &str) -> Option<OciError> {
    let hit = find_in(e)?;
    Some(match *hit {
        Exceeded::Stream { size, limit } => OciError::TooLarge {
            what: format!("stream limit: the uncompressed layers up to {layer}"),
            size,
            limit,
        },
        Exceeded::Ratio {
            size,
            compressed,
            ratio,
        } => OciError::TooLarge {
            what: format!(
                "expansion-ratio limit ({ratio}:1): {layer} uncompressed, from \
                 {compressed} compressed bytes read"
            ),
            size,
            limit: compressed.saturating_mul(ratio),
        },
    })
}

/// An [`Exceeded`] anywhere in an error's chain (the tar reader wraps some errors).
fn find_in<'a>(e: &'a (dyn std::error::Error + 'static)) -> Option<&'a Exceeded> {
    if let Some(hit) = e.downcast_ref::<Exceeded>() {
        return Some(hit);
    }
    if let Some(inner) = e.downcast_ref::<io::Error>().and_then(|io| io.get_ref()) {
        if let Some(hit) = find_in(inner) {
            return Some(hit);
        }
    }
    e.source().and_then(find_in)
}

/// A reader counting a layer's uncompressed bytes against the stream and ratio limits.
pub(crate) struct Metered<R> {
    inner: R,
    /// Uncompressed bytes of all layers so far.
    count: u64,
    layer_start: u64,
    limits: Limits,
    compressed: Option<Arc<AtomicU64>>,
}

impl<R: Read> Read for Metered<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.count += n as u64;
        if self.count > self.limits.max_stream_bytes {
            return Err(io::Error::other(Exceeded::Stream {
                size: self.count,
                limit: self.limits.max_stream_bytes,
            }));
        }
        if let Some(compressed) = &self.compressed {
            let layer = self.count - self.layer_start;
            let compressed = compressed.load(Ordering::Relaxed);
            let ratio = self.limits.max_expansion_ratio;
            if layer > self.limits.expansion_floor_bytes && layer > compressed.saturating_mul(ratio)
            {
                return Err(io::Error::other(Exceeded::Ratio {
                    size: layer,
                    compressed,
                    ratio,
                }));
            }
        }
        Ok(n)
    }
}

/// A reader counting the bytes read through it into a shared counter (a layer's
/// compressed bytes, read by a decompressor that owns the reader).
pub(crate) struct Counted<R> {
    pub inner: R,
    pub count: Arc<AtomicU64>,
}

impl<R: Read> Read for Counted<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.count.fetch_add(n as u64, Ordering::Relaxed);
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn room_is_what_is_free_beyond_the_reserve() {
        let dir = tempfile::tempdir().unwrap();
        ensure_free(dir.path(), 0, 0, "for nothing").unwrap();
        let free = free_bytes(dir.path()).unwrap();
        let err = ensure_free(dir.path(), free, 1 << 30, "for the ext4 image").unwrap_err();
        let msg = err.to_string();
        assert!(
            matches!(
                err,
                OciError::NoSpace {
                    reserve_mib: 1024,
                    ..
                }
            ),
            "{msg}"
        );
        assert!(
            msg.contains("not enough free disk space for the ext4 image"),
            "{msg}"
        );
        assert!(
            !msg.contains(&dir.path().display().to_string()),
            "no host path: {msg}"
        );
    }

    /// An error that wraps another, as the tar reader wraps some I/O errors.
    #[derive(Debug)]
    struct Wrapped(io::Error);

    impl std::fmt::Display for Wrapped {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            write!(f, "while reading an entry")
        }
    }

    impl std::error::Error for Wrapped {
        fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
            Some(&self.0)
        }
    }

    #[test]
    fn a_limit_hit_is_found_however_the_reader_wrapped_it() {
        let hit = || {
            io::Error::other(Exceeded::Stream {
                size: 11,
                limit: 10,
            })
        };
        let wrapped = io::Error::other(Wrapped(hit()));
        for e in [hit(), wrapped] {
            let err = limit_hit(&e, "layer 3 (sha256:x)").expect("the limit");
            assert!(
                err.to_string()
                    .starts_with("stream limit: the uncompressed layers up to layer 3"),
                "{err}"
            );
        }
        assert!(limit_hit(&io::Error::other("truncated"), "layer 0").is_none());
    }
}
