"""The API's requests and responses, without I/O.

Each operation is described once as a :class:`Call` (method, path, body and
a parser for the answer) so the sync and async clients only differ in how
they send it. The streamed exec's NDJSON events are turned into callbacks
and a :class:`~zygote.models.CommandResult` by :class:`ExecCollector`, also
I/O-free.
"""

from __future__ import annotations

import base64
import codecs
import datetime
import json
import math
from dataclasses import dataclass
from typing import Any, Awaitable, Callable, Generic, Literal, Mapping, Optional, Sequence, TypeVar, Union
from urllib.parse import quote

import httpx

from .errors import (
    BranchIncomplete,
    CommandFailed,
    CommandTimeout,
    MergeConflictError,
    SandboxBusy,
    SandboxNotRunning,
    ServerError,
    ZygoteError,
    error_for,
)
from .models import (
    BranchResult,
    CommandResult,
    ExposedPort,
    FileEntry,
    Image,
    KeepResult,
    MergeReport,
    MetricSample,
    SandboxDiff,
    SandboxEvent,
    EgressEntry,
    SandboxInfo,
    SandboxTree,
    Snapshot,
    Volume,
    WriteResult,
)

T = TypeVar("T")
S = TypeVar("S")

# An output callback gets decoded text; an async sandbox may also pass a
# coroutine function.
OutputCallback = Callable[[str], Union[None, Awaitable[None]]]
Command = Union[str, Sequence[str]]
# What a merge does with a path both sides changed: stop (nothing is changed),
# take the other sandbox's version, or keep this one's.
OnConflict = Literal["fail", "theirs", "ours"]

# Commands run by default for at most this long; the daemon kills them
# after it (an agent's stuck command should not hang its caller forever).
DEFAULT_COMMAND_TIMEOUT = 60.0


@dataclass(frozen=True)
class Call(Generic[T]):
    method: str
    path: str
    parse: Callable[[httpx.Response], T]
    # A mapping, or (name, value) pairs when a name repeats (list filters).
    params: Optional[Union[Mapping[str, str], tuple[tuple[str, str], ...]]] = None
    json: Any = None
    content: Optional[bytes] = None


def seg(s: str) -> str:
    """One path segment (ids come from users; keep `/` and `?` out of paths)."""
    return quote(s, safe="")


def raise_for_error(resp: httpx.Response) -> None:
    if resp.status_code < 400:
        return
    code, message = f"http_{resp.status_code}", resp.reason_phrase or "HTTP error"
    try:
        body = resp.json()
        err = body["error"]
        code, message = str(err["code"]), str(err["message"])
    except (ValueError, KeyError, TypeError):
        text = resp.text.strip()
        if text:
            message = text[:500]
    raise error_for(code, message, resp.status_code)


def _json(resp: httpx.Response) -> Any:
    try:
        return resp.json()
    except ValueError as e:
        raise ServerError(f"unexpected answer from zygoted: {e}", code="bad_response") from e


def _sandboxes(resp: httpx.Response) -> list[SandboxInfo]:
    return [SandboxInfo.from_json(s) for s in _json(resp)["sandboxes"]]


def _none(_: httpx.Response) -> None:
    return None


# --- calls -----------------------------------------------------------------


def info() -> Call[dict[str, Any]]:
    return Call("GET", "/v1/info", _json)


def list_images() -> Call[list[Image]]:
    return Call("GET", "/v1/images", lambda r: [Image.from_json(i) for i in _json(r)["images"]])


