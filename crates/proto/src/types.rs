//! Request and response bodies. Every type here is plain serde data so the
//! daemon and SDKs can reuse them; the JSON shapes are specified in
//! `PROTOCOL.md` and in the crate docs.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::b64;
use crate::error::ErrorBody;
use crate::process::{
    ProcessInfo, ProcessOutput, ProcessOutputRequest, ProcessSignalRequest, ProcessStdinRequest,
};

/// A request together with the connection-unique id its responses carry.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RequestFrame {
    pub id: u64,
    #[serde(flatten)]
    pub request: Request,
}

/// Everything the host can ask of the agent, tagged by `"type"`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Request {
    Hello(HelloRequest),
    Health,
    Exec(ExecRequest),
    Kill(KillRequest),
    ReadFile(ReadFileRequest),
    WriteFile(WriteFileRequest),
    ListDir(PathRequest),
    Stat(StatRequest),
    Rename(RenameRequest),
    Remove(RemoveRequest),
    Reidentify(ReidentifyRequest),
    Walk(WalkRequest),
    Apply(ApplyRequest),
    /// Start a background process (see [`crate::process`]).
    Spawn(ExecRequest),
    Processes,
    ProcessOutput(ProcessOutputRequest),
    ProcessStdin(ProcessStdinRequest),
    ProcessSignal(ProcessSignalRequest),
    Shutdown,
    PtyOpen(PtyOpenRequest),
    PtyInput(PtyInputRequest),
    PtyResize(PtyResizeRequest),
    /// Stream the changes under a directory (see [`crate::watch`]).
    Watch(crate::watch::WatchRequest),
    Unwatch(crate::watch::UnwatchRequest),
    /// The guest's resource counters now (see [`crate::stats`]).
    Stats,
}

impl Request {
    /// Every `"type"` value the agent understands, so it can tell an unknown
    /// request (`unknown_request`) from a known one with bad fields (`bad_request`).
    pub const TYPES: &'static [&'static str] = &[
        "hello",
        "health",
        "exec",
        "kill",
        "read_file",
        "write_file",
        "list_dir",
        "stat",
        "rename",
        "remove",
        "reidentify",
        "walk",
        "apply",
        "spawn",
        "processes",
        "process_output",
        "process_stdin",
        "process_signal",
        "shutdown",
        "pty_open",
        "pty_input",
        "pty_resize",
        "watch",
        "unwatch",
        "stats",
    ];
}

/// The first request of every connection once the agent has a token: it proves the
/// peer is the daemon that owns this sandbox, and starts a new session (on a
/// virtio-serial port, whose one byte stream outlives each host connection, the previous
/// session's execs are killed and their output dropped). An agent that has no token yet
/// (a fresh boot) takes this one; `new_token` replaces it (each branch child or restored
/// sandbox gets its own). Answered with `ok`, or `unauthorized`.
#[derive(Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct HelloRequest {
    pub token: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub new_token: Option<String>,
}

impl std::fmt::Debug for HelloRequest {
    // Secrets stay out of logs.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HelloRequest")
            .field("token", &"<redacted>")
            .field("new_token", &self.new_token.as_ref().map(|_| "<redacted>"))
            .finish()
    }
}

/// Run a program. The agent answers with `exec_started`, then any number of
/// `output` events as the program writes, then exactly one `exit` (or a single
/// `error` if the program could not be started).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExecRequest {
    /// Program and arguments; `argv[0]` is looked up in `PATH`.
    pub argv: Vec<String>,
    /// Variables set on top of the agent's environment (or of an empty one
    /// when `clear_env`).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub env: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "is_false")]
    pub clear_env: bool,
    /// Working directory; the agent's own (`/` in a guest) when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cwd: Option<String>,
    /// Bytes written to the program's stdin, which is then closed. Absent:
    /// stdin is `/dev/null`.
    #[serde(
        default,
        with = "b64::opt_bytes",
        skip_serializing_if = "Option::is_none"
    )]
    pub stdin: Option<Vec<u8>>,
    /// Wall-clock limit; on expiry the whole process group gets SIGKILL and
    /// the exit event has `timed_out: true`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_ms: Option<u64>,
    /// Run as this user / group id (the agent must be root to change them).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uid: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gid: Option<u32>,
}

