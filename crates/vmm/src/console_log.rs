//! The guest console as a bounded file: what a VM's serial port printed, kept on the
//! host without letting a guest fill the disk.
//!
//! A guest writes its serial port as fast as the host reads it (0.5 MB/s was measured
//! from a shell loop); an append-only log grows without limit, and whoever reads it
//! whole (the API's `/logs`, the exit-reason scan) holds all of it in memory (issue 33).
//! [`BoundedLog`] keeps the file under [`LOG_CAP`] bytes: once the next write would
//! pass the cap, the file is rewritten as its first [`HEAD_KEEP`] bytes (the boot, which
//! explains most failures), a marker line saying how much was dropped, and its last
//! [`TAIL_KEEP`] bytes (what happened lately), then writing goes on. The rewrite goes to
//! a temporary file renamed over the log, so a reader, or a writer killed at any point,
//! never sees a half-written log; it costs a copy of about half the cap per half cap of
//! output.
//!
//! Readers take a bounded tail with [`read_tail`] (which never reads more than asked,
//! whatever the file's size: a log written before this bound existed may be larger).
//!
//! zygote's VMM writes its guests' consoles through it; the qemu runtime pipes QEMU's
//! serial output into a small process that does (`zygoted`'s console pump).
use std::fs::{File, OpenOptions};
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

/// The most bytes a console log holds (it is compacted before a write would pass it).
pub const LOG_CAP: u64 = 2 * 1024 * 1024;
/// Bytes kept from the start of the output (the boot).
pub const HEAD_KEEP: u64 = 64 * 1024;
/// Bytes kept from the end of the output at each compaction.
pub const TAIL_KEEP: u64 = 1024 * 1024;
/// How far into the kept tail a compaction looks for a line start to begin it at.
const LINE_SEARCH: u64 = 4096;
/// The most one write adds (a longer one is taken in parts): what a compacted log
/// (head, marker, tail) plus one write must still fit under the cap.
const MAX_WRITE: usize = 256 * 1024;

/// A console log file that never grows past [`LOG_CAP`] (see the module docs).
pub struct BoundedLog {
    path: PathBuf,
    file: File,
    /// Bytes in the file now.
    len: u64,
    /// Output bytes dropped by this writer's compactions so far.
    dropped: u64,
}

impl BoundedLog {
    /// A new, empty log at `path` (an existing file is replaced).
    pub fn create(path: &Path) -> io::Result<BoundedLog> {
        let file = File::create(path)?;
        Ok(BoundedLog {
            path: path.to_path_buf(),
            file,
            len: 0,
            dropped: 0,
        })
    }

    /// The log at `path`, appended to (created if missing). A file already over the cap
    /// is compacted at the first write.
    pub fn append(path: &Path) -> io::Result<BoundedLog> {
        let file = OpenOptions::new().create(true).append(true).open(path)?;
        let len = file.metadata()?.len();
        Ok(BoundedLog {
            path: path.to_path_buf(),
            file,
            len,
            dropped: 0,
        })
    }

    /// Bytes in the file now.
    pub fn len(&self) -> u64 {
        self.len
    }

    /// Whether the file is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Rewrites the file as head, marker and tail (see the module docs).
    fn compact(&mut self) -> io::Result<()> {
        let mut old = File::open(&self.path)?;
        let len = old.metadata()?.len();
        let head_len = HEAD_KEEP.min(len);
        let mut tail_start = len.saturating_sub(TAIL_KEEP).max(head_len);
        // Start the tail at a line, if one starts soon enough.
        let mut probe = vec![0u8; LINE_SEARCH.min(len - tail_start) as usize];
        old.seek(SeekFrom::Start(tail_start))?;
        old.read_exact(&mut probe)?;
        if let Some(nl) = probe.iter().position(|&b| b == b'\n') {
            tail_start += nl as u64 + 1;
        }
        self.dropped += tail_start - head_len;
        let tmp = self.path.with_extension("log.tmp");
        let mut new = File::create(&tmp)?;
        old.seek(SeekFrom::Start(0))?;
        io::copy(&mut (&mut old).take(head_len), &mut new)?;
        let marker = format!(
            "\n[zygote: {} bytes of console output dropped here; the log keeps the first {} \
             KiB and the latest output, at most {} KiB in all]\n",
            self.dropped,
            HEAD_KEEP / 1024,
            LOG_CAP / 1024
        );
        new.write_all(marker.as_bytes())?;
        old.seek(SeekFrom::Start(tail_start))?;
        io::copy(&mut old, &mut new)?;
        std::fs::rename(&tmp, &self.path)?;
        self.len = new.metadata()?.len();
        self.file = new;
        Ok(())
    }
}

