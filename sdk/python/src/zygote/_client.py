"""HTTP clients (sync and async) that send :class:`~zygote._api.Call` s.

A client holds one connection pool and the daemon's address and token;
sandboxes made from it (and their branches) share it. Closing it is
optional for short scripts (connections are released when it is garbage
collected) but long-running programs should use it as a context manager.
"""

from __future__ import annotations

import inspect
import ssl
from contextlib import asynccontextmanager, contextmanager
from typing import Any, AsyncIterator, Iterator, List, Mapping, Optional, TypeVar, Union

import httpx

from . import _api
from ._api import Call, Command, ExecCollector, OutputCallback
from ._branch import BranchCollector, ProgressCallback
from ._config import Config, Verify, resolve
from ._version import __version__
from .errors import ConnectionFailed, RequestTimeout
from .models import BranchResult, CommandResult, SandboxInfo, Snapshot

__all__ = ["Client", "AsyncClient", "DEFAULT_HTTP_TIMEOUT"]

T = TypeVar("T")

# Creating, branching and snapshotting boot or migrate whole VMs; under QEMU
# TCG that takes tens of seconds, so the read timeout is generous.
DEFAULT_HTTP_TIMEOUT = httpx.Timeout(connect=10.0, read=600.0, write=60.0, pool=60.0)


def _ssl_verify(cfg: Config) -> Union[bool, ssl.SSLContext]:
    verify = cfg.verify
    if not cfg.url.startswith("https://"):
        # No TLS: skip loading the system CA bundle (tens of ms per client).
        return False
    # A CA path (e.g. the daemon's self-signed certificate) becomes a context
    # trusting exactly that; httpx deprecated passing paths directly.
    if isinstance(verify, str):
        return ssl.create_default_context(cafile=verify)
    return verify


def _headers(cfg: Config) -> dict[str, str]:
    h = {"User-Agent": f"zygote-python/{__version__}"}
    if cfg.token:
        h["Authorization"] = f"Bearer {cfg.token}"
    return h


@contextmanager
def _transport_errors(cfg: Config) -> Iterator[None]:
    """httpx's transport exceptions as ZygoteErrors, so callers need catch
    only one hierarchy."""
    try:
        yield
    except httpx.TimeoutException as e:
        raise RequestTimeout(f"zygoted at {cfg.url} did not answer in time: {e}") from e
    except httpx.TransportError as e:
        raise ConnectionFailed(f"cannot reach zygoted at {cfg.url}: {e} (is it running? `zygote serve`)") from e


def _stream_timeout(timeout: Optional[float]) -> httpx.Timeout:
    return httpx.Timeout(
        connect=DEFAULT_HTTP_TIMEOUT.connect,
        read=_api.stream_read_timeout(timeout),
        write=DEFAULT_HTTP_TIMEOUT.write,
        pool=DEFAULT_HTTP_TIMEOUT.pool,
    )