impl ExecRequest {
    /// A request running `argv` with every other field defaulted.
    pub fn new<I, S>(argv: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        ExecRequest {
            argv: argv.into_iter().map(Into::into).collect(),
            ..Default::default()
        }
    }

    /// `sh -c SCRIPT`.
    pub fn shell(script: impl Into<String>) -> Self {
        Self::new(["sh".to_string(), "-c".to_string(), script.into()])
    }
}

/// Send a signal to a running exec's process group.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct KillRequest {
    /// The request id of the `exec` on the same connection.
    pub exec_id: u64,
    /// Signal number (1..=64); SIGKILL (9) when absent.
    #[serde(default = "default_signal")]
    pub signal: i32,
}

fn default_signal() -> i32 {
    9
}

/// Largest terminal width or height (`cols`, `rows`) a pty may have.
pub const MAX_PTY_DIM: u16 = 1000;

/// Ptys open at once in one guest (over every connection); one more is refused with
/// `limit_reached`.
pub const MAX_PTYS: usize = 256;

/// Most bytes one `pty_input` carries, and most input a pty holds that its program
/// has not read yet (a `pty_input` that does not fit is answered `busy`).
pub const MAX_PTY_INPUT: usize = 64 * 1024;

/// Run a program on a new pseudo-terminal. Like `exec`: `pty_started`, then `output`
/// events (stream `stdout`: the terminal's output), then one `exit`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PtyOpenRequest {
    /// Program and arguments; empty: the login shell of the agent's user (from
    /// `/etc/passwd`, `/bin/sh` if none) started as a login shell (`-l`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub argv: Vec<String>,
    /// Variables set on top of the agent's environment; `TERM` defaults to
    /// `xterm-256color`.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub env: BTreeMap<String, String>,
    /// Working directory; the user's home directory (else `/`) when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cwd: Option<String>,
    /// Terminal size, each 1..=[`MAX_PTY_DIM`].
    pub cols: u16,
    pub rows: u16,
    /// Run as this user / group id (the agent must be root to change them), as exec's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uid: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gid: Option<u32>,
}

/// Keystrokes (raw bytes) for a running pty.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PtyInputRequest {
    /// The request id of the `pty_open` on the same connection.
    pub pty_id: u64,
    /// At most [`MAX_PTY_INPUT`] bytes.
    #[serde(with = "b64::bytes")]
    pub data: Vec<u8>,
}

/// A new terminal size for a running pty (its foreground programs get SIGWINCH).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PtyResizeRequest {
    pub pty_id: u64,
    pub cols: u16,
    pub rows: u16,
}

/// Read (part of) a file. The agent returns at most [`crate::MAX_DATA_CHUNK`]
/// bytes per request; [`crate::client::AgentClient::read_file`] loops.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReadFileRequest {
    pub path: String,
    #[serde(default)]
    pub offset: u64,
    /// Maximum bytes to return; the chunk limit when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub len: Option<u64>,
}

/// Write a file. Without `append` the write is atomic: data goes to a temp
/// file in the same directory, is fsynced, renamed over `path`, and the
/// directory is fsynced. With `append` the data is appended (creating the file)
/// and fsynced; that is how large uploads are staged before a `rename`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WriteFileRequest {
    pub path: String,
    #[serde(with = "b64::bytes")]
    pub data: Vec<u8>,
    /// Permission bits (e.g. `0o644`); 0o644 for new files when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<u32>,
    #[serde(default, skip_serializing_if = "is_false")]
    pub append: bool,
    /// Create missing parent directories (mode 0o755).
    #[serde(default, skip_serializing_if = "is_false")]
    pub create_parents: bool,
    /// Owner of the written file and of the parents this write creates (the agent must
    /// be root to give them away); the agent's own user when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub owner: Option<Owner>,
}