def create_sandboxes(
    *,
    image: Optional[str] = None,
    snapshot: Optional[str] = None,
    name: Optional[str] = None,
    n: Optional[int] = None,
    memory_mib: Optional[int] = None,
    vcpus: Optional[int] = None,
    limits: Optional[Mapping[str, int]] = None,
    ttl_secs: Optional[int] = None,
    network: Optional[str] = None,
    allow_out: Optional[Sequence[str]] = None,
    deny_out: Optional[Sequence[str]] = None,
    envs: Optional[Mapping[str, str]] = None,
    secrets: Optional[Mapping[str, Any]] = None,
    metadata: Optional[Mapping[str, str]] = None,
    auto_resume: Optional[bool] = None,
    ttl_action: Optional[str] = None,
    volumes: Optional[Mapping[str, Union[str, Volume]]] = None,
) -> Call[list[SandboxInfo]]:
    body: dict[str, Any] = {}
    for key, value in (
        ("image", image),
        ("snapshot", snapshot),
        ("name", name),
        ("n", n),
        ("mem_mib", memory_mib),
        ("vcpus", vcpus),
        ("limits", dict(limits) if limits else None),
        ("ttl_secs", ttl_secs),
        ("ttl_action", check_ttl_action(ttl_action)),
        ("auto_resume", auto_resume),
        ("network", network),
        # An empty allow_out is sent: it allows no destination at all.
        ("allow_out", cidrs("allow_out", allow_out)),
        ("deny_out", cidrs("deny_out", deny_out)),
        ("envs", dict(envs) if envs is not None else None),
        ("secrets", secret_specs(secrets)),
        ("metadata", dict(metadata) if metadata is not None else None),
        ("volumes", volume_mounts(volumes)),
    ):
        if value is not None:
            body[key] = value
    return Call("POST", "/v1/sandboxes", _sandboxes, json=body)


def volume_mounts(volumes: Optional[Mapping[str, Any]]) -> Optional[list[dict[str, str]]]:
    """``{"/guest/path": "volume name or id" | Volume}`` as the API takes it."""
    if not volumes:
        return None
    return [
        {"name": v.name if isinstance(v, Volume) else str(v), "path": path} for path, v in volumes.items()
    ]


# --- volumes -----------------------------------------------------------------


def create_volume(name: str, size_mib: Optional[int] = None) -> Call[Volume]:
    body: dict[str, Any] = {"name": name}
    if size_mib is not None:
        body["size_mib"] = size_mib
    return Call("POST", "/v1/volumes", lambda r: Volume.from_json(_json(r)), json=body)


def list_volumes() -> Call[list[Volume]]:
    return Call("GET", "/v1/volumes", lambda r: [Volume.from_json(v) for v in _json(r)["volumes"]])


def get_volume(volume: str) -> Call[Volume]:
    return Call("GET", f"/v1/volumes/{seg(volume)}", lambda r: Volume.from_json(_json(r)))


def delete_volume(volume: str) -> Call[None]:
    return Call("DELETE", f"/v1/volumes/{seg(volume)}", _none)


def secret_specs(secrets: Optional[Mapping[str, Any]]) -> Optional[dict[str, Any]]:
    """``{"NAME": "value"}`` (inherited by branch children) or
    ``{"NAME": {"value": "...", "inherit": False, "hosts": ["api.example.com"]}}``,
    as the API takes them."""
    if secrets is None:
        return None
    out: dict[str, Any] = {}
    for name, spec in secrets.items():
        if isinstance(spec, str):
            out[name] = {"value": spec}
        elif isinstance(spec, Mapping) and isinstance(spec.get("value"), str):
            out[name] = dict(spec)
        else:
            raise TypeError(
                f"secret {name!r}: give a string or "
                "{'value': str, 'inherit': bool, 'hosts': [str, ...]}"
            )
        hosts = out[name].get("hosts")
        if isinstance(hosts, str):
            raise TypeError(f"secret {name!r}: hosts is a list of names, not one string")
    return out


def cidrs(what: str, value: Optional[Sequence[str]]) -> Optional[list[str]]:
    """A CIDR list as sent. One string is a ``Sequence[str]`` too: refused
    rather than sent as a list of its characters."""
    if value is None:
        return None
    if isinstance(value, str):
        raise TypeError(
            f"{what} takes a list of IPv4 CIDRs and domain names, not one string (write [{value!r}])"
        )
    return list(value)


