//! The archives of E2B's COPY steps, read as hostile input. The SDK uploads the files a
//! COPY names as a tar (gzipped by default) whose entry names are relative to its build
//! context (`data`, `data/a.txt`); the build writes them into the guest through the
//! agent, one entry at a time, never by unpacking the archive on the host or running
//! `tar` in the guest.
//!
//! Checked when the upload arrives ([`check_archive`]) and again entry by entry while
//! copying ([`read_entries`]): at most [`MAX_ENTRIES`] entries and
//! [`MAX_UNPACKED_BYTES`] of unpacked archive (a gzip bomb stops there), each file at
//! most [`MAX_COPY_FILE_BYTES`]; names relative, without `..`, at most
//! [`MAX_PATH_BYTES`]; only directories, regular files and symlinks; a symlink's target
//! relative and inside the tree it is copied into; nothing under a symlink of the
//! archive (which would write through it).
//!
//! The copy also recomputes the SDK's `filesHash` (`e2b/template/utils.py`
//! `calculate_files_hash`: `COPY <src> <dest>`, then per file its relative path, its
//! `st_mode`, its size unless a directory, and its content or link target) from the
//! entries: an archive that is not what its hash says fails the step, so the per-step
//! cache, keyed by that hash, cannot be poisoned by a mismatched upload.
use std::io::Read;

use sha2::{Digest, Sha256};

/// Bytes of one upload as sent (gzipped or not).
pub const MAX_UPLOAD_BYTES: u64 = 256 << 20;
/// Bytes of one archive once gunzipped (headers included).
pub const MAX_UNPACKED_BYTES: u64 = 1 << 30;
/// Entries of one archive.
pub const MAX_ENTRIES: usize = 100_000;
/// Bytes of one file copied (it is held in memory on its way to the guest).
pub const MAX_COPY_FILE_BYTES: u64 = 128 << 20;
/// Bytes of an entry's name or a symlink's target.
pub const MAX_PATH_BYTES: usize = 4096;

#[derive(Debug, thiserror::Error)]
pub enum ArchiveError {
    #[error("the archive is not a valid tar: {0}")]
    Malformed(String),
    #[error("the archive has more than {MAX_ENTRIES} entries")]
    TooManyEntries,
    #[error("the archive unpacks to more than {MAX_UNPACKED_BYTES} bytes")]
    TooLarge,
    #[error("archive entry {0:?} is larger than {MAX_COPY_FILE_BYTES} bytes")]
    FileTooLarge(String),
    #[error("archive entry {0:?}: absolute paths, '..' and names over {MAX_PATH_BYTES} bytes are refused")]
    BadPath(String),
    #[error("archive entry {0:?}: only directories, regular files and symlinks can be copied")]
    BadType(String),
    #[error("archive entry {0:?} lies under a symlink of the archive")]
    UnderSymlink(String),
    #[error("archive entry {path:?}: symlink target {target:?} leaves the copied tree")]
    SymlinkEscape { path: String, target: String },
    #[error("archive entry {0:?} is not part of the COPY source")]
    OutsideSource(String),
    #[error("the uploaded files do not match their filesHash")]
    HashMismatch,
}

/// What an entry is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EntryKind {
    Dir,
    File(Vec<u8>),
    Symlink(String),
}

/// One entry, its name normalized (`a/b`, no `./`, no trailing `/`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    pub path: String,
    /// Permission bits (`mode & 0o7777`).
    pub mode: u32,
    pub kind: EntryKind,
}

/// Counts what it reads and refuses past [`MAX_UNPACKED_BYTES`].
struct Bounded<R> {
    inner: R,
    read: u64,
}

impl<R: Read> Read for Bounded<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.read += n as u64;
        if self.read > MAX_UNPACKED_BYTES {
            return Err(std::io::Error::other(ArchiveError::TooLarge.to_string()));
        }
        Ok(n)
    }
}

/// `bytes` unpacked: gunzipped when it starts with gzip's magic.
fn unpacked<'a>(bytes: &'a [u8]) -> Box<dyn Read + 'a> {
    if bytes.starts_with(&[0x1f, 0x8b]) {
        Box::new(Bounded {
            inner: flate2::read::GzDecoder::new(bytes),
            read: 0,
        })
    } else {
        Box::new(Bounded {
            inner: bytes,
            read: 0,
        })
    }
}

