"""The code interpreter (image ``code-interpreter``), without I/O.

``POST /v1/sandboxes/{id}/code`` runs Python in a context's Jupyter kernel and streams
NDJSON events (stdout/stderr chunks, results as mime bundles, then an error and/or
``done``); :class:`CodeCollector` turns them into callbacks and an :class:`Execution`.
Contexts (independent kernels) are plain calls.
"""

from __future__ import annotations

import base64
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable, Mapping, Optional, Union

import httpx

from ._api import Call, _json, _none, seg, stream_event
from .errors import ServerError, error_for


@dataclass
class Result:
    """A value: the cell's last expression (``is_main_result``) or something displayed
    (a figure). ``data`` maps mime types to values (base64 for images)."""

    data: dict[str, Any]
    is_main_result: bool = False

    @property
    def text(self) -> Optional[str]:
        return self.data.get("text/plain")

    @property
    def html(self) -> Optional[str]:
        return self.data.get("text/html")

    @property
    def markdown(self) -> Optional[str]:
        return self.data.get("text/markdown")

    @property
    def svg(self) -> Optional[str]:
        return self.data.get("image/svg+xml")

    @property
    def json(self) -> Any:
        return self.data.get("application/json")

    @property
    def png(self) -> Optional[str]:
        """Base64 of the PNG (checked by the daemon)."""
        return self.data.get("image/png")

    def png_bytes(self) -> Optional[bytes]:
        return None if self.png is None else base64.b64decode(self.png)

    def formats(self) -> list[str]:
        return sorted(self.data)


@dataclass
class ExecutionError:
    """The code raised (``name``/``value``/``traceback`` as Python formats them), ran past
    its timeout (``TimeoutError``) or its kernel died (``KernelDied``: restart the
    context)."""

    name: str
    value: str
    traceback: list[str] = field(default_factory=list)


@dataclass
class Logs:
    stdout: list[str] = field(default_factory=list)
    stderr: list[str] = field(default_factory=list)


@dataclass
class Execution:
    results: list[Result] = field(default_factory=list)
    logs: Logs = field(default_factory=Logs)
    error: Optional[ExecutionError] = None
    execution_count: Optional[int] = None

    @property
    def text(self) -> Optional[str]:
        """``text/plain`` of the main result, if any."""
        for r in self.results:
            if r.is_main_result:
                return r.text
        return None


@dataclass
class CodeContext:
    id: str
    language: str
    cwd: str


Callback = Callable[[Any], Union[None, Awaitable[None]]]


def code_path(sid: str) -> str:
    return f"/v1/sandboxes/{seg(sid)}/code"


def code_body(
    code: str,
    *,
    context: Optional[Union[str, CodeContext]] = None,
    timeout: Optional[float] = None,
    envs: Optional[Mapping[str, str]] = None,
) -> dict[str, Any]:
    body: dict[str, Any] = {"code": code, "language": "python"}
    if context is not None:
        body["context"] = context.id if isinstance(context, CodeContext) else context
    if timeout is not None:
        body["timeout_ms"] = max(1, int(timeout * 1000))
    if envs:
        body["envs"] = dict(envs)
    return body


def read_timeout(timeout: Optional[float]) -> Optional[float]:
    """The daemon interrupts at the execution's timeout (default 300 s); the first call
    of a context also starts its kernel."""
    return (timeout or 300.0) + 360.0


class CodeCollector:
    """Consumes the NDJSON lines of ``POST .../code``; ``feed`` returns the callbacks to
    invoke with their argument (an async caller awaits coroutine ones)."""

    def __init__(
        self,
        on_stdout: Optional[Callback] = None,
        on_stderr: Optional[Callback] = None,
        on_result: Optional[Callback] = None,
        on_error: Optional[Callback] = None,
    ) -> None:
        self.execution = Execution()
        self._cbs = {"stdout": on_stdout, "stderr": on_stderr, "result": on_result, "error": on_error}
        self._done = False
        self._failure: Optional[Exception] = None

    def feed(self, line: str) -> list[tuple[Callback, Any]]:
        ev = stream_event(line, "code")
        if ev is None:
            return []
        kind = ev["type"]
        ex = self.execution
        arg: Any = None
        if kind in ("stdout", "stderr"):
            arg = str(ev.get("text", ""))
            (ex.logs.stdout if kind == "stdout" else ex.logs.stderr).append(arg)
        elif kind == "result":
            arg = Result(data=dict(ev.get("data") or {}), is_main_result=bool(ev.get("main")))
            ex.results.append(arg)
        elif kind == "error":
            arg = ExecutionError(str(ev.get("name", "")), str(ev.get("value", "")), list(ev.get("traceback") or []))
            ex.error = arg
        elif kind == "done":
            ex.execution_count = int(ev.get("execution_count") or 0)
            self._done = True
        elif kind == "failure":
            self._failure = error_for(str(ev.get("code", "error")), str(ev.get("message", "")))
        cb = self._cbs.get(kind)
        return [(cb, arg)] if cb else []

    def result(self) -> Execution:
        if self._failure is not None:
            raise self._failure
        if not self._done:
            raise ServerError("the code stream ended without a done event", code="stream_ended")
        return self.execution


def _context(resp: httpx.Response) -> CodeContext:
    d = _json(resp)
    return CodeContext(id=d["id"], language=d["language"], cwd=d["cwd"])


def _contexts(resp: httpx.Response) -> list[CodeContext]:
    return [CodeContext(id=d["id"], language=d["language"], cwd=d["cwd"]) for d in _json(resp)["contexts"]]


def list_contexts(sid: str) -> Call[list[CodeContext]]:
    return Call("GET", f"{code_path(sid)}/contexts", parse=_contexts)


def create_context(sid: str, cwd: Optional[str] = None) -> Call[CodeContext]:
    body: dict[str, Any] = {"language": "python"}
    if cwd is not None:
        body["cwd"] = cwd
    return Call("POST", f"{code_path(sid)}/contexts", json=body, parse=_context)


def _context_id(context: Union[str, CodeContext]) -> str:
    return context.id if isinstance(context, CodeContext) else context


def restart_context(sid: str, context: Union[str, CodeContext]) -> Call[None]:
    return Call("POST", f"{code_path(sid)}/contexts/{seg(_context_id(context))}/restart", parse=_none)


def remove_context(sid: str, context: Union[str, CodeContext]) -> Call[None]:
    return Call("DELETE", f"{code_path(sid)}/contexts/{seg(_context_id(context))}", parse=_none)