def metadata_filters(metadata: Optional[Mapping[str, str]]) -> Optional[tuple[tuple[str, str], ...]]:
    """``{"k": "v", ...}`` as the list's query: one ``metadata=k=v`` per pair
    (the daemon ANDs them); the client URL-encodes each (a value may hold
    ``=``, ``&`` or spaces). The daemon splits a filter at its first ``=``, so
    a key holding one (never a valid key) is refused here rather than
    silently read as another filter."""
    if metadata is None:
        return None
    if not isinstance(metadata, Mapping):
        raise TypeError("metadata filters are a mapping of key to value, e.g. {'team': 'search'}")
    pairs: list[tuple[str, str]] = []
    for key, value in metadata.items():
        if not isinstance(key, str) or not isinstance(value, str):
            raise TypeError(f"metadata filter {key!r}: keys and values are strings")
        if not key or "=" in key:
            raise ValueError(f"metadata filter key {key!r} must be non-empty and without '='")
        pairs.append(("metadata", f"{key}={value}"))
    return tuple(pairs)


def list_sandboxes(metadata: Optional[Mapping[str, str]] = None) -> Call[list[SandboxInfo]]:
    """``GET /v1/sandboxes``; with ``metadata``, only the sandboxes whose
    metadata has every one of those key/value pairs."""
    return Call("GET", "/v1/sandboxes", _sandboxes, params=metadata_filters(metadata))


def get_sandbox(sid: str) -> Call[SandboxInfo]:
    return Call("GET", f"/v1/sandboxes/{seg(sid)}", lambda r: SandboxInfo.from_json(_json(r)))


def delete_sandbox(sid: str) -> Call[None]:
    return Call("DELETE", f"/v1/sandboxes/{seg(sid)}", _none)


def branch_body(
    count: int,
    ttl_secs: Optional[int] = None,
    env: Optional[Sequence[Mapping[str, str]]] = None,
    mergeable: bool = False,
) -> dict[str, Any]:
    body: dict[str, Any] = {"count": count}
    if ttl_secs is not None:
        body["ttl_secs"] = ttl_secs
    if mergeable:
        body["mergeable"] = True
    if env is not None:
        if isinstance(env, Mapping) or len(env) != count:
            raise ValueError(f"env takes one mapping per child: a list of {count}")
        body["env"] = [dict(e) for e in env]
    return body


def branch_path(sid: str) -> str:
    return f"/v1/sandboxes/{seg(sid)}/branch"


def branch(
    sid: str,
    count: int,
    ttl_secs: Optional[int] = None,
    env: Optional[Sequence[Mapping[str, str]]] = None,
    mergeable: bool = False,
) -> Call[BranchResult]:
    body = branch_body(count, ttl_secs, env, mergeable)
    return Call("POST", branch_path(sid), lambda r: BranchResult.from_json(_json(r)), json=body)


def branch_children(res: BranchResult, n: int, children: list[S], *, allow_partial: bool) -> list[S]:
    """The handles on a branch's running ``children``, or, when some of the
    ``n`` requested did not come up and ``allow_partial`` is false,
    :class:`~zygote.errors.BranchIncomplete` carrying them (so no running
    child is lost) and the causes."""
    if res.failed and not allow_partial:
        causes = "; ".join(f"child {f.index} failed: {f.error}" for f in res.failed)
        raise BranchIncomplete(
            f"only {len(res.children)} of {n} children of {res.parent} came up; {causes}",
            parent=res.parent,
            children=children,
            failures=list(res.failed),
        )
    return children


def set_ttl(sid: str, ttl_secs: Optional[int], ttl_action: Optional[str] = None) -> Call[SandboxInfo]:
    # null is meaningful here (no TTL), so the field is always sent.
    body: dict[str, Any] = {"ttl_secs": ttl_secs}
    if ttl_action is not None:
        body["ttl_action"] = check_ttl_action(ttl_action)
    return Call(
        "PUT",
        f"/v1/sandboxes/{seg(sid)}/ttl",
        lambda r: SandboxInfo.from_json(_json(r)),
        json=body,
    )


