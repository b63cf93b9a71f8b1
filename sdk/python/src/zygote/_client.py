"""HTTP clients (sync and async) that send :class:`~zygote._api.Call` s.

A client holds one connection pool and the daemon's address and token;
sandboxes made from it (and their branches) share it. Closing it is
optional for short scripts (connections are released when it is garbage
collected) but long-running programs should use it as a context manager.
"""

from __future__ import annotations

import asyncio
import inspect
import os
import secrets
import ssl
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path
from typing import IO, Any, AsyncIterator, Callable, Iterator, List, Mapping, Optional, TypeVar, Union

import httpx

from . import _api, _code, _transfer
from ._api import Call, Command, ExecCollector, OutputCallback
from ._branch import BranchCollector, ProgressCallback
from ._code import CodeCollector, CodeContext, Execution, ExecutionError, Result
from ._config import Config, Verify, resolve
from ._transfer import CHUNK, Transfer, TransferCallback, TransferCollector
from ._version import __version__
from .errors import ConnectionFailed, RequestTimeout, ServerError
from .models import BranchResult, CommandResult, Image, PushResult, SandboxInfo, Snapshot, Volume

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


def _snapshot_id(snapshot: Union[Snapshot, str]) -> str:
    return snapshot if isinstance(snapshot, str) else snapshot.id


# A path for export and import: a str or a path object.
StrPath = Union[str, "os.PathLike[str]"]


def _partial(dest: Path) -> Path:
    """Where an export is written before it is complete (then renamed to ``dest``)."""
    return dest.with_name(f".{dest.name}.{secrets.token_hex(4)}.part")


def _cut_short(what: str, e: Exception) -> ServerError:
    # The daemon ends a body it cannot finish by breaking the connection, so a
    # partial pack is never mistaken for a whole one.
    return ServerError(f"the {what} was cut short: {e}", code="stream_ended")


def _import_headers(size: int) -> dict[str, str]:
    return {"Content-Type": "application/x-tar", "Content-Length": str(size)}


def _stream_timeout(timeout: Optional[float]) -> httpx.Timeout:
    return httpx.Timeout(
        connect=DEFAULT_HTTP_TIMEOUT.connect,
        read=_api.stream_read_timeout(timeout),
        write=DEFAULT_HTTP_TIMEOUT.write,
        pool=DEFAULT_HTTP_TIMEOUT.pool,
    )


