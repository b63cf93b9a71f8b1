//! Background processes: programs the agent starts and keeps track of after the
//! request that started them has been answered (`spawn`), unlike an `exec`, which
//! lives exactly as long as its request.
//!
//! The agent keeps each one's output in a bounded ring, addressed by a byte offset
//! that counts everything the process ever printed on stdout and stderr together,
//! so a reader can come back later (another connection, another daemon, a branch
//! child) and ask for what it has not seen yet. The processes belong to the guest,
//! not to a connection: a host that goes away leaves them running.

use serde::{Deserialize, Serialize};

use crate::b64;
use crate::types::{ExecResult, Stream};

/// Bytes of output the agent keeps per background process; older output is dropped
/// (a reader asking for it learns how much it missed).
pub const PROCESS_OUTPUT_RING: usize = 1024 * 1024;

/// Background processes the agent tracks at once, running or ended; starting one
/// more first forgets the oldest ended one, and is refused (`busy`) when all are
/// still running.
pub const MAX_PROCESSES: usize = 256;

/// Longest a `process_output` request waits for new output.
pub const MAX_OUTPUT_WAIT_MS: u64 = 30_000;

/// Most bytes one `process_output` answer carries.
pub const MAX_OUTPUT_READ: usize = 256 * 1024;

/// Whether a background process is still running.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ProcessState {
    Running,
    /// Ended, and all its output has been collected.
    Exited,
}

/// One background process as the agent sees it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProcessInfo {
    /// Its pid in the guest (also its process group id).
    pub pid: u32,
    pub argv: Vec<String>,
    pub state: ProcessState,
    /// How it ended, once `state` is `exited`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exit: Option<ExecResult>,
    /// When it started, by the guest's clock (milliseconds since the epoch).
    pub started_unix_ms: u64,
    /// Bytes it has printed so far (stdout and stderr together): the offset the next
    /// output will have.
    pub output_bytes: u64,
    /// Its stdin is still open for `process_stdin`.
    pub stdin_open: bool,
}

/// What was printed from `offset` on.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProcessOutputRequest {
    pub pid: u32,
    /// Combined stdout+stderr byte offset to read from (0: from the start).
    #[serde(default)]
    pub offset: u64,
    /// When nothing is there yet and the process still runs, wait up to this long
    /// for output or its end (at most [`MAX_OUTPUT_WAIT_MS`]; 0: answer at once).
    #[serde(default)]
    pub wait_ms: u64,
}

/// Consecutive bytes of one stream.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OutputChunk {
    pub stream: Stream,
    #[serde(with = "b64::bytes")]
    pub data: Vec<u8>,
}

/// The answer to `process_output`: the chunks in the order they were printed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProcessOutput {
    pub chunks: Vec<OutputChunk>,
    /// Offset of the first byte of `chunks` (past `offset` when older output was
    /// dropped from the ring).
    pub offset: u64,
    /// Where to read next: `offset` plus the bytes in `chunks`.
    pub next_offset: u64,
    /// The process, as of this answer. Once it is `exited` and `next_offset` equals
    /// its `output_bytes`, there is nothing more to read.
    pub process: ProcessInfo,
}

/// Write to a background process's stdin (and/or close it).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProcessStdinRequest {
    pub pid: u32,
    #[serde(default, with = "b64::bytes", skip_serializing_if = "Vec::is_empty")]
    pub data: Vec<u8>,
    /// Close stdin after writing `data` (the program sees end of file).
    #[serde(default)]
    pub eof: bool,
}

/// Send a signal to a background process's process group.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProcessSignalRequest {
    pub pid: u32,
    /// 1..=64.
    pub signal: i32,
}
