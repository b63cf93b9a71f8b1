//! Length-prefixed framing: a 4-byte big-endian payload length, then that many
//! bytes of UTF-8 JSON.
//!
//! A length prefix (rather than newline-delimited JSON) lets a reader reject an
//! oversize message before buffering it, and makes a truncated message
//! detectable instead of silently merging it with the next one.

use std::io::{self, Read, Write};

/// Largest payload either side accepts or sends: 16 MiB.
pub const MAX_FRAME_LEN: usize = 16 * 1024 * 1024;

/// Why a frame could not be read.
#[derive(Debug, thiserror::Error)]
pub enum FrameError {
    #[error("frame of {len} bytes exceeds the {max}-byte limit")]
    TooLarge { len: usize, max: usize },
    #[error("stream ended inside a frame ({got} of {expected} bytes)")]
    Truncated { expected: usize, got: usize },
    #[error("i/o error reading frame: {0}")]
    Io(#[from] io::Error),
}

/// Read as many bytes as possible into `buf`, stopping early only at EOF.
/// Returns how many bytes were read.
fn read_full(r: &mut impl Read, buf: &mut [u8]) -> io::Result<usize> {
    let mut got = 0;
    while got < buf.len() {
        match r.read(&mut buf[got..]) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        }
    }
    Ok(got)
}

/// The payload buffer grows by at most this much (or by what it holds already) per step,
/// so a header that announces a large frame costs memory only as its bytes arrive.
const GROW_STEP: usize = 64 * 1024;

/// Read one frame. `Ok(None)` means the peer closed the stream cleanly at a
/// frame boundary. On [`FrameError::TooLarge`] the payload has not been
/// consumed, so the stream is no longer in sync and must be closed.
///
/// The length prefix is the peer's word, not a fact: the buffer is grown as the
/// payload actually arrives (doubling from [`GROW_STEP`], never past the announced
/// length), so a peer that announces 16 MiB and sends ten bytes makes the reader
/// hold kilobytes, not the announced size.
pub fn read_frame(r: &mut impl Read, max: usize) -> Result<Option<Vec<u8>>, FrameError> {
    let mut header = [0u8; 4];
    let got = read_full(r, &mut header)?;
    if got == 0 {
        return Ok(None);
    }
    if got < 4 {
        return Err(FrameError::Truncated { expected: 4, got });
    }
    let len = u32::from_be_bytes(header) as usize;
    if len > max {
        return Err(FrameError::TooLarge { len, max });
    }
    let mut payload = Vec::new();
    while payload.len() < len {
        let start = payload.len();
        let step = (len - start).min(start.max(GROW_STEP));
        payload.reserve_exact(step);
        payload.resize(start + step, 0);
        let got = read_full(r, &mut payload[start..])?;
        if got < step {
            return Err(FrameError::Truncated {
                expected: len,
                got: start + got,
            });
        }
    }
    Ok(Some(payload))
}

/// Write one frame (header and payload in a single `write_all` so that a
/// writer shared behind a mutex never interleaves partial frames) and flush.
pub fn write_frame(w: &mut impl Write, payload: &[u8]) -> io::Result<()> {
    if payload.len() > MAX_FRAME_LEN {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!(
                "frame of {} bytes exceeds the {MAX_FRAME_LEN}-byte limit",
                payload.len()
            ),
        ));
    }
    let mut buf = Vec::with_capacity(4 + payload.len());
    buf.extend_from_slice(&(payload.len() as u32).to_be_bytes());
    buf.extend_from_slice(payload);
    w.write_all(&buf)?;
    w.flush()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_clean_eof() {
        let mut buf = Vec::new();
        write_frame(&mut buf, b"hello").unwrap();
        write_frame(&mut buf, b"").unwrap();
        let mut r = &buf[..];
        assert_eq!(read_frame(&mut r, 100).unwrap().unwrap(), b"hello");
        assert_eq!(read_frame(&mut r, 100).unwrap().unwrap(), b"");
        assert!(read_frame(&mut r, 100).unwrap().is_none());
    }

    #[test]
    fn oversize_and_truncated() {
        let mut buf = Vec::new();
        write_frame(&mut buf, &[7u8; 50]).unwrap();
        assert!(matches!(
            read_frame(&mut &buf[..], 10),
            Err(FrameError::TooLarge { len: 50, max: 10 })
        ));
        assert!(matches!(
            read_frame(&mut &buf[..20], 100),
            Err(FrameError::Truncated {
                expected: 50,
                got: 16
            })
        ));
        assert!(matches!(
            read_frame(&mut &buf[..2], 100),
            Err(FrameError::Truncated {
                expected: 4,
                got: 2
            })
        ));
    }

    #[test]
    fn writer_refuses_oversize() {
        let big = vec![0u8; MAX_FRAME_LEN + 1];
        assert!(write_frame(&mut Vec::new(), &big).is_err());
    }
}
