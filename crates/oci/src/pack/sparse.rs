//! A file as a compressed, sparse blob: only its non-zero 64 KiB blocks are stored,
//! each with its offset, and the whole is compressed with zstd (level 3, one thread).
//!
//! The encoding depends on the file's bytes alone (not on which ranges the host
//! filesystem allocated): the same content always gives the same blob and digest, so a
//! registry dedups it and a second push uploads nothing. Holes are found with
//! SEEK_DATA/SEEK_HOLE and never read. Decoding writes the blocks at their offsets into
//! a file of the recorded length, which is sparse again.
//!
//! Layout before compression: `ZYSPARSE1\n`, the length (u64 LE), then per stored
//! block its offset (u64 LE), its length (u32 LE) and its bytes, then u64::MAX.
use std::fs::File;
use std::io::{BufReader, BufWriter, Read, Seek, SeekFrom, Write};
use std::os::fd::AsRawFd;
use std::os::unix::fs::FileExt;
use std::path::Path;

use super::Room;
use crate::error::{IoContext, OciError, Result};

const MAGIC: &[u8] = b"ZYSPARSE1\n";
const BLOCK: usize = 64 << 10;
const END: u64 = u64::MAX;

/// Encodes `src` into `out`; calls `progress` with bytes of `src` covered so far.
pub fn encode(src: &Path, out: &mut dyn Write, progress: &mut dyn FnMut(u64)) -> Result<()> {
    let mut file = File::open(src).ctx(|| format!("opening {}", src.display()))?;
    let len = file
        .metadata()
        .ctx(|| format!("stat {}", src.display()))?
        .len();
    let mut z = zstd::stream::write::Encoder::new(out, 3).ctx(|| "starting zstd".into())?;
    z.write_all(MAGIC)
        .and_then(|_| z.write_all(&len.to_le_bytes()))
        .ctx(|| "writing the blob".into())?;
    let mut buf = vec![0u8; BLOCK];
    let mut pos = 0u64;
    while pos < len {
        let (data, end) = next_data(&file, pos, len);
        pos = data;
        // Block-aligned, so that where the filesystem put holes does not matter.
        pos -= pos % BLOCK as u64;
        while pos < end {
            let n = (len - pos).min(BLOCK as u64) as usize;
            file.seek(SeekFrom::Start(pos))
                .ctx(|| format!("seeking in {}", src.display()))?;
            file.read_exact(&mut buf[..n])
                .ctx(|| format!("reading {}", src.display()))?;
            if buf[..n].iter().any(|&b| b != 0) {
                z.write_all(&pos.to_le_bytes())
                    .and_then(|_| z.write_all(&(n as u32).to_le_bytes()))
                    .and_then(|_| z.write_all(&buf[..n]))
                    .ctx(|| "writing the blob".into())?;
            }
            pos += n as u64;
            progress(pos);
        }
    }
    z.write_all(&END.to_le_bytes())
        .ctx(|| "writing the blob".into())?;
    z.finish()
        .and_then(|w| w.flush())
        .ctx(|| "finishing the blob".into())?;
    Ok(())
}

/// The next data range at or after `pos`: (start, end); (len, len) if none.
fn next_data(file: &File, pos: u64, len: u64) -> (u64, u64) {
    let fd = file.as_raw_fd();
    // SAFETY: fd is open for the life of `file`; lseek has no memory effects.
    let data = unsafe { libc::lseek(fd, pos as libc::off_t, libc::SEEK_DATA) };
    if data < 0 {
        return match std::io::Error::last_os_error().raw_os_error() {
            Some(libc::ENXIO) => (len, len),
            // No SEEK_DATA here: read everything.
            _ => (pos, len),
        };
    }
    // SAFETY: as above.
    let hole = unsafe { libc::lseek(fd, data, libc::SEEK_HOLE) };
    let end = if hole < 0 {
        len
    } else {
        (hole as u64).min(len)
    };
    (data as u64, end)
}

/// What one decode may write.
#[derive(Debug, Clone, Copy)]
pub struct DecodeLimits {
    /// The file's length (apparent size: holes cost nothing).
    pub max_len: u64,
    /// Bytes of data written (what the blocks take on disk): a few MiB of zstd can
    /// claim terabytes, so this is the free space where `dest` is.
    pub room: Room,
}

