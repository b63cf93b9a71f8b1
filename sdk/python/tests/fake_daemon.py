"""A scripted stand-in for zygoted: answers requests with the responses of
a test-vector case, in order, and records what it was sent so the test can
compare it with the expected requests. With a :class:`FakeFiles` attached,
creating, listing, getting and deleting sandboxes, file reads and writes,
branches and merges are answered from its state instead, the way zygoted
does (metadata included)."""

from __future__ import annotations

import base64
import json
import itertools
import re
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Optional
from urllib.parse import parse_qs, parse_qsl, urlsplit


@dataclass
class Recorded:
    method: str
    path: str
    query: dict[str, str]
    headers: dict[str, str]
    body: bytes
    raw_query: str = ""
    """The query string as sent (``query`` keeps only a repeated name's last value)."""


Files = dict[str, str]
Answer = tuple[int, Any]


def _error(status: int, code: str, message: str) -> Answer:
    return status, {"error": {"code": code, "message": message}}


# zygoted's metadata rules (crates/api/src/model/metadata.rs).
MAX_METADATA_KEYS = 64
METADATA_KEY = re.compile(r"[A-Za-z0-9._/-]{1,128}")
MAX_METADATA_VALUE_LEN = 1024
PARENT_KEY = "zygote.parent"


def metadata_error(m: Any) -> Optional[str]:
    """Why zygoted refuses ``m`` as a create's metadata (None: it takes it)."""
    if not isinstance(m, dict):
        return "metadata must be an object of strings"
    if len(m) > MAX_METADATA_KEYS - 1:
        return f"metadata has {len(m)} keys; at most {MAX_METADATA_KEYS - 1}"
    for k, v in m.items():
        if not METADATA_KEY.fullmatch(k):
            return f"metadata key {k!r} must be 1-128 characters of A-Z a-z 0-9 . _ - /"
        if k.startswith("zygote."):
            return f"metadata key {k!r}: keys starting with 'zygote.' are zygote's own"
        if not isinstance(v, str) or len(v.encode()) > MAX_METADATA_VALUE_LEN or "\0" in v:
            return f"metadata value of {k!r} must be at most {MAX_METADATA_VALUE_LEN} bytes, without NUL"
    return None


def parse_filters(raw_query: str) -> "list[tuple[str, str]] | Answer":
    """The list's ``metadata=key=value`` filters, or zygoted's 400 answer."""
    filters: list[tuple[str, str]] = []
    for name, value in parse_qsl(raw_query, keep_blank_values=True):
        if name != "metadata":
            return _error(400, "invalid_argument", f"unknown query parameter {name!r} (filter with metadata=key=value)")
        key, eq, val = value.partition("=")
        if not eq:
            return _error(400, "invalid_argument", f"metadata filter {value!r}: want key=value")
        if not METADATA_KEY.fullmatch(key):
            return _error(400, "invalid_argument", f"metadata key {key!r} must be 1-128 characters of A-Z a-z 0-9 . _ - /")
        filters.append((key, val))
    return filters