def _code_timeout(timeout: Optional[float]) -> httpx.Timeout:
    return httpx.Timeout(
        connect=DEFAULT_HTTP_TIMEOUT.connect,
        read=_code.read_timeout(timeout),
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
        user: Optional[Union[str, int]] = None,
    ) -> CommandResult:
        """Runs a command through the streaming endpoint, calling
        ``on_stdout``/``on_stderr`` as output arrives."""
        body = _api.exec_body(cmd, timeout=timeout, env=env, cwd=cwd, stdin=stdin, user=user)
        collector = ExecCollector(cmd, on_stdout, on_stderr, check)
        for line in self._stream_lines(_api.exec_path(sandbox_id), body, _stream_timeout(timeout)):
            for cb, text in collector.feed(line):
                cb(text)
        return collector.result()

    def run_code(
        self,
        sandbox_id: str,
        code: str,
        *,
        context: Optional[Union[str, CodeContext]] = None,
        timeout: Optional[float] = None,
        envs: Optional[Mapping[str, str]] = None,
        on_stdout: Optional[Callable[[str], None]] = None,
        on_stderr: Optional[Callable[[str], None]] = None,
        on_result: Optional[Callable[[Result], None]] = None,
        on_error: Optional[Callable[[ExecutionError], None]] = None,
    ) -> Execution:
        """Runs Python in the sandbox's code interpreter (image ``code-interpreter``),
        calling the callbacks as events arrive; see :class:`~zygote.Execution`. ``envs``:
        environment variables for this execution only."""
        body = _code.code_body(code, context=context, timeout=timeout, envs=envs)
        collector = CodeCollector(on_stdout, on_stderr, on_result, on_error)
        for line in self._stream_lines(_code.code_path(sandbox_id), body, _code_timeout(timeout)):
            for cb, arg in collector.feed(line):
                cb(arg)
        return collector.result()

    def branch_stream(
        self, sandbox_id: str, body: dict[str, Any], collector: BranchCollector[Any], on_progress: ProgressCallback
    ) -> BranchResult:
        """A branch through the streaming endpoint: ``on_progress`` gets each
        child as it comes up (or fails); returns the summary."""
        path, streamed = _api.branch_path(sandbox_id), {**body, "stream": True}
        for line in self._stream_lines(path, streamed, httpx.USE_CLIENT_DEFAULT):
            progress = collector.feed(line)
            if progress is not None:
                on_progress(progress)
        return collector.result()

    def _stream_lines(self, path: str, body: Any, timeout: Any) -> Iterator[str]:
        """The NDJSON lines of ``POST path`` as they arrive (an error status raises)."""
        with _transport_errors(self.config):
            with self._http.stream("POST", path, json=body, timeout=timeout) as resp:
                if resp.status_code >= 400:
                    resp.read()
                    _api.raise_for_error(resp)
                yield from resp.iter_lines()

    def transfer(self, transfer: Transfer[T], on_progress: Optional[TransferCallback] = None) -> T:
        """An image pull or a snapshot push or pull (NDJSON): ``on_progress``
        gets each progress line; returns what the final line carries."""
        collector = TransferCollector(transfer)
        with _transport_errors(self.config):
            with self._http.stream("POST", transfer.path, json=transfer.body) as resp:
                if resp.status_code >= 400:
                    resp.read()
                    _api.raise_for_error(resp)
                for line in resp.iter_lines():
                    progress = collector.feed(line)
                    if progress is not None and on_progress is not None:
                        on_progress(progress)
        return collector.result()

    # Images and snapshot packs.

    def images(self) -> List[Image]:
        """The images sandboxes can boot: built ones (``minimal``) and OCI
        images pulled or imported (with ``source`` and ``digest``)."""
        return self.call(_api.list_images())

    def pull_image(
        self,
        reference: str,
        *,
        username: Optional[str] = None,
        password: Optional[str] = None,
        on_progress: Optional[TransferCallback] = None,
    ) -> Image:
        """Pulls an OCI image (``alpine:3.20``, ``registry.example:5000/team/app:1.4``,
        ``app@sha256:...``) into the daemon and converts it; returns the image,
        whose ``name`` ``Sandbox.create(image=...)`` takes (so does the reference:
        a create pulls on first use). ``username``/``password`` are for this pull
        only (else the daemon's docker config). ``on_progress`` gets each
        :class:`~zygote.TransferProgress` (``resolved``, ``layer``, ``progress``).

        Raises :class:`~zygote.errors.ImageNotFound`,
        :class:`~zygote.errors.RegistryUnauthorized`,
        :class:`~zygote.errors.UnsupportedPlatform`, :class:`~zygote.errors.BadImage`,
        :class:`~zygote.errors.ImageTooLarge` or :class:`~zygote.errors.RegistryError`."""
        return self.transfer(_transfer.pull_image(reference, username, password), on_progress)

    def push_snapshot(
        self,
        snapshot: Union[Snapshot, str],
        reference: str,
        *,
        username: Optional[str] = None,
        password: Optional[str] = None,
        on_progress: Optional[TransferCallback] = None,
    ) -> PushResult:
        """Pushes a snapshot to a registry as one OCI artifact (its base image,
        disk and memory state); blobs the registry has are not sent again.
        ``on_progress`` gets ``blob`` and ``progress`` lines. The pack holds the
        guest's memory: push it only where you would keep the sandbox."""
        t = _transfer.push_snapshot(_snapshot_id(snapshot), reference, username, password)
        return self.transfer(t, on_progress)

    def pull_snapshot(
        self,
        reference: str,
        *,
        name: Optional[str] = None,
        username: Optional[str] = None,
        password: Optional[str] = None,
        on_progress: Optional[TransferCallback] = None,
    ) -> Snapshot:
        """Pulls a snapshot pack (pushed by :meth:`push_snapshot`, here or on
        another host) and registers it as a new snapshot (``name``: default the
        exported one's); ``Sandbox.restore`` starts sandboxes from it. Its
        ``pack`` says where it came from. ``Sandbox.restore(reference)`` pulls on
        first use too."""
        return self.transfer(_transfer.pull_snapshot(reference, name, username, password), on_progress)

    def export_snapshot(self, snapshot: Union[Snapshot, str], path: StrPath) -> int:
        """Writes a snapshot's pack (a tar) to the file ``path``, streamed as
        the daemon sends it; returns its size in bytes. The file appears only
        once it is complete. It holds the guest's memory: keep it as you would
        the sandbox."""
        dest = Path(path)
        part = _partial(dest)
        written = 0
        try:
            with _transport_errors(self.config):
                with self._http.stream("GET", _transfer.export_path(_snapshot_id(snapshot))) as resp:
                    if resp.status_code >= 400:
                        resp.read()
                        _api.raise_for_error(resp)
                    with open(part, "wb") as f:
                        try:
                            for chunk in resp.iter_bytes(CHUNK):
                                f.write(chunk)
                                written += len(chunk)
                        except (httpx.RemoteProtocolError, httpx.ReadError) as e:
                            raise _cut_short(f"export of {_snapshot_id(snapshot)}", e) from e
            os.replace(part, dest)
        finally:
            part.unlink(missing_ok=True)
        return written

    def import_snapshot(self, path: StrPath, *, name: Optional[str] = None) -> Snapshot:
        """Uploads a pack file (made by :meth:`export_snapshot`), streamed from
        disk, and registers it as a new snapshot (``name``: default the
        exported one's). A damaged pack raises :class:`~zygote.errors.BadImage`
        with nothing registered."""
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size

            def chunks() -> Iterator[bytes]:
                while chunk := f.read(CHUNK):
                    yield chunk

            with _transport_errors(self.config):
                resp = self._http.post(
                    _transfer.IMPORT_PATH,
                    params=_transfer.import_params(name),
                    content=chunks(),
                    headers=_import_headers(size),
                )
        _api.raise_for_error(resp)
        return Snapshot.from_json(_api._json(resp))

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
        self.call(_api.delete_snapshot(_snapshot_id(snapshot)))

    def create_volume(self, name: str, *, size_mib: Optional[int] = None) -> Volume:
        """A new empty volume (ext4, sparse on the host; 1024 MiB unless given)."""
        return self.call(_api.create_volume(name, size_mib))

    def volumes(self) -> List[Volume]:
        return self.call(_api.list_volumes())

    def get_volume(self, volume: str) -> Volume:
        """A volume by name or id."""
        return self.call(_api.get_volume(volume))

    def delete_volume(self, volume: Union[Volume, str]) -> None:
        """Deletes a volume and its data; refused (Conflict) while a sandbox has it."""
        self.call(_api.delete_volume(volume.id if isinstance(volume, Volume) else volume))

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
        user: Optional[Union[str, int]] = None,
    ) -> CommandResult:
        """As :meth:`Client.exec`; callbacks may be plain or coroutine functions."""
        body = _api.exec_body(cmd, timeout=timeout, env=env, cwd=cwd, stdin=stdin, user=user)
        collector = ExecCollector(cmd, on_stdout, on_stderr, check)
        async with self._stream(_api.exec_path(sandbox_id), body, _stream_timeout(timeout)) as resp:
            async for line in resp.aiter_lines():
                for cb, text in collector.feed(line):
                    maybe = cb(text)
                    if inspect.isawaitable(maybe):
                        await maybe
        return collector.result()

    async def run_code(
        self,
        sandbox_id: str,
        code: str,
        *,
        context: Optional[Union[str, CodeContext]] = None,
        timeout: Optional[float] = None,
        envs: Optional[Mapping[str, str]] = None,
        on_stdout: Optional[_code.Callback] = None,
        on_stderr: Optional[_code.Callback] = None,
        on_result: Optional[_code.Callback] = None,
        on_error: Optional[_code.Callback] = None,
    ) -> Execution:
        """As :meth:`Client.run_code`; callbacks may be plain or coroutine functions."""
        body = _code.code_body(code, context=context, timeout=timeout, envs=envs)
        collector = CodeCollector(on_stdout, on_stderr, on_result, on_error)
        async with self._stream(_code.code_path(sandbox_id), body, _code_timeout(timeout)) as resp:
            async for line in resp.aiter_lines():
                for cb, arg in collector.feed(line):
                    maybe = cb(arg)
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

    async def transfer(self, transfer: Transfer[T], on_progress: Optional[TransferCallback] = None) -> T:
        """As :meth:`Client.transfer`; ``on_progress`` may be a plain or a
        coroutine function."""
        collector = TransferCollector(transfer)
        async with self._stream(transfer.path, transfer.body, httpx.USE_CLIENT_DEFAULT) as resp:
            async for line in resp.aiter_lines():
                progress = collector.feed(line)
                if progress is not None and on_progress is not None:
                    maybe = on_progress(progress)
                    if inspect.isawaitable(maybe):
                        await maybe
        return collector.result()

    async def images(self) -> List[Image]:
        """See :meth:`Client.images`."""
        return await self.call(_api.list_images())

    async def pull_image(
        self,
        reference: str,
        *,
        username: Optional[str] = None,
        password: Optional[str] = None,
        on_progress: Optional[TransferCallback] = None,
    ) -> Image:
        """See :meth:`Client.pull_image`."""
        return await self.transfer(_transfer.pull_image(reference, username, password), on_progress)

    async def push_snapshot(
        self,
        snapshot: Union[Snapshot, str],
        reference: str,
        *,
        username: Optional[str] = None,
        password: Optional[str] = None,
        on_progress: Optional[TransferCallback] = None,
    ) -> PushResult:
        """See :meth:`Client.push_snapshot`."""
        t = _transfer.push_snapshot(_snapshot_id(snapshot), reference, username, password)
        return await self.transfer(t, on_progress)

    async def pull_snapshot(
        self,
        reference: str,
        *,
        name: Optional[str] = None,
        username: Optional[str] = None,
        password: Optional[str] = None,
        on_progress: Optional[TransferCallback] = None,
    ) -> Snapshot:
        """See :meth:`Client.pull_snapshot`."""
        return await self.transfer(_transfer.pull_snapshot(reference, name, username, password), on_progress)

    async def export_snapshot(self, snapshot: Union[Snapshot, str], path: StrPath) -> int:
        """See :meth:`Client.export_snapshot` (file writes run in a thread)."""
        dest = Path(path)
        part = _partial(dest)
        written = 0
        try:
            with _transport_errors(self.config):
                async with self._http.stream("GET", _transfer.export_path(_snapshot_id(snapshot))) as resp:
                    if resp.status_code >= 400:
                        await resp.aread()
                        _api.raise_for_error(resp)
                    f: IO[bytes] = await asyncio.to_thread(open, part, "wb")
                    try:
                        async for chunk in resp.aiter_bytes(CHUNK):
                            await asyncio.to_thread(f.write, chunk)
                            written += len(chunk)
                    except (httpx.RemoteProtocolError, httpx.ReadError) as e:
                        raise _cut_short(f"export of {_snapshot_id(snapshot)}", e) from e
                    finally:
                        await asyncio.to_thread(f.close)
            os.replace(part, dest)
        finally:
            part.unlink(missing_ok=True)
        return written

    async def import_snapshot(self, path: StrPath, *, name: Optional[str] = None) -> Snapshot:
        """See :meth:`Client.import_snapshot` (file reads run in a thread)."""
        f: IO[bytes] = await asyncio.to_thread(open, path, "rb")
        try:
            size = os.fstat(f.fileno()).st_size

            async def chunks() -> AsyncIterator[bytes]:
                while chunk := await asyncio.to_thread(f.read, CHUNK):
                    yield chunk

            with _transport_errors(self.config):
                resp = await self._http.post(
                    _transfer.IMPORT_PATH,
                    params=_transfer.import_params(name),
                    content=chunks(),
                    headers=_import_headers(size),
                )
        finally:
            f.close()
        _api.raise_for_error(resp)
        return Snapshot.from_json(_api._json(resp))

    async def info(self) -> dict[str, Any]:
        return await self.call(_api.info())

    async def sandboxes(self, metadata: Optional[Mapping[str, str]] = None) -> List[SandboxInfo]:
        return await self.call(_api.list_sandboxes(metadata))

    async def snapshots(self) -> List[Snapshot]:
        return await self.call(_api.list_snapshots())

    async def get_snapshot(self, snapshot_id: str) -> Snapshot:
        return await self.call(_api.get_snapshot(snapshot_id))

    async def delete_snapshot(self, snapshot: Union[Snapshot, str]) -> None:
        await self.call(_api.delete_snapshot(_snapshot_id(snapshot)))

    async def create_volume(self, name: str, *, size_mib: Optional[int] = None) -> Volume:
        return await self.call(_api.create_volume(name, size_mib))

    async def volumes(self) -> List[Volume]:
        return await self.call(_api.list_volumes())

    async def get_volume(self, volume: str) -> Volume:
        return await self.call(_api.get_volume(volume))

    async def delete_volume(self, volume: Union[Volume, str]) -> None:
        await self.call(_api.delete_volume(volume.id if isinstance(volume, Volume) else volume))

    async def aclose(self) -> None:
        await self._http.aclose()

    async def __aenter__(self) -> "AsyncClient":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()
