//! Wire types of the VMM control socket.
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::devices::virtio::block::DiskFile;
use crate::vmm::snapshot::SnapshotMode;

/// Largest memory read/write through the socket (probe tests, diagnostics).
pub const MAX_MEMORY_IO: u64 = 1 << 20;

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum Request {
    Status,
    Pause,
    Resume,
    /// Fork one child per entry of `children` (see [`ChildSpec`]). How many a request
    /// may ask for is the daemon's decision (its API's `MAX_BRANCH_COUNT`): only the
    /// daemon reaches this socket, and what parsing any request may cost is bounded by
    /// the request line limit ([`super::conn::MAX_REQUEST_LINE`]).
    Branch {
        children: Vec<ChildSpec>,
        /// Also save the branch point: a full snapshot written to this (new) directory
        /// by the frozen copy that forks the children, after the reply's children run;
        /// the directory appears complete when it is done.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        point_snapshot: Option<PathBuf>,
        #[serde(default = "default_ready_timeout_ms")]
        ready_timeout_ms: u64,
    },
    Snapshot {
        mode: SnapshotMode,
        path: PathBuf,
    },
    /// Read guest-physical memory (hex encoded in the reply).
    ReadMemory {
        gpa: u64,
        len: u64,
    },
    /// Write guest-physical memory from the host side (not seen by KVM's dirty log).
    WriteMemory {
        gpa: u64,
        hex: String,
    },
    /// A readable dump of the VM's vCPU, interrupt and virtio queue state (briefly
    /// pausing it): for reports on a guest that stopped answering.
    Diagnose,
    /// Stop the VM and the VMM process.
    Stop,
}

/// One child of a `branch` request: where it serves and the host resources that are its
/// own. Fields the daemon does not know are refused, so a misspelt one is not silently
/// left out.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ChildSpec {
    /// Its control socket, served with this same protocol. It must not exist yet and
    /// its directory must; the parent binds it before it forks.
    pub socket: PathBuf,
    /// Where its console goes (None: discarded).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub console: Option<PathBuf>,
    /// Its own vsock socket (required when the VM has a vsock device).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vsock: Option<PathBuf>,
    /// Its own tap (required when the VM has a network device).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tap: Option<String>,
    /// A cgroup v2 directory it joins before building its VM (None: it stays in the
    /// parent's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cgroup: Option<PathBuf>,
    /// A network namespace (a `/run/netns/<name>` file) it joins before opening its
    /// tap, so that each child's tap is in its own namespace (None: it stays in the
    /// parent's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub netns: Option<PathBuf>,
    /// Files for its block devices, by id, instead of the parent's: each persistent
    /// disk of the parent needs one (a frozen copy, opened copy-on-write), or the child
    /// writes into the parent's file.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub disk_files: Vec<DiskFile>,
}

