//! A layer blob as the tar stream the applier reads: decompressed (whatever the media
//! type claims, the magic number decides), its compressed bytes counted for the
//! expansion ratio, its uncompressed bytes metered against the stream limits
//! (`budget.rs`) and hashed into the diff id the image config must list.
use std::fs::File;
use std::io::{self, Read};
use std::sync::atomic::AtomicU64;
use std::sync::Arc;

use sha2::{Digest, Sha256};

use crate::budget::{Counted, Metered};

/// A layer blob as a tar stream (gzip and zstd are recognized by their magic numbers),
/// and the count of the blob's bytes read so far (for the expansion ratio).
pub(crate) fn decompress(mut file: File) -> io::Result<(Box<dyn Read + Send>, Arc<AtomicU64>)> {
    use std::io::{Seek, SeekFrom};
    let mut magic = [0u8; 4];
    let n = file.read(&mut magic)?;
    file.seek(SeekFrom::Start(0))?;
    let count = Arc::new(AtomicU64::new(0));
    let counted = Counted {
        inner: file,
        count: count.clone(),
    };
    let reader = io::BufReader::with_capacity(1 << 20, counted);
    let reader: Box<dyn Read + Send> = match &magic[..n] {
        [0x1f, 0x8b, ..] => Box::new(flate2::read::MultiGzDecoder::new(reader)),
        [0x28, 0xb5, 0x2f, 0xfd] => Box::new(zstd::stream::read::Decoder::with_buffer(reader)?),
        _ => Box::new(reader),
    };
    Ok((reader, count))
}

/// The uncompressed stream's sha256 (the layer's diff id), as the tar reader reads it.
pub(crate) struct Hashing<R> {
    pub inner: Metered<R>,
    pub hasher: Sha256,
}

impl<R> Hashing<R> {
    pub fn new(inner: Metered<R>) -> Self {
        Hashing {
            inner,
            hasher: Sha256::new(),
        }
    }
}

impl<R: Read> Read for Hashing<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.hasher.update(&buf[..n]);
        Ok(n)
    }
}