def set_network(
    sid: str,
    network: Optional[str] = None,
    allow_out: Optional[Sequence[str]] = None,
    deny_out: Optional[Sequence[str]] = None,
) -> Call[SandboxInfo]:
    # The whole policy is replaced: what is left out is the create default.
    body: dict[str, Any] = {}
    for key, value in (
        ("network", network),
        ("allow_out", cidrs("allow_out", allow_out)),
        ("deny_out", cidrs("deny_out", deny_out)),
    ):
        if value is not None:
            body[key] = value
    return Call(
        "PUT",
        f"/v1/sandboxes/{seg(sid)}/network",
        lambda r: SandboxInfo.from_json(_json(r)),
        json=body,
    )


TTL_ACTIONS = ("delete", "pause")


def check_ttl_action(action: Optional[str]) -> Optional[str]:
    """``action`` if it is one the daemon knows (``delete``, ``pause``)."""
    if action is not None and action not in TTL_ACTIONS:
        raise ValueError(f"ttl_action must be one of {', '.join(TTL_ACTIONS)}, not {action!r}")
    return action


def pause(sid: str) -> Call[SandboxInfo]:
    return Call("POST", f"/v1/sandboxes/{seg(sid)}/pause", lambda r: SandboxInfo.from_json(_json(r)))


def resume(sid: str) -> Call[SandboxInfo]:
    return Call("POST", f"/v1/sandboxes/{seg(sid)}/resume", lambda r: SandboxInfo.from_json(_json(r)))


def restore_in_place(sid: str, snapshot: str) -> Call[SandboxInfo]:
    return Call(
        "POST",
        f"/v1/sandboxes/{seg(sid)}/restore",
        lambda r: SandboxInfo.from_json(_json(r)),
        json={"snapshot": snapshot},
    )


def tree(sid: str) -> Call[SandboxTree]:
    return Call("GET", f"/v1/sandboxes/{seg(sid)}/tree", lambda r: SandboxTree.from_json(_json(r)))


EVENT_LEVELS = ("debug", "info", "warn", "error")


def events(
    sid: str,
    *,
    since_ms: Optional[int] = None,
    until_ms: Optional[int] = None,
    limit: Optional[int] = None,
    newest_first: bool = False,
    level: Optional[str] = None,
    search: Optional[str] = None,
) -> Call[list[SandboxEvent]]:
    if level is not None and level not in EVENT_LEVELS:
        raise ValueError(f"level must be one of {', '.join(EVENT_LEVELS)}, not {level!r}")
    params: dict[str, str] = {}
    for key, value in (("since_ms", since_ms), ("until_ms", until_ms), ("limit", limit)):
        if value is not None:
            params[key] = str(int(value))
    if newest_first:
        params["order"] = "desc"
    if level is not None:
        params["level"] = level
    if search is not None:
        params["search"] = search
    return Call(
        "GET",
        f"/v1/sandboxes/{seg(sid)}/events",
        lambda r: [SandboxEvent.from_json(e) for e in _json(r)["events"]],
        params=params,
    )


def egress(sid: str, *, limit: Optional[int] = None) -> Call[list[EgressEntry]]:
    params: dict[str, str] = {}
    if limit is not None:
        params["limit"] = str(int(limit))
    return Call(
        "GET",
        f"/v1/sandboxes/{seg(sid)}/egress",
        lambda r: [EgressEntry.from_json(e) for e in _json(r)["entries"]],
        params=params,
    )


def keep(sid: str, promote: bool = False) -> Call[KeepResult]:
    return Call(
        "POST",
        f"/v1/sandboxes/{seg(sid)}/keep",
        lambda r: KeepResult.from_json(_json(r)),
        json={"promote": promote},
    )


def diff(sid: str, against: str, path: Optional[str] = None, content: bool = False) -> Call[SandboxDiff]:
    params = {"against": against, "content": "true" if content else "false"}
    if path is not None:
        params["path"] = path
    return Call(
        "GET",
        f"/v1/sandboxes/{seg(sid)}/diff",
        lambda r: SandboxDiff.from_json(_json(r)),
        params=params,
    )


