"""Background processes: ``commands.run(..., background=True)``.

The daemon starts the program and answers at once (202, the process); the
program keeps running in the guest, its stdin open, its output kept there
(the last 1 MiB of each). A :class:`CommandHandle` follows it by pid: its
output from an offset (``GET .../processes/{pid}/output``, JSON, or NDJSON
with ``follow=true``), stdin and signals. The guest keeps the processes, not
the daemon or this handle, so another handle (:meth:`Commands.connect`, or
a branch child, where each process runs on as the child's own copy under the
same pid) picks one up later.

The requests are :class:`~zygote._api.Call` s like the rest of the API; the
followed output goes through :class:`ProcessCollector`, the foreground
exec's collector that also counts the offset.
"""

from __future__ import annotations

import base64
import inspect
import time
from contextlib import asynccontextmanager, contextmanager
from typing import AsyncIterator, Iterator, List, Mapping, Optional, Protocol, Union

import httpx

from . import _api
from ._api import Call, Command, ExecCollector, OutputCallback, seg
from ._client import DEFAULT_HTTP_TIMEOUT, AsyncClient, Client, _transport_errors
from .errors import FileNotFound, ProcessExited, ProcessNotFound, RequestTimeout
from .models import CommandResult, ProcessInfo, ProcessOutput

__all__ = ["CommandHandle", "AsyncCommandHandle", "ProcessCommands", "AsyncProcessCommands"]

# A signal by name (``"SIGTERM"``, ``"TERM"``, ``"interrupt"``...) or number.
Signal = Union[str, int]

# The daemon's longest wait for new output in one request (wait_ms).
MAX_OUTPUT_WAIT = 30.0


# --- calls -------------------------------------------------------------------


def _procs(sid: str) -> str:
    return f"/v1/sandboxes/{seg(sid)}/processes"


def _info(r: httpx.Response) -> ProcessInfo:
    return ProcessInfo.from_json(_api._json(r))


def start(
    sid: str,
    cmd: Command,
    *,
    timeout: Optional[float],
    env: Optional[Mapping[str, str]] = None,
    cwd: Optional[str] = None,
    stdin: Optional[str] = None,
    user: Optional[Union[str, int]] = None,
) -> Call[ProcessInfo]:
    body = _api.exec_body(cmd, timeout=timeout, env=env, cwd=cwd, stdin=stdin, user=user)
    body["background"] = True
    return Call("POST", f"/v1/sandboxes/{seg(sid)}/exec", _info, json=body)


def list_processes(sid: str) -> Call[List[ProcessInfo]]:
    return Call("GET", _procs(sid), lambda r: [ProcessInfo.from_json(p) for p in _api._json(r)["processes"]])


def get_process(sid: str, pid: int) -> Call[ProcessInfo]:
    return Call("GET", f"{_procs(sid)}/{pid}", _info)


def output(sid: str, pid: int, offset: int = 0, wait: float = 0.0) -> Call[ProcessOutput]:
    """Output from ``offset``; with nothing new yet, waits up to ``wait``
    seconds (at most 30) for some or for the end."""
    if not 0 <= wait <= MAX_OUTPUT_WAIT:
        raise ValueError(f"wait is 0..{MAX_OUTPUT_WAIT:g} seconds")
    params = {"offset": str(offset)}
    if wait:
        params["wait_ms"] = str(round(wait * 1000))
    return Call(
        "GET", f"{_procs(sid)}/{pid}/output", lambda r: ProcessOutput.from_json(_api._json(r)), params=params
    )


def send_stdin(sid: str, pid: int, data: Union[str, bytes], eof: bool = False) -> Call[None]:
    """Text goes as ``data``, bytes as ``data_base64`` (exactly those bytes)."""
    body: dict[str, object] = (
        {"data": data} if isinstance(data, str) else {"data_base64": base64.b64encode(bytes(data)).decode()}
    )
    if eof:
        body["eof"] = True
    return Call("POST", f"{_procs(sid)}/{pid}/stdin", _api._none, json=body)


