//! A VM's console log on the host: `serial.log` in its directory, bounded, and read only
//! as a bounded tail.
//!
//! The file is a [`BoundedLog`] (at most [`LOG_CAP`] bytes: the boot, a marker saying how
//! much was dropped, the latest output). zygote's VMM writes it itself. QEMU cannot be
//! told to bound a file, so the qemu runtime has it print the serial port to its stdout,
//! a pipe into a small process running [`pump`] (this binary started again with
//! [`PUMP_ARG`], see [`run_pump_if_asked`]): it lives in the VM's supervisor pipeline,
//! not in the daemon, so the log keeps being written while the daemon is down or
//! restarting, and it never stops reading (a failed write drops the output, it does not
//! block the guest's serial port).
//!
//! Readers never load the whole file: the exit-reason scan and boot errors read a tail
//! ([`tail_text`]), and `GET .../logs` streams one.
use std::ffi::OsString;
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};

pub use zygote_vmm::console_log::LOG_CAP;
use zygote_vmm::console_log::{read_tail, BoundedLog};

/// The console log's name in a VM's directory.
pub const LOG_FILE: &str = "serial.log";

/// The first argument that makes this binary a console pump.
pub const PUMP_ARG: &str = "__zygote-console-pump";

/// How much of the log the exit-reason scan and boot errors look at.
pub const SCAN_BYTES: u64 = 64 * 1024;

/// The console log of the VM in `dir`.
pub fn path(dir: &Path) -> PathBuf {
    dir.join(LOG_FILE)
}

/// The last `max` bytes of the console log in `dir` as text (empty without one).
pub fn tail_text(dir: &Path, max: u64) -> String {
    match read_tail(&path(dir), max) {
        Ok((bytes, _)) => String::from_utf8_lossy(&bytes).into_owned(),
        Err(_) => String::new(),
    }
}

/// The last `n` lines of the console log in `dir` (from its last [`SCAN_BYTES`]), for
/// boot errors.
pub fn last_lines(dir: &Path, n: usize) -> String {
    let text = tail_text(dir, SCAN_BYTES);
    let mut lines: Vec<&str> = text.lines().rev().take(n).collect();
    lines.reverse();
    lines.join("\n")
}

/// The program that runs [`pump`]: this executable, if it is still there (a binary
/// replaced by an upgrade is too: it takes the same argument).
pub fn pump_program() -> Option<PathBuf> {
    std::env::current_exe().ok().filter(|p| p.is_file())
}

/// Copies `input` into a new bounded log at `log` until `input` ends. A write that fails
/// (a full disk, the VM directory removed) drops that output and goes on reading: the
/// writer on the other end (QEMU's serial port) must never block on the log.
pub fn pump(mut input: impl Read, log: &Path) -> io::Result<()> {
    let mut out = BoundedLog::create(log).ok();
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = match input.read(&mut buf) {
            Ok(0) => return Ok(()),
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        if let Some(w) = &mut out {
            if w.write_all(&buf[..n]).is_err() {
                out = None;
            }
        }
    }
}

/// When this process was started as a console pump (`<exe> PUMP_ARG <log>`): pumps
/// stdin into the log and returns the exit status. None for any other command line.
pub fn run_pump_if_asked(args: &[OsString]) -> Option<i32> {
    if args.get(1).map(|a| a.as_os_str()) != Some(PUMP_ARG.as_ref()) {
        return None;
    }
    let Some(log) = args.get(2) else {
        eprintln!("{PUMP_ARG}: no log file given");
        return Some(2);
    };
    // A bigger pipe lets the serial port run ahead of a slow disk for longer.
    // SAFETY: fcntl on our own stdin; failure leaves the default size.
    unsafe { libc::fcntl(0, libc::F_SETPIPE_SZ, 1 << 20) };
    match pump(io::stdin().lock(), Path::new(log)) {
        Ok(()) => Some(0),
        Err(e) => {
            eprintln!("{PUMP_ARG}: reading the console: {e}");
            Some(1)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_pump_bounds_what_it_is_given_and_keeps_the_end() {
        let dir = tempfile::tempdir().unwrap();
        let log = path(dir.path());
        let mut input = Vec::new();
        for i in 0..400_000 {
            input.extend_from_slice(format!("console line {i}\n").as_bytes());
        }
        assert!(input.len() as u64 > 2 * LOG_CAP);
        pump(&input[..], &log).unwrap();
        let len = std::fs::metadata(&log).unwrap().len();
        assert!(len <= LOG_CAP, "{len}");
        assert!(tail_text(dir.path(), 100).ends_with("console line 399999\n"));
        assert!(tail_text(dir.path(), 100).len() <= 100);
    }

    #[test]
    fn a_pump_whose_log_cannot_be_written_still_reads_everything() {
        let dir = tempfile::tempdir().unwrap();
        let input = vec![b'x'; 1 << 20];
        let mut reader = &input[..];
        pump(&mut reader, &dir.path().join("missing/serial.log")).unwrap();
        assert!(reader.is_empty(), "all input was consumed");
    }

    #[test]
    fn only_the_pump_argument_makes_a_pump() {
        let args = |v: &[&str]| v.iter().map(OsString::from).collect::<Vec<_>>();
        assert_eq!(
            run_pump_if_asked(&args(&["zygoted", "--listen", "x"])),
            None
        );
        assert_eq!(run_pump_if_asked(&args(&["zygoted"])), None);
        assert_eq!(run_pump_if_asked(&args(&["zygoted", PUMP_ARG])), Some(2));
    }
}
