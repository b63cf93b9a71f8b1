"""The asyncio sandbox API: the same surface as :mod:`zygote.sandbox`,
with coroutines. ``AsyncSandbox.create`` and friends are awaited; the
context manager is ``async with``."""

from __future__ import annotations

from types import TracebackType
from typing import Any, List, Literal, Mapping, Optional, Sequence, Type, Union, overload

from . import _api
from ._api import Command, OnConflict, OutputCallback, TimeBound
from ._branch import BranchCollector, ProgressCallback
from ._client import AsyncClient
from ._code_sandbox import AsyncCodeInterpreter
from ._process import AsyncCommandHandle, AsyncProcessCommands
from .aio_pty import AsyncPty
from ._watch import AsyncWatchHandle
from .errors import SandboxNotFound, ZygoteError
from .models import (
    CommandResult,
    ExposedPort,
    FileEntry,
    KeepResult,
    MergeReport,
    MetricSample,
    SandboxDiff,
    SandboxEvent,
    EgressEntry,
    SandboxInfo,
    SandboxTree,
    Snapshot,
    WriteResult,
)
from .sandbox import DEFAULT_IMAGE

__all__ = ["AsyncSandbox", "AsyncCommands", "AsyncFiles"]


def _client(client: Optional[AsyncClient], url: Optional[str], token: Optional[str]) -> AsyncClient:
    if client is not None:
        if url is not None or token is not None:
            raise ValueError("give either client or url/token, not both")
        return client
    return AsyncClient(url, token)


def _snapshot_id(snapshot: Union[Snapshot, str]) -> str:
    return snapshot if isinstance(snapshot, str) else snapshot.id


class AsyncCommands(AsyncProcessCommands):
    def __init__(self, sandbox: "AsyncSandbox") -> None:
        self._sb = sandbox

    @overload
    async def run(
        self,
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
        background: Literal[False] = False,
    ) -> CommandResult: ...

    @overload
    async def run(
        self,
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
        background: Literal[True],
    ) -> AsyncCommandHandle: ...

    @overload
    async def run(
        self,
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
        background: bool,
    ) -> Union[CommandResult, AsyncCommandHandle]: ...

    async def run(
        self,
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
        background: bool = False,
    ) -> Union[CommandResult, AsyncCommandHandle]:
        """See :meth:`zygote.Commands.run`; callbacks may be coroutine functions."""
        if background:
            return await self._start(
                cmd,
                timeout=timeout,
                on_stdout=on_stdout,
                on_stderr=on_stderr,
                env=env,
                cwd=cwd,
                stdin=stdin,
                check=check,
                user=user,
            )
        return await self._sb.client.exec(
            self._sb.id,
            cmd,
            timeout=timeout,
            on_stdout=on_stdout,
            on_stderr=on_stderr,
            env=env,
            cwd=cwd,
            stdin=stdin,
            check=check,
            user=user,
        )


class AsyncFiles:
    def __init__(self, sandbox: "AsyncSandbox") -> None:
        self._sb = sandbox

    async def read(self, path: str, *, special: bool = False) -> str:
        return (await self.read_bytes(path, special=special)).decode("utf-8")

    async def read_bytes(self, path: str, *, special: bool = False) -> bytes:
        return await self._sb.client.call(_api.read_file(self._sb.id, path, special))

    async def write(self, path: str, data: Union[str, bytes], *, mode: Optional[int] = None) -> WriteResult:
        return await self._sb.client.call(_api.write_file(self._sb.id, path, data, mode))

    async def list(self, path: str = "/") -> List[FileEntry]:
        return await self._sb.client.call(_api.list_dir(self._sb.id, path))

    async def watch(self, path: str, *, recursive: bool = False) -> AsyncWatchHandle:
        """See :meth:`zygote.sandbox.Files.watch`; ``async for`` the handle."""
        return await AsyncWatchHandle(self._sb.client, self._sb.id, path, recursive)._open()