def signal(sid: str, pid: int, sig: Signal) -> Call[None]:
    if isinstance(sig, bool) or not isinstance(sig, (str, int)):
        raise TypeError(f"a signal is a name such as 'SIGTERM' or a number, not {sig!r}")
    return Call("POST", f"{_procs(sid)}/{pid}/signal", _api._none, json={"signal": sig})


def follow_path(sid: str, pid: int) -> str:
    return f"{_procs(sid)}/{pid}/output"


@contextmanager
def pid_errors() -> Iterator[None]:
    """The guest's "no such process" (``guest_not_found``, which the SDK
    otherwise reads as a missing file) as :class:`ProcessNotFound`."""
    try:
        yield
    except FileNotFound as e:
        raise ProcessNotFound(e.message, code=e.code, status=e.status) from e


def _follow_timeout(read: Optional[float]) -> httpx.Timeout:
    # The follow stream may stay silent as long as the program prints nothing:
    # reads wait for the caller's deadline, or forever.
    return httpx.Timeout(
        connect=DEFAULT_HTTP_TIMEOUT.connect,
        read=read,
        write=DEFAULT_HTTP_TIMEOUT.write,
        pool=DEFAULT_HTTP_TIMEOUT.pool,
    )


class _Deadline:
    """``wait(timeout)``: what is left of it, and the error once it is spent."""

    def __init__(self, pid: int, timeout: Optional[float]) -> None:
        if timeout is not None and timeout <= 0:
            raise ValueError("timeout must be positive (or None to wait until the process ends)")
        self.pid, self.timeout = pid, timeout
        self.at = None if timeout is None else time.monotonic() + timeout

    def left(self) -> Optional[float]:
        return None if self.at is None else max(0.001, self.at - time.monotonic())

    def passed(self) -> bool:
        return self.at is not None and time.monotonic() >= self.at

    def error(self) -> RequestTimeout:
        return RequestTimeout(f"process {self.pid} is still running after {self.timeout:g} s", code="wait_timeout")


class ProcessCollector(ExecCollector):
    """The foreground collector, from an offset of a background process's
    output: the followed events, or the JSON reads of :meth:`add`."""

    def __init__(
        self,
        argv: Command,
        on_stdout: Optional[OutputCallback],
        on_stderr: Optional[OutputCallback],
        check: bool,
        offset: int = 0,
    ) -> None:
        super().__init__(argv, on_stdout, on_stderr, check)
        self.offset = offset

    def feed(self, line: str) -> list[tuple[OutputCallback, str]]:
        before = self.output_bytes
        out = super().feed(line)
        self.offset += self.output_bytes - before
        return out

    def add(self, got: ProcessOutput) -> list[tuple[OutputCallback, str]]:
        """Output read as JSON (already decoded by the daemon)."""
        self.offset = got.next_offset
        return self._emit("stdout", got.stdout) + self._emit("stderr", got.stderr)

    def text(self, stream: str) -> str:
        return "".join(self._text[stream])

    @property
    def done(self) -> bool:
        """The exit was seen: :meth:`result` is final."""
        return self._end is not None

    def retry(self) -> None:
        """Forget an error a follow ended with (the process may still be
        followed: e.g. the agent was briefly unreachable)."""
        self._error = None


class _Handle:
    """What the sync and async handles share: the pid and what was read."""

    def __init__(
        self,
        sandbox_id: str,
        info: ProcessInfo,
        on_stdout: Optional[OutputCallback],
        on_stderr: Optional[OutputCallback],
        check: bool,
        offset: int,
    ) -> None:
        self.sandbox_id = sandbox_id
        self.pid = info.pid
        self.argv = info.argv
        self._last = info
        self._c = ProcessCollector(list(info.argv) or [str(info.pid)], on_stdout, on_stderr, check, offset)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(sandbox={self.sandbox_id!r}, pid={self.pid})"

    @property
    def stdout(self) -> str:
        """The stdout read so far (by :meth:`wait` or :meth:`poll`)."""
        return self._c.text("stdout")

    @property
    def stderr(self) -> str:
        """The stderr read so far."""
        return self._c.text("stderr")

    @property
    def offset(self) -> int:
        """Where the next read starts (stdout and stderr bytes counted together)."""
        return self._c.offset

    @property
    def exit_code(self) -> Optional[int]:
        """The exit code once it is known to have ended (None while running,
        or when a signal ended it)."""
        return self._last.exit_code

    def _ended(self) -> bool:
        return self._c.done

    def _result(self) -> CommandResult:
        end = self._c._end
        if end is not None:
            ended = {k: end.get(k) for k in ("exit_code", "signal", "timed_out", "duration_ms")}
            self._last = ProcessInfo.from_json({**self._last.raw, "state": "exited", **ended})
        return self._c.result()


