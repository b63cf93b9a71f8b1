//! Writing a staged file's bytes with its all-zero blocks left as holes.
//!
//! A GNU sparse tar entry lists its data chunks and the tar reader hands out the holes
//! between them as zeros; a regular entry can be gigabytes of zeros from a few MiB of
//! gzip. Writing those zeros is what let a 10 KiB layer fill a disk. Here every block
//! of [`BLOCK`] bytes that is all zeros is skipped: data goes in with positioned writes
//! and the file gets its full length at the end, so the holes are never written (no
//! zero writes, no seeks past written data). The result is the same image: the staged
//! tree is only the input of `mkfs.ext4 -d`, which skips all-zero blocks itself when it
//! copies a file. What is written is charged to the disk budget before it is written;
//! the logical size is the caller's to charge (the apparent-size limit), before this
//! reads anything.
use std::fs::File;
use std::io::{self, Read};
use std::os::unix::fs::FileExt;
use std::path::Path;

use crate::budget::Budget;
use crate::error::{IoContext, OciError, Result};

/// The granularity of holes: the staging filesystem's block size (and ext4's).
pub const BLOCK: usize = 4096;
/// Bytes read per round (a multiple of [`BLOCK`], so every round starts on a block).
const CHUNK: usize = 64 * BLOCK;

/// Copies up to `size` bytes of `src` into the empty file `out` (named `path` in
/// errors); returns how many `src` had. Read errors go through `read_error`.
pub(crate) fn copy_sparse(
    src: &mut dyn Read,
    out: &File,
    path: &Path,
    size: u64,
    budget: &mut Budget,
    read_error: &dyn Fn(io::Error) -> OciError,
) -> Result<u64> {
    let mut buf = vec![0u8; CHUNK];
    let mut offset = 0u64;
    while offset < size {
        let want = (size - offset).min(CHUNK as u64) as usize;
        let got = fill(src, &mut buf[..want]).map_err(read_error)?;
        write_data_blocks(&buf[..got], offset, out, path, budget)?;
        offset += got as u64;
        if got < want {
            break;
        }
    }
    out.set_len(offset)
        .ctx(|| format!("setting the size of {}", path.display()))?;
    Ok(offset)
}

/// Writes the runs of blocks of `buf` that are not all zeros, at `offset` (a multiple
/// of [`BLOCK`]) plus their place in `buf`.
fn write_data_blocks(
    buf: &[u8],
    offset: u64,
    out: &File,
    path: &Path,
    budget: &mut Budget,
) -> Result<()> {
    let mut write = |run: &[u8], at: usize| -> Result<()> {
        budget.disk(run.len().next_multiple_of(BLOCK) as u64)?;
        out.write_all_at(run, offset + at as u64)
            .ctx(|| format!("writing {}", path.display()))
    };
    let mut run_start = None;
    for at in (0..buf.len()).step_by(BLOCK) {
        let block = &buf[at..(at + BLOCK).min(buf.len())];
        match (is_zero(block), run_start) {
            (false, None) => run_start = Some(at),
            (true, Some(start)) => {
                write(&buf[start..at], start)?;
                run_start = None;
            }
            _ => {}
        }
    }
    if let Some(start) = run_start {
        write(&buf[start..], start)?;
    }
    Ok(())
}

fn is_zero(block: &[u8]) -> bool {
    // Whole 64-byte words at a time: the inner fold vectorizes.
    block
        .chunks(64)
        .all(|c| c.iter().fold(0u8, |acc, b| acc | b) == 0)
}

/// Reads until `buf` is full or `src` ends; the count read.
fn fill(src: &mut dyn Read, buf: &mut [u8]) -> io::Result<usize> {
    let mut got = 0;
    while got < buf.len() {
        match src.read(&mut buf[got..]) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(got)
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::MetadataExt;

    use super::*;
    use crate::budget::Limits;

    fn budget(dir: &Path, disk: u64) -> Budget {
        let limits = Limits {
            max_disk_bytes: Some(disk),
            reserve_bytes: 0,
            ..Limits::default()
        };
        Budget::new(dir, limits).unwrap()
    }

    fn copy(data: &[u8], size: u64, disk: u64) -> (tempfile::TempDir, Result<u64>) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        let out = File::create(&path).unwrap();
        let mut b = budget(dir.path(), disk);
        let r = copy_sparse(&mut &data[..], &out, &path, size, &mut b, &|e| {
            OciError::Io {
                context: "reading".into(),
                source: e,
            }
        });
        (dir, r)
    }

    #[test]
    fn zero_blocks_become_holes_and_data_lands_where_it_was() {
        let mut data = vec![0u8; 3 * CHUNK + 100];
        data[5] = 1; // first block
        data[CHUNK + BLOCK] = 2; // one block inside the second chunk
        data[3 * CHUNK + 99] = 3; // the partial last block
        let (dir, r) = copy(&data, data.len() as u64, 1 << 20);
        assert_eq!(r.unwrap(), data.len() as u64);
        let path = dir.path().join("f");
        assert_eq!(std::fs::read(&path).unwrap(), data);
        let m = std::fs::metadata(&path).unwrap();
        assert!(
            m.blocks() * 512 <= 4 * BLOCK as u64,
            "three data blocks, {} bytes allocated",
            m.blocks() * 512
        );
    }

    #[test]
    fn all_zeros_write_nothing_and_a_short_source_is_reported() {
        let (dir, r) = copy(&vec![0u8; 10 * CHUNK], 10 * CHUNK as u64, 0);
        assert_eq!(r.unwrap(), 10 * CHUNK as u64, "no budget needed for holes");
        let m = std::fs::metadata(dir.path().join("f")).unwrap();
        assert_eq!((m.len(), m.blocks()), (10 * CHUNK as u64, 0));
        let (_dir, r) = copy(b"abc", 10, 1 << 20);
        assert_eq!(r.unwrap(), 3);
    }

    #[test]
    fn data_past_the_disk_budget_is_refused_before_it_is_written() {
        let data = vec![7u8; 4 * BLOCK];
        let (dir, r) = copy(&data, data.len() as u64, 2 * BLOCK as u64);
        let err = r.unwrap_err();
        assert!(err.to_string().contains("disk budget"), "{err}");
        let m = std::fs::metadata(dir.path().join("f")).unwrap();
        assert_eq!(m.blocks(), 0, "nothing of the refused run was written");
    }
}