/// A relative entry name as `a/b`; `None` for `.` (the root itself).
pub fn normalize(raw: &str) -> Result<Option<String>, ArchiveError> {
    let bad = || ArchiveError::BadPath(printable(raw));
    if raw.len() > MAX_PATH_BYTES || raw.starts_with('/') || raw.contains('\0') {
        return Err(bad());
    }
    let mut parts = Vec::new();
    for c in raw.split('/') {
        match c {
            "" | "." => {}
            ".." => return Err(bad()),
            c => parts.push(c),
        }
    }
    Ok((!parts.is_empty()).then(|| parts.join("/")))
}

/// Whether symlink `target` at `path` (both relative to the same root) stays inside
/// the tree rooted at `root` (`""`: the whole archive).
pub fn link_stays_inside(path: &str, target: &str, root: &str) -> bool {
    if target.starts_with('/') || target.len() > MAX_PATH_BYTES {
        return false;
    }
    let mut at: Vec<&str> = path.split('/').collect();
    at.pop();
    for c in target.split('/') {
        match c {
            "" | "." => {}
            ".." => {
                if at.pop().is_none() {
                    return false;
                }
            }
            c => at.push(c),
        }
    }
    let resolved = at.join("/");
    root.is_empty() || resolved == root || resolved.starts_with(&format!("{root}/"))
}

fn printable(s: &str) -> String {
    s.chars().take(200).filter(|c| !c.is_control()).collect()
}

/// Every entry of `bytes` in order, checked as the module doc says (symlinks against
/// `link_root` of their path: see [`link_stays_inside`]), passed to `each` with its
/// data; also returns the SDK's files hash of `COPY <src> <dest>` over them.
pub fn read_entries(
    bytes: &[u8],
    src: &str,
    dest: &str,
    link_root: &dyn Fn(&str) -> String,
    each: &mut dyn FnMut(Entry) -> Result<(), ArchiveError>,
) -> Result<String, ArchiveError> {
    let malformed = |e: std::io::Error| {
        if e.to_string() == ArchiveError::TooLarge.to_string() {
            ArchiveError::TooLarge
        } else {
            ArchiveError::Malformed(e.to_string())
        }
    };
    let mut hash = Sha256::new();
    hash.update(format!("COPY {src} {dest}").as_bytes());
    let mut archive = tar::Archive::new(unpacked(bytes));
    let mut links: Vec<String> = Vec::new();
    let mut count = 0usize;
    for entry in archive.entries().map_err(malformed)? {
        let mut entry = entry.map_err(malformed)?;
        let ty = entry.header().entry_type();
        if ty.is_pax_global_extensions() {
            continue;
        }
        count += 1;
        if count > MAX_ENTRIES {
            return Err(ArchiveError::TooManyEntries);
        }
        let raw = String::from_utf8_lossy(&entry.path_bytes()).into_owned();
        let Some(path) = normalize(&raw)? else {
            continue;
        };
        if links
            .iter()
            .any(|l| path.starts_with(&format!("{l}/")) || path == *l)
        {
            return Err(ArchiveError::UnderSymlink(printable(&path)));
        }
        let mode = entry.header().mode().map_err(malformed)? & 0o7777;
        let (kind, type_bits) = if ty.is_dir() {
            (EntryKind::Dir, 0o040000)
        } else if ty.is_file() {
            let size = entry.header().size().map_err(malformed)?;
            if size > MAX_COPY_FILE_BYTES {
                return Err(ArchiveError::FileTooLarge(printable(&path)));
            }
            let mut data = Vec::with_capacity(size as usize);
            entry.read_to_end(&mut data).map_err(malformed)?;
            (EntryKind::File(data), 0o100000)
        } else if ty.is_symlink() {
            let target = entry
                .link_name_bytes()
                .map(|t| String::from_utf8_lossy(&t).into_owned())
                .unwrap_or_default();
            if !link_stays_inside(&path, &target, &link_root(&path)) {
                return Err(ArchiveError::SymlinkEscape {
                    path: printable(&path),
                    target: printable(&target),
                });
            }
            links.push(path.clone());
            (EntryKind::Symlink(target), 0o120000)
        } else {
            return Err(ArchiveError::BadType(printable(&path)));
        };
        hash.update(path.as_bytes());
        hash.update((type_bits | mode).to_string().as_bytes());
        match &kind {
            EntryKind::Dir => {}
            EntryKind::File(data) => {
                hash.update(data.len().to_string().as_bytes());
                hash.update(data);
            }
            EntryKind::Symlink(target) => {
                hash.update(target.len().to_string().as_bytes());
                hash.update(target.as_bytes());
            }
        }
        each(Entry { path, mode, kind })?;
    }
    Ok(hex::encode(hash.finalize()))
}