def merge(
    sid: str,
    from_id: str,
    paths: Optional[Sequence[str]] = None,
    on_conflict: OnConflict = "fail",
    dry_run: bool = False,
) -> Call[MergeReport]:
    body: dict[str, Any] = {"from": from_id, "on_conflict": on_conflict, "dry_run": dry_run}
    if paths is not None:
        if isinstance(paths, str):
            # One string is a Sequence[str] too: refused rather than sent as characters.
            raise TypeError(f"paths takes a list of directories, not one string (write [{paths!r}])")
        body["paths"] = list(paths)
    return Call(
        "POST",
        f"/v1/sandboxes/{seg(sid)}/merge",
        lambda r: MergeReport.from_json(_json(r)),
        json=body,
    )


def merged(report: MergeReport, dry_run: bool) -> MergeReport:
    """``report``, or :class:`~zygote.errors.MergeConflictError` carrying it when
    conflicts stopped the merge. The daemon answers that case with 200 and
    ``applied: false`` (as it does for a dry run, or for nothing to merge): the
    unsettled conflicts are what tell it apart."""
    stuck = report.unresolved
    if dry_run or not stuck:
        return report
    shown = ", ".join(f"{c.path} (ours {c.ours}, theirs {c.theirs})" for c in stuck[:10])
    more = f" and {len(stuck) - 10} more" if len(stuck) > 10 else ""
    raise MergeConflictError(
        f"merging {report.from_} into {report.sandbox} stopped on {len(stuck)} conflict(s), "
        f"nothing was changed: {shown}{more}",
        report=report,
    )


def _ports(resp: httpx.Response) -> list[ExposedPort]:
    return [ExposedPort.from_json(p) for p in _json(resp)["ports"]]


def expose_port(sid: str, port: int, public: bool = False) -> Call[ExposedPort]:
    return Call(
        "POST",
        f"/v1/sandboxes/{seg(sid)}/ports",
        lambda r: ExposedPort.from_json(_json(r)),
        json={"port": port, "public": public},
    )


def list_ports(sid: str) -> Call[list[ExposedPort]]:
    return Call("GET", f"/v1/sandboxes/{seg(sid)}/ports", _ports)


def unexpose_port(sid: str, port: int) -> Call[None]:
    return Call("DELETE", f"/v1/sandboxes/{seg(sid)}/ports/{seg(str(port))}", _none)


def find_port(ports: Sequence[ExposedPort], port: int) -> Optional[ExposedPort]:
    return next((p for p in ports if p.port == port), None)


def already_exposed(e: ZygoteError) -> bool:
    """An expose refused because the port is exposed already: a 409 that is
    not about the sandbox's state (busy, not running)."""
    return e.status == 409 and not isinstance(e, (SandboxBusy, SandboxNotRunning))


# A time bound of ``metrics``: unix seconds, or an aware (or local) datetime.
TimeBound = Union[int, float, datetime.datetime, None]


def unix_seconds(what: str, t: TimeBound) -> Optional[int]:
    if t is None:
        return None
    if isinstance(t, datetime.datetime):
        return int(t.timestamp())
    if isinstance(t, bool) or not isinstance(t, (int, float)) or not math.isfinite(t) or t < 0:
        raise ValueError(f"{what} must be unix seconds (>= 0) or a datetime, got {t!r}")
    return int(t)


def metrics(sid: str, start: TimeBound = None, end: TimeBound = None) -> Call[list[MetricSample]]:
    params = {}
    for key, value in (("start", unix_seconds("start", start)), ("end", unix_seconds("end", end))):
        if value is not None:
            params[key] = str(value)
    if "start" in params and "end" in params and int(params["start"]) > int(params["end"]):
        raise ValueError(f"start ({params['start']}) must not be after end ({params['end']})")
    return Call(
        "GET",
        f"/v1/sandboxes/{seg(sid)}/metrics",
        lambda r: [MetricSample.from_json(m) for m in _json(r)["metrics"]],
        params=params,
    )


