//! The REST API's JSON bodies, with validation: one module per resource (as the
//! daemon's `api/` routes), the bounds in [`limits`]. Every request type rejects
//! unknown fields, and [`Validate`] turns out-of-range values into 400s before
//! anything is started.
mod agent;
mod branch;
mod code;
mod console;
mod create;
mod diff;
mod egress;
mod env;
mod events;
mod exec;
mod files;
mod fork;
mod image;
pub mod limits;
mod live_events;
mod logs;
mod merge;
pub mod metadata;
mod metrics;
mod network;
mod network_names;
mod pack;
mod ports;
mod process;
mod pty;
mod sandboxes;
mod snapshots;
mod system;
mod tree;
mod ttl;
mod validate;
mod volumes;
mod watch;
pub use agent::{AgentHealth, AgentState};
pub use branch::{
    BranchEvent, BranchFailure, BranchPhases, BranchRequest, BranchResponse, ChildPhases,
    ReidentifyParts,
};
pub use code::{
    validate_context_id, CodeContext, CodeContextList, CodeEvent, CodeRequest,
    CreateContextRequest, CODE_ENV_LIMITS, CODE_LANGUAGE, DEFAULT_CODE_TIMEOUT_MS, DEFAULT_CONTEXT,
    MAX_CODE_BYTES, RESULT_MIME_TYPES,
};
pub use console::ConsoleLogin;
pub use create::{CheckedCreate, CreateEvent, CreateSandboxRequest};
pub use diff::{DiffChange, DiffEntry, DiffQuery, SandboxDiff};
pub use egress::{EgressEntry, EgressList, EgressQuery};
pub use env::{
    validate_vars, validate_vars_within, ImageRun, SandboxEnv, SecretSpec, VarLimits, CA_ENV,
    GUEST_CA_BUNDLE, GUEST_EGRESS_CA, MAX_SECRET_HOSTS,
};
pub use events::{
    EventLevel, EventList, EventOrder, EventsQuery, SandboxEvent, MAX_EVENTS_PER_QUERY,
    MAX_EVENT_SEARCH,
};
pub use live_events::{
    parse_stream_id, stream_id, LiveEvent, LiveEventsQuery, StreamLagged, StreamReady, REPLAY_EVENTS,
    SSE_LAGGED, SSE_READY, SSE_SANDBOX,
};
pub use exec::{parse_user, ExecEvent, ExecRequest, ExecResponse};
pub use files::{DirListing, FileEntry, PathQuery, WriteResult};
pub use fork::ForkHook;
pub use image::{BuildEvent, BuildImageRequest, Image, ImageList, PullImageRequest};
pub use limits::*;
pub use logs::{LogsQuery, LOG_CAP};
pub use merge::{MergeChange, MergeConflict, MergeReport, MergeRequest, OnConflict};
pub use metrics::{MetricSample, MetricsList, MetricsQuery};
pub use network::{
    parse_cidr, DnsCounts, NameRule, NetworkMode, NetworkPolicy, NetworkRequest, NetworkView,
    SetNetworkRequest, MAX_NETWORK_RULES,
};
pub use pack::{ImportQuery, PackEvent, PackOrigin, PullSnapshotRequest, PushSnapshotRequest};
pub use ports::{ExposePortRequest, ExposedPort, PortList, ProxyInfo};
pub use process::{
    OutputQuery, Process, ProcessList, ProcessOutput, SignalRequest, SignalSpec, StdinRequest,
};
pub use pty::{
    check_pty_size, PtyClientMessage, PtyQuery, PtyServerMessage, MAX_PTY_ENV, PTY_PROTOCOL,
};
pub use sandboxes::{CgroupReport, Limits, Origin, Sandbox, SandboxList};
pub use snapshots::{RestoreRequest, Snapshot, SnapshotKind, SnapshotList, SnapshotRequest};
pub use system::{CgroupInfo, Health, Info, NetworkInfo, RuntimeInfo};
pub use tree::{KeepRequest, KeepResponse, SandboxTree, TreeNode, TreeSnapshot};
pub use ttl::{SetTtlRequest, TtlAction, MAX_TTL_SECS};
pub use validate::{in_range, validate_guest_path, validate_name, Validate};
pub use volumes::{
    validate_mount_path, validate_mounts, validate_volume_name, CreateVolumeRequest, MountedVolume,
    Volume, VolumeList, VolumeMountSpec, DEFAULT_VOLUME_MIB, MAX_VOLUME_MIB, MAX_VOLUME_MOUNTS,
    MIN_VOLUME_MIB,
};
pub use watch::{FileWatchEvent, WatchQuery};