class AsyncSandbox(AsyncCodeInterpreter):
    """asyncio handle on one sandbox; see :class:`zygote.Sandbox`."""

    def __init__(self, sandbox_id: str, *, client: Optional[AsyncClient] = None) -> None:
        self.id = sandbox_id
        self.client = client if client is not None else AsyncClient()
        self.commands = AsyncCommands(self)
        self.files = AsyncFiles(self)
        self.pty = AsyncPty(self)

    def __repr__(self) -> str:
        return f"AsyncSandbox({self.id!r})"

    @classmethod
    async def create(
        cls,
        image: str = DEFAULT_IMAGE,
        *,
        memory_mib: Optional[int] = None,
        vcpus: Optional[int] = None,
        name: Optional[str] = None,
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
        volumes: Optional[Mapping[str, Any]] = None,
        client: Optional[AsyncClient] = None,
        url: Optional[str] = None,
        token: Optional[str] = None,
    ) -> "AsyncSandbox":
        """See :meth:`zygote.Sandbox.create` (``network``, ``allow_out``, ``deny_out``, ``metadata`` included)."""
        c = _client(client, url, token)
        made = await c.call(
            _api.create_sandboxes(
                image=image,
                memory_mib=memory_mib,
                vcpus=vcpus,
                name=name,
                limits=limits,
                ttl_secs=ttl_secs,
                network=network,
                allow_out=allow_out,
                deny_out=deny_out,
                envs=envs,
                secrets=secrets,
                metadata=metadata,
                auto_resume=auto_resume,
                ttl_action=ttl_action,
                volumes=volumes,
            )
        )
        return cls(made[0].id, client=c)

    @classmethod
    async def restore(
        cls,
        snapshot: Union[Snapshot, str],
        *,
        name: Optional[str] = None,
        ttl_secs: Optional[int] = None,
        client: Optional[AsyncClient] = None,
        url: Optional[str] = None,
        token: Optional[str] = None,
    ) -> "AsyncSandbox":
        c = _client(client, url, token)
        made = await c.call(_api.create_sandboxes(snapshot=_snapshot_id(snapshot), name=name, ttl_secs=ttl_secs))
        return cls(made[0].id, client=c)

    @classmethod
    async def connect(
        cls,
        sandbox_id: str,
        *,
        client: Optional[AsyncClient] = None,
        url: Optional[str] = None,
        token: Optional[str] = None,
    ) -> "AsyncSandbox":
        c = _client(client, url, token)
        await c.call(_api.get_sandbox(sandbox_id))
        return cls(sandbox_id, client=c)

    @classmethod
    async def list(
        cls,
        *,
        metadata: Optional[Mapping[str, str]] = None,
        client: Optional[AsyncClient] = None,
        url: Optional[str] = None,
        token: Optional[str] = None,
    ) -> List["AsyncSandbox"]:
        """See :meth:`zygote.Sandbox.list` (``metadata`` filters, ANDed)."""
        c = _client(client, url, token)
        return [cls(s.id, client=c) for s in await c.call(_api.list_sandboxes(metadata))]

    async def info(self) -> SandboxInfo:
        return await self.client.call(_api.get_sandbox(self.id))

    async def is_running(self) -> bool:
        try:
            return (await self.info()).state == "running"
        except SandboxNotFound:
            return False

    async def branch(
        self,
        n: int = 1,
        *,
        ttl_secs: Optional[int] = None,
        env: Optional[Sequence[Mapping[str, str]]] = None,
        allow_partial: bool = False,
        mergeable: bool = False,
        on_progress: Optional[ProgressCallback] = None,
    ) -> List["AsyncSandbox"]:
        """See :meth:`zygote.Sandbox.branch` (raises
        :class:`~zygote.errors.BranchIncomplete` unless ``allow_partial``;
        ``mergeable=True`` keeps the branch point for :meth:`merge`;
        ``on_progress``, a plain or coroutine function, gets each child as
        it comes up)."""
        if on_progress is None:
            res = await self.client.call(_api.branch(self.id, n, ttl_secs, env, mergeable))
        else:
            collector = BranchCollector(n, lambda sid: type(self)(sid, client=self.client))
            body = _api.branch_body(n, ttl_secs, env, mergeable)
            res = await self.client.branch_stream(self.id, body, collector, on_progress)
        children = [type(self)(child, client=self.client) for child in res.children]
        return _api.branch_children(res, n, children, allow_partial=allow_partial)

    async def snapshot(self, mode: str = "full", *, name: Optional[str] = None) -> Snapshot:
        return await self.client.call(_api.create_snapshot(self.id, mode, name))

    async def rollback(self, snapshot: Union[Snapshot, str]) -> SandboxInfo:
        return await self.client.call(_api.restore_in_place(self.id, _snapshot_id(snapshot)))

    async def set_ttl(self, ttl_secs: Optional[int], *, ttl_action: Optional[str] = None) -> SandboxInfo:
        """The daemon deletes this sandbox ``ttl_secs`` from now (replacing any
        earlier deadline); ``None`` keeps it until killed. ``ttl_action``
        (``"delete"`` or ``"pause"``) changes what the deadline does. While the
        sandbox is paused its TTL does not run: it starts whole at resume."""
        return await self.client.call(_api.set_ttl(self.id, ttl_secs, ttl_action))

    async def set_network(
        self,
        *,
        network: Optional[str] = None,
        allow_out: Optional[Sequence[str]] = None,
        deny_out: Optional[Sequence[str]] = None,
    ) -> SandboxInfo:
        """Replaces this sandbox's network policy while it runs or is paused
        (``network``: ``"egress"`` or ``"none"``; IPv4 CIDR lists as at create;
        what is left out is the create default). In force for new connections
        when this returns; branch children made later inherit it."""
        return await self.client.call(_api.set_network(self.id, network, allow_out, deny_out))

    async def pause(self) -> SandboxInfo:
        """Pauses the sandbox to disk: its memory and devices are saved, its VM
        process ends (its memory returns to the host); it keeps its id, files,
        network and lineage, and its TTL stops. Commands and file calls raise
        :class:`~zygote.errors.SandboxPaused` until :meth:`resume` (or resume
        it themselves if it was created with ``auto_resume=True``)."""
        return await self.client.call(_api.pause(self.id))

    async def resume(self) -> SandboxInfo:
        """Brings a paused sandbox back where it was: the same processes, files
        and network; its clock is stepped to now."""
        return await self.client.call(_api.resume(self.id))

    async def egress(self, *, limit: Optional[int] = None) -> List[EgressEntry]:
        """This sandbox's egress record, oldest first: the connections its guest made
        through the daemon's egress proxy (TCP to the ports rules by name cover), each
        with host, address, port, method and path (plain HTTP), allowed or refused and
        why, bytes each way; the last ``limit`` (1..10000, default 1000)."""
        return await self.client.call(_api.egress(self.id, limit=limit))

    async def events(
        self,
        *,
        since_ms: Optional[int] = None,
        until_ms: Optional[int] = None,
        limit: Optional[int] = None,
        newest_first: bool = False,
        level: Optional[str] = None,
        search: Optional[str] = None,
    ) -> List[SandboxEvent]:
        """What happened to this sandbox and in it, oldest first (``newest_first``
        turns that round): started, branched, paused, resumed, commands started and
        how they ended, snapshots, network and timeout changes, its VM stopping.
        ``since_ms``/``until_ms`` (unix milliseconds) bound the time, ``level``
        (``debug``/``info``/``warn``/``error``) keeps that level and above,
        ``search`` keeps messages containing it, ``limit`` (1..1000, default 100)
        the first that many. A branch child's log starts at the branch."""
        return await self.client.call(
            _api.events(
                self.id,
                since_ms=since_ms,
                until_ms=until_ms,
                limit=limit,
                newest_first=newest_first,
                level=level,
                search=search,
            )
        )

    async def tree(self) -> SandboxTree:
        """The lineage: topmost existing ancestor and every descendant, with
        each one's unique memory (what deleting it gives back) and disk layer
        bytes, plus snapshots/branch points."""
        return await self.client.call(_api.tree(self.id))

    async def diff(
        self, other: Union["AsyncSandbox", str], path: str = "/root", *, content: bool = False
    ) -> SandboxDiff:
        """How this sandbox's files under ``path`` differ from ``other``'s
        (a sibling, the parent, any sandbox): ``added`` (only here),
        ``removed`` (only there) and ``modified``; with ``content=True`` each
        modified text file up to 256 KiB carries its unified diff."""
        other_id = other if isinstance(other, str) else other.id
        return await self.client.call(_api.diff(self.id, other_id, path, content))

    async def keep(self, *, promote: bool = False) -> KeepResult:
        """Keep this branch child: delete its siblings (other children of its
        branch point) and their descendants; with ``promote=True`` also delete
        the parent and take its name (see :meth:`zygote.Sandbox.keep`)."""
        return await self.client.call(_api.keep(self.id, promote))

    async def merge(
        self,
        other: Union["AsyncSandbox", str],
        paths: Optional[Sequence[str]] = None,
        *,
        on_conflict: OnConflict = "fail",
        dry_run: bool = False,
    ) -> MergeReport:
        """See :meth:`zygote.Sandbox.merge`: raises
        :class:`~zygote.errors.MergeConflictError` (with ``.report``) when
        conflicts stopped it and ``on_conflict`` is ``"fail"``."""
        other_id = other if isinstance(other, str) else other.id
        report = await self.client.call(_api.merge(self.id, other_id, paths, on_conflict, dry_run))
        return _api.merged(report, dry_run)

    async def expose_port(self, port: int, *, public: bool = False) -> ExposedPort:
        """See :meth:`zygote.Sandbox.expose_port`."""
        return await self.client.call(_api.expose_port(self.id, port, public))

    async def ports(self) -> List[ExposedPort]:
        return await self.client.call(_api.list_ports(self.id))

    async def unexpose_port(self, port: int) -> None:
        await self.client.call(_api.unexpose_port(self.id, port))

    async def get_host(self, port: int) -> str:
        """See :meth:`zygote.Sandbox.get_host` (exposes the port first if it is not yet)."""
        found = _api.find_port(await self.ports(), port)
        if found is None:
            try:
                found = await self.expose_port(port)
            except ZygoteError as e:
                # Exposed by someone else since the listing: use that.
                found = _api.find_port(await self.ports(), port) if _api.already_exposed(e) else None
                if found is None:
                    raise
        return found.host

    async def metrics(self, start: TimeBound = None, end: TimeBound = None) -> List[MetricSample]:
        """The samples the daemon took of this sandbox between ``start`` and
        ``end`` (inclusive; unix seconds or datetimes; both optional), oldest
        first: one every few seconds while it runs (none while paused), the
        newest 720 kept in the daemon's memory (lost when it restarts)."""
        return await self.client.call(_api.metrics(self.id, start, end))

    async def logs(self) -> str:
        return await self.client.call(_api.logs(self.id))

    async def kill(self) -> bool:
        try:
            await self.client.call(_api.delete_sandbox(self.id))
        except SandboxNotFound:
            return False
        return True

    async def __aenter__(self) -> "AsyncSandbox":
        return self

    async def __aexit__(
        self,
        exc_type: Optional[Type[BaseException]],
        exc: Optional[BaseException],
        tb: Optional[TracebackType],
    ) -> None:
        try:
            await self.kill()
        except Exception:
            if exc is None:
                raise
