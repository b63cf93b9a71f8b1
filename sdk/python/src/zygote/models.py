"""Plain data returned by the SDK (immutable snapshots of API objects).

Field names follow the daemon's JSON; fields the SDK does not model are
kept in ``raw`` so nothing the daemon sends is lost.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping, Optional
from urllib.parse import urlsplit

__all__ = [
    "SandboxInfo",
    "NetworkInfo",
    "ExposedPort",
    "CommandResult",
    "FileEntry",
    "WriteResult",
    "Snapshot",
    "PackOrigin",
    "Image",
    "PushResult",
    "TransferProgress",
    "BranchResult",
    "BranchFailure",
    "SandboxTree",
    "TreeNode",
    "TreeSnapshot",
    "KeepResult",
    "DiffEntry",
    "DiffChange",
    "SandboxDiff",
    "MergeChange",
    "MergeConflict",
    "MergeReport",
    "ProcessInfo",
    "ProcessOutput",
    "MetricSample",
]


def _opt_int(v: Any) -> Optional[int]:
    return None if v is None else int(v)


def _opt_float(v: Any) -> Optional[float]:
    return None if v is None else float(v)


@dataclass(frozen=True)
class NetworkInfo:
    """A sandbox's network: its policy and its address. Branch children
    inherit their parent's policy (each gets an address of its own)."""

    mode: str
    """``egress`` (outbound traffic through NAT) or ``none`` (no traffic at all)."""
    allow_out: tuple[str, ...]
    """When not empty, the only IPv4 CIDRs and domain names outbound traffic may reach."""
    deny_out: tuple[str, ...]
    """IPv4 CIDRs and domain names always refused (applied before ``allow_out``)."""
    address: Optional[str]
    """The guest's IPv4 address (None: the sandbox has no isolated network)."""
    isolated: bool
    """The sandbox has a network namespace of its own with the policy enforced
    (False: the daemon runs without the isolated network; see ``client.info()``)."""

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> "NetworkInfo":
        return cls(
            mode=str(d.get("mode", "")),
            allow_out=tuple(d.get("allow_out") or ()),
            deny_out=tuple(d.get("deny_out") or ()),
            address=d.get("address"),
            isolated=bool(d.get("isolated", False)),
        )


@dataclass(frozen=True)
class ForkHook:
    """How one of the guest's ``/etc/zygote/forked.d`` hooks ended when the sandbox was
    last started, branched or restored (hooks run before it is reported ready)."""

    name: str
    exit_code: Optional[int]
    """None when it was killed (timeout, signal) or could not start."""
    error: Optional[str]
    stderr_tail: str

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and self.error is None

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> "ForkHook":
        return cls(
            name=str(d.get("name", "")),
            exit_code=_opt_int(d.get("exit_code")),
            error=d.get("error"),
            stderr_tail=str(d.get("stderr_tail") or ""),
        )


