//! A tar stream written header by header, hostile names and all: the builder of the
//! `tar` crate refuses `..` and absolute names, which the applier's tests and the fuzz
//! generator need to send. Names and link targets too long for a header's field go in
//! a PAX record.
use tar::{EntryType, GnuExtSparseHeader, Header};

/// Fields every generated header gets unless it says otherwise.
const UID: u64 = 1000;
const GID: u64 = 100;
const MTIME: u64 = 1_600_000_000;

#[derive(Default, Clone)]
pub struct TarStream {
    b: Vec<u8>,
}

impl TarStream {
    /// A ustar header with `path` written raw (cut to the field's 100 bytes).
    pub fn header(path: &[u8], kind: EntryType, mode: u32, size: u64) -> Header {
        let mut h = Header::new_ustar();
        let name = &mut h.as_old_mut().name;
        let n = path.len().min(name.len());
        name[..n].copy_from_slice(&path[..n]);
        h.set_entry_type(kind);
        h.set_mode(mode);
        h.set_size(size);
        h.set_uid(UID);
        h.set_gid(GID);
        h.set_mtime(MTIME);
        h
    }

    /// Appends `h` (its checksum set) and `data`, padded to a block.
    pub fn push(&mut self, mut h: Header, data: &[u8]) -> &mut Self {
        h.set_cksum();
        self.b.extend_from_slice(h.as_bytes());
        self.raw(data);
        self.pad();
        self
    }

    /// Appends bytes as they are (no header, no padding).
    pub fn raw(&mut self, data: &[u8]) -> &mut Self {
        self.b.extend_from_slice(data);
        self
    }

    fn pad(&mut self) {
        let pad = (512 - self.b.len() % 512) % 512;
        self.b.extend(std::iter::repeat_n(0u8, pad));
    }

    /// A PAX header with the next entry's long path, if it needs one.
    fn long_path(&mut self, path: &[u8]) -> &mut Self {
        if path.len() > 100 {
            self.pax(&[("path", path)]);
        }
        self
    }

    pub fn file(&mut self, path: &str, data: &[u8], mode: u32) -> &mut Self {
        self.entry(path.as_bytes(), EntryType::Regular, mode, data)
    }

    /// Any entry with a body: `path` raw (a PAX record when long).
    pub fn entry(&mut self, path: &[u8], kind: EntryType, mode: u32, data: &[u8]) -> &mut Self {
        self.long_path(path);
        let h = Self::header(path, kind, mode, data.len() as u64);
        self.push(h, data)
    }

    pub fn dir(&mut self, path: &str, mode: u32) -> &mut Self {
        self.entry(path.as_bytes(), EntryType::Directory, mode, b"")
    }

    /// A symlink or hard link to `target` (a PAX record when long).
    pub fn link(&mut self, path: &str, target: &str, kind: EntryType) -> &mut Self {
        self.link_raw(path.as_bytes(), target.as_bytes(), kind)
    }

    pub fn link_raw(&mut self, path: &[u8], target: &[u8], kind: EntryType) -> &mut Self {
        if target.len() > 100 {
            self.pax(&[("linkpath", target)]);
        }
        self.long_path(path);
        let mut h = Self::header(path, kind, 0o777, 0);
        let t = &mut h.as_old_mut().linkname;
        let n = target.len().min(t.len());
        t[..n].copy_from_slice(&target[..n]);
        self.push(h, b"")
    }

    /// An entry without a body (fifo, device).
    pub fn special(&mut self, path: &str, kind: EntryType) -> &mut Self {
        self.entry(path.as_bytes(), kind, 0o644, b"")
    }

    /// A PAX header (xattrs, long values) for the next entry.
    pub fn pax(&mut self, records: &[(&str, &[u8])]) -> &mut Self {
        let mut body = Vec::new();
        for (k, v) in records {
            let rest = format!(" {k}=").len() + v.len() + 1;
            let mut len = rest + 1;
            while len.to_string().len() + rest != len {
                len += 1;
            }
            body.extend_from_slice(format!("{len} {k}=").as_bytes());
            body.extend_from_slice(v);
            body.push(b'\n');
        }
        let h = Self::header(b"PaxHeader", EntryType::XHeader, 0o644, body.len() as u64);
        self.push(h, &body)
    }

    /// A GNU sparse file of `real_size` logical bytes whose data is `chunks` (offset,
    /// bytes) and holes elsewhere; chunks past the header's four go in extension
    /// blocks. Nothing is checked: overlapping or unaligned chunks are for the tar
    /// reader to refuse.
    pub fn sparse(&mut self, path: &str, real_size: u64, chunks: &[(u64, &[u8])]) -> &mut Self {
        let stored: u64 = chunks.iter().map(|(_, d)| d.len() as u64).sum();
        let mut h = Header::new_gnu();
        let name = &mut h.as_old_mut().name;
        let n = path.len().min(name.len());
        name[..n].copy_from_slice(&path.as_bytes()[..n]);
        h.set_entry_type(EntryType::GNUSparse);
        h.set_mode(0o644);
        h.set_size(stored);
        h.set_uid(UID);
        h.set_gid(GID);
        h.set_mtime(MTIME);
        let (inline, rest) = chunks.split_at(chunks.len().min(4));
        let gnu = h.as_gnu_mut().expect("a GNU header");
        for (slot, (offset, data)) in gnu.sparse.iter_mut().zip(inline) {
            slot.set_offset(*offset);
            slot.set_length(data.len() as u64);
        }
        gnu.set_real_size(real_size);
        gnu.set_is_extended(!rest.is_empty());
        h.set_cksum();
        self.b.extend_from_slice(h.as_bytes());
        let groups: Vec<_> = rest.chunks(21).collect();
        for (i, group) in groups.iter().enumerate() {
            let mut ext = GnuExtSparseHeader::new();
            for (slot, (offset, data)) in ext.sparse_mut().iter_mut().zip(group.iter()) {
                slot.set_offset(*offset);
                slot.set_length(data.len() as u64);
            }
            ext.set_is_extended(i + 1 < groups.len());
            self.b.extend_from_slice(ext.as_bytes());
        }
        for (_, data) in chunks {
            self.b.extend_from_slice(data);
        }
        self.pad();
        self
    }

    /// The stream with its end-of-archive blocks.
    pub fn bytes(&self) -> Vec<u8> {
        let mut b = self.b.clone();
        b.extend(std::iter::repeat_n(0u8, 1024));
        b
    }

    /// The stream so far, without an end.
    pub fn unterminated(&self) -> &[u8] {
        &self.b
    }
}
