//! Random layers for the applier, structure first: a stream of plausible entries with
//! hostile details (names from a small pool so that entries collide, `..`, `.` and
//! empty components, whiteouts of every shape, links into and out of the tree, GNU
//! sparse maps of every size, PAX records, unknown entry types), some of it truncated
//! or with bytes flipped. About two layers in three are *well-formed* (nothing the applier
//! must refuse, though links still point out of the tree and sparse files still claim
//! gigabytes): an applier that refused every layer would pass the checks without
//! having written anything. The choices come from an [`Entropy`]: a seeded generator for
//! the randomized test, or the fuzzer's bytes, so that libFuzzer mutates decisions
//! instead of having to discover the tar format.
use tar::EntryType;

use super::tar_stream::TarStream;

/// Where a generator's decisions come from.
pub trait Entropy {
    fn next(&mut self) -> u64;

    /// In `0..n` (0 when `n` is 0).
    fn below(&mut self, n: u64) -> u64 {
        if n == 0 {
            0
        } else {
            self.next() % n
        }
    }

    fn pick<T: Copy>(&mut self, xs: &[T]) -> T {
        xs[self.below(xs.len() as u64) as usize]
    }
}

/// xorshift64*: tiny and deterministic.
pub struct Seeded(u64);

impl Seeded {
    pub fn new(seed: u64) -> Seeded {
        Seeded(seed | 1)
    }
}

impl Entropy for Seeded {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
}

/// A fuzzer's input as decisions, four bytes each; zeros once it is used up (so the
/// generator still ends).
pub struct FuzzBytes<'a> {
    data: &'a [u8],
    at: usize,
}

impl<'a> FuzzBytes<'a> {
    pub fn new(data: &'a [u8]) -> FuzzBytes<'a> {
        FuzzBytes { data, at: 0 }
    }
}

impl Entropy for FuzzBytes<'_> {
    fn next(&mut self) -> u64 {
        let mut word = [0u8; 4];
        let rest = self.data.get(self.at..).unwrap_or(&[]);
        let n = rest.len().min(4);
        word[..n].copy_from_slice(&rest[..n]);
        self.at += 4;
        u64::from(u32::from_le_bytes(word))
    }
}

/// Path components: few, so that entries meet; whiteouts; names of what lies next to
/// the staging root.
const COMPONENTS: &[&str] = &[
    "a",
    "b",
    "c",
    "s",
    "l",
    "d",
    "victim",
    ".",
    ".wh.a",
    ".wh.b",
    ".wh.s",
    ".wh.d",
    ".wh..wh..opq",
    ".wh..wh.plnk",
    "sentinel",
    "keep",
    "root",
];

/// Components only hostile layers have: each makes the applier refuse the entry.
const HOSTILE_COMPONENTS: &[&str] = &["..", "", ".wh.", ".wh..", ".wh..."];

/// Link targets that lead out of the tree if followed on the host.
const ESCAPES: &[&str] = &[
    "/",
    ".",
    "..",
    "../..",
    "../../..",
    "../sentinel",
    "../sentinel/keep",
    "../../sentinel/sub",
    "/..",
    "/../sentinel",
    "a/../..",
    "s",
    "l",
    "a/b",
];

/// One to three layers; `outside` is the absolute path of a directory next to the
/// staging root, which links may name.
pub fn layers<E: Entropy>(e: &mut E, outside: &str) -> Vec<Vec<u8>> {
    let count = 1 + e.below(3);
    (0..count)
        .map(|_| {
            let mut g = Gen {
                e: &mut *e,
                outside,
                hostile: false,
            };
            g.hostile = g.e.below(3) == 0;
            g.layer()
        })
        .collect()
}

/// One layer's generator.
struct Gen<'a, E> {
    e: &'a mut E,
    outside: &'a str,
    hostile: bool,
}