def logs(sid: str) -> Call[str]:
    return Call("GET", f"/v1/sandboxes/{seg(sid)}/logs", lambda r: r.text)


def read_file(sid: str, path: str, special: bool = False) -> Call[bytes]:
    params = {"path": path}
    if special:
        params["special"] = "true"
    return Call("GET", f"/v1/sandboxes/{seg(sid)}/files", lambda r: r.content, params=params)


def write_file(sid: str, path: str, data: Union[str, bytes], mode: Optional[int] = None) -> Call[WriteResult]:
    params = {"path": path}
    if mode is not None:
        params["mode"] = format(mode, "o")
    content = data.encode() if isinstance(data, str) else bytes(data)

    def parse(r: httpx.Response) -> WriteResult:
        d = _json(r)
        return WriteResult(path=d["path"], size=int(d["size"]))

    return Call("PUT", f"/v1/sandboxes/{seg(sid)}/files", parse, params=params, content=content)


def list_dir(sid: str, path: str) -> Call[list[FileEntry]]:
    return Call(
        "GET",
        f"/v1/sandboxes/{seg(sid)}/files/list",
        lambda r: [FileEntry.from_json(e) for e in _json(r)["entries"]],
        params={"path": path},
    )


def create_snapshot(sid: str, kind: Optional[str] = None, name: Optional[str] = None) -> Call[Snapshot]:
    body: dict[str, Any] = {"sandbox": sid}
    if kind is not None:
        body["kind"] = kind
    if name is not None:
        body["name"] = name
    return Call("POST", "/v1/snapshots", lambda r: Snapshot.from_json(_json(r)), json=body)


def list_snapshots() -> Call[list[Snapshot]]:
    return Call("GET", "/v1/snapshots", lambda r: [Snapshot.from_json(s) for s in _json(r)["snapshots"]])


def get_snapshot(snap_id: str) -> Call[Snapshot]:
    return Call("GET", f"/v1/snapshots/{seg(snap_id)}", lambda r: Snapshot.from_json(_json(r)))


def delete_snapshot(snap_id: str) -> Call[None]:
    return Call("DELETE", f"/v1/snapshots/{seg(snap_id)}", _none)


# --- exec --------------------------------------------------------------------


def argv_of(cmd: Command) -> list[str]:
    """A string is a shell command line; a sequence is argv as is."""
    if isinstance(cmd, str):
        return ["sh", "-c", cmd]
    argv = list(cmd)
    if not argv:
        raise ValueError("empty command")
    return argv


def exec_body(
    cmd: Command,
    *,
    timeout: Optional[float],
    env: Optional[Mapping[str, str]] = None,
    cwd: Optional[str] = None,
    stdin: Optional[str] = None,
    user: Optional[Union[str, int]] = None,
) -> dict[str, Any]:
    body: dict[str, Any] = {"argv": argv_of(cmd)}
    if env:
        body["env"] = dict(env)
    if cwd is not None:
        body["cwd"] = cwd
    if user is not None:
        body["user"] = user_spec(user)
    if stdin is not None:
        body["stdin"] = stdin
    if timeout is not None:
        if timeout <= 0:
            raise ValueError("timeout must be positive (or None for no limit)")
        body["timeout_ms"] = max(1, math.ceil(timeout * 1000))
    return body


def user_spec(user: Union[str, int]) -> str:
    """An exec's ``user`` as the API takes it: ``root``, ``UID`` or ``UID:GID``
    (an int is a uid). The daemon checks the form (400 otherwise)."""
    if isinstance(user, bool) or not isinstance(user, (str, int)):
        raise TypeError(f"user is 'root', a uid or 'UID:GID', not {user!r}")
    return str(user)


def exec_path(sid: str) -> str:
    return f"/v1/sandboxes/{seg(sid)}/exec/stream"