/// A numeric owner: user and group id.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Owner {
    pub uid: u32,
    pub gid: u32,
}

/// A request naming one absolute path.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PathRequest {
    pub path: String,
}

/// Every entry under a directory, for comparing trees (`walk`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WalkRequest {
    pub path: String,
    /// Also give each regular file's sha256.
    #[serde(default)]
    pub hash: bool,
}

/// One entry of a `walk`: its path relative to the walked directory ('/'-separated),
/// its metadata (symlinks not followed) and, when asked, a regular file's sha256.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WalkEntry {
    pub path: String,
    #[serde(flatten)]
    pub meta: Metadata,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sha256: Option<String>,
}

/// Most entries one `walk` returns; a larger tree is refused (walk a narrower path).
pub const MAX_WALK_ENTRIES: usize = 50_000;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StatRequest {
    pub path: String,
    /// Describe a symlink's target instead of the link (default true).
    #[serde(default = "default_true")]
    pub follow_symlinks: bool,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RenameRequest {
    pub from: String,
    pub to: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RemoveRequest {
    pub path: String,
    /// Remove a directory and everything below it.
    #[serde(default, skip_serializing_if = "is_false")]
    pub recursive: bool,
}

/// A batch of tree changes the agent makes in order (a `merge` applies one): it stops
/// at the first that fails and answers `applied` with how many were made, or an error
/// naming the failed one. Once received, the batch runs to its end whether or not the
/// host is still connected, so a host that dies mid-way never leaves it half-sent.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ApplyRequest {
    pub ops: Vec<TreeOp>,
}

/// Most operations one `apply` takes (as many as a `walk` returns entries, plus slack).
pub const MAX_APPLY_OPS: usize = 2 * MAX_WALK_ENTRIES;

/// One change of an [`ApplyRequest`]. Paths are absolute; none of them follows a
/// symlink in its last component.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum TreeOp {
    /// Create a directory (an existing one is kept) and set its permission bits.
    Mkdir { path: String, mode: u32 },
    /// Make `path` a symlink to `target`, replacing a file or symlink there.
    Symlink { path: String, target: String },
    /// Move a staged file into place, replacing a file or symlink there, then set its
    /// permission bits.
    Install { from: String, to: String, mode: u32 },
    /// Remove a file, symlink or (with `recursive`) directory tree; absent is fine.
    Remove {
        path: String,
        #[serde(default, skip_serializing_if = "is_false")]
        recursive: bool,
    },
    /// Set permission bits (symlinks have none to set).
    Chmod { path: String, mode: u32 },
    /// Set the owner (of a symlink itself, not its target).
    Chown { path: String, uid: u32, gid: u32 },
}

/// Give a freshly branched/restored VM its own identity: fresh entropy, a
/// hostname and the current time (a restored guest wakes with the clock and
/// RNG state of the snapshot).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReidentifyRequest {
    /// Written to `/dev/urandom`, and credited with RNDADDENTROPY when root.
    #[serde(default, with = "b64::bytes", skip_serializing_if = "Vec::is_empty")]
    pub entropy: Vec<u8>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hostname: Option<String>,
    /// Wall-clock time to set (CLOCK_REALTIME).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub time: Option<UnixTime>,
    /// The guest's own network identity (a branch child or restored guest wakes up with
    /// its source's address and MAC).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub net: Option<NetIdentity>,
    /// Who the guest is now: with it, the agent also writes a new `/etc/machine-id`,
    /// bumps the generation counter (`/run/zygote/generation`) and runs the hooks in
    /// `/etc/zygote/forked.d/`, in that order, before it answers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub identity: Option<SandboxIdentity>,
}