@dataclass(frozen=True)
class SandboxInfo:
    id: str
    state: str
    """``creating``, ``running``, ``paused`` (paused to disk with ``pause()``; also
    for a moment while a branch or snapshot stops the VM), ``pausing``,
    ``resuming``, ``error``, ``dead`` or ``deleting``."""
    runtime: str
    hostname: str
    name: Optional[str]
    memory_mib: int
    vcpus: int
    created_at: int
    pid: Optional[int]
    origin: Mapping[str, Any]
    """What it started from: ``{"image": {...}}``, ``{"snapshot": {"id"}}`` or
    ``{"branch": {"parent", "branch_point"}}``."""
    depends_on: tuple[str, ...]
    exit_reason: Optional[str]
    raw: Mapping[str, Any] = field(repr=False, compare=False)
    ttl_secs: Optional[int] = None
    """Time-to-live in seconds once running; None: kept until killed."""
    expires_at: Optional[int] = None
    """Unix seconds when the daemon deletes the sandbox (None: never)."""
    network: Optional[NetworkInfo] = None
    """Its network policy and address (None from daemons without networking)."""
    fork_hooks: tuple[ForkHook, ...] = ()
    """The guest's ``forked.d`` hooks at its last start/branch/restore, in order."""
    envs: Mapping[str, str] = field(default_factory=dict)
    """Environment variables every command gets (``envs`` at create, per-child ``env``)."""
    secrets: tuple[str, ...] = ()
    """Names of its secrets (values are never shown)."""
    metadata: Mapping[str, str] = field(default_factory=dict)
    """Its labels: ``metadata`` given at create; a branch child has its parent's
    plus ``zygote.parent`` (the parent's id). Empty from daemons without metadata."""
    auto_resume: bool = False
    """Commands and file calls resume it when it is paused."""
    ttl_action: str = "delete"
    """What its TTL running out does: ``delete`` or ``pause``."""
    paused_at: Optional[int] = None
    """Unix seconds when it was paused, while it is paused."""
    ttl_left_secs: Optional[int] = None
    """While paused with a TTL: the seconds it will have once resumed."""
    disk_bytes: Optional[int] = None
    """Bytes its own writable disk layer holds on the host (None without a VM)."""
    metrics: Optional["MetricSample"] = None
    """Its newest metrics sample (taken every few seconds while it runs), None before one."""

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> "SandboxInfo":
        net = d.get("network")
        return cls(
            id=d["id"],
            state=d["state"],
            runtime=d.get("runtime", ""),
            hostname=d.get("hostname", ""),
            name=d.get("name"),
            memory_mib=int(d.get("mem_mib", 0)),
            vcpus=int(d.get("vcpus", 0)),
            created_at=int(d.get("created_at", 0)),
            pid=_opt_int(d.get("pid")),
            origin=d.get("origin") or {},
            depends_on=tuple(d.get("depends_on") or ()),
            exit_reason=d.get("exit_reason"),
            raw=d,
            ttl_secs=_opt_int(d.get("ttl_secs")),
            expires_at=_opt_int(d.get("expires_at")),
            network=NetworkInfo.from_json(net) if isinstance(net, Mapping) else None,
            envs={str(k): str(v) for k, v in (d.get("envs") or {}).items()},
            secrets=tuple(str(s) for s in (d.get("secrets") or ())),
            metadata={str(k): str(v) for k, v in (d.get("metadata") or {}).items()},
            auto_resume=bool(d.get("auto_resume", False)),
            ttl_action=str(d.get("ttl_action") or "delete"),
            paused_at=_opt_int(d.get("paused_at")),
            ttl_left_secs=_opt_int(d.get("ttl_left_secs")),
            disk_bytes=_opt_int(d.get("disk_bytes")),
            metrics=(
                MetricSample.from_json(d["metrics"]) if isinstance(d.get("metrics"), Mapping) else None
            ),
            fork_hooks=tuple(
                ForkHook.from_json(h) for h in (d.get("fork_hooks") or ()) if isinstance(h, Mapping)
            ),
        )


@dataclass(frozen=True)
class ExposedPort:
    """A guest port reachable through the daemon's proxy (see
    ``sb.expose_port``). Unless ``public``, requests to it need the API
    token (``Authorization: Bearer <token>``)."""

    port: int
    """The port inside the guest."""
    public: bool
    """Reachable without the API token."""
    url: str
    """``http://<port>-<sandbox id>.localhost:<proxy port>``: the guest port at
    the root of its own host name."""
    path_url: str
    """``http://127.0.0.1:<proxy port>/sandboxes/<id>/ports/<port>/``: the same
    under a path, for clients that cannot resolve ``*.localhost``."""

    @property
    def host(self) -> str:
        """``url`` without its scheme: ``<port>-<sandbox id>.localhost:<proxy port>``."""
        return urlsplit(self.url).netloc

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> "ExposedPort":
        return cls(
            port=int(d["port"]),
            public=bool(d.get("public", False)),
            url=str(d["url"]),
            path_url=str(d.get("path_url", "")),
        )


@dataclass(frozen=True)
class MetricSample:
    """One sample of a running sandbox's resource use (see ``sb.metrics()``).
    Bytes unless said otherwise; the figures are the guest's own report,
    bounded by the daemon."""

    timestamp: str
    """When it was taken (RFC 3339, UTC)."""
    timestamp_unix: int
    """The same, in unix seconds."""
    cpu_count: int
    cpu_used_pct: float
    """Percent of all the guest's CPUs busy since the previous sample (0..100)."""
    mem_total: int
    mem_used: int
    mem_cache: int
    disk_total: int
    disk_used: int

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> "MetricSample":
        return cls(
            timestamp=str(d["timestamp"]),
            timestamp_unix=int(d["timestamp_unix"]),
            cpu_count=int(d["cpu_count"]),
            cpu_used_pct=float(d["cpu_used_pct"]),
            mem_total=int(d["mem_total"]),
            mem_used=int(d["mem_used"]),
            mem_cache=int(d["mem_cache"]),
            disk_total=int(d["disk_total"]),
            disk_used=int(d["disk_used"]),
        )