@dataclass
class FakeFiles:
    """Sandboxes holding regular files (absolute path -> text), branched and
    merged like zygoted does it: a branch copies the parent's files into each
    child and, when ``mergeable`` (or ``keeps_points``, as on the qemu
    runtime), keeps them as the branch point's state; a merge compares, under
    each merged directory, that state with both sandboxes' files (three-way)
    and answers a MergeReport. Directories, modes and links are not modelled.

    Sandboxes carry metadata like zygoted's: validated at create (400
    ``invalid_argument``), inherited by branch children with ``zygote.parent``
    added, shown in every sandbox view and used to filter the list.

    Pause and resume too: a paused sandbox's file calls get 409
    ``sandbox_paused`` (one created with ``auto_resume`` is resumed instead),
    pausing a paused one or resuming a running one 409 ``wrong_state``."""

    sandboxes: dict[str, Files] = field(default_factory=dict)
    metadata: dict[str, dict[str, str]] = field(default_factory=dict)
    keeps_points: bool = False
    # child -> (parent, branch point id); point id -> the files it kept (None: not kept).
    origin: dict[str, tuple[str, str]] = field(default_factory=dict)
    points: dict[str, Optional[Files]] = field(default_factory=dict)
    paused: set[str] = field(default_factory=set)
    # sandbox -> {"auto_resume": bool, "ttl_action": str}, as given at create.
    lifecycle: dict[str, dict[str, Any]] = field(default_factory=dict)
    _ids: "itertools.count[int]" = field(default_factory=lambda: itertools.count(1))

    def view(self, sid: str) -> dict[str, Any]:
        """A sandbox as zygoted shows it (the fields this model keeps)."""
        life = self.lifecycle.get(sid, {})
        return {
            "id": sid,
            "state": "paused" if sid in self.paused else "running",
            "name": None,
            "metadata": dict(self.metadata.get(sid, {})),
            "pid": None if sid in self.paused else 4242,
            "paused_at": 1700000000 if sid in self.paused else None,
            "auto_resume": bool(life.get("auto_resume", False)),
            "ttl_action": life.get("ttl_action", "delete"),
        }

    def answer(
        self, method: str, path: str, query: dict[str, str], body: bytes, raw_query: str = ""
    ) -> Optional[tuple[int, Any]]:
        """The answer to a request this model handles (JSON, or bytes for a read), else None."""
        if path == "/v1/sandboxes":
            return self.create(json.loads(body)) if method == "POST" else self.list_sandboxes(raw_query)
        one = re.fullmatch(r"/v1/sandboxes/([^/]+)", path)
        if one is not None and one[1] in self.sandboxes and method in ("GET", "DELETE"):
            if method == "GET":
                return 200, self.view(one[1])
            del self.sandboxes[one[1]]
            self.metadata.pop(one[1], None)
            return 204, None
        m = re.fullmatch(r"/v1/sandboxes/([^/]+)/(files|branch|merge|pause|resume)", path)
        if m is None or m[1] not in self.sandboxes:
            return None
        sid, route = m[1], m[2]
        if route in ("pause", "resume"):
            return self.pause_or_resume(sid, route)
        if sid in self.paused:
            if route != "files" or not self.lifecycle.get(sid, {}).get("auto_resume"):
                return _error(409, "sandbox_paused", f"sandbox {sid} is paused: resume it first")
            self.paused.discard(sid)
        files = self.sandboxes[sid]
        if route == "files" and method == "GET":
            if query["path"] not in files:
                return _error(404, "guest_not_found", f"{query['path']}: no such file")
            return 200, files[query["path"]].encode()
        if route == "files" and method == "PUT":
            files[query["path"]] = body.decode()
            return 200, {"path": query["path"], "size": len(body)}
        req = json.loads(body)
        if route == "branch":
            point = f"snap-{next(self._ids):012x}"
            self.points[point] = dict(files) if self.keeps_points or req.get("mergeable") else None
            children = [f"sb-{next(self._ids):012x}" for _ in range(req.get("count", 1))]
            for child in children:
                self.sandboxes[child] = dict(files)
                self.metadata[child] = self.metadata.get(sid, {}) | {PARENT_KEY: sid}
                self.origin[child] = (sid, point)
            return 201, {"parent": sid, "branch_point": point, "children": children, "failed": [], "duration_ms": 1}
        return self.merge(sid, req)

    def pause_or_resume(self, sid: str, op: str) -> Answer:
        paused = sid in self.paused
        if (op == "pause") == paused:
            state = "paused" if paused else "running"
            needs = "running" if op == "pause" else "paused"
            return _error(409, "wrong_state", f"sandbox {sid} is {state}: {op} needs it {needs}")
        if op == "pause":
            self.paused.add(sid)
        else:
            self.paused.discard(sid)
        return 200, self.view(sid)

    def create(self, req: dict[str, Any]) -> Answer:
        meta = req.get("metadata") or {}
        why = metadata_error(meta)
        if why is not None:
            return _error(400, "invalid_argument", why)
        made = []
        for _ in range(req.get("n", 1)):
            sid = f"sb-{next(self._ids):012x}"
            self.sandboxes[sid] = {}
            self.metadata[sid] = dict(meta)
            self.lifecycle[sid] = {k: req[k] for k in ("auto_resume", "ttl_action") if k in req}
            made.append(self.view(sid))
        return 201, {"sandboxes": made}

    def list_sandboxes(self, raw_query: str) -> Answer:
        filters = parse_filters(raw_query)
        if isinstance(filters, tuple):
            return filters
        return 200, {
            "sandboxes": [
                self.view(sid)
                for sid in self.sandboxes
                if all(self.metadata.get(sid, {}).get(k) == v for k, v in filters)
            ]
        }

    def _common_point(self, a: str, b: str) -> Optional[str]:
        # Parent and child, or two children of one branch point: the simple trees.
        for x, y in ((a, b), (b, a)):
            if self.origin.get(y, ("", ""))[0] == x:
                return self.origin[y][1]
        if a in self.origin and self.origin[a][1] == self.origin.get(b, ("", ""))[1]:
            return self.origin[a][1]
        return None

    def merge(self, sid: str, req: dict[str, Any]) -> Answer:
        src, on_conflict, dry_run = req["from"], req.get("on_conflict", "fail"), req.get("dry_run", False)
        if src not in self.sandboxes:
            return _error(404, "not_found", f'sandbox "{src}" not found')
        point = self._common_point(sid, src)
        if point is None:
            return _error(409, "conflict", f"{sid} and {src} are not of one tree")
        base = self.points[point]
        if base is None:
            return _error(409, "conflict", f"the common state of {sid} and {src} ({point}) was not saved")
        dirs = sorted(p.rstrip("/") for p in req.get("paths") or ["/root"])
        ours, theirs = self.sandboxes[sid], self.sandboxes[src]
        changes: list[dict[str, Any]] = []
        conflicts: list[dict[str, Any]] = []
        take: dict[str, Optional[str]] = {}

        def did(before: Optional[str], after: Optional[str]) -> str:
            return "added" if before is None else "removed" if after is None else "modified"

        for path in sorted(set(base) | set(theirs)):
            if not any(path.startswith(d + "/") for d in dirs):
                continue
            b, o, t = base.get(path), ours.get(path), theirs.get(path)
            if t == b or t == o:
                continue  # theirs did not change it, or both made the same change
            if o != b:
                conflicts.append(
                    {"path": path, "ours": did(b, o), "theirs": did(b, t)}
                    | ({} if on_conflict == "fail" else {"resolution": on_conflict})
                )
                if on_conflict != "theirs":
                    continue
            take[path] = t
            action = "remove" if t is None else "add" if b is None else "modify"
            changes.append({"path": path, "action": action, "kind": "file", "size": len(t or "")})
        applied = not (on_conflict == "fail" and conflicts) and not dry_run and bool(take)
        if applied:
            for path, text in take.items():
                if text is None:
                    del ours[path]
                else:
                    ours[path] = text
        report = {
            "sandbox": sid,
            "from": src,
            "base": point,
            "paths": dirs,
            "applied": applied,
            "changes": changes,
            "conflicts": conflicts,
            "skipped": [],
            "bytes_copied": sum(c["size"] for c in changes) if applied else 0,
            "duration_ms": 1,
        }
        return 200, report