/// Decodes `blob` into a new file `dest` (which must not exist), refusing anything
/// malformed or over `limits`; returns the data bytes written. `what` names the file in
/// errors (never a host path: they reach API clients).
pub fn decode(blob: &Path, dest: &Path, what: &str, limits: &DecodeLimits) -> Result<u64> {
    let bad = |m: String| OciError::BadImage {
        what: what.to_string(),
        message: m,
    };
    let f = File::open(blob).ctx(|| format!("opening {}", blob.display()))?;
    let mut z = zstd::stream::read::Decoder::new(BufReader::new(f))
        .map_err(|e| bad(format!("not zstd: {e}")))?;
    let mut magic = [0u8; MAGIC.len()];
    z.read_exact(&mut magic)
        .map_err(|e| bad(format!("reading it: {e}")))?;
    if magic != MAGIC {
        return Err(bad("not a zygote sparse file".into()));
    }
    let len = read_u64(&mut z).map_err(|e| bad(format!("reading its length: {e}")))?;
    if len > limits.max_len {
        return Err(OciError::TooLarge {
            what: what.to_string(),
            size: len,
            limit: limits.max_len,
        });
    }
    let out = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(dest)
        .ctx(|| format!("creating {}", dest.display()))?;
    out.set_len(len)
        .ctx(|| format!("sizing {}", dest.display()))?;
    let mut buf = vec![0u8; BLOCK];
    let mut last_end = 0u64;
    let mut written = 0u64;
    loop {
        let offset = read_u64(&mut z).map_err(|e| bad(format!("truncated: {e}")))?;
        if offset == END {
            break;
        }
        let mut n = [0u8; 4];
        z.read_exact(&mut n)
            .map_err(|e| bad(format!("truncated: {e}")))?;
        let n = u32::from_le_bytes(n) as usize;
        if n == 0 || n > BLOCK || offset < last_end || offset.saturating_add(n as u64) > len {
            return Err(bad(format!(
                "a block at {offset} of {n} bytes is out of place"
            )));
        }
        written += n as u64;
        limits.room.check(written, || format!("decoding {what}"))?;
        z.read_exact(&mut buf[..n])
            .map_err(|e| bad(format!("truncated: {e}")))?;
        out.write_all_at(&buf[..n], offset)
            .ctx(|| format!("writing {}", dest.display()))?;
        last_end = offset + n as u64;
    }
    let mut rest = [0u8; 1];
    if z.read(&mut rest).map_err(|e| bad(e.to_string()))? != 0 {
        return Err(bad("bytes after its end".into()));
    }
    out.sync_data()
        .ctx(|| format!("syncing {}", dest.display()))?;
    Ok(written)
}

fn read_u64(r: &mut impl Read) -> std::io::Result<u64> {
    let mut b = [0u8; 8];
    r.read_exact(&mut b)?;
    Ok(u64::from_le_bytes(b))
}

/// Encodes `src` to a new file `dest`.
pub fn encode_to(src: &Path, dest: &Path, progress: &mut dyn FnMut(u64)) -> Result<()> {
    let f = File::create(dest).ctx(|| format!("creating {}", dest.display()))?;
    let mut w = BufWriter::with_capacity(1 << 20, f);
    encode(src, &mut w, progress)?;
    w.flush().ctx(|| format!("writing {}", dest.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_sparse_files_and_depends_on_content_only() {
        let dir = tempfile::tempdir().unwrap();
        let a = dir.path().join("a");
        let f = File::create(&a).unwrap();
        f.set_len(40 << 20).unwrap();
        f.write_all_at(b"hello", 3).unwrap();
        f.write_all_at(&[9u8; 200_000], 5 << 20).unwrap();
        f.write_all_at(b"end", (40 << 20) - 3).unwrap();
        drop(f);
        // The same bytes, fully allocated (zeros written out).
        let b = dir.path().join("b");
        std::fs::write(&b, std::fs::read(&a).unwrap()).unwrap();
        let (ea, eb) = (dir.path().join("a.z"), dir.path().join("b.z"));
        encode_to(&a, &ea, &mut |_| {}).unwrap();
        encode_to(&b, &eb, &mut |_| {}).unwrap();
        assert_eq!(std::fs::read(&ea).unwrap(), std::fs::read(&eb).unwrap());
        assert!(std::fs::metadata(&ea).unwrap().len() < 64 << 10);
        let back = dir.path().join("back");
        let open = DecodeLimits {
            max_len: u64::MAX,
            room: Room::UNBOUNDED,
        };
        let data = decode(&ea, &back, "a", &open).unwrap();
        assert!((200_000..4 << 20).contains(&data), "{data}");
        assert_eq!(std::fs::read(&back).unwrap(), std::fs::read(&a).unwrap());
        use std::os::unix::fs::MetadataExt;
        assert!(
            std::fs::metadata(&back).unwrap().blocks() * 512 < 4 << 20,
            "sparse again"
        );
        // Refused: over either limit, or damaged; the message names the file as told.
        let short = DecodeLimits {
            max_len: 1 << 20,
            ..open
        };
        assert!(matches!(
            decode(&ea, &dir.path().join("over"), "a", &short),
            Err(OciError::TooLarge { .. })
        ));
        let no_room = DecodeLimits {
            room: Room {
                spare: 100_000,
                reserve: 1 << 20,
            },
            ..open
        };
        let e = decode(&ea, &dir.path().join("full"), "the disk", &no_room).unwrap_err();
        assert!(
            matches!(
                e,
                OciError::NoSpace {
                    free_mib: 1,
                    reserve_mib: 1,
                    ..
                }
            ),
            "{e}"
        );
        assert!(e.to_string().contains("decoding the disk"), "{e}");
        let mut bytes = std::fs::read(&ea).unwrap();
        bytes.truncate(bytes.len() / 2);
        std::fs::write(&ea, bytes).unwrap();
        let e = decode(&ea, &dir.path().join("cut"), "a", &open).unwrap_err();
        assert!(
            !e.to_string().contains(&*dir.path().to_string_lossy()),
            "{e}"
        );
    }
}
