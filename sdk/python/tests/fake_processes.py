"""Background processes the way zygoted serves them (crates/daemon/src/api/processes.rs),
for the fake daemon: ``POST .../exec {"background": true}`` answers 202 with the
process; the process routes list it, read its output from an offset (JSON, with a
long-poll ``wait_ms``, or ``follow=true`` NDJSON streamed as it is printed), write
its stdin and signal it, with the daemon's error codes.

The guest's programs are modelled by name (argv[0], or the command of ``sh -c``):

- ``cat``: copies stdin to stdout; exits 0 at end of file.
- ``talk``: prints ``start``; answers each stdin line ``L`` with ``got L``; at end of
  file prints ``bye`` to stderr and exits 3 (the e2e test's script).
- ``sleep``: prints nothing and reads nothing (a full pipe, 64 KiB, makes stdin
  writes ``guest_busy``); runs until a signal.
- ``echo WORDS``: prints them and exits 0.

Anything else fails to start (``guest_spawn_failed``, as a missing program does).
A signal other than SIGCONT/SIGSTOP ends a program (``signal`` set, no exit code);
a ``timeout_ms`` past kills it with SIGKILL and ``timed_out``. Each process keeps
the last ``ring_bytes`` of its output (1 MiB, like the guest's ring). ``follow_errors``
makes follows end in an error line (the agent lost mid-follow)."""

from __future__ import annotations

import base64
import copy
import json
import re
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Iterator, Optional

Answer = dict[str, Any]

SIGNALS = {"KILL": 9, "TERM": 15, "INT": 2, "HUP": 1, "QUIT": 3, "USR1": 10, "USR2": 12, "STOP": 19, "CONT": 18}
PIPE_BYTES = 65536


def _error(status: int, code: str, message: str) -> Answer:
    return {"status": status, "json": {"error": {"code": code, "message": message}}}


def signal_number(spec: Any) -> Optional[int]:
    """The daemon's SignalRequest::number (None: refused)."""
    if isinstance(spec, bool):
        return None
    if isinstance(spec, int):
        return spec if 1 <= spec <= 64 else None
    if isinstance(spec, str):
        bare = spec.upper().removeprefix("SIG")
        return SIGNALS.get("INT" if bare == "INTERRUPT" else bare)
    return None


@dataclass
class FakeProcess:
    pid: int
    argv: list[str]
    program: str
    args: list[str]
    started: float
    timeout_ms: Optional[int]
    ring_bytes: int
    chunks: list[tuple[int, str, bytes]] = field(default_factory=list)  # (offset, stream, data)
    total: int = 0
    state: str = "running"
    exit_code: Optional[int] = None
    signal: Optional[int] = None
    timed_out: bool = False
    duration_ms: Optional[int] = None
    stdin_open: bool = True
    unread: bytes = b""  # stdin not consumed yet (cat/talk consume lines, sleep nothing)

    def view(self) -> dict[str, Any]:
        return {
            "pid": self.pid,
            "argv": self.argv,
            "state": self.state,
            "exit_code": self.exit_code,
            "signal": self.signal,
            "timed_out": self.timed_out,
            "duration_ms": self.duration_ms,
            "started_at_ms": int(self.started * 1000),
            "output_bytes": self.total,
            "stdin_open": self.stdin_open,
        }

    def print(self, stream: str, data: bytes) -> None:
        if not data:
            return
        self.chunks.append((self.total, stream, data))
        self.total += len(data)
        while self.chunks and self.total - self.chunks[0][0] - len(self.chunks[0][2]) >= self.ring_bytes:
            self.chunks.pop(0)  # whole chunks out of the ring

    @property
    def ring_start(self) -> int:
        return self.chunks[0][0] if self.chunks else self.total

    def read(self, offset: int) -> tuple[int, list[tuple[str, bytes]]]:
        """Output from ``offset`` (or the ring's start, if later): (where it starts, chunks)."""
        start = max(offset, self.ring_start)
        out = [(s, d[max(0, start - o):]) for o, s, d in self.chunks if o + len(d) > start]
        return start, out

    def end(self, *, code: Optional[int] = None, signal: Optional[int] = None, timed_out: bool = False) -> None:
        self.state, self.exit_code, self.signal, self.timed_out = "exited", code, signal, timed_out
        self.duration_ms = int((time.monotonic() - self.started) * 1000)
        self.stdin_open = False

    def stdin(self, data: bytes, eof: bool) -> None:
        self.unread += data
        if self.program in ("cat", "talk"):
            if self.program == "cat":
                self.print("stdout", self.unread)
                self.unread = b""
            while b"\n" in self.unread:
                line, _, self.unread = self.unread.partition(b"\n")
                self.print("stdout", b"got " + line + b"\n")
        if eof:
            self.stdin_open = False
            if self.program == "cat":
                self.end(code=0)
            elif self.program == "talk":
                self.print("stderr", b"bye\n")
                self.end(code=3)


