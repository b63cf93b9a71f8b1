//! Snapshot directories on disk.
//!
//! ```text
//! <snapshot>/meta.json    mode, parent (for diffs), sizes, memory checksum
//! <snapshot>/state.bin    VmState (header + SHA-256, see persist/mod.rs)
//! <snapshot>/memory.bin   guest RAM, ranges concatenated; sparse: all-zero pages (full)
//!                         or clean pages (diff) are holes
//! <snapshot>/dirty.bin    diff only: which 4 KiB pages memory.bin carries (u64 words)
//! <snapshot>/device-N.data private data of virtio device N (a disk's CoW pages)
//! ```
//! A snapshot is written into `<snapshot>.tmp-<pid>`, every file fsynced, then renamed into
//! place and the parent directory fsynced, so a crash leaves either nothing or a whole
//! snapshot.
use std::fs::{self, File, OpenOptions};
use std::io::{Read, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::{CpuIdentity, PersistError, VmState};

pub const PAGE: usize = 4096;
pub const META_FILE: &str = "meta.json";
pub const STATE_FILE: &str = "state.bin";
pub const MEMORY_FILE: &str = "memory.bin";
pub const DIRTY_FILE: &str = "dirty.bin";

/// Private data of virtio device `i` (e.g. a disk's copy-on-write pages).
pub fn device_data_file(i: usize) -> String {
    format!("device-{i}.data")
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SnapshotMode {
    /// All memory, written while the VM is paused.
    Full,
    /// Pages dirtied since the previous snapshot, layered on it (written by a forked
    /// frozen copy while the VM keeps running).
    Diff,
    /// All memory, written by a forked frozen copy while the VM keeps running.
    Live,
}

impl std::fmt::Display for SnapshotMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Full => "full",
            Self::Diff => "diff",
            Self::Live => "live",
        })
    }
}

impl std::str::FromStr for SnapshotMode {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "full" => Ok(Self::Full),
            "diff" => Ok(Self::Diff),
            "live" => Ok(Self::Live),
            other => Err(format!(
                "unknown snapshot mode {other:?} (full, diff or live)"
            )),
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SnapshotMeta {
    pub format_version: u32,
    pub mode: SnapshotMode,
    /// Diff snapshots: the snapshot this one layers on (absolute path).
    pub parent: Option<PathBuf>,
    pub mem_bytes: u64,
    /// Pages stored in memory.bin (non-hole pages).
    pub pages_written: u64,
    /// CRC-32 over (page index, page bytes) of every stored page, in order.
    pub memory_crc32: u32,
    pub created_unix: u64,
}

/// Iterator over the guest RAM bytes as one slice (ranges are contiguous in the host
/// mapping and in the file).
pub struct MemoryView<'a> {
    pub bytes: &'a [u8],
}

fn is_zero(page: &[u8]) -> bool {
    // Compare as u64 words: much faster than byte-wise on 4 KiB.
    let (pre, words, post) = unsafe { page.align_to::<u64>() };
    pre.iter().all(|&b| b == 0) && words.iter().all(|&w| w == 0) && post.iter().all(|&b| b == 0)
}

/// Write memory pages to `path` as a sparse file. `select(page)` chooses pages to store;
/// `skip_zero` also leaves all-zero pages as holes. Returns (pages written, crc).
pub fn write_memory(
    path: &Path,
    mem: &MemoryView,
    select: impl Fn(usize) -> bool,
    skip_zero: bool,
) -> Result<(u64, u32), PersistError> {
    let file = File::create(path)?;
    file.set_len(mem.bytes.len() as u64)?;
    let mut crc = crc32fast::Hasher::new();
    let mut written = 0u64;
    // Coalesce consecutive stored pages into one write.
    let mut run_start: Option<usize> = None;
    let pages = mem.bytes.len() / PAGE;
    let flush = |start: usize, end: usize| -> std::io::Result<()> {
        file.write_all_at(&mem.bytes[start * PAGE..end * PAGE], (start * PAGE) as u64)
    };
    for p in 0..pages {
        let page = &mem.bytes[p * PAGE..(p + 1) * PAGE];
        let store = select(p) && !(skip_zero && is_zero(page));
        if store {
            crc.update(&(p as u64).to_le_bytes());
            crc.update(page);
            written += 1;
            run_start.get_or_insert(p);
        } else if let Some(s) = run_start.take() {
            flush(s, p)?;
        }
    }
    if let Some(s) = run_start {
        flush(s, pages)?;
    }
    file.sync_all()?;
    Ok((written, crc.finalize()))
}

/// Bitmap helpers over u64 words.
pub fn bit_set(bitmap: &[u64], page: usize) -> bool {
    bitmap
        .get(page / 64)
        .is_some_and(|w| w & (1 << (page % 64)) != 0)
}

pub fn write_file_synced(path: &Path, bytes: &[u8]) -> Result<(), PersistError> {
    let mut f = File::create(path)?;
    f.write_all(bytes)?;
    f.sync_all()?;
    Ok(())
}

/// A snapshot directory under construction; renamed into place by `commit`.
pub struct PendingSnapshot {
    pub tmp: PathBuf,
    pub dest: PathBuf,
}

