//! The kernel's inotify interface, through libc: one instance (a descriptor), watches
//! on directories added to and removed from it, and the events read from it.
//!
//! Records are parsed with every length checked against the bytes read, although the
//! kernel writes them: a parser that trusts a length field is one bug away from reading
//! past its buffer.
use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

/// What every watch asks the kernel for.
const MASK: u32 = libc::IN_CREATE
    | libc::IN_MODIFY
    | libc::IN_DELETE
    | libc::IN_MOVED_FROM
    | libc::IN_MOVED_TO
    | libc::IN_ATTRIB
    | libc::IN_DELETE_SELF
    | libc::IN_MOVE_SELF
    | libc::IN_ONLYDIR;

/// Size of an `inotify_event` header; its name (NUL-padded) follows.
const HEADER: usize = std::mem::size_of::<libc::inotify_event>();

/// One inotify instance.
pub(crate) struct Inotify {
    fd: OwnedFd,
}

/// One event as the kernel reported it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct RawEvent {
    /// The watch it came from (-1 for a queue overflow).
    pub wd: i32,
    pub mask: u32,
    /// Pairs the two halves of a rename (IN_MOVED_FROM, IN_MOVED_TO).
    pub cookie: u32,
    /// The entry's name within the watched directory; empty for the directory itself.
    pub name: Vec<u8>,
}

impl Inotify {
    /// A non-blocking instance.
    pub(crate) fn new() -> io::Result<Inotify> {
        // SAFETY: inotify_init1 takes flags only and returns a new descriptor or -1.
        let fd = unsafe { libc::inotify_init1(libc::IN_NONBLOCK | libc::IN_CLOEXEC) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `fd` is a fresh descriptor that nothing else owns.
        Ok(Inotify {
            fd: unsafe { OwnedFd::from_raw_fd(fd) },
        })
    }

    pub(crate) fn fd(&self) -> &OwnedFd {
        &self.fd
    }

    /// Watch the directory `path`; `follow` says whether a symlink there is followed
    /// (only for the directory the client named: never for one found below it).
    pub(crate) fn add(&self, path: &Path, follow: bool) -> io::Result<i32> {
        let c = CString::new(path.as_os_str().as_bytes())
            .map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
        let mask = if follow {
            MASK
        } else {
            MASK | libc::IN_DONT_FOLLOW
        };
        // SAFETY: `c` is a NUL-terminated string that outlives the call.
        let wd = unsafe { libc::inotify_add_watch(self.fd.as_raw_fd(), c.as_ptr(), mask) };
        if wd < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(wd)
    }

    /// Stop watching `wd` (gone already is fine).
    pub(crate) fn remove(&self, wd: i32) {
        // SAFETY: inotify_rm_watch has no memory-safety preconditions.
        unsafe { libc::inotify_rm_watch(self.fd.as_raw_fd(), wd) };
    }

    /// The events queued now (none: empty), read into `buf`.
    pub(crate) fn read(&self, buf: &mut [u8]) -> io::Result<Vec<RawEvent>> {
        // SAFETY: the kernel writes at most `buf.len()` bytes into `buf`.
        let n = unsafe { libc::read(self.fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
        if n < 0 {
            let e = io::Error::last_os_error();
            return match e.kind() {
                io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted => Ok(Vec::new()),
                _ => Err(e),
            };
        }
        Ok(parse(&buf[..n as usize]))
    }
}

/// The records in `bytes`; a record that does not fit is dropped with what follows.
pub(crate) fn parse(bytes: &[u8]) -> Vec<RawEvent> {
    let mut events = Vec::new();
    let mut at = 0;
    while bytes.len() - at >= HEADER {
        let field = |off: usize| {
            let b = &bytes[at + off..at + off + 4];
            u32::from_ne_bytes([b[0], b[1], b[2], b[3]])
        };
        // struct inotify_event { int wd; uint32_t mask, cookie, len; char name[]; }
        let (wd, mask, cookie, len) = (field(0) as i32, field(4), field(8), field(12) as usize);
        let Some(end) = (at + HEADER).checked_add(len).filter(|&e| e <= bytes.len()) else {
            break;
        };
        let raw = &bytes[at + HEADER..end];
        let name = raw.split(|&b| b == 0).next().unwrap_or_default().to_vec();
        events.push(RawEvent {
            wd,
            mask,
            cookie,
            name,
        });
        at = end;
    }
    events
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(wd: i32, mask: u32, name: &[u8], len: u32) -> Vec<u8> {
        let mut b = Vec::new();
        b.extend_from_slice(&wd.to_ne_bytes());
        b.extend_from_slice(&mask.to_ne_bytes());
        b.extend_from_slice(&0u32.to_ne_bytes());
        b.extend_from_slice(&len.to_ne_bytes());
        let mut padded = name.to_vec();
        padded.resize(len as usize, 0);
        b.extend_from_slice(&padded);
        b
    }

    #[test]
    fn records_are_parsed_and_a_lying_length_stops_the_parse() {
        let mut bytes = record(1, libc::IN_CREATE, b"a.txt", 16);
        bytes.extend(record(-1, libc::IN_Q_OVERFLOW, b"", 0));
        let mut lying = record(2, libc::IN_DELETE, b"b", 16);
        lying.truncate(HEADER + 4); // says 16 bytes of name, holds 4
        bytes.extend(lying);
        let events = parse(&bytes);
        assert_eq!(
            events,
            vec![
                RawEvent {
                    wd: 1,
                    mask: libc::IN_CREATE,
                    cookie: 0,
                    name: b"a.txt".to_vec()
                },
                RawEvent {
                    wd: -1,
                    mask: libc::IN_Q_OVERFLOW,
                    cookie: 0,
                    name: vec![]
                },
            ]
        );
        assert!(parse(&bytes[..HEADER - 1]).is_empty());
    }

    #[test]
    fn a_real_instance_reports_a_created_file() {
        let dir = tempfile::tempdir().unwrap();
        let ino = Inotify::new().unwrap();
        let wd = ino.add(dir.path(), true).unwrap();
        std::fs::write(dir.path().join("x"), b"1").unwrap();
        let mut buf = vec![0u8; 4096];
        let events = ino.read(&mut buf).unwrap();
        assert!(
            events
                .iter()
                .any(|e| e.wd == wd && e.mask & libc::IN_CREATE != 0 && e.name == b"x"),
            "{events:?}"
        );
        let file = dir.path().join("x");
        let err = ino.add(&file, true).unwrap_err();
        assert_eq!(err.raw_os_error(), Some(libc::ENOTDIR));
    }
}