class Client:
    """Synchronous connection to zygoted.

    ``url``/``token`` default to ``$ZYGOTE_URL`` (else http://127.0.0.1:7420)
    and ``$ZYGOTE_TOKEN`` (else the token file in the daemon's state
    directory); ``verify`` to ``$ZYGOTE_CA_CERT`` for https.
    """

    def __init__(
        self,
        url: Optional[str] = None,
        token: Optional[str] = None,
        *,
        verify: Optional[Verify] = None,
        timeout: Union[float, httpx.Timeout] = DEFAULT_HTTP_TIMEOUT,
        transport: Optional[httpx.BaseTransport] = None,
    ) -> None:
        self.config = resolve(url, token, verify)
        if transport is None and self.config.unix_socket:
            transport = httpx.HTTPTransport(uds=self.config.unix_socket)
        self._http = httpx.Client(
            base_url=self.config.base_url,
            headers=_headers(self.config),
            timeout=timeout,
            transport=transport,
            verify=_ssl_verify(self.config),
        )

    def call(self, call: Call[T]) -> T:
        with _transport_errors(self.config):
            resp = self._http.request(call.method, call.path, params=call.params, json=call.json, content=call.content)
        _api.raise_for_error(resp)
        return call.parse(resp)

    def exec(
        self,
        sandbox_id: str,
        cmd: Command,
        *,
        timeout: Optional[float] = _api.DEFAULT_COMMAND_TIMEOUT,
        on_stdout: Optional[OutputCallback] = None,
        on_stderr: Optional[OutputCallback] = None,
        env: Optional[Mapping[str, str]] = None,
        cwd: Optional[str] = None,
        stdin: Optional[str] = None,
        check: bool = False,
    ) -> CommandResult:
        """Runs a command through the streaming endpoint, calling
        ``on_stdout``/``on_stderr`` as output arrives."""
        body = _api.exec_body(cmd, timeout=timeout, env=env, cwd=cwd, stdin=stdin)
        collector = ExecCollector(cmd, on_stdout, on_stderr, check)
        with _transport_errors(self.config):
            with self._http.stream(
                "POST", _api.exec_path(sandbox_id), json=body, timeout=_stream_timeout(timeout)
            ) as resp:
                if resp.status_code >= 400:
                    resp.read()
                    _api.raise_for_error(resp)
                for line in resp.iter_lines():
                    for cb, text in collector.feed(line):
                        cb(text)
        return collector.result()

    def branch_stream(
        self, sandbox_id: str, body: dict[str, Any], collector: BranchCollector[Any], on_progress: ProgressCallback
    ) -> BranchResult:
        """A branch through the streaming endpoint: ``on_progress`` gets each
        child as it comes up (or fails); returns the summary."""
        with _transport_errors(self.config):
            with self._http.stream("POST", _api.branch_path(sandbox_id), json={**body, "stream": True}) as resp:
                if resp.status_code >= 400:
                    resp.read()
                    _api.raise_for_error(resp)
                for line in resp.iter_lines():
                    progress = collector.feed(line)
                    if progress is not None:
                        on_progress(progress)
        return collector.result()

    # Daemon-level conveniences.

    def info(self) -> dict[str, Any]:
        """``GET /v1/info``: runtime in use, snapshot kinds, cgroup support."""
        return self.call(_api.info())

    def sandboxes(self, metadata: Optional[Mapping[str, str]] = None) -> List[SandboxInfo]:
        """Every sandbox; with ``metadata``, only those whose metadata has all
        of those key/value pairs."""
        return self.call(_api.list_sandboxes(metadata))

    def snapshots(self) -> List[Snapshot]:
        return self.call(_api.list_snapshots())

    def get_snapshot(self, snapshot_id: str) -> Snapshot:
        return self.call(_api.get_snapshot(snapshot_id))

    def delete_snapshot(self, snapshot: Union[Snapshot, str]) -> None:
        self.call(_api.delete_snapshot(snapshot if isinstance(snapshot, str) else snapshot.id))

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class AsyncClient:
    """The asyncio counterpart of :class:`Client` (same arguments)."""

    def __init__(
        self,
        url: Optional[str] = None,
        token: Optional[str] = None,
        *,
        verify: Optional[Verify] = None,
        timeout: Union[float, httpx.Timeout] = DEFAULT_HTTP_TIMEOUT,
        transport: Optional[httpx.AsyncBaseTransport] = None,
    ) -> None:
        self.config = resolve(url, token, verify)
        if transport is None and self.config.unix_socket:
            transport = httpx.AsyncHTTPTransport(uds=self.config.unix_socket)
        self._http = httpx.AsyncClient(
            base_url=self.config.base_url,
            headers=_headers(self.config),
            timeout=timeout,
            transport=transport,
            verify=_ssl_verify(self.config),
        )

    async def call(self, call: Call[T]) -> T:
        with _transport_errors(self.config):
            resp = await self._http.request(
                call.method, call.path, params=call.params, json=call.json, content=call.content
            )
        _api.raise_for_error(resp)
        return call.parse(resp)

    async def exec(
        self,
        sandbox_id: str,
        cmd: Command,
        *,
        timeout: Optional[float] = _api.DEFAULT_COMMAND_TIMEOUT,
        on_stdout: Optional[OutputCallback] = None,
        on_stderr: Optional[OutputCallback] = None,
        env: Optional[Mapping[str, str]] = None,
        cwd: Optional[str] = None,
        stdin: Optional[str] = None,
        check: bool = False,
    ) -> CommandResult:
        """As :meth:`Client.exec`; callbacks may be plain or coroutine functions."""
        body = _api.exec_body(cmd, timeout=timeout, env=env, cwd=cwd, stdin=stdin)
        collector = ExecCollector(cmd, on_stdout, on_stderr, check)
        async with self._stream(_api.exec_path(sandbox_id), body, _stream_timeout(timeout)) as resp:
            async for line in resp.aiter_lines():
                for cb, text in collector.feed(line):
                    maybe = cb(text)
                    if inspect.isawaitable(maybe):
                        await maybe
        return collector.result()

    async def branch_stream(
        self, sandbox_id: str, body: dict[str, Any], collector: BranchCollector[Any], on_progress: ProgressCallback
    ) -> BranchResult:
        """As :meth:`Client.branch_stream`; ``on_progress`` may be a plain or a
        coroutine function."""
        # Each line within the client's own read timeout (a child takes seconds).
        path, streamed = _api.branch_path(sandbox_id), {**body, "stream": True}
        async with self._stream(path, streamed, httpx.USE_CLIENT_DEFAULT) as resp:
            async for line in resp.aiter_lines():
                progress = collector.feed(line)
                if progress is not None:
                    maybe = on_progress(progress)
                    if inspect.isawaitable(maybe):
                        await maybe
        return collector.result()

    @asynccontextmanager
    async def _stream(self, path: str, body: Any, timeout: Any) -> AsyncIterator[httpx.Response]:
        with _transport_errors(self.config):
            async with self._http.stream("POST", path, json=body, timeout=timeout) as resp:
                if resp.status_code >= 400:
                    await resp.aread()
                    _api.raise_for_error(resp)
                yield resp

    async def info(self) -> dict[str, Any]:
        return await self.call(_api.info())

    async def sandboxes(self, metadata: Optional[Mapping[str, str]] = None) -> List[SandboxInfo]:
        return await self.call(_api.list_sandboxes(metadata))

    async def snapshots(self) -> List[Snapshot]:
        return await self.call(_api.list_snapshots())

    async def get_snapshot(self, snapshot_id: str) -> Snapshot:
        return await self.call(_api.get_snapshot(snapshot_id))

    async def delete_snapshot(self, snapshot: Union[Snapshot, str]) -> None:
        await self.call(_api.delete_snapshot(snapshot if isinstance(snapshot, str) else snapshot.id))

    async def aclose(self) -> None:
        await self._http.aclose()

    async def __aenter__(self) -> "AsyncClient":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()