impl PendingSnapshot {
    pub fn create(dest: &Path) -> Result<Self, PersistError> {
        if dest.exists() {
            return Err(PersistError::Io(std::io::Error::new(
                std::io::ErrorKind::AlreadyExists,
                format!("{} already exists", dest.display()),
            )));
        }
        let name = dest
            .file_name()
            .ok_or_else(|| std::io::Error::other("snapshot path has no final component"))?;
        let tmp = dest.with_file_name(format!(
            "{}.tmp-{}",
            name.to_string_lossy(),
            std::process::id()
        ));
        let _ = fs::remove_dir_all(&tmp);
        fs::create_dir_all(&tmp)?;
        Ok(Self {
            tmp,
            dest: dest.to_path_buf(),
        })
    }

    pub fn file(&self, name: &str) -> PathBuf {
        self.tmp.join(name)
    }

    pub fn write_state(&self, state: &VmState, cpu: &CpuIdentity) -> Result<(), PersistError> {
        let mut buf = Vec::new();
        state.write_to(&mut buf, cpu)?;
        write_file_synced(&self.file(STATE_FILE), &buf)
    }

    pub fn commit(self, meta: &SnapshotMeta) -> Result<PathBuf, PersistError> {
        let json =
            serde_json::to_vec_pretty(meta).map_err(|e| PersistError::Encode(e.to_string()))?;
        write_file_synced(&self.file(META_FILE), &json)?;
        File::open(&self.tmp)?.sync_all()?;
        fs::rename(&self.tmp, &self.dest)?;
        if let Some(parent) = self.dest.parent() {
            File::open(parent)?.sync_all()?;
        }
        Ok(self.dest.clone())
    }
}

impl Drop for PendingSnapshot {
    fn drop(&mut self) {
        // After a successful commit the temp dir no longer exists; otherwise clean up.
        let _ = fs::remove_dir_all(&self.tmp);
    }
}

pub fn read_meta(dir: &Path) -> Result<SnapshotMeta, PersistError> {
    let bytes = fs::read(dir.join(META_FILE))?;
    let meta: SnapshotMeta =
        serde_json::from_slice(&bytes).map_err(|e| PersistError::Encode(e.to_string()))?;
    if meta.format_version != super::FORMAT_VERSION {
        return Err(PersistError::Version {
            found: meta.format_version,
        });
    }
    Ok(meta)
}

pub fn read_state(dir: &Path, host: &CpuIdentity) -> Result<VmState, PersistError> {
    let mut f = File::open(dir.join(STATE_FILE))?;
    VmState::read_from(&mut f, host)
}

pub fn read_bitmap(dir: &Path) -> Result<Vec<u64>, PersistError> {
    let mut bytes = Vec::new();
    File::open(dir.join(DIRTY_FILE))?.read_to_end(&mut bytes)?;
    if bytes.len() % 8 != 0 {
        return Err(PersistError::Checksum);
    }
    Ok(bytes
        .chunks_exact(8)
        .map(|c| u64::from_le_bytes(c.try_into().unwrap()))
        .collect())
}

pub fn bitmap_bytes(bitmap: &[u64]) -> Vec<u8> {
    bitmap.iter().flat_map(|w| w.to_le_bytes()).collect()
}

/// The chain from the base full snapshot to `dir`, base first.
pub fn chain(dir: &Path) -> Result<Vec<(PathBuf, SnapshotMeta)>, PersistError> {
    let mut out = Vec::new();
    let mut cur = Some(dir.to_path_buf());
    while let Some(d) = cur {
        if out.len() > 1024 {
            return Err(PersistError::Encode(
                "snapshot chain too long or cyclic".into(),
            ));
        }
        let meta = read_meta(&d)?;
        cur = match meta.mode {
            SnapshotMode::Diff => Some(meta.parent.clone().ok_or_else(|| {
                PersistError::Encode(format!("diff snapshot {} has no parent", d.display()))
            })?),
            _ => None,
        };
        out.push((d, meta));
    }
    out.reverse();
    Ok(out)
}

/// Recompute a stored memory file's checksum (reads the whole file).
pub fn verify_memory(dir: &Path, meta: &SnapshotMeta) -> Result<(), PersistError> {
    let file = File::open(dir.join(MEMORY_FILE))?;
    let bitmap = match meta.mode {
        SnapshotMode::Diff => Some(read_bitmap(dir)?),
        _ => None,
    };
    let mut crc = crc32fast::Hasher::new();
    let mut page = vec![0u8; PAGE];
    let mut pages = 0u64;
    for p in 0..(meta.mem_bytes as usize / PAGE) {
        if let Some(b) = &bitmap {
            if !bit_set(b, p) {
                continue;
            }
        }
        file.read_exact_at(&mut page, (p * PAGE) as u64)?;
        if bitmap.is_none() && is_zero(&page) {
            continue;
        }
        crc.update(&(p as u64).to_le_bytes());
        crc.update(&page);
        pages += 1;
    }
    if pages != meta.pages_written || crc.finalize() != meta.memory_crc32 {
        return Err(PersistError::Checksum);
    }
    Ok(())
}

pub fn open_rw(path: &Path) -> std::io::Result<File> {
    OpenOptions::new().read(true).write(true).open(path)
}

#[cfg(test)]
#[path = "snapshot_files_tests.rs"]
mod tests;