/// The checks of an upload as it arrives: every entry as [`read_entries`] checks it,
/// symlinks kept inside the archive.
pub fn check_archive(bytes: &[u8]) -> Result<(), ArchiveError> {
    read_entries(bytes, "", "", &|_| String::new(), &mut |_| Ok(())).map(|_| ())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn archive(entries: &[(&str, tar::EntryType, &str)]) -> Vec<u8> {
        let mut b = tar::Builder::new(Vec::new());
        for (path, ty, data) in entries {
            let mut h = tar::Header::new_gnu();
            h.set_entry_type(*ty);
            h.set_mode(0o644);
            if *ty == tar::EntryType::Symlink {
                h.set_size(0);
                h.set_link_name(data).unwrap();
                // Raw name bytes: the builder itself refuses `..` and absolute names.
                set_name(&mut h, path);
                h.set_cksum();
                b.append(&h, &[][..]).unwrap();
            } else {
                h.set_size(data.len() as u64);
                set_name(&mut h, path);
                h.set_cksum();
                b.append(&h, data.as_bytes()).unwrap();
            }
        }
        b.into_inner().unwrap()
    }

    fn set_name(h: &mut tar::Header, path: &str) {
        let name = &mut h.as_old_mut().name;
        name.fill(0);
        name[..path.len()].copy_from_slice(path.as_bytes());
    }

    use tar::EntryType::{Directory, Regular, Symlink};

    #[test]
    fn hostile_archives_are_refused() {
        let ok = archive(&[
            ("data/", Directory, ""),
            ("data/a.txt", Regular, "hi"),
            ("data/l", Symlink, "a.txt"),
        ]);
        check_archive(&ok).unwrap();
        for (bad, says) in [
            (archive(&[("../x", Regular, "x")]), "'..'"),
            (archive(&[("a/../../x", Regular, "x")]), "'..'"),
            (archive(&[("/etc/passwd", Regular, "x")]), "absolute"),
            (archive(&[("l", Symlink, "/etc")]), "leaves"),
            (archive(&[("d/l", Symlink, "../../etc")]), "leaves"),
            (
                archive(&[("l", Symlink, "d"), ("l/x", Regular, "x")]),
                "under a symlink",
            ),
            (archive(&[("fifo", tar::EntryType::Fifo, "")]), "only"),
            (archive(&[("h", tar::EntryType::Link, "")]), "only"),
            (b"not a tar at all, just bytes that go on".repeat(20), "tar"),
        ] {
            let e = check_archive(&bad).unwrap_err().to_string();
            assert!(e.contains(says), "{e:?} does not say {says:?}");
        }
    }

    #[test]
    fn symlinks_stay_in_their_root() {
        assert!(link_stays_inside("d/l", "../x", ""));
        assert!(!link_stays_inside("d/l", "../x", "d"));
        assert!(link_stays_inside("d/e/l", "../x", "d"));
        assert!(!link_stays_inside("l", "/x", ""));
    }

    #[test]
    fn hash_is_the_sdks() {
        // Python: calculate_files_hash('f.txt', '/d/', ...) over a 0o644 file "hi":
        // sha256(b"COPY f.txt /d/" b"f.txt" b"33188" b"2" b"hi").
        let a = archive(&[("f.txt", Regular, "hi")]);
        let got = read_entries(&a, "f.txt", "/d/", &|_| String::new(), &mut |_| Ok(())).unwrap();
        let want = hex::encode(Sha256::digest(b"COPY f.txt /d/f.txt331882hi"));
        assert_eq!(got, want);
    }
}