/// The ids a guest's "you were forked" hooks see (`ZYGOTE_SANDBOX_ID`, ...).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SandboxIdentity {
    pub sandbox_id: String,
    /// The sandbox this one was branched from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent_id: Option<String>,
    /// The snapshot this one was restored from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub snapshot_id: Option<String>,
}

/// How one `/etc/zygote/forked.d/` hook ended.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct HookOutcome {
    /// File name within `forked.d`.
    pub name: String,
    /// Exit code; None when it was killed by a signal, timed out or did not start.
    #[serde(default)]
    pub exit_code: Option<i32>,
    /// Why it failed, when it did (timeout, signal, could not run).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// The end of what it wrote to stderr (bounded).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub stderr_tail: String,
}

impl HookOutcome {
    pub fn succeeded(&self) -> bool {
        self.exit_code == Some(0) && self.error.is_none()
    }
}

/// An interface's address, default route and MAC.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NetIdentity {
    /// Interface name (`eth0`).
    pub interface: String,
    /// IPv4 address with prefix length, `10.213.0.7/16`.
    pub address: String,
    /// Default gateway (on the address's subnet).
    pub gateway: String,
    /// `02:7a:63:00:00:05`.
    pub mac: String,
}

/// Seconds and nanoseconds since the Unix epoch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct UnixTime {
    pub secs: i64,
    #[serde(default)]
    pub nanos: u32,
}

impl UnixTime {
    /// The host's current time.
    pub fn now() -> Self {
        let d = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default();
        UnixTime {
            secs: d.as_secs() as i64,
            nanos: d.subsec_nanos(),
        }
    }
}

/// A response or event, tagged by `"type"`, with the id of the request it
/// belongs to.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ResponseFrame {
    /// Request id; 0 for connection-level errors that cannot be attributed to
    /// a request (e.g. an unparsable or oversize frame).
    pub id: u64,
    #[serde(flatten)]
    pub response: Response,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Response {
    Health(HealthInfo),
    /// The exec's program is running with this pid (also its process group id).
    ExecStarted {
        pid: u32,
    },
    /// The pty's program is running with this pid (its own session and process group).
    PtyStarted {
        pid: u32,
    },
    /// A chunk of the exec's output, sent as soon as it is read.
    Output {
        stream: Stream,
        #[serde(with = "b64::bytes")]
        data: Vec<u8>,
    },
    /// Final event of an exec.
    Exit(ExecResult),
    FileData(FileChunk),
    Written {
        /// Size of the file after the write.
        size: u64,
    },
    DirListing {
        entries: Vec<DirEntry>,
    },
    Stat(Metadata),
    Reidentified(ReidentifyReport),
    /// Entries under the walked directory, sorted by path (the directory itself not
    /// included).
    Walked {
        entries: Vec<WalkEntry>,
    },
    /// How many operations of an `apply` were made (all of them).
    Applied {
        done: u32,
    },
    /// A background process started (`spawn`).
    Spawned(ProcessInfo),
    /// Every background process the agent tracks, oldest first.
    Processes {
        processes: Vec<ProcessInfo>,
    },
    ProcessOutput(ProcessOutput),
    /// A `watch` is in place: its events follow.
    WatchStarted,
    /// Changes under a watched directory, in the order the kernel reported them.
    WatchEvents {
        events: Vec<crate::watch::WatchEvent>,
    },
    /// The guest's resource counters (`stats`).
    Stats(crate::stats::GuestStats),
    /// Success without a payload (kill, rename, remove, shutdown).
    Ok,
    Error(ErrorBody),
    /// A response type this version does not know (a newer agent).
    #[serde(other)]
    Unknown,
}