@dataclass
class FakeProcesses:
    """Per sandbox id: pid -> process. Any sandbox id is taken as running."""

    ring_bytes: int = 1 << 20
    sandboxes: dict[str, dict[int, FakeProcess]] = field(default_factory=dict)
    next_pid: int = 100
    # The next follows end with this error line after the output so far (the agent
    # lost mid-follow), as many times as given.
    follow_errors: list[dict[str, str]] = field(default_factory=list)
    lock: threading.Condition = field(default_factory=threading.Condition)

    def branch(self, parent: str, child: str) -> None:
        """A branch child runs its own copy of each of the parent's processes (same pids)."""
        with self.lock:
            self.sandboxes[child] = copy.deepcopy(self.sandboxes.get(parent, {}))

    def _tick(self) -> None:
        now = time.monotonic()
        for procs in self.sandboxes.values():
            for p in procs.values():
                if p.state == "running" and p.timeout_ms is not None and (now - p.started) * 1000 >= p.timeout_ms:
                    p.end(signal=9, timed_out=True)

    def answer(self, method: str, path: str, query: dict[str, str], body: bytes) -> Optional[Answer]:
        m = re.fullmatch(r"/v1/sandboxes/([^/]+)/(exec|processes)(?:/([^/]+))?(?:/(output|stdin|signal))?", path)
        if m is None:
            return None
        sid, route, pid_s, what = m[1], m[2], m[3], m[4]
        with self.lock:
            self._tick()
            procs = self.sandboxes.setdefault(sid, {})
            if route == "exec":
                req = json.loads(body)
                if pid_s is not None or not req.get("background"):
                    return None
                return self.spawn(procs, req)
            if pid_s is None:
                return {"status": 200, "json": {"processes": [p.view() for p in sorted(procs.values(), key=lambda p: p.pid)]}}
            if not pid_s.isdigit() or int(pid_s) == 0:
                return _error(400, "invalid_argument", f"pid must be a positive integer, got {pid_s!r}")
            p = procs.get(int(pid_s))
            if what is None:
                if p is None:
                    return _error(404, "not_found", f'process "{pid_s}" not found')
                return {"status": 200, "json": p.view()}
            if p is None:
                return _error(404, "guest_not_found", f"no process {pid_s}")
            if what == "output":
                return self.output(p, query)
            req = json.loads(body)
            if what == "stdin":
                return self.stdin(p, req)
            return self.signal(p, req)

    def spawn(self, procs: dict[int, FakeProcess], req: dict[str, Any]) -> Answer:
        argv = req["argv"]
        words = argv[2].split() if argv[:2] == ["sh", "-c"] and len(argv) > 2 else argv
        if not words or words[0] not in ("cat", "talk", "sleep", "echo"):
            return _error(422, "guest_spawn_failed", f"spawn {argv[0]}: No such file or directory")
        self.next_pid += 1
        p = FakeProcess(
            pid=self.next_pid,
            argv=argv,
            program=words[0],
            args=words[1:],
            started=time.monotonic(),
            timeout_ms=req.get("timeout_ms"),
            ring_bytes=self.ring_bytes,
        )
        procs[p.pid] = p
        if p.program == "talk":
            p.print("stdout", b"start\n")
        if p.program == "echo":
            p.print("stdout", " ".join(p.args).encode() + b"\n")
            p.end(code=0)
        elif req.get("stdin"):
            p.stdin(req["stdin"].encode(), eof=False)
        self.lock.notify_all()
        return {"status": 202, "json": p.view()}

    def output(self, p: FakeProcess, query: dict[str, str]) -> Answer:
        offset = int(query.get("offset", "0"))
        if query.get("follow") == "true":
            if "wait_ms" in query:
                return _error(400, "invalid_argument", "wait_ms does not apply with follow=true")
            return {"status": 200, "ndjson": self.follow(p, offset)}
        wait_ms = int(query.get("wait_ms", "0"))
        if not 0 <= wait_ms <= 30000:
            return _error(400, "invalid_argument", f"wait_ms must be in 0..=30000, got {wait_ms}")
        deadline = time.monotonic() + wait_ms / 1000
        while p.total <= max(offset, p.ring_start) and p.state == "running" and time.monotonic() < deadline:
            self.lock.wait(min(0.02, max(0.0, deadline - time.monotonic())))
            self._tick()
        start, chunks = p.read(offset)
        text = {s: b"".join(d for st, d in chunks if st == s).decode(errors="replace") for s in ("stdout", "stderr")}
        return {
            "status": 200,
            "json": {
                **text,
                "offset": start,
                "next_offset": p.total,
                "dropped_bytes": start - offset if start > offset else 0,
                "process": p.view(),
            },
        }

    def follow(self, p: FakeProcess, offset: int) -> Iterator[dict[str, Any]]:
        """The NDJSON lines, as the process prints them (run by the handler's thread)."""
        pos = offset
        failure = self.follow_errors.pop(0) if self.follow_errors else None
        while True:
            with self.lock:
                self._tick()
                start, chunks = p.read(pos)
                pos = p.total
                ended = p.state == "exited"
                if not chunks and not ended:
                    self.lock.wait(0.02)
                    continue
                exit_line = {
                    "type": "exit",
                    "exit_code": p.exit_code,
                    "signal": p.signal,
                    "timed_out": p.timed_out,
                    "duration_ms": p.duration_ms,
                }
            for stream, data in chunks:
                yield {"type": "output", "stream": stream, "data": base64.b64encode(data).decode()}
            if failure is not None:
                yield {"type": "error", **failure}
                return
            if ended:
                yield exit_line
                return

    def stdin(self, p: FakeProcess, req: dict[str, Any]) -> Answer:
        if "data" in req and "data_base64" in req:
            return _error(400, "invalid_argument", "give data or data_base64, not both")
        data = req["data"].encode() if "data" in req else base64.b64decode(req.get("data_base64", ""))
        if not data and not req.get("eof"):
            return _error(400, "invalid_argument", "nothing to do: no data and no eof")
        if p.state == "exited":
            return _error(409, "process_exited", f"process {p.pid} has exited")
        if not p.stdin_open:
            return _error(400, "guest_bad_request", f"process {p.pid} closed its stdin")
        if p.program == "sleep" and len(p.unread) + len(data) > PIPE_BYTES:
            return _error(409, "guest_busy", f"process {p.pid} did not read its stdin within 10 s")
        p.stdin(data, bool(req.get("eof")))
        self.lock.notify_all()
        return {"status": 204}

    def signal(self, p: FakeProcess, req: dict[str, Any]) -> Answer:
        sig = signal_number(req.get("signal"))
        if sig is None:
            return _error(400, "invalid_argument", f"unknown signal {req.get('signal')!r}")
        if p.state == "exited":
            return _error(409, "process_exited", f"process {p.pid} has exited")
        if sig not in (SIGNALS["CONT"], SIGNALS["STOP"]):
            p.end(signal=sig)
        self.lock.notify_all()
        return {"status": 204}