@dataclass(frozen=True)
class CommandResult:
    """How a command ended and what it printed (decoded as UTF-8, invalid
    bytes replaced)."""

    stdout: str
    stderr: str
    exit_code: Optional[int]
    """None when it was ended by a signal."""
    signal: Optional[int] = None
    timed_out: bool = False
    duration_ms: int = 0

    @property
    def ok(self) -> bool:
        return self.exit_code == 0


@dataclass(frozen=True)
class FileEntry:
    name: str
    kind: str
    """``file``, ``dir``, ``symlink`` or ``other``."""
    size: int
    mode: int
    mtime: int

    @property
    def is_dir(self) -> bool:
        return self.kind == "dir"

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> "FileEntry":
        return cls(name=d["name"], kind=d["kind"], size=int(d["size"]), mode=int(d["mode"]), mtime=int(d["mtime"]))


@dataclass(frozen=True)
class WriteResult:
    path: str
    size: int


@dataclass(frozen=True)
class PackOrigin:
    """Where a snapshot imported from a pack came from (``Snapshot.pack``)."""

    source: str
    """``oci://REFERENCE`` for a pull (:meth:`zygote.Client.pull_snapshot`), ``file``
    for an uploaded pack (:meth:`zygote.Client.import_snapshot`)."""
    digest: str
    """The pack's manifest digest."""
    snapshot: str
    """The snapshot's id on the daemon that exported it."""

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> "PackOrigin":
        return cls(source=str(d.get("source", "")), digest=str(d.get("digest", "")), snapshot=str(d.get("snapshot", "")))


@dataclass(frozen=True)
class Snapshot:
    """A saved sandbox state; start new sandboxes from it with
    ``Sandbox.restore(snapshot)`` or roll one back with ``sb.rollback(snapshot)``."""

    id: str
    kind: str
    """``full``, ``diff``, ``live`` or ``branch`` (made by a branch)."""
    name: Optional[str]
    runtime: str
    source_sandbox: str
    memory_mib: int
    vcpus: int
    created_at: int
    size_bytes: int
    depends_on: tuple[str, ...]
    dependents: tuple[str, ...]
    raw: Mapping[str, Any] = field(repr=False, compare=False)
    pause_ms: Optional[float] = None
    """How long taking it stopped the sandbox's vCPUs, in milliseconds (None:
    not measured, e.g. recorded by an older daemon)."""
    pack: Optional[PackOrigin] = None
    """For a snapshot imported from a pack (pulled from a registry or uploaded):
    where it came from. None for one taken here."""

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> "Snapshot":
        pack = d.get("pack")
        return cls(
            id=d["id"],
            kind=d.get("kind", ""),
            name=d.get("name"),
            runtime=d.get("runtime", ""),
            source_sandbox=d.get("source_sandbox", ""),
            memory_mib=int(d.get("mem_mib", 0)),
            vcpus=int(d.get("vcpus", 0)),
            created_at=int(d.get("created_at", 0)),
            size_bytes=int(d.get("size_bytes", 0)),
            depends_on=tuple(d.get("depends_on") or ()),
            dependents=tuple(d.get("dependents") or ()),
            raw=d,
            pause_ms=_opt_float(d.get("pause_ms")),
            pack=PackOrigin.from_json(pack) if isinstance(pack, Mapping) else None,
        )


@dataclass(frozen=True)
class Image:
    """An image sandboxes boot from: built from a recipe (``minimal``) or
    converted from an OCI image (pulled from a registry, or imported)."""

    name: str
    """A recipe's name, or for an OCI image its normalized reference
    (``docker.io/library/python:3.12-slim``): what ``Sandbox.create(image=...)`` takes."""
    sha256: str
    """Hash of the root filesystem image file."""
    size_bytes: int
    """Apparent size of its (sparse) ext4 file."""
    disk_bytes: int
    """Bytes it takes on the host."""
    description: str
    built_at: int
    """Unix seconds when it was built or converted."""
    raw: Mapping[str, Any] = field(repr=False, compare=False)
    source: Optional[str] = None
    """For an OCI image: where it came from (the reference, or the archive imported)."""
    digest: Optional[str] = None
    """For an OCI image: its manifest digest (``sha256:...``)."""

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> "Image":
        return cls(
            name=str(d["name"]),
            sha256=str(d.get("sha256", "")),
            size_bytes=int(d.get("size_bytes") or 0),
            disk_bytes=int(d.get("disk_bytes") or 0),
            description=str(d.get("description") or ""),
            built_at=int(d.get("built_at") or 0),
            raw=d,
            source=d.get("source"),
            digest=d.get("digest"),
        )