class CommandHandle(_Handle):
    """A background process: ``sb.commands.run(cmd, background=True)`` or
    ``sb.commands.connect(pid)``. The program runs on whether or not the
    handle is used; :meth:`wait` reads its output (passing it to the
    callbacks) until it ends."""

    def __init__(
        self,
        client: Client,
        sandbox_id: str,
        info: ProcessInfo,
        *,
        on_stdout: Optional[OutputCallback] = None,
        on_stderr: Optional[OutputCallback] = None,
        check: bool = False,
        offset: int = 0,
    ) -> None:
        super().__init__(sandbox_id, info, on_stdout, on_stderr, check, offset)
        self._client = client

    def wait(self, timeout: Optional[float] = None) -> CommandResult:
        """Follows the output until the program ends and returns how, like a
        foreground ``run`` (:class:`~zygote.errors.CommandTimeout` when its
        own ``timeout`` killed it; :class:`~zygote.errors.CommandFailed` on
        a non-zero exit when started with ``check=True``).

        ``timeout`` (seconds) bounds this wait only: past it
        :class:`~zygote.errors.RequestTimeout` is raised and the program runs
        on (wait again to go on reading)."""
        deadline = _Deadline(self.pid, timeout)
        if self._ended():
            return self._result()
        self._c.retry()
        try:
            with self._follow(deadline.left()) as resp:
                for line in resp.iter_lines():
                    for cb, text in self._c.feed(line):
                        cb(text)
                    if self._ended():
                        break
                    if deadline.passed():
                        raise deadline.error()
        except RequestTimeout as e:
            if deadline.at is not None and e.code != "wait_timeout":
                raise deadline.error() from e
            raise
        return self._result()

    @contextmanager
    def _follow(self, read: Optional[float]) -> Iterator[httpx.Response]:
        params = {"follow": "true", "offset": str(self.offset)}
        path = follow_path(self.sandbox_id, self.pid)
        with pid_errors(), _transport_errors(self._client.config):
            with self._client._http.stream("GET", path, params=params, timeout=_follow_timeout(read)) as resp:
                if resp.status_code >= 400:
                    resp.read()
                    _api.raise_for_error(resp)
                yield resp

    def poll(self, wait: float = 0.0) -> ProcessInfo:
        """Reads what it printed since the last read (waiting up to ``wait``
        seconds, at most 30, when nothing is new), passes it to the
        callbacks, and returns the process as of then."""
        with pid_errors():
            got = self._client.call(output(self.sandbox_id, self.pid, self.offset, wait))
        for cb, text in self._c.add(got):
            cb(text)
        self._last = got.process
        return got.process

    def info(self) -> ProcessInfo:
        """The process as the daemon shows it now."""
        self._last = self._client.call(get_process(self.sandbox_id, self.pid))
        return self._last

    def send_stdin(self, data: Union[str, bytes], *, eof: bool = False) -> None:
        """Writes to its stdin (text, or exact bytes); ``eof=True`` closes it
        afterwards. Raises :class:`~zygote.errors.ProcessExited` once it has
        ended."""
        with pid_errors():
            self._client.call(send_stdin(self.sandbox_id, self.pid, data, eof))

    def close_stdin(self) -> None:
        """Closes its stdin: the program reads end of file."""
        self.send_stdin(b"", eof=True)

    def signal(self, sig: Signal) -> None:
        """Sends ``sig`` (``"SIGTERM"``, ``"INT"``, ``9``...) to its process group."""
        with pid_errors():
            self._client.call(signal(self.sandbox_id, self.pid, sig))

    def kill(self) -> bool:
        """SIGKILL; False when it had already ended (or is unknown)."""
        try:
            self.signal("SIGKILL")
        except (ProcessExited, ProcessNotFound):
            return False
        return True