fn default_ready_timeout_ms() -> u64 {
    30_000
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum VmRunState {
    Running,
    Paused,
    Stopped,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct StatusInfo {
    pub pid: i32,
    pub state: VmRunState,
    pub vcpus: usize,
    pub mem_mib: u64,
    /// Set once the guest has ended (reset, power-off or an error).
    pub exit: Option<String>,
    /// Direct child processes (branch children or spawners) not yet reaped.
    pub children: Vec<i32>,
    /// The snapshot the next `diff` would layer on.
    pub last_snapshot: Option<PathBuf>,
    /// Warm spawners kept for the next branch (`--warm-spawners`).
    #[serde(default)]
    pub spawners: Vec<crate::vmm::warm::SpawnerInfo>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ChildInfo {
    pub index: usize,
    pub pid: i32,
    pub socket: PathBuf,
    /// From the request to the child's VM running.
    pub ready_ms: f64,
    /// The part of that the child spent building its VM (new KVM VM, state, threads).
    #[serde(default)]
    pub restore_ms: f64,
    /// Warm branch only: the part of `ready_ms` spent catching the spawner up before the
    /// pause (writing the pages the guest changed since the last catch-up).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub catch_up_ms: Option<f64>,
    /// Warm branch only: sending the spawner the state and the devices' private data
    /// (after the parent resumed, before the child could restore), and its size.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state_ms: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state_bytes: Option<u64>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct BranchInfo {
    pub children: Vec<ChildInfo>,
    pub pause_ms: f64,
    pub spawner: Option<i32>,
    /// The child came from a warm spawner (no fork, its VM built ahead).
    #[serde(default)]
    pub warm: bool,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SnapshotInfo {
    pub path: PathBuf,
    pub mode: SnapshotMode,
    pub pause_ms: f64,
    pub total_ms: f64,
    pub pages_written: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorBody {
    /// Stable machine-readable code: bad_request, stopped, branch_failed, snapshot_failed,
    /// memory, busy (too many connections), internal.
    pub code: String,
    pub message: String,
}

/// One reply line: `{"ok":true,"data":...}` or `{"ok":false,"error":{...}}`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Reply {
    pub ok: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data: Option<serde_json::Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<ErrorBody>,
}

impl Reply {
    pub fn ok(data: impl Serialize) -> Self {
        Self {
            ok: true,
            data: Some(serde_json::to_value(data).unwrap_or(serde_json::Value::Null)),
            error: None,
        }
    }

    pub fn err(code: &str, message: impl std::fmt::Display) -> Self {
        Self {
            ok: false,
            data: None,
            error: Some(ErrorBody {
                code: code.into(),
                message: message.to_string(),
            }),
        }
    }
}

pub fn to_hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

pub fn from_hex(s: &str) -> Result<Vec<u8>, String> {
    if !s.len().is_multiple_of(2) {
        return Err("hex string has odd length".into());
    }
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).map_err(|e| format!("bad hex: {e}")))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_wire_format() {
        let r: Request =
            serde_json::from_str(r#"{"op":"snapshot","mode":"diff","path":"/x"}"#).unwrap();
        assert!(matches!(
            r,
            Request::Snapshot {
                mode: SnapshotMode::Diff,
                ..
            }
        ));
        let r: Request = serde_json::from_str(
            r#"{"op":"branch","children":[{"socket":"/a"},{"socket":"/b","console":"/b.log","cgroup":"/g"}]}"#,
        )
        .unwrap();
        match r {
            Request::Branch {
                children,
                ready_timeout_ms,
                ..
            } => {
                assert_eq!(
                    children,
                    [
                        ChildSpec {
                            socket: "/a".into(),
                            ..Default::default()
                        },
                        ChildSpec {
                            socket: "/b".into(),
                            console: Some("/b.log".into()),
                            cgroup: Some("/g".into()),
                            ..Default::default()
                        }
                    ]
                );
                assert_eq!(ready_timeout_ms, 30_000);
            }
            other => panic!("{other:?}"),
        }
        // A child needs its socket; a field nobody knows is refused, not dropped.
        for bad in [
            r#"{"op":"branch","children":[{"console":"/c"}]}"#,
            r#"{"op":"branch","children":[{"socket":"/a","cgroups":"/g"}]}"#,
            r#"{"op":"branch","child_sockets":["/a"]}"#,
        ] {
            assert!(serde_json::from_str::<Request>(bad).is_err(), "{bad}");
        }
        assert!(serde_json::from_str::<Request>(r#"{"op":"explode"}"#).is_err());
        assert_eq!(
            serde_json::to_string(&Request::Status).unwrap(),
            r#"{"op":"status"}"#
        );
    }

    #[test]
    fn hex_round_trip_and_errors() {
        assert_eq!(
            from_hex(&to_hex(&[0, 1, 0xab, 0xff])).unwrap(),
            vec![0, 1, 0xab, 0xff]
        );
        assert!(from_hex("abc").is_err());
        assert!(from_hex("zz").is_err());
    }

    #[test]
    fn reply_shapes() {
        let ok = serde_json::to_string(&Reply::ok(5)).unwrap();
        assert_eq!(ok, r#"{"ok":true,"data":5}"#);
        let err = serde_json::to_string(&Reply::err("stopped", "the VM has stopped")).unwrap();
        assert!(err.contains(r#""code":"stopped""#));
    }
}
