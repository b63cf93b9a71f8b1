//! Running build tools while relaying their output as progress lines.
use std::collections::VecDeque;
use std::io::{BufRead, BufReader, Read};
use std::process::{Command, Stdio};
use std::sync::mpsc;

use crate::error::{ImageError, Result};

/// A sink for human-readable progress lines.
pub type Progress<'a> = &'a mut dyn FnMut(&str);

/// Lines kept for the error message when a command fails.
const TAIL_LINES: usize = 25;

/// Runs `cmd`, sends each stderr line (and each stdout line unless
/// `capture_stdout`) to `progress`, and returns the captured stdout lines.
/// On failure the error carries the last lines of output.
pub(crate) fn run_streaming(
    cmd: &mut Command,
    what: &str,
    capture_stdout: bool,
    progress: Progress<'_>,
) -> Result<Vec<String>> {
    let program = cmd.get_program().to_string_lossy().into_owned();
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|source| ImageError::Spawn { program, source })?;
    let (tx, rx) = mpsc::channel::<String>();
    let stderr = child.stderr.take().expect("piped stderr");
    let stdout = child.stdout.take().expect("piped stdout");
    let err_tx = tx.clone();
    let err_thread = std::thread::spawn(move || forward_lines(stderr, |l| err_tx.send(l).is_ok()));
    let out_thread = std::thread::spawn(move || {
        let mut captured = Vec::new();
        forward_lines(stdout, |l| {
            if capture_stdout {
                captured.push(l);
                true
            } else {
                tx.send(l).is_ok()
            }
        });
        captured
    });
    let mut tail = VecDeque::with_capacity(TAIL_LINES);
    for line in rx {
        progress(&line);
        if tail.len() == TAIL_LINES {
            tail.pop_front();
        }
        tail.push_back(line);
    }
    let _ = err_thread.join();
    let captured = out_thread.join().unwrap_or_default();
    let status = child.wait().map_err(|source| ImageError::Io {
        context: format!("waiting for {what}"),
        source,
    })?;
    if !status.success() {
        if capture_stdout {
            tail.extend(captured.iter().rev().take(5).rev().cloned());
        }
        return Err(ImageError::CommandFailed {
            what: what.to_string(),
            status: status.to_string(),
            tail: Vec::from(tail).join("\n"),
        });
    }
    Ok(captured)
}

/// Splits a stream into lines (lossy UTF-8, `\r` treated as a line end so that
/// tools redrawing one status line still show progress).
fn forward_lines(stream: impl Read, mut send: impl FnMut(String) -> bool) {
    let mut reader = BufReader::new(stream);
    let mut buf = Vec::new();
    loop {
        buf.clear();
        match reader.read_until(b'\n', &mut buf) {
            Ok(0) | Err(_) => return,
            Ok(_) => {}
        }
        for part in buf.split(|&b| b == b'\n' || b == b'\r') {
            if part.is_empty() {
                continue;
            }
            if !send(String::from_utf8_lossy(part).into_owned()) {
                return;
            }
        }
    }
}

/// Runs a short command quietly and returns its stdout.
pub(crate) fn run_quiet(cmd: &mut Command, what: &str) -> Result<String> {
    let program = cmd.get_program().to_string_lossy().into_owned();
    let out = cmd
        .stdin(Stdio::null())
        .output()
        .map_err(|source| ImageError::Spawn { program, source })?;
    if !out.status.success() {
        let mut tail = String::from_utf8_lossy(&out.stderr).into_owned();
        tail.push_str(&String::from_utf8_lossy(&out.stdout));
        return Err(ImageError::CommandFailed {
            what: what.to_string(),
            status: out.status.to_string(),
            tail: tail.trim_end().to_string(),
        });
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn streams_and_captures() {
        let mut seen = Vec::new();
        let out = run_streaming(
            Command::new("sh").args(["-c", "echo out1; echo err1 >&2; printf 'a\\rb\\n' >&2"]),
            "sh",
            true,
            &mut |l| seen.push(l.to_string()),
        )
        .unwrap();
        assert_eq!(out, vec!["out1"]);
        assert_eq!(seen, vec!["err1", "a", "b"]);
    }

    #[test]
    fn failure_carries_tail() {
        let err = run_streaming(
            Command::new("sh").args(["-c", "echo boom >&2; exit 3"]),
            "boom-tool",
            false,
            &mut |_| {},
        )
        .unwrap_err();
        let msg = err.to_string();
        assert!(msg.contains("boom-tool failed"), "{msg}");
        assert!(msg.contains("exit status: 3"), "{msg}");
        assert!(msg.contains("boom"), "{msg}");
    }
}