impl Response {
    /// Whether this ends its request: everything except exec, pty and watch progress
    /// events.
    pub fn is_terminal(&self) -> bool {
        !matches!(
            self,
            Response::ExecStarted { .. }
                | Response::PtyStarted { .. }
                | Response::Output { .. }
                | Response::WatchStarted
                | Response::WatchEvents { .. }
        )
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HealthInfo {
    pub agent_version: String,
    pub protocol_version: u32,
    /// Running as the guest's init.
    pub pid1: bool,
    pub hostname: String,
    /// Milliseconds since the agent started.
    pub uptime_ms: u64,
    /// `--no-system-changes`: reidentify/shutdown only validate and report.
    pub dry_run: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Stream {
    Stdout,
    Stderr,
}

/// How an exec ended.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExecResult {
    /// Exit status when the program exited normally.
    pub exit_code: Option<i32>,
    /// Terminating signal when it was killed by one.
    pub signal: Option<i32>,
    /// The agent killed it because `timeout_ms` expired.
    pub timed_out: bool,
    pub duration_ms: u64,
}

impl ExecResult {
    /// Exited with status 0 (and was not killed).
    pub fn success(&self) -> bool {
        self.exit_code == Some(0)
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileChunk {
    #[serde(with = "b64::bytes")]
    pub data: Vec<u8>,
    /// Offset of `data` in the file.
    pub offset: u64,
    /// File size when it was read.
    pub size: u64,
    /// `offset + data.len()` reached the end of the file.
    pub eof: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FileKind {
    File,
    Dir,
    Symlink,
    Other,
}

impl FileKind {
    /// The name on the wire (`file`, `dir`, `symlink`, `other`).
    pub fn as_str(self) -> &'static str {
        match self {
            FileKind::File => "file",
            FileKind::Dir => "dir",
            FileKind::Symlink => "symlink",
            FileKind::Other => "other",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DirEntry {
    /// File name (not UTF-8 names are converted lossily).
    pub name: String,
    /// Metadata of the entry itself (symlinks are not followed).
    #[serde(flatten)]
    pub meta: Metadata,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Metadata {
    pub kind: FileKind,
    pub size: u64,
    /// Permission bits incl. setuid/setgid/sticky (`st_mode & 0o7777`).
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
    /// Modification time, seconds since the epoch.
    pub mtime: i64,
    pub mtime_nanos: u32,
    /// Link target, for symlinks.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub symlink_target: Option<String>,
}

/// What `reidentify` did (or, in dry-run mode, would have done).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReidentifyReport {
    pub entropy_bytes: usize,
    /// The entropy was credited to the kernel pool (RNDADDENTROPY, root only).
    pub entropy_credited: bool,
    /// The kernel's CRNG was reseeded from the pool right away (RNDRESEEDCRNG, root
    /// only): the next /dev/urandom and getrandom() bytes already depend on the new
    /// entropy, instead of after the kernel's next periodic reseed.
    #[serde(default)]
    pub crng_reseeded: bool,
    pub hostname_set: bool,
    pub clock_set: bool,
    /// The interface now has the requested address, route and MAC.
    #[serde(default)]
    pub net_set: bool,
    /// A new `/etc/machine-id` was written.
    #[serde(default)]
    pub machine_id_set: bool,
    /// The generation counter's new value (`/run/zygote/generation`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub generation: Option<u64>,
    /// The `forked.d` hooks that ran, in order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub hooks: Vec<HookOutcome>,
    /// Nothing was changed: the agent runs with `--no-system-changes`.
    pub dry_run: bool,
    /// How long each part took in the guest (absent from older agents and dry runs).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub took_us: Option<ReidentifyTimes>,
}

/// Microseconds each part of a `reidentify` took in the guest, for a branch child's
/// bring-up phases (0: the part was not asked for).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReidentifyTimes {
    /// Mixing (and crediting) the entropy, reseeding the CRNG.
    pub entropy: u64,
    /// Hostname, /etc/hostname and /etc/hosts.
    pub hostname: u64,
    pub clock: u64,
    /// The interface's MAC, address and route.
    pub net: u64,
    /// machine-id, the generation counter and the `forked.d` hooks.
    pub identity: u64,
}

fn is_false(b: &bool) -> bool {
    !*b
}

fn default_true() -> bool {
    true
}
