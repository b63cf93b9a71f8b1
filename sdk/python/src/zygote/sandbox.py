"""The synchronous sandbox API."""

from __future__ import annotations

from types import TracebackType
from typing import Any, List, Literal, Mapping, Optional, Sequence, Type, Union, overload

from . import _api
from ._api import Command, OnConflict, OutputCallback, TimeBound
from ._branch import BranchCollector, ProgressCallback
from ._client import Client
from ._code_sandbox import CodeInterpreter
from ._process import CommandHandle, ProcessCommands
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
from .pty import Pty
from ._watch import WatchHandle

__all__ = ["Sandbox", "Commands", "Files"]

DEFAULT_IMAGE = "minimal"


def _client(client: Optional[Client], url: Optional[str], token: Optional[str]) -> Client:
    if client is not None:
        if url is not None or token is not None:
            raise ValueError("give either client or url/token, not both")
        return client
    return Client(url, token)


def _snapshot_id(snapshot: Union[Snapshot, str]) -> str:
    return snapshot if isinstance(snapshot, str) else snapshot.id


class Commands(ProcessCommands):
    """``sb.commands``: programs in the sandbox (background ones too:
    ``list``, ``connect``, ``kill``, ``signal``, ``send_stdin``)."""

    def __init__(self, sandbox: "Sandbox") -> None:
        self._sb = sandbox

    @overload
    def run(
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
    def run(
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
    ) -> CommandHandle: ...

    @overload
    def run(
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
    ) -> Union[CommandResult, CommandHandle]: ...

    def run(
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
    ) -> Union[CommandResult, CommandHandle]:
        """Runs ``cmd`` (a shell command line, or an argv list) and waits
        for it. Output is streamed: ``on_stdout``/``on_stderr`` get text as
        the program prints it.

        ``timeout`` is in seconds (None: no limit); past it the program is
        killed and :class:`~zygote.errors.CommandTimeout` raised (its
        ``result`` holds the output so far). A non-zero exit is returned,
        not raised, unless ``check=True`` (then
        :class:`~zygote.errors.CommandFailed`).

        With ``background=True`` it returns once the program runs: a
        :class:`~zygote.CommandHandle` (``pid``, ``wait()``, ``kill()``,
        ``send_stdin()``...) whose ``wait()`` follows the output (to the
        callbacks) and returns or raises as above. ``timeout`` still bounds
        the program's whole run (pass ``None`` for a server); its stdin stays
        open, ``stdin`` is written first.

        ``user`` runs it as ``"root"``, a uid (``1000`` or ``"1000"``, group 0)
        or ``"UID:GID"`` (numeric, like ``docker exec -u``). By default, and
        for ``env`` and ``cwd`` left out, the sandbox's OCI image decides (its
        ``User``, ``Env`` and ``WorkingDir``); otherwise root in ``/``.
        """
        if background:
            return self._start(
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
        return self._sb.client.exec(
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


class Files:
    """``sb.files``: the guest's file system (absolute paths)."""

    def __init__(self, sandbox: "Sandbox") -> None:
        self._sb = sandbox

    def read(self, path: str, *, special: bool = False) -> str:
        """The file as UTF-8 text (use :meth:`read_bytes` for binary files).
        Raises :class:`~zygote.errors.FileNotFound`. A device, FIFO or socket is
        refused unless ``special=True`` (then read up to the daemon's 64 MiB limit)."""
        return self.read_bytes(path, special=special).decode("utf-8")

    def read_bytes(self, path: str, *, special: bool = False) -> bytes:
        return self._sb.client.call(_api.read_file(self._sb.id, path, special))

    def write(self, path: str, data: Union[str, bytes], *, mode: Optional[int] = None) -> WriteResult:
        """Atomically replaces ``path`` (parent directories are created);
        ``mode`` is permission bits, e.g. ``0o755``."""
        return self._sb.client.call(_api.write_file(self._sb.id, path, data, mode))

    def list(self, path: str = "/") -> List[FileEntry]:
        """Entries of a directory."""
        return self._sb.client.call(_api.list_dir(self._sb.id, path))

    def watch(self, path: str, *, recursive: bool = False) -> WatchHandle:
        """Watches the directory ``path`` (with ``recursive``, every directory
        below it, new ones too): iterate the handle for :class:`~zygote.WatchEvent`\\ s
        as they happen, ``stop()`` it to end the watch. Changes made after this
        returns are reported. Raises :class:`~zygote.errors.FileNotFound` for a
        missing directory."""
        return WatchHandle(self._sb.client, self._sb.id, path, recursive)


class Sandbox(CodeInterpreter):
    """A handle on one sandbox (a microVM).

    Make one with :meth:`create`, :meth:`restore`, :meth:`connect` or
    :meth:`branch`; ``Sandbox(id, client=...)`` wraps a known id without a
    request. As a context manager it kills the sandbox on exit.
    """

    def __init__(self, sandbox_id: str, *, client: Optional[Client] = None) -> None:
        self.id = sandbox_id
        self.client = client if client is not None else Client()
        self.commands = Commands(self)
        self.files = Files(self)
        self.pty = Pty(self)

    def __repr__(self) -> str:
        return f"Sandbox({self.id!r})"

    # --- making sandboxes ---------------------------------------------------

    @classmethod
    def create(
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
        client: Optional[Client] = None,
        url: Optional[str] = None,
        token: Optional[str] = None,
    ) -> "Sandbox":
        """Boots a sandbox from an image and returns once its agent answers.

        ``image`` is a built image's name (``minimal``) or an OCI image
        reference (``python:3.12-slim``, ``registry.example:5000/team/app:1.4``),
        pulled on first use (:meth:`Client.pull_image` pulls ahead, with
        progress and credentials); its ``Env``, ``WorkingDir`` and ``User`` are
        the defaults of every command.

        ``limits`` are cgroup limits (``memory_mib``, ``cpu_percent``, ``pids``).
        With ``ttl_secs`` the daemon deletes the sandbox that many seconds
        after it is running, even if this process dies first (see :meth:`set_ttl`);
        with ``ttl_action="pause"`` it pauses it instead (see :meth:`pause`).
        ``auto_resume=True``: commands and file calls on it while it is paused
        resume it first (otherwise they raise :class:`~zygote.errors.SandboxPaused`).

        ``network`` is ``"egress"`` (the daemon's default: outbound traffic
        through NAT) or ``"none"`` (no traffic at all). ``allow_out`` (IPv4
        CIDRs such as ``"10.77.0.0/24"``, single addresses, or domain names such
        as ``"pypi.org"`` and ``"*.github.com"``, optionally ``":port"``; names
        cover TCP 80 and 443 by default and are the only ones that resolve) makes
        those the only destinations allowed (an empty list allows none);
        ``deny_out`` destinations are always refused. Branch children inherit the policy.

        ``envs`` are environment variables every command in the sandbox gets
        (a command's own ``env`` wins); ``secrets`` too, but the daemon never
        shows their values, and one given as ``{"value": ..., "inherit": False}``
        is not passed to branch children. Neither is written into the guest.
        A secret given as ``{"value": ..., "hosts": ["api.openai.com"]}`` is bound
        to those hosts: commands see only a placeholder, and the daemon's egress
        proxy puts the value into the headers of HTTPS requests to those hosts
        alone, so it never enters the guest (nor a snapshot or branch child).

        ``metadata`` are your own labels (``{"team": "search"}``; at most 63
        keys of 1-128 characters of ``A-Za-z0-9._-/``, values up to 1024 bytes;
        keys starting ``zygote.`` are reserved): shown in :meth:`info`, kept by
        branch children (which add ``zygote.parent``), and usable to filter
        :meth:`list`. Invalid ones raise :class:`~zygote.errors.InvalidArgument`.

        ``volumes`` mounts named volumes: ``{"/data": "my-vol"}`` (a name, an id
        or a :class:`~zygote.models.Volume`; see :meth:`Client.create_volume`).
        This sandbox writes them (one sandbox at a time: another create naming
        one raises :class:`~zygote.errors.Conflict`); its branch children see a
        copy-on-write view.
        """
        c = _client(client, url, token)
        made = c.call(
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
    def restore(
        cls,
        snapshot: Union[Snapshot, str],
        *,
        name: Optional[str] = None,
        ttl_secs: Optional[int] = None,
        client: Optional[Client] = None,
        url: Optional[str] = None,
        token: Optional[str] = None,
    ) -> "Sandbox":
        """A new sandbox started from a snapshot (its memory, processes and
        files): a snapshot, its id, or the reference of a snapshot pack in a
        registry (``registry.example:5000/team/warm:v1``, pulled on first use;
        see :meth:`Client.pull_snapshot`). To roll an existing sandbox back
        instead, use :meth:`rollback`."""
        c = _client(client, url, token)
        made = c.call(_api.create_sandboxes(snapshot=_snapshot_id(snapshot), name=name, ttl_secs=ttl_secs))
        return cls(made[0].id, client=c)

    @classmethod
    def connect(
        cls,
        sandbox_id: str,
        *,
        client: Optional[Client] = None,
        url: Optional[str] = None,
        token: Optional[str] = None,
    ) -> "Sandbox":
        """A handle on an existing sandbox; raises :class:`SandboxNotFound`."""
        c = _client(client, url, token)
        c.call(_api.get_sandbox(sandbox_id))
        return cls(sandbox_id, client=c)

    @classmethod
    def list(
        cls,
        *,
        metadata: Optional[Mapping[str, str]] = None,
        client: Optional[Client] = None,
        url: Optional[str] = None,
        token: Optional[str] = None,
    ) -> List["Sandbox"]:
        """Handles on the daemon's sandboxes; with ``metadata``, only those
        whose metadata has every one of those pairs, e.g.
        ``Sandbox.list(metadata={"zygote.parent": sb.id})`` for a sandbox's
        branch children."""
        c = _client(client, url, token)
        return [cls(s.id, client=c) for s in c.call(_api.list_sandboxes(metadata))]

    # --- this sandbox ---------------------------------------------------------

    def info(self) -> SandboxInfo:
        """Current state from the daemon."""
        return self.client.call(_api.get_sandbox(self.id))

    def is_running(self) -> bool:
        try:
            return self.info().state == "running"
        except SandboxNotFound:
            return False

    def branch(
        self,
        n: int = 1,
        *,
        ttl_secs: Optional[int] = None,
        env: Optional[Sequence[Mapping[str, str]]] = None,
        allow_partial: bool = False,
        mergeable: bool = False,
        on_progress: Optional[ProgressCallback] = None,
    ) -> List["Sandbox"]:
        """Forks this sandbox's live state into ``n`` children (memory,
        processes and files, copy-on-write). Each child then diverges
        independently; this sandbox keeps running. Children get ``ttl_secs``,
        or without it this sandbox's TTL (counted from their start). ``env``
        (one mapping per child) adds to each child's environment, over this
        sandbox's ``envs``: tokens, seeds, task ids.

        When only some of the children came up it raises
        :class:`~zygote.errors.BranchIncomplete`, which carries the running
        ones (``.children``) and the causes (``.failures``); with
        ``allow_partial=True`` it returns the running children instead.
        When none came up the daemon's error is raised.

        ``mergeable=True`` keeps the branch point's state so the children can
        later be merged into this sandbox or into each other (:meth:`merge`);
        the qemu runtime always keeps it, the kvm runtime only when asked (it
        costs a memory file of this sandbox, written after the children run).

        ``on_progress`` (a callable taking a :class:`~zygote.BranchProgress`)
        is called for each child as soon as it runs or fails, in the order
        they finish, with a handle on it: large fan-outs (up to 256 children)
        can be followed, and a child used, while its siblings still come up.
        The return value is the same."""
        if on_progress is None:
            res = self.client.call(_api.branch(self.id, n, ttl_secs, env, mergeable))
        else:
            collector = BranchCollector(n, lambda sid: type(self)(sid, client=self.client))
            body = _api.branch_body(n, ttl_secs, env, mergeable)
            res = self.client.branch_stream(self.id, body, collector, on_progress)
        children = [type(self)(child, client=self.client) for child in res.children]
        return _api.branch_children(res, n, children, allow_partial=allow_partial)

    def snapshot(self, mode: str = "full", *, name: Optional[str] = None) -> Snapshot:
        """Saves this sandbox's state; ``mode`` is a snapshot kind the runtime
        supports (``full``; ``diff``/``live`` on the kvm runtime)."""
        return self.client.call(_api.create_snapshot(self.id, mode, name))

    def rollback(self, snapshot: Union[Snapshot, str]) -> SandboxInfo:
        """Restores this sandbox in place to ``snapshot`` (a snapshot of it
        or of its lineage); its id stays the same."""
        return self.client.call(_api.restore_in_place(self.id, _snapshot_id(snapshot)))

    def set_ttl(self, ttl_secs: Optional[int], *, ttl_action: Optional[str] = None) -> SandboxInfo:
        """The daemon deletes this sandbox ``ttl_secs`` from now (replacing any
        earlier deadline); ``None`` keeps it until killed. ``ttl_action``
        (``"delete"`` or ``"pause"``) changes what the deadline does. While the
        sandbox is paused its TTL does not run: it starts whole at resume."""
        return self.client.call(_api.set_ttl(self.id, ttl_secs, ttl_action))

    def set_network(
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
        return self.client.call(_api.set_network(self.id, network, allow_out, deny_out))

    def pause(self) -> SandboxInfo:
        """Pauses the sandbox to disk: its memory and devices are saved, its VM
        process ends (its memory returns to the host); it keeps its id, files,
        network and lineage, and its TTL stops. Commands and file calls raise
        :class:`~zygote.errors.SandboxPaused` until :meth:`resume` (or resume
        it themselves if it was created with ``auto_resume=True``)."""
        return self.client.call(_api.pause(self.id))

    def resume(self) -> SandboxInfo:
        """Brings a paused sandbox back where it was: the same processes, files
        and network; its clock is stepped to now."""
        return self.client.call(_api.resume(self.id))

    def egress(self, *, limit: Optional[int] = None) -> List[EgressEntry]:
        """This sandbox's egress record, oldest first: the connections its guest made
        through the daemon's egress proxy (TCP to the ports rules by name cover), each
        with host, address, port, method and path (plain HTTP), allowed or refused and
        why, bytes each way; the last ``limit`` (1..10000, default 1000)."""
        return self.client.call(_api.egress(self.id, limit=limit))

    def events(
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
        return self.client.call(
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

    def tree(self) -> SandboxTree:
        """The lineage: topmost existing ancestor and every descendant, with
        each one's unique memory (what deleting it gives back) and disk layer
        bytes, plus snapshots/branch points."""
        return self.client.call(_api.tree(self.id))

    def diff(
        self, other: Union["Sandbox", str], path: str = "/root", *, content: bool = False
    ) -> SandboxDiff:
        """How this sandbox's files under ``path`` differ from ``other``'s
        (a sibling, the parent, any sandbox): ``added`` (only here),
        ``removed`` (only there) and ``modified``; with ``content=True`` each
        modified text file up to 256 KiB carries its unified diff."""
        other_id = other if isinstance(other, str) else other.id
        return self.client.call(_api.diff(self.id, other_id, path, content))

    def keep(self, *, promote: bool = False) -> KeepResult:
        """Keep this branch child: delete its siblings (other children of its
        branch point) and their descendants; with ``promote=True`` also delete
        the parent and take its name.

        Raises :class:`~zygote.errors.ConflictError` when this sandbox is not a
        branch child, has no siblings left (without ``promote``), or has no
        parent left to promote over."""
        return self.client.call(_api.keep(self.id, promote))

    def merge(
        self,
        other: Union["Sandbox", str],
        paths: Optional[Sequence[str]] = None,
        *,
        on_conflict: OnConflict = "fail",
        dry_run: bool = False,
    ) -> MergeReport:
        """Brings the changes ``other`` made to its files under ``paths``
        (directories, default ``["/root"]``) since the two parted into this
        sandbox, three-way: ``other`` is a child (of a ``mergeable`` branch),
        a sibling or any sandbox of the same tree. What this sandbox changed
        itself is kept. Returns the :class:`~zygote.models.MergeReport`.

        Where both changed a path differently, ``on_conflict`` decides:
        ``"fail"`` (the default) changes nothing and raises
        :class:`~zygote.errors.MergeConflictError`, whose ``.report`` and
        ``.conflicts`` say what conflicts; ``"theirs"`` takes ``other``'s
        version, ``"ours"`` keeps this one's (each conflict's ``resolution``
        says which). ``dry_run=True`` reports what would be done, conflicts
        included, and raises nothing.

        Raises :class:`~zygote.errors.ConflictError` when the two are not of
        one tree, or their common state was not kept (on the kvm runtime,
        branch with ``mergeable=True``)."""
        other_id = other if isinstance(other, str) else other.id
        report = self.client.call(_api.merge(self.id, other_id, paths, on_conflict, dry_run))
        return _api.merged(report, dry_run)

    def expose_port(self, port: int, *, public: bool = False) -> ExposedPort:
        """Makes guest port ``port`` reachable through the daemon's proxy, at
        ``.url`` (``http://<port>-<id>.localhost:<proxy port>``) and ``.path_url``.
        Unless ``public``, the proxy wants the API token
        (``Authorization: Bearer <token>``, the one this client uses).
        A port already exposed raises :class:`~zygote.errors.ConflictError`;
        one outside 1-65535 :class:`~zygote.errors.InvalidArgument`."""
        return self.client.call(_api.expose_port(self.id, port, public))

    def ports(self) -> List[ExposedPort]:
        """The ports exposed so far."""
        return self.client.call(_api.list_ports(self.id))

    def unexpose_port(self, port: int) -> None:
        """Stops exposing ``port``; raises :class:`~zygote.errors.NotFoundError`
        if it was not exposed."""
        self.client.call(_api.unexpose_port(self.id, port))

    def get_host(self, port: int) -> str:
        """The host (no scheme) at which the daemon's proxy serves guest port
        ``port``: ``<port>-<id>.localhost:<proxy port>``, as in
        ``f"http://{sb.get_host(8080)}"`` (E2B's ``get_host``).

        A port not exposed yet is exposed first, not public: requests to it
        then need the API token. For a port reachable without the token, call
        ``expose_port(port, public=True)`` before."""
        found = _api.find_port(self.ports(), port)
        if found is None:
            try:
                found = self.expose_port(port)
            except ZygoteError as e:
                # Exposed by someone else since the listing: use that.
                found = _api.find_port(self.ports(), port) if _api.already_exposed(e) else None
                if found is None:
                    raise
        return found.host

    def metrics(self, start: TimeBound = None, end: TimeBound = None) -> List[MetricSample]:
        """The samples the daemon took of this sandbox between ``start`` and
        ``end`` (inclusive; unix seconds or datetimes; both optional), oldest
        first: one every few seconds while it runs (none while paused), the
        newest 720 kept in the daemon's memory (lost when it restarts)."""
        return self.client.call(_api.metrics(self.id, start, end))

    def logs(self) -> str:
        """The guest's serial console output."""
        return self.client.call(_api.logs(self.id))

    def kill(self) -> bool:
        """Stops the VM and removes the sandbox. False if it was already gone."""
        try:
            self.client.call(_api.delete_sandbox(self.id))
        except SandboxNotFound:
            return False
        return True

    def __enter__(self) -> "Sandbox":
        return self

    def __exit__(
        self,
        exc_type: Optional[Type[BaseException]],
        exc: Optional[BaseException],
        tb: Optional[TracebackType],
    ) -> None:
        try:
            self.kill()
        except Exception:
            # Don't let a failed clean-up hide the error that ended the block.
            if exc is None:
                raise