class AsyncCommandHandle(_Handle):
    """The asyncio :class:`CommandHandle` (callbacks may be coroutine functions)."""

    def __init__(
        self,
        client: AsyncClient,
        sandbox_id: str,
        info: ProcessInfo,
        *,
        on_stdout: Optional[OutputCallback] = None,
        on_stderr: Optional[OutputCallback] = None,
        check: bool = False,
        offset: int = 0,
    ) -> None:
        super().__init__(sandbox_id, info, on_stdout, on_stderr, check, offset)
        self._client = client

    async def wait(self, timeout: Optional[float] = None) -> CommandResult:
        """See :meth:`CommandHandle.wait`."""
        deadline = _Deadline(self.pid, timeout)
        if self._ended():
            return self._result()
        self._c.retry()
        try:
            async with self._follow(deadline.left()) as resp:
                async for line in resp.aiter_lines():
                    for cb, text in self._c.feed(line):
                        await _call(cb, text)
                    if self._ended():
                        break
                    if deadline.passed():
                        raise deadline.error()
        except RequestTimeout as e:
            if deadline.at is not None and e.code != "wait_timeout":
                raise deadline.error() from e
            raise
        return self._result()

    @asynccontextmanager
    async def _follow(self, read: Optional[float]) -> AsyncIterator[httpx.Response]:
        params = {"follow": "true", "offset": str(self.offset)}
        path = follow_path(self.sandbox_id, self.pid)
        with pid_errors(), _transport_errors(self._client.config):
            async with self._client._http.stream("GET", path, params=params, timeout=_follow_timeout(read)) as resp:
                if resp.status_code >= 400:
                    await resp.aread()
                    _api.raise_for_error(resp)
                yield resp

    async def poll(self, wait: float = 0.0) -> ProcessInfo:
        """See :meth:`CommandHandle.poll`."""
        with pid_errors():
            got = await self._client.call(output(self.sandbox_id, self.pid, self.offset, wait))
        for cb, text in self._c.add(got):
            await _call(cb, text)
        self._last = got.process
        return got.process

    async def info(self) -> ProcessInfo:
        self._last = await self._client.call(get_process(self.sandbox_id, self.pid))
        return self._last

    async def send_stdin(self, data: Union[str, bytes], *, eof: bool = False) -> None:
        """See :meth:`CommandHandle.send_stdin`."""
        with pid_errors():
            await self._client.call(send_stdin(self.sandbox_id, self.pid, data, eof))

    async def close_stdin(self) -> None:
        await self.send_stdin(b"", eof=True)

    async def signal(self, sig: Signal) -> None:
        with pid_errors():
            await self._client.call(signal(self.sandbox_id, self.pid, sig))

    async def kill(self) -> bool:
        """SIGKILL; False when it had already ended (or is unknown)."""
        try:
            await self.signal("SIGKILL")
        except (ProcessExited, ProcessNotFound):
            return False
        return True


async def _call(cb: OutputCallback, text: str) -> None:
    maybe = cb(text)
    if inspect.isawaitable(maybe):
        await maybe


# --- sb.commands -------------------------------------------------------------


class _SyncSandbox(Protocol):
    id: str
    client: Client


class _AsyncSandbox(Protocol):
    id: str
    client: AsyncClient