impl Write for BoundedLog {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let buf = &buf[..buf.len().min(MAX_WRITE)];
        if self.len + buf.len() as u64 > LOG_CAP {
            self.compact()?;
        }
        let n = self.file.write(buf)?;
        self.len += n as u64;
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.file.flush()
    }
}

/// The last `max` bytes of the log at `path` (fewer if it is shorter), and the file's
/// size. Reads at most `max` bytes whatever the file's size.
pub fn read_tail(path: &Path, max: u64) -> io::Result<(Vec<u8>, u64)> {
    let mut file = File::open(path)?;
    let len = file.metadata()?.len();
    let start = len.saturating_sub(max);
    file.seek(SeekFrom::Start(start))?;
    let mut out = Vec::with_capacity((len - start) as usize);
    file.take(len - start).read_to_end(&mut out)?;
    Ok((out, len))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn numbered_lines(from: usize, n: usize) -> Vec<u8> {
        (from..from + n)
            .flat_map(|i| format!("line {i:08}\n").into_bytes())
            .collect()
    }

    #[test]
    fn the_log_stays_under_its_cap_and_keeps_the_boot_and_the_latest_output() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("serial.log");
        let mut log = BoundedLog::create(&path).unwrap();
        let boot = b"Linux version 6.1 booting\n".to_vec();
        log.write_all(&boot).unwrap();
        // 10 MiB of output in pieces of one line to several hundred.
        let mut written = 0usize;
        let mut line = 0;
        while written < 10 << 20 {
            let chunk = numbered_lines(line, 1 + line % 500);
            line += 1 + line % 500;
            written += chunk.len();
            log.write_all(&chunk).unwrap();
            assert!(std::fs::metadata(&path).unwrap().len() <= LOG_CAP);
        }
        let last = numbered_lines(line - 1, 1);
        let text = std::fs::read(&path).unwrap();
        assert!(text.len() as u64 <= LOG_CAP);
        assert!(text.starts_with(&boot), "the boot is kept");
        assert!(text.ends_with(&last), "the latest output is kept");
        let shown = String::from_utf8_lossy(&text);
        assert_eq!(shown.matches("[zygote: ").count(), 1, "one marker");
        assert!(shown.contains("bytes of console output dropped here"));
        // The kept tail starts at a line.
        let after_marker = shown.split("KiB in all]\n").nth(1).unwrap();
        assert!(
            after_marker.starts_with("line "),
            "{:?}",
            &after_marker[..20]
        );
        assert!(!path.with_extension("log.tmp").exists());
        assert_eq!(log.len(), text.len() as u64);
    }

    #[test]
    fn a_huge_write_is_taken_in_parts_under_the_cap() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("serial.log");
        let mut log = BoundedLog::create(&path).unwrap();
        log.write_all(&vec![b'y'; 5 << 20]).unwrap();
        assert!(std::fs::metadata(&path).unwrap().len() <= LOG_CAP);
    }

    #[test]
    fn appending_to_an_oversized_log_compacts_it() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("serial.log");
        std::fs::write(&path, vec![b'x'; (LOG_CAP + 12345) as usize]).unwrap();
        let mut log = BoundedLog::append(&path).unwrap();
        log.write_all(b"new\n").unwrap();
        let len = std::fs::metadata(&path).unwrap().len();
        assert!(len <= LOG_CAP, "{len}");
        assert!(std::fs::read(&path).unwrap().ends_with(b"new\n"));
    }

    #[test]
    fn a_tail_reads_only_what_is_asked() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("serial.log");
        std::fs::write(&path, b"0123456789").unwrap();
        assert_eq!(read_tail(&path, 4).unwrap(), (b"6789".to_vec(), 10));
        assert_eq!(read_tail(&path, 100).unwrap(), (b"0123456789".to_vec(), 10));
        assert!(read_tail(&dir.path().join("none"), 4).is_err());
    }
}