impl<E: Entropy> Gen<'_, E> {
    fn layer(&mut self) -> Vec<u8> {
        let mut t = TarStream::default();
        for _ in 0..1 + self.e.below(16) {
            self.entry(&mut t);
        }
        if !self.hostile {
            return t.bytes();
        }
        let e = &mut *self.e;
        let mut bytes = if e.below(8) == 0 {
            t.unterminated().to_vec()
        } else {
            t.bytes()
        };
        if e.below(4) == 0 && !bytes.is_empty() {
            for _ in 0..1 + e.below(8) {
                let at = e.below(bytes.len() as u64) as usize;
                bytes[at] = e.next() as u8;
            }
        }
        if e.below(8) == 0 {
            bytes.truncate(e.below(bytes.len() as u64 + 1) as usize);
        }
        bytes
    }

    fn entry(&mut self, t: &mut TarStream) {
        match self.e.below(14) {
            0..=2 => {
                let (p, d, m) = (self.path(), self.data(), self.mode());
                t.file(&p, &d, m);
            }
            3 => {
                let (p, m) = (self.path(), self.mode());
                t.dir(&p, m);
            }
            4 => {
                let (p, target) = (self.path(), self.link_target());
                t.link(&p, &target, EntryType::Symlink);
            }
            5 => {
                // Well-formed layers link to what they hold (or held: a later entry
                // may have replaced it).
                let target = if self.hostile {
                    self.link_target()
                } else {
                    self.path()
                };
                let (p, d) = (self.path(), self.data());
                if !self.hostile {
                    t.file(&target, &d, 0o644);
                }
                t.link(&p, &target, EntryType::Link);
            }
            6 => {
                let (dir, hidden) = (self.path(), self.component());
                let hidden = if hidden == "." && !self.hostile {
                    "a"
                } else {
                    hidden
                };
                t.file(&format!("{dir}/.wh.{hidden}"), b"", 0o644);
            }
            7 => {
                let dir = self.path();
                t.file(&format!("{dir}/.wh..wh..opq"), b"", 0o644);
            }
            8 => self.sparse(t),
            9 => {
                let p = self.path();
                let kind = self.e.pick(&[EntryType::Fifo, EntryType::Char]);
                t.special(&p, kind);
            }
            10 => {
                let p = self.path();
                let uid = if self.hostile {
                    self.e.pick(&["-1", "99999999999999999999", "x", ""])
                } else {
                    self.e.pick(&["0", "1000", "65534"])
                };
                t.pax(&[
                    ("SCHILY.xattr.user.fuzz", b"v"),
                    ("path", p.as_bytes()),
                    ("uid", uid.as_bytes()),
                    ("mtime", b"1600000000.5"),
                ]);
                // (A long name here would be a second PAX header for the same file.)
                let (p, d) = (self.component(), self.data());
                t.file(p, &d, 0o644);
            }
            11 if self.hostile => {
                let (p, d) = (self.path(), self.data());
                let kind = EntryType::new(self.e.next() as u8);
                t.entry(p.as_bytes(), kind, 0o644, &d);
            }
            12 => {
                let mut long = self.path().into_bytes();
                long.push(0);
                t.entry(b"././@LongLink", EntryType::GNULongName, 0o644, &long);
                let d = self.data();
                t.file("short-name", &d, 0o644);
            }
            _ => {
                // A link, then a file through it.
                let (p, target) = (self.path(), self.link_target());
                t.link(&p, &target, EntryType::Symlink);
                let (below, d) = (self.path(), self.data());
                t.file(&format!("{p}/{below}"), &d, 0o644);
            }
        }
    }

    fn component(&mut self) -> &'static str {
        if self.hostile && self.e.below(4) == 0 {
            self.e.pick(HOSTILE_COMPONENTS)
        } else {
            self.e.pick(COMPONENTS)
        }
    }

    fn path(&mut self) -> String {
        if self.e.below(40) == 0 {
            // Names past a header's 100 bytes go in PAX records; past 255 they are no
            // file names.
            let max = if self.hostile { 350 } else { 250 };
            return "x".repeat(101 + self.e.below(max - 100) as usize);
        }
        let mut p = match self.e.below(6) {
            0 => "/".to_string(),
            1 => "./".to_string(),
            _ => String::new(),
        };
        for i in 0..1 + self.e.below(4) {
            if i > 0 {
                p.push('/');
            }
            p.push_str(self.component());
        }
        if self.e.below(10) == 0 {
            p.push('/');
        }
        p
    }

    /// Symlink targets are never refused, wherever they point: the applier resolves
    /// them inside the tree.
    fn link_target(&mut self) -> String {
        match self.e.below(5) {
            0 => {
                let rest = self.e.pick(&[
                    "",
                    "/keep",
                    "/sub",
                    "/sub/keep2",
                    "/..",
                    "/../root",
                    "/link",
                ]);
                format!("{}{rest}", self.outside)
            }
            1 | 2 => self.e.pick(ESCAPES).to_string(),
            _ => self.path(),
        }
    }

    fn mode(&mut self) -> u32 {
        self.e
            .pick(&[0o644, 0o755, 0o000, 0o4755, 0o1777, 0o500, 0o7777])
    }

    fn data(&mut self) -> Vec<u8> {
        let e = &mut *self.e;
        let big = if self.hostile { 1 << 20 } else { 128 << 10 };
        match e.below(8) {
            0 => vec![0; e.below(256 << 10) as usize],
            1 => (0..e.below(big)).map(|i| (i as u8) | 1).collect(),
            2 => {
                // Zeros with data here and there: holes between blocks.
                let mut d = vec![0; e.below(64 << 10) as usize];
                for _ in 0..e.below(4) {
                    if !d.is_empty() {
                        let at = e.below(d.len() as u64) as usize;
                        d[at] = 0x5a;
                    }
                }
                d
            }
            _ => (0..e.below(2000)).map(|_| e.next() as u8).collect(),
        }
    }

    /// A GNU sparse entry: a map of up to 30 chunks (past the header's four they go in
    /// extension blocks) with holes up to gigabytes between them. Hostile layers also
    /// claim sizes up to a terabyte and send maps the tar reader must refuse
    /// (overlapping, unaligned, not matching the size).
    fn sparse(&mut self, t: &mut TarStream) {
        let p = self.path();
        let hostile = self.hostile;
        let e = &mut *self.e;
        let count = e.below(30);
        let gaps: &[u64] = if hostile {
            &[0, 512, 4096, 65536, 1 << 20, 3 << 30]
        } else {
            &[0, 4096, 65536, 1 << 20]
        };
        let mut chunks: Vec<(u64, Vec<u8>)> = Vec::new();
        let mut end = 0u64;
        for i in 0..count {
            let gap = e.pick(gaps) * e.below(3);
            let offset = if hostile && e.below(16) == 0 {
                e.next()
            } else {
                end + gap
            };
            let len = if i + 1 == count || (hostile && e.below(8) == 0) {
                e.below(1500)
            } else {
                512 * e.below(4)
            };
            let fill = e.pick(&[0x5a, 0]);
            chunks.push((offset, vec![fill; len as usize]));
            end = offset.saturating_add(len);
        }
        let real_size = match e.below(4) {
            0 if hostile => e.pick(&[4096, 1 << 20, 64 << 20, 3 << 30, 1 << 40]),
            _ => end + e.pick(&[0, 1, 4096, 1 << 20]),
        };
        if real_size > end && !(hostile && e.below(4) == 0) {
            // A trailing hole: GNU tar ends the map with an empty chunk at the size.
            chunks.push((real_size, Vec::new()));
        }
        let refs: Vec<(u64, &[u8])> = chunks.iter().map(|(o, d)| (*o, &d[..])).collect();
        t.sparse(&p, real_size, &refs);
    }
}
