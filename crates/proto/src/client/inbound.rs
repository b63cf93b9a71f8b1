//! Decoding what the agent sends: one length-prefixed frame, then one JSON response.
//!
//! This is where the host meets bytes written by a guest, and a guest is hostile code:
//! nothing in them is trusted. The length prefix is checked against
//! [`MAX_FRAME_LEN`] before anything is read, and the payload buffer grows only as
//! bytes arrive ([`frame::read_frame`]); JSON decoding is bounded by the frame (serde's
//! nesting limit keeps a deep document from exhausting the stack). Every failure is an
//! [`InboundError`] value, never a panic. The client's reader thread
//! ([`super::AgentClient`]) is the only caller; the fuzz target
//! (`fuzz/`, and the seeded test `tests/agent_frames_fuzz.rs`) calls it
//! directly with arbitrary byte streams.
use std::io::Read;

use crate::frame::{self, FrameError, MAX_FRAME_LEN};
use crate::ResponseFrame;

/// Why the next response could not be read.
#[derive(Debug, thiserror::Error)]
pub enum InboundError {
    /// The framing broke (oversize or truncated frame) or the transport failed: the
    /// stream is no longer at a frame boundary.
    #[error("bad frame from agent: {0}")]
    Frame(#[from] FrameError),
    /// A well-framed payload that is not a response (not JSON, wrong shape or types).
    #[error("undecodable response from agent: {0}")]
    Json(#[from] serde_json::Error),
}

impl InboundError {
    /// The transport failed (as opposed to the agent sending something wrong).
    pub fn is_transport(&self) -> bool {
        matches!(self, InboundError::Frame(FrameError::Io(_)))
    }
}

/// The next response on `r`; `Ok(None)` when the agent closed the stream cleanly at a
/// frame boundary.
pub fn read_response(r: &mut impl Read) -> Result<Option<ResponseFrame>, InboundError> {
    let Some(bytes) = frame::read_frame(r, MAX_FRAME_LEN)? else {
        return Ok(None);
    };
    Ok(Some(serde_json::from_slice(&bytes)?))
}