@dataclass
class FakeDaemon:
    responses: list[dict[str, Any]] = field(default_factory=list)
    requests: list[Recorded] = field(default_factory=list)
    files: Optional[FakeFiles] = None
    # Background processes (tests/fake_processes.py): answers {"status", "json" | "ndjson"}.
    processes: Optional[Any] = None
    # Images, snapshots and packs (tests/fake_oci.py): answers as processes', or None to
    # let the other models (and the script) answer.
    oci: Optional[Any] = None
    _scripted: int = 0
    _server: Optional[ThreadingHTTPServer] = None

    @property
    def url(self) -> str:
        assert self._server is not None
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def load(self, responses: list[dict[str, Any]]) -> None:
        """Script the next exchanges (and forget earlier requests)."""
        self.responses = list(responses)
        self.requests = []
        self._scripted = 0

    def start(self) -> "FakeDaemon":
        fake = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:  # keep pytest output clean
                pass

            def _handle(self) -> None:
                parts = urlsplit(self.path)
                body = self._body()
                query = {k: v[-1] for k, v in parse_qs(parts.query, keep_blank_values=True).items()}
                fake.requests.append(
                    Recorded(
                        method=self.command,
                        path=parts.path,
                        query=query,
                        headers={k.lower(): v for k, v in self.headers.items()},
                        body=body,
                        raw_query=parts.query,
                    )
                )
                for model in (fake.processes, fake.oci):
                    answer = model.answer(self.command, parts.path, query, body) if model is not None else None
                    if answer is not None:
                        self._respond(answer)
                        return
                modelled = (
                    fake.files.answer(self.command, parts.path, query, body, parts.query) if fake.files else None
                )
                if modelled is not None:
                    status, answer = modelled
                    if answer is None:
                        self._send(status, None, b"")
                    elif isinstance(answer, bytes):
                        self._send(status, "application/octet-stream", answer)
                    else:
                        self._send(status, "application/json", json.dumps(answer).encode())
                    return
                index = fake._scripted
                fake._scripted += 1
                if index >= len(fake.responses):
                    self._send(599, "application/json", b'{"error":{"code":"fake_exhausted","message":"unexpected request"}}')
                    return
                self._respond(fake.responses[index])

            def _body(self) -> bytes:
                if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
                    data = bytearray()
                    while True:
                        size = int(self.rfile.readline().split(b";")[0].strip(), 16)
                        chunk = self.rfile.read(size + 2)[:size]
                        if size == 0:
                            return bytes(data)
                        data += chunk
                length = int(self.headers.get("Content-Length") or 0)
                return self.rfile.read(length) if length else b""

            def _respond(self, r: dict[str, Any]) -> None:
                status = r["status"]
                if "chunks" in r:
                    # A body streamed in chunks; with "cut", broken off before its end
                    # (as zygoted does with a body it cannot finish).
                    self.send_response(status)
                    self.send_header("Content-Type", r.get("content_type", "application/octet-stream"))
                    self.send_header("Transfer-Encoding", "chunked")
                    self.end_headers()
                    for chunk in r["chunks"]:
                        self.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
                    if r.get("cut"):
                        self.wfile.flush()
                        self.close_connection = True
                        return
                    self.wfile.write(b"0\r\n\r\n")
                elif "ndjson" in r:
                    # Chunked, one event per chunk, as the daemon streams them.
                    self.send_response(status)
                    self.send_header("Content-Type", "application/x-ndjson")
                    self.send_header("Transfer-Encoding", "chunked")
                    self.end_headers()
                    try:
                        for ev in r["ndjson"]:
                            line = json.dumps(ev).encode() + b"\n"
                            self.wfile.write(b"%x\r\n%s\r\n" % (len(line), line))
                            self.wfile.flush()
                        self.wfile.write(b"0\r\n\r\n")
                    except (BrokenPipeError, ConnectionResetError):
                        # A client that stopped reading (a callback raised): as zygoted,
                        # drop the rest of the stream.
                        self.close_connection = True
                elif "json" in r:
                    self._send(status, "application/json", json.dumps(r["json"]).encode())
                elif "body_text" in r:
                    self._send(status, r.get("content_type", "text/plain"), r["body_text"].encode())
                elif "body_base64" in r:
                    self._send(status, r.get("content_type", "application/octet-stream"), base64.b64decode(r["body_base64"]))
                else:
                    self._send(status, None, b"")

            def _send(self, status: int, ctype: Optional[str], body: bytes) -> None:
                self.send_response(status)
                if ctype:
                    self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            do_GET = do_POST = do_PUT = do_DELETE = _handle

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