class ProcessCommands:
    """The background-process half of ``sb.commands``."""

    _sb: _SyncSandbox

    def _start(
        self,
        cmd: Command,
        *,
        timeout: Optional[float],
        on_stdout: Optional[OutputCallback],
        on_stderr: Optional[OutputCallback],
        env: Optional[Mapping[str, str]],
        cwd: Optional[str],
        stdin: Optional[str],
        check: bool,
        user: Optional[Union[str, int]] = None,
    ) -> CommandHandle:
        info = self._sb.client.call(start(self._sb.id, cmd, timeout=timeout, env=env, cwd=cwd, stdin=stdin, user=user))
        return CommandHandle(self._sb.client, self._sb.id, info, on_stdout=on_stdout, on_stderr=on_stderr, check=check)

    def list(self) -> List[ProcessInfo]:
        """The background processes, oldest first (running and ended; the
        guest keeps the 256 most recent)."""
        return self._sb.client.call(list_processes(self._sb.id))

    def connect(
        self,
        pid: int,
        *,
        on_stdout: Optional[OutputCallback] = None,
        on_stderr: Optional[OutputCallback] = None,
        check: bool = False,
    ) -> CommandHandle:
        """A handle on the background process ``pid`` (started earlier, by
        another handle, or in the parent of this branch child); its
        :meth:`~CommandHandle.wait` reads the output from the start (what
        the guest still keeps). Raises :class:`~zygote.errors.ProcessNotFound`."""
        info = self._sb.client.call(get_process(self._sb.id, pid))
        return CommandHandle(self._sb.client, self._sb.id, info, on_stdout=on_stdout, on_stderr=on_stderr, check=check)

    def kill(self, pid: int) -> bool:
        """SIGKILL to ``pid``; False when it had already ended (or is unknown)."""
        try:
            self.signal(pid, "SIGKILL")
        except (ProcessExited, ProcessNotFound):
            return False
        return True

    def signal(self, pid: int, sig: Signal) -> None:
        with pid_errors():
            self._sb.client.call(signal(self._sb.id, pid, sig))

    def send_stdin(self, pid: int, data: Union[str, bytes], *, eof: bool = False) -> None:
        """Writes to ``pid``'s stdin; ``eof=True`` closes it afterwards."""
        with pid_errors():
            self._sb.client.call(send_stdin(self._sb.id, pid, data, eof))


class AsyncProcessCommands:
    """The background-process half of ``AsyncSandbox.commands``."""

    _sb: _AsyncSandbox

    async def _start(
        self,
        cmd: Command,
        *,
        timeout: Optional[float],
        on_stdout: Optional[OutputCallback],
        on_stderr: Optional[OutputCallback],
        env: Optional[Mapping[str, str]],
        cwd: Optional[str],
        stdin: Optional[str],
        check: bool,
        user: Optional[Union[str, int]] = None,
    ) -> AsyncCommandHandle:
        info = await self._sb.client.call(start(self._sb.id, cmd, timeout=timeout, env=env, cwd=cwd, stdin=stdin, user=user))
        return AsyncCommandHandle(
            self._sb.client, self._sb.id, info, on_stdout=on_stdout, on_stderr=on_stderr, check=check
        )

    async def list(self) -> List[ProcessInfo]:
        """See :meth:`ProcessCommands.list`."""
        return await self._sb.client.call(list_processes(self._sb.id))

    async def connect(
        self,
        pid: int,
        *,
        on_stdout: Optional[OutputCallback] = None,
        on_stderr: Optional[OutputCallback] = None,
        check: bool = False,
    ) -> AsyncCommandHandle:
        """See :meth:`ProcessCommands.connect`."""
        info = await self._sb.client.call(get_process(self._sb.id, pid))
        return AsyncCommandHandle(
            self._sb.client, self._sb.id, info, on_stdout=on_stdout, on_stderr=on_stderr, check=check
        )

    async def kill(self, pid: int) -> bool:
        try:
            await self.signal(pid, "SIGKILL")
        except (ProcessExited, ProcessNotFound):
            return False
        return True

    async def signal(self, pid: int, sig: Signal) -> None:
        with pid_errors():
            await self._sb.client.call(signal(self._sb.id, pid, sig))

    async def send_stdin(self, pid: int, data: Union[str, bytes], *, eof: bool = False) -> None:
        with pid_errors():
            await self._sb.client.call(send_stdin(self._sb.id, pid, data, eof))