@dataclass(frozen=True)
class PushResult:
    """A snapshot pushed to a registry (:meth:`zygote.Client.push_snapshot`)."""

    reference: str
    """Where it is: what :meth:`zygote.Client.pull_snapshot` (or
    ``Sandbox.restore``) takes on another host."""
    digest: str
    """The pack's manifest digest; ``REPOSITORY@DIGEST`` names this very pack."""
    size: int
    """Bytes of all its blobs (a second push of the same snapshot uploads none)."""

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> "PushResult":
        return cls(reference=str(d.get("reference", "")), digest=str(d.get("digest", "")), size=int(d.get("size") or 0))


@dataclass(frozen=True)
class TransferProgress:
    """One progress line of an image pull or a snapshot push or pull, as the
    ``on_progress`` callbacks get it. ``type`` says which fields are set:

    - ``progress``: ``line``, a step in words;
    - ``resolved`` (image pulls): ``reference`` resolved to the manifest
      ``digest`` with ``layers`` layers of ``bytes`` compressed bytes;
    - ``layer`` (image pulls) and ``blob`` (snapshot packs): number ``index``
      (``digest``) has ``done`` of ``total`` bytes; ``state`` is ``cached``
      (already there: nothing is sent), ``resuming``, ``downloading`` (also
      for uploads) or ``done``.

    Lines of kinds newer than this SDK come with only ``type`` (and ``raw``)."""

    type: str
    line: Optional[str] = None
    reference: Optional[str] = None
    digest: Optional[str] = None
    layers: Optional[int] = None
    bytes: Optional[int] = None
    index: Optional[int] = None
    done: Optional[int] = None
    total: Optional[int] = None
    state: Optional[str] = None
    raw: Mapping[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> "TransferProgress":
        return cls(
            type=str(d.get("type", "")),
            line=d.get("line"),
            reference=d.get("reference"),
            digest=d.get("digest"),
            layers=_opt_int(d.get("layers")),
            bytes=_opt_int(d.get("bytes")),
            index=_opt_int(d.get("index")),
            done=_opt_int(d.get("done")),
            total=_opt_int(d.get("total")),
            state=d.get("state"),
            raw=d,
        )


@dataclass(frozen=True)
class BranchFailure:
    """A requested child of a branch that did not come up (the daemon left
    nothing of it)."""

    index: int
    """Its position among the requested children (0-based)."""
    error: str
    """Why it failed."""

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> "BranchFailure":
        return cls(index=int(d["index"]), error=str(d.get("error", "")))


@dataclass(frozen=True)
class BranchResult:
    parent: str
    branch_point: str
    """Id of the (implicit) snapshot the children share."""
    children: tuple[str, ...]
    """The children that run."""
    duration_ms: int
    failed: list[BranchFailure] = field(default_factory=list, hash=False)
    """Requested children that did not come up (empty when all did, and from
    daemons that predate partial branches)."""
    pause_ms: Optional[float] = None
    """How long the parent's vCPUs were stopped, in milliseconds (None: not
    measured)."""

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> "BranchResult":
        return cls(
            parent=d["parent"],
            branch_point=d["branch_point"],
            children=tuple(d["children"]),
            duration_ms=int(d.get("duration_ms", 0)),
            failed=[BranchFailure.from_json(f) for f in d.get("failed") or ()],
            pause_ms=_opt_float(d.get("pause_ms")),
        )


@dataclass(frozen=True)
class TreeNode:
    """One sandbox of a :class:`SandboxTree`."""

    id: str
    name: Optional[str]
    state: str
    parent: Optional[str]
    """The sandbox it was branched from, or whose snapshot it was started from
    (None: a root, or its parent is gone)."""
    started_from: Optional[str]
    """The branch point (a branch child) or snapshot (a restore) it started from."""
    children: tuple[str, ...]
    """Its children's ids, oldest first."""
    unique_memory_bytes: Optional[int]
    """Memory of its VM process not shared with any other process: what deleting
    it gives back to the host (None: it has no running VM)."""
    disk_bytes: Optional[int]
    """Bytes on disk of its own writable disk layer (None: the runtime keeps the
    disk in the VM's memory, or the sandbox has none)."""
    raw: Mapping[str, Any] = field(repr=False, compare=False)

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> "TreeNode":
        return cls(
            id=d["id"],
            name=d.get("name"),
            state=d.get("state", ""),
            parent=d.get("parent"),
            started_from=d.get("started_from"),
            children=tuple(d.get("children") or ()),
            unique_memory_bytes=_opt_int(d.get("unique_memory_bytes")),
            disk_bytes=_opt_int(d.get("disk_bytes")),
            raw=d,
        )


@dataclass(frozen=True)
class TreeSnapshot:
    """A snapshot or branch point taken of a sandbox of a :class:`SandboxTree`."""

    id: str
    kind: str
    """``full``, ``diff``, ``live`` or ``branch`` (a branch point)."""
    source_sandbox: str
    size_bytes: int
    raw: Mapping[str, Any] = field(repr=False, compare=False)

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> "TreeSnapshot":
        return cls(
            id=d["id"],
            kind=d.get("kind", ""),
            source_sandbox=d.get("source_sandbox", ""),
            size_bytes=int(d.get("size_bytes", 0)),
            raw=d,
        )


@dataclass(frozen=True)
class SandboxTree:
    """A sandbox's lineage (``sb.tree()``): its topmost existing ancestor and
    every descendant, and the snapshots and branch points taken of them."""

    root: str
    """The topmost ancestor that still exists."""
    sandboxes: tuple[TreeNode, ...]
    """Every sandbox of the tree, parents before their children."""
    snapshots: tuple[TreeSnapshot, ...]

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> "SandboxTree":
        return cls(
            root=d["root"],
            sandboxes=tuple(TreeNode.from_json(n) for n in d.get("sandboxes") or ()),
            snapshots=tuple(TreeSnapshot.from_json(s) for s in d.get("snapshots") or ()),
        )


@dataclass(frozen=True)
class KeepResult:
    """What ``sb.keep()`` did."""

    kept: str
    """The sandbox kept."""
    deleted: tuple[str, ...]
    """Its siblings and their descendants (and, with ``promote``, its parent), deleted."""
    name: Optional[str]
    """The name it took from its parent (``promote``; None otherwise, or when
    the parent had none)."""

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> "KeepResult":
        return cls(kept=d["kept"], deleted=tuple(d.get("deleted") or ()), name=d.get("name"))


@dataclass(frozen=True)
class SandboxEvent:
    """One entry of a sandbox's event log (:meth:`zygote.Sandbox.events`): what the
    daemon did to it or in it (started, branched, paused, a command and how it ended,
    a snapshot, a network or timeout change, its VM stopping)."""

    ts_ms: int
    """When, in unix milliseconds."""
    level: str
    """``debug``, ``info``, ``warn`` or ``error``."""
    message: str
    fields: Mapping[str, str]
    """Details: ids, the command line, its exit code, ..."""

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> "SandboxEvent":
        return cls(
            ts_ms=int(d["ts_ms"]),
            level=str(d["level"]),
            message=str(d["message"]),
            fields={str(k): str(v) for k, v in (d.get("fields") or {}).items()},
        )


@dataclass(frozen=True)
class EgressEntry:
    """One entry of a sandbox's egress record (:meth:`zygote.Sandbox.egress`): a
    connection its guest made through the daemon's egress proxy (rules by name)."""

    sandbox: str
    """The sandbox that made it (a branch child is a sandbox of its own)."""
    event: str
    """``refused``, ``open``, ``closed``, ``cut`` (by a policy change) or ``failed``."""
    host: Optional[str]
    """The host it named (TLS SNI or HTTP Host), if any."""
    address: str
    port: int
    protocol: str
    """``tls``, ``http`` or empty."""
    method: Optional[str]
    path: Optional[str]
    """Plain HTTP only: the first request's method and path."""
    reason: str
    bytes_out: int
    bytes_in: int
    started_ms: int
    ended_ms: Optional[int]
    secrets: tuple[str, ...] = ()
    """Names of the secrets bound to hosts whose values went out on it."""

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> "EgressEntry":
        return cls(
            sandbox=str(d["sandbox"]),
            event=str(d["event"]),
            host=d.get("host"),
            address=str(d["address"]),
            port=int(d["port"]),
            protocol=str(d.get("protocol") or ""),
            method=d.get("method"),
            path=d.get("path"),
            reason=str(d.get("reason") or ""),
            bytes_out=int(d.get("bytes_out") or 0),
            bytes_in=int(d.get("bytes_in") or 0),
            started_ms=int(d["started_ms"]),
            ended_ms=None if d.get("ended_ms") is None else int(d["ended_ms"]),
            secrets=tuple(str(n) for n in (d.get("secrets") or ())),
        )


@dataclass(frozen=True)
class DiffEntry:
    """An entry only on one side of :meth:`zygote.Sandbox.diff`."""

    path: str
    """Relative to the compared directory."""
    kind: str
    """``file``, ``dir``, ``symlink`` or ``other``."""
    size: int
    mode: int

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> "DiffEntry":
        return cls(path=d["path"], kind=d["kind"], size=int(d["size"]), mode=int(d["mode"]))


@dataclass(frozen=True)
class DiffChange:
    """An entry on both sides that differs (content, type, mode or link target)."""

    path: str
    kind_before: str
    kind: str
    size_before: int
    size: int
    mode_before: int
    mode: int
    unified: Optional[str]
    """With ``content=True``, for text files up to 256 KiB: the unified diff."""

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> "DiffChange":
        return cls(
            path=d["path"],
            kind_before=d["kind_before"],
            kind=d["kind"],
            size_before=int(d["size_before"]),
            size=int(d["size"]),
            mode_before=int(d["mode_before"]),
            mode=int(d["mode"]),
            unified=d.get("unified"),
        )


@dataclass(frozen=True)
class SandboxDiff:
    """How one sandbox's files under ``path`` differ from another's."""

    sandbox: str
    against: str
    path: str
    added: tuple[DiffEntry, ...]
    """Only in ``sandbox``."""
    removed: tuple[DiffEntry, ...]
    """Only in ``against``."""
    modified: tuple[DiffChange, ...]

    @property
    def identical(self) -> bool:
        return not (self.added or self.removed or self.modified)

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> "SandboxDiff":
        return cls(
            sandbox=d["sandbox"],
            against=d["against"],
            path=d["path"],
            added=tuple(DiffEntry.from_json(e) for e in d.get("added") or ()),
            removed=tuple(DiffEntry.from_json(e) for e in d.get("removed") or ()),
            modified=tuple(DiffChange.from_json(e) for e in d.get("modified") or ()),
        )


@dataclass(frozen=True)
class MergeChange:
    """One change :meth:`zygote.Sandbox.merge` made (or, not applied, would make)."""

    path: str
    """Absolute path in the guest merged into."""
    action: str
    """``add``, ``modify``, ``remove`` or ``mode`` (permissions only)."""
    kind: str
    """The kind it has afterwards (``file``, ``dir``, ``symlink``); for ``remove``,
    the kind removed."""
    size: int
    """Bytes copied for it (files)."""

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> "MergeChange":
        return cls(path=d["path"], action=d["action"], kind=d.get("kind", ""), size=int(d.get("size", 0)))


@dataclass(frozen=True)
class MergeConflict:
    """A path both sandboxes changed differently since their common branch point."""

    path: str
    ours: str
    """What the sandbox merged into did to it: ``added``, ``modified``, ``removed``,
    or ``changed below`` (a directory the other side removed or replaced has
    changes of ours inside)."""
    theirs: str
    """What the sandbox merged from did to it."""
    resolution: Optional[str]
    """``theirs`` or ``ours`` when ``on_conflict`` settled it; None when it stopped
    the merge."""

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> "MergeConflict":
        return cls(path=d["path"], ours=d.get("ours", ""), theirs=d.get("theirs", ""), resolution=d.get("resolution"))


@dataclass(frozen=True)
class MergeReport:
    """What ``parent.merge(child)`` did: the changes ``child`` made under
    ``paths`` since the two parted, made in ``parent``."""

    sandbox: str
    """The sandbox merged into."""
    from_: str
    """The sandbox merged from (``from`` in the API)."""
    base: str
    """The snapshot (branch point) holding the state both descend from."""
    paths: tuple[str, ...]
    """The directories merged."""
    applied: bool
    """Whether the changes were made: False with ``dry_run``, when a conflict
    stopped the merge (then nothing was changed), or when there was nothing to
    change."""
    changes: tuple[MergeChange, ...]
    conflicts: tuple[MergeConflict, ...]
    skipped: tuple[str, ...]
    """Entries of the other sandbox that cannot be merged (FIFOs, sockets,
    devices), left alone."""
    bytes_copied: int
    duration_ms: int
    raw: Mapping[str, Any] = field(repr=False, compare=False)

    @property
    def unresolved(self) -> tuple[MergeConflict, ...]:
        """The conflicts that stop the merge (none settled by ``on_conflict``)."""
        return tuple(c for c in self.conflicts if c.resolution is None)

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> "MergeReport":
        return cls(
            sandbox=d["sandbox"],
            from_=d["from"],
            base=d.get("base", ""),
            paths=tuple(d.get("paths") or ()),
            applied=bool(d.get("applied", False)),
            changes=tuple(MergeChange.from_json(c) for c in d.get("changes") or ()),
            conflicts=tuple(MergeConflict.from_json(c) for c in d.get("conflicts") or ()),
            skipped=tuple(d.get("skipped") or ()),
            bytes_copied=int(d.get("bytes_copied", 0)),
            duration_ms=int(d.get("duration_ms", 0)),
            raw=d,
        )


@dataclass(frozen=True)
class ProcessInfo:
    """A background process (``commands.run(..., background=True)``) as the
    daemon shows it."""

    pid: int
    """Its pid in the guest (also its process group): what the process calls take."""
    argv: tuple[str, ...]
    state: str
    """``running`` or ``exited`` (ended, and all its output collected)."""
    exit_code: Optional[int]
    """Its exit status once it exited normally (None while running or when a signal ended it)."""
    signal: Optional[int]
    """The signal that ended it, if one did."""
    timed_out: bool
    """Killed because its ``timeout`` expired."""
    duration_ms: Optional[int]
    """How long it ran, once it has ended."""
    started_at_ms: int
    """When it started, by the guest's clock (unix milliseconds)."""
    output_bytes: int
    """Bytes printed so far, stdout and stderr together."""
    stdin_open: bool
    """Its stdin still takes data."""
    raw: Mapping[str, Any] = field(repr=False, compare=False)

    @property
    def running(self) -> bool:
        return self.state == "running"

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> "ProcessInfo":
        return cls(
            pid=int(d["pid"]),
            argv=tuple(d.get("argv") or ()),
            state=str(d.get("state", "")),
            exit_code=_opt_int(d.get("exit_code")),
            signal=_opt_int(d.get("signal")),
            timed_out=bool(d.get("timed_out", False)),
            duration_ms=_opt_int(d.get("duration_ms")),
            started_at_ms=int(d.get("started_at_ms") or 0),
            output_bytes=int(d.get("output_bytes") or 0),
            stdin_open=bool(d.get("stdin_open", False)),
            raw=d,
        )


@dataclass(frozen=True)
class ProcessOutput:
    """What a background process printed from an offset (decoded as UTF-8,
    invalid bytes replaced), and the process as of then."""

    stdout: str
    stderr: str
    offset: int
    """Where this output starts: the offset asked, or later when older output
    was dropped (the guest keeps the last 1 MiB of each process's output)."""
    next_offset: int
    """The offset to read from next (stdout and stderr bytes counted together)."""
    dropped_bytes: int
    process: ProcessInfo

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> "ProcessOutput":
        return cls(
            stdout=str(d.get("stdout", "")),
            stderr=str(d.get("stderr", "")),
            offset=int(d.get("offset") or 0),
            next_offset=int(d.get("next_offset") or 0),
            dropped_bytes=int(d.get("dropped_bytes") or 0),
            process=ProcessInfo.from_json(d["process"]),
        )


@dataclass(frozen=True)
class Volume:
    """A named volume: an ext4 filesystem that outlives sandboxes. Mount it at
    create (``Sandbox.create(..., volumes={"/data": "my-vol"})``); that sandbox
    writes it, its branch children see a copy-on-write view."""

    id: str
    name: str
    size_mib: int
    created_at: int
    attached_to: Optional[str]
    """The sandbox it is mounted in (the only one that writes it), if any."""
    raw: Mapping[str, Any] = field(repr=False, compare=False)

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> "Volume":
        return cls(
            id=d["id"],
            name=d["name"],
            size_mib=int(d.get("size_mib", 0)),
            created_at=int(d.get("created_at", 0)),
            attached_to=d.get("attached_to"),
            raw=d,
        )