def stream_read_timeout(timeout: Optional[float]) -> Optional[float]:
    """HTTP read timeout for a streamed exec: the daemon enforces the
    command's own timeout, so wait a little longer than that, or forever
    when the command has none (it may legitimately print nothing for long)."""
    return None if timeout is None else timeout + 30.0


def stream_event(line: str, what: str) -> Optional[dict[str, Any]]:
    """One NDJSON line of a streamed answer as an object with a ``type`` (None for a
    blank line); anything else is the daemon's fault."""
    line = line.strip()
    if not line:
        return None
    try:
        ev = json.loads(line)
        ev["type"]
    except (ValueError, KeyError, TypeError) as e:
        raise ServerError(f"bad {what} event {line[:200]!r}", code="bad_response") from e
    if not isinstance(ev, dict):
        raise ServerError(f"bad {what} event {line[:200]!r}", code="bad_response")
    return ev


class ExecCollector:
    """Consumes the NDJSON lines of ``POST .../exec/stream``.

    ``feed`` returns the callbacks to invoke (so an async caller can await
    coroutine callbacks); ``result`` returns the outcome or raises.
    Output is decoded incrementally so a UTF-8 character split across two
    chunks is not mangled.
    """

    def __init__(
        self,
        cmd: Command,
        on_stdout: Optional[OutputCallback] = None,
        on_stderr: Optional[OutputCallback] = None,
        check: bool = False,
    ) -> None:
        self._cmd = cmd
        self._check = check
        self._callbacks = {"stdout": on_stdout, "stderr": on_stderr}
        self._decoders = {s: codecs.getincrementaldecoder("utf-8")("replace") for s in ("stdout", "stderr")}
        self._text: dict[str, list[str]] = {"stdout": [], "stderr": []}
        self._end: Optional[Mapping[str, Any]] = None
        self._error: Optional[ZygoteError] = None
        self.pid: Optional[int] = None
        # Output bytes seen, both streams together (a background process's offset).
        self.output_bytes = 0

    def feed(self, line: str) -> list[tuple[OutputCallback, str]]:
        ev = stream_event(line, "exec")
        if ev is None:
            return []
        kind = ev["type"]
        if kind == "started":
            self.pid = ev.get("pid")
        elif kind == "output":
            stream = ev.get("stream")
            if stream in self._decoders:
                data = base64.b64decode(ev.get("data", ""))
                self.output_bytes += len(data)
                text = self._decoders[stream].decode(data)
                return self._emit(stream, text)
        elif kind == "exit":
            self._end = ev
            # Flush what a decoder held back (an incomplete character at the end).
            return [cb for s in ("stdout", "stderr") for cb in self._emit(s, self._decoders[s].decode(b"", final=True))]
        elif kind == "error":
            self._error = error_for(str(ev.get("code", "error")), str(ev.get("message", "")))
        return []

    def _emit(self, stream: str, text: str) -> list[tuple[OutputCallback, str]]:
        if not text:
            return []
        self._text[stream].append(text)
        cb = self._callbacks[stream]
        return [(cb, text)] if cb else []

    def result(self) -> CommandResult:
        if self._error is not None:
            raise self._error
        if self._end is None:
            raise ServerError("the exec stream ended without an exit event", code="stream_ended")
        end = self._end
        res = CommandResult(
            stdout="".join(self._text["stdout"]),
            stderr="".join(self._text["stderr"]),
            exit_code=end.get("exit_code"),
            signal=end.get("signal"),
            timed_out=bool(end.get("timed_out")),
            duration_ms=int(end.get("duration_ms") or 0),
        )
        what = self._cmd if isinstance(self._cmd, str) else " ".join(self._cmd)
        if res.timed_out:
            raise CommandTimeout(f"command timed out after {res.duration_ms} ms: {what}", result=res)
        if self._check and res.exit_code != 0:
            how = f"signal {res.signal}" if res.exit_code is None else f"exit code {res.exit_code}"
            raise CommandFailed(f"command failed with {how}: {what}", result=res)
        return res
