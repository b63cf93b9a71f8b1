"""An MCP server (stdio) exposing zygote sandboxes as tools, so an MCP
host (an agent) can create sandboxes, run commands, move files, branch,
inspect a branch tree, merge a branch's changes back and keep one branch,
snapshot, restore and kill them, pull OCI images, and push and pull
snapshots to and from registries.

Run it as ``zygote-mcp`` (or ``python -m zygote.mcp_server``); it finds
the daemon like the SDK does (``ZYGOTE_URL``, ``ZYGOTE_TOKEN`` or the
daemon's token file). Sandboxes it created are killed when the session
ends unless ``--keep-sandboxes`` is given, so a host that forgets to clean
up does not leak VMs. Needs the ``mcp`` extra: ``pip install 'zygote[mcp]'``.
"""

from __future__ import annotations

import argparse
import dataclasses
from contextlib import asynccontextmanager
from typing import Any, AsyncIterator, Optional

from mcp.server import MCPServer
from mcp.server.mcpserver.exceptions import ToolError

from . import _mcp_code, _process
from ._api import OnConflict
from ._client import AsyncClient
from ._version import __version__
from .aio import AsyncSandbox
from .errors import BranchIncomplete, CommandTimeout, MergeConflictError, ProcessExited, ProcessNotFound, ZygoteError
from .models import Image, MergeReport, ProcessInfo, Snapshot

__all__ = ["build_server", "main"]

INSTRUCTIONS = (
    "Tools for zygote microVM sandboxes. create_sandbox boots a Linux VM and returns its id; "
    "exec runs shell commands in it; write_file/read_file/list_files move data; branch_sandbox "
    "forks a running sandbox into N copy-on-write children (same memory, processes and files) "
    "to try alternatives in parallel; sandbox_tree shows a sandbox's lineage (parents, children, "
    "memory and disk each one holds), diff_sandboxes compares two sandboxes' files (pick the "
    "best child), merge_sandboxes brings one sandbox's file changes since the branch point into "
    "another (a winning child's into its parent; branch with mergeable=true), and keep_branch "
    "keeps one child of a branch and deletes its siblings; "
    "snapshot_sandbox saves a state and restore_snapshot starts a new sandbox from it; "
    "pause_sandbox saves an idle sandbox to disk (its VM stops, it keeps its id, files and "
    "processes) and resume_sandbox brings it back where it was; "
    "kill_sandbox removes one. Kill sandboxes you no longer need. "
    "sandbox_metrics shows a sandbox's CPU, memory and disk use over time (sampled every few seconds). "
    "pull_image fetches an OCI image (e.g. python:3.12-slim) so create_sandbox can boot it (create_sandbox "
    "also pulls a reference on first use); exec's user runs a command as root, UID or UID:GID (default: "
    "the image's user). push_snapshot sends a snapshot to a registry and pull_snapshot brings one back "
    "(from this or another host) as a snapshot restore_snapshot can start. "
    "start_background_command starts a long-running program (a server, a watcher) and returns "
    "its pid at once; read_process_output reads what it printed from an offset (optionally "
    "waiting for more), send_process_input writes to its stdin, kill_process signals it, "
    "list_processes lists them. Background processes are copied into branch children. "
    "run_code runs Python in a sandbox of image code-interpreter, keeping its state between calls."
)


class _Session:
    """The daemon connection and the sandboxes this server made."""

    def __init__(self, client: AsyncClient) -> None:
        self.client = client
        self.created: set[str] = set()

    def sandbox(self, sandbox_id: str) -> AsyncSandbox:
        return AsyncSandbox(sandbox_id, client=self.client)

    def adopt(self, sandbox_id: str) -> str:
        self.created.add(sandbox_id)
        return sandbox_id


def _report(r: MergeReport) -> dict[str, Any]:
    return {
        "sandbox_id": r.sandbox,
        "from_sandbox_id": r.from_,
        "base": r.base,
        "paths": list(r.paths),
        "applied": r.applied,
        "changes": [{"path": c.path, "action": c.action, "kind": c.kind, "size": c.size} for c in r.changes],
        "conflicts": [
            {"path": c.path, "ours": c.ours, "theirs": c.theirs, "resolution": c.resolution} for c in r.conflicts
        ],
        "skipped": list(r.skipped),
        "bytes_copied": r.bytes_copied,
    }


def _proc(p: ProcessInfo) -> dict[str, Any]:
    return {
        "pid": p.pid,
        "command": list(p.argv),
        "state": p.state,
        "exit_code": p.exit_code,
        "signal": p.signal,
        "timed_out": p.timed_out,
        "output_bytes": p.output_bytes,
        "stdin_open": p.stdin_open,
    }


def _image(i: Image) -> dict[str, Any]:
    return {"image": i.name, "source": i.source, "digest": i.digest, "size_bytes": i.size_bytes}


def _snapshot(s: Snapshot) -> dict[str, Any]:
    return {
        "snapshot_id": s.id,
        "name": s.name,
        "kind": s.kind,
        "size_bytes": s.size_bytes,
        "pack": None if s.pack is None else {"source": s.pack.source, "digest": s.pack.digest},
    }


def _tool_error(e: ZygoteError) -> ToolError:
    # The host (and model) sees this text; keep the stable code in it so a
    # model can tell "no such sandbox" from "daemon down".
    return ToolError(f"{e.message} [{e.code}]")


def build_server(
    url: Optional[str] = None,
    token: Optional[str] = None,
    keep_sandboxes: bool = False,
) -> MCPServer[Any]:
    session = _Session(AsyncClient(url, token))

    @asynccontextmanager
    async def lifespan(_: MCPServer[Any]) -> AsyncIterator[None]:
        try:
            yield None
        finally:
            if not keep_sandboxes:
                for sid in sorted(session.created):
                    try:
                        await session.sandbox(sid).kill()
                    except ZygoteError:
                        pass  # best effort: the daemon may be gone already
            await session.client.aclose()

    server: MCPServer[Any] = MCPServer(
        "zygote", version=__version__, instructions=INSTRUCTIONS, lifespan=lifespan, log_level="WARNING"
    )

    @server.tool()
    async def create_sandbox(
        image: str = "minimal",
        memory_mib: Optional[int] = None,
        metadata: Optional[dict[str, str]] = None,
        volumes: Optional[dict[str, str]] = None,
    ) -> dict[str, Any]:
        """Boot a new sandbox (a Linux microVM) from an image (a built one such as "minimal",
        or an OCI image reference, pulled on first use); returns its sandbox_id.
        metadata: your own labels (key -> value; keys of A-Za-z0-9._-/, not starting
        "zygote."), kept by branch children (which add "zygote.parent") and usable to
        filter list_sandboxes. volumes: named volumes to mount (guest path -> volume name,
        see create_volume); this sandbox writes them, its branch children see a
        copy-on-write view."""
        try:
            sb = await AsyncSandbox.create(
                image, memory_mib=memory_mib, metadata=metadata, volumes=volumes, client=session.client
            )
        except ZygoteError as e:
            raise _tool_error(e) from e
        # Adopted before anything else can fail, so the session still kills it.
        session.adopt(sb.id)
        try:
            info = await sb.info()
        except ZygoteError as e:
            raise _tool_error(e) from e
        return {
            "sandbox_id": sb.id,
            "state": info.state,
            "runtime": info.runtime,
            "memory_mib": info.memory_mib,
            "metadata": dict(info.metadata),
        }

    @server.tool(name="exec")
    async def exec_command(
        sandbox_id: str, command: str, timeout_seconds: float = 60.0, user: Optional[str] = None
    ) -> dict[str, Any]:
        """Run a shell command (sh -c) in a sandbox; returns stdout, stderr, exit_code and timed_out.
        user: "root", a numeric UID or "UID:GID" (default: the sandbox image's user, else root)."""
        try:
            res = await session.sandbox(sandbox_id).commands.run(command, timeout=timeout_seconds, user=user)
        except CommandTimeout as e:
            # A timeout is an outcome the model should see, with the output so far.
            res = e.result
        except ZygoteError as e:
            raise _tool_error(e) from e
        return {"stdout": res.stdout, "stderr": res.stderr, "exit_code": res.exit_code, "timed_out": res.timed_out}

    @server.tool()
    async def write_file(sandbox_id: str, path: str, content: str) -> dict[str, Any]:
        """Write text to an absolute path in a sandbox (parent directories are created)."""
        try:
            w = await session.sandbox(sandbox_id).files.write(path, content)
        except ZygoteError as e:
            raise _tool_error(e) from e
        return {"path": w.path, "size": w.size}

    @server.tool()
    async def read_file(sandbox_id: str, path: str) -> str:
        """Read a text file at an absolute path in a sandbox."""
        try:
            data = await session.sandbox(sandbox_id).files.read_bytes(path)
        except ZygoteError as e:
            raise _tool_error(e) from e
        return data.decode("utf-8", errors="replace")

    @server.tool()
    async def list_files(sandbox_id: str, path: str = "/") -> dict[str, Any]:
        """List a directory in a sandbox (name, kind, size of each entry)."""
        try:
            entries = await session.sandbox(sandbox_id).files.list(path)
        except ZygoteError as e:
            raise _tool_error(e) from e
        return {"path": path, "entries": [{"name": e.name, "kind": e.kind, "size": e.size} for e in entries]}

    @server.tool()
    async def branch_sandbox(sandbox_id: str, n: int = 2, mergeable: bool = False) -> dict[str, Any]:
        """Fork a running sandbox into n copy-on-write children that start from its exact
        current state and then diverge independently; returns their sandbox ids, and in
        "failed" the children that could not be brought up (index among the n, error).
        mergeable=true keeps the branch point so a child's changes can later be merged
        back (merge_sandboxes)."""
        failed: list[dict[str, Any]] = []
        try:
            children = await session.sandbox(sandbox_id).branch(n, mergeable=mergeable)
        except BranchIncomplete as e:
            # Some children run: hand them over (and kill them with the session) and
            # say which ones are missing, rather than losing the running ones.
            children = e.children
            failed = [{"index": f.index, "error": f.error} for f in e.failures]
        except ZygoteError as e:
            raise _tool_error(e) from e
        return {"parent": sandbox_id, "children": [session.adopt(c.id) for c in children], "failed": failed}

    @server.tool()
    async def sandbox_tree(sandbox_id: str) -> dict[str, Any]:
        """Show the lineage of a sandbox: its topmost existing ancestor and every descendant
        (parents first), each with its parent, children, the memory deleting it would give
        back (unique_memory_bytes) and its own disk layer (disk_bytes), plus the snapshots and
        branch points taken of them."""
        try:
            tree = await session.sandbox(sandbox_id).tree()
        except ZygoteError as e:
            raise _tool_error(e) from e
        return {
            "root": tree.root,
            "sandboxes": [
                {
                    "sandbox_id": n.id,
                    "name": n.name,
                    "state": n.state,
                    "parent": n.parent,
                    "started_from": n.started_from,
                    "children": list(n.children),
                    "unique_memory_bytes": n.unique_memory_bytes,
                    "disk_bytes": n.disk_bytes,
                }
                for n in tree.sandboxes
            ],
            "snapshots": [
                {"snapshot_id": s.id, "kind": s.kind, "source_sandbox": s.source_sandbox, "size_bytes": s.size_bytes}
                for s in tree.snapshots
            ],
        }

    @server.tool()
    async def keep_branch(sandbox_id: str, promote: bool = False) -> dict[str, Any]:
        """Keep one child of a branch: delete its siblings (the other children of the same
        branch point) and their descendants. With promote=true also delete its parent and
        give the kept child the parent's name. Returns the kept id, the deleted ids and the
        name taken (null without promote)."""
        try:
            res = await session.sandbox(sandbox_id).keep(promote=promote)
        except ZygoteError as e:
            raise _tool_error(e) from e
        for gone in res.deleted:
            session.created.discard(gone)
        return {"kept": res.kept, "deleted": list(res.deleted), "name": res.name}

    @server.tool()
    async def diff_sandboxes(
        sandbox_id: str, against: str, path: str = "/root", content: bool = False
    ) -> dict[str, Any]:
        """How one sandbox's files under `path` differ from another's (a sibling, its
        parent): paths added (only in sandbox_id), removed (only in against) and
        modified; with content=true, a unified diff per modified text file."""
        try:
            d = await session.sandbox(sandbox_id).diff(against, path, content=content)
        except ZygoteError as e:
            raise _tool_error(e) from e
        return {
            "added": [e.path for e in d.added],
            "removed": [e.path for e in d.removed],
            "modified": [
                {"path": m.path, **({"unified": m.unified} if m.unified is not None else {})}
                for m in d.modified
            ],
        }

    @server.tool()
    async def merge_sandboxes(
        sandbox_id: str,
        from_sandbox_id: str,
        paths: Optional[list[str]] = None,
        on_conflict: OnConflict = "fail",
        dry_run: bool = False,
    ) -> dict[str, Any]:
        """Bring the file changes from_sandbox_id made under `paths` (directories, default
        ["/root"]) since the two parted into sandbox_id, three-way (e.g. a winning child's
        into its parent); sandbox_id's own changes are kept. Returns the changes made
        (path, action add/modify/remove/mode). Where both changed a path differently it is
        listed in "conflicts": with on_conflict="fail" nothing is changed ("applied": false)
        so you can decide, then merge again with "theirs" (take from_sandbox_id's version)
        or "ours" (keep sandbox_id's). dry_run=true only reports."""
        try:
            report = await session.sandbox(sandbox_id).merge(
                from_sandbox_id, paths, on_conflict=on_conflict, dry_run=dry_run
            )
        except MergeConflictError as e:
            # A conflict is an outcome for the model to act on, not a failure.
            report = e.report
        except ZygoteError as e:
            raise _tool_error(e) from e
        return _report(report)

    @server.tool()
    async def snapshot_sandbox(sandbox_id: str, name: Optional[str] = None) -> dict[str, Any]:
        """Save a sandbox's full state (memory, processes, files); returns a snapshot_id."""
        try:
            snap = await session.sandbox(sandbox_id).snapshot("full", name=name)
        except ZygoteError as e:
            raise _tool_error(e) from e
        return {"snapshot_id": snap.id, "kind": snap.kind, "size_bytes": snap.size_bytes}

    @server.tool()
    async def restore_snapshot(snapshot_id: str) -> dict[str, Any]:
        """Start a new sandbox from a snapshot (its id, or the registry reference of a pushed
        snapshot, pulled on first use); returns its sandbox_id."""
        try:
            sb = await AsyncSandbox.restore(snapshot_id, client=session.client)
        except ZygoteError as e:
            raise _tool_error(e) from e
        return {"sandbox_id": session.adopt(sb.id)}

    @server.tool()
    async def pull_image(reference: str) -> dict[str, Any]:
        """Pull an OCI image from a registry (e.g. "python:3.12-slim",
        "registry.example:5000/team/app:1.4") so create_sandbox can boot it; returns the
        image name to pass to create_sandbox, its source and manifest digest. Registry
        credentials come from the daemon's docker config."""
        try:
            image = await session.client.pull_image(reference)
        except ZygoteError as e:
            raise _tool_error(e) from e
        return _image(image)

    @server.tool()
    async def push_snapshot(snapshot_id: str, reference: str) -> dict[str, Any]:
        """Push a snapshot (from snapshot_sandbox) to a registry as one artifact, e.g.
        "registry.example:5000/team/warm:v1"; pull_snapshot on any zygote host brings it
        back. It holds the sandbox's memory: push only where the sandbox's data may go.
        Returns the reference, the manifest digest and the bytes of its blobs."""
        try:
            pushed = await session.client.push_snapshot(snapshot_id, reference)
        except ZygoteError as e:
            raise _tool_error(e) from e
        return {"reference": pushed.reference, "digest": pushed.digest, "size_bytes": pushed.size}

    @server.tool()
    async def pull_snapshot(reference: str, name: Optional[str] = None) -> dict[str, Any]:
        """Pull a snapshot pushed with push_snapshot (here or on another host) and register
        it as a snapshot of this daemon (name: default the pushed one's); returns its
        snapshot_id for restore_snapshot."""
        try:
            snap = await session.client.pull_snapshot(reference, name=name)
        except ZygoteError as e:
            raise _tool_error(e) from e
        return _snapshot(snap)

    @server.tool()
    async def pause_sandbox(sandbox_id: str) -> dict[str, Any]:
        """Pause a sandbox to disk: its memory and processes are saved and its VM stops
        (freeing the host's memory); it keeps its id and files. exec and file tools on it
        fail until resume_sandbox."""
        try:
            info = await session.sandbox(sandbox_id).pause()
        except ZygoteError as e:
            raise _tool_error(e) from e
        return {"sandbox_id": sandbox_id, "state": info.state}

    @server.tool()
    async def resume_sandbox(sandbox_id: str) -> dict[str, Any]:
        """Resume a paused sandbox where it was: the same processes and files."""
        try:
            info = await session.sandbox(sandbox_id).resume()
        except ZygoteError as e:
            raise _tool_error(e) from e
        return {"sandbox_id": sandbox_id, "state": info.state}

    @server.tool()
    async def sandbox_events(
        sandbox_id: str, level: Optional[str] = None, search: Optional[str] = None, limit: int = 50
    ) -> dict[str, Any]:
        """What happened to a sandbox and in it, oldest first: started, branched, paused,
        resumed, commands and how they ended (exit codes), snapshots, network and timeout
        changes, its VM stopping. level (debug, info, warn, error) keeps that level and
        above; search keeps messages containing it; the newest `limit` (1..1000) events."""
        try:
            events = await session.sandbox(sandbox_id).events(
                level=level, search=search, limit=limit, newest_first=True
            )
        except ZygoteError as e:
            raise _tool_error(e) from e
        except ValueError as e:
            raise ToolError(str(e)) from e
        return {
            "sandbox_id": sandbox_id,
            "events": [
                {"ts_ms": e.ts_ms, "level": e.level, "message": e.message, "fields": dict(e.fields)}
                for e in reversed(events)
            ],
        }

    @server.tool()
    async def sandbox_egress(sandbox_id: str, limit: int = 100) -> dict[str, Any]:
        """The connections a sandbox's guest made under rules by name (its egress
        record), oldest first: host, address, port, method and path on plain HTTP,
        event (refused, open, closed, cut, failed) and why, bytes each way. The newest
        `limit` (1..10000). Each branch child has its own record."""
        try:
            entries = await session.sandbox(sandbox_id).egress(limit=limit)
        except ZygoteError as e:
            raise _tool_error(e) from e
        return {
            "sandbox_id": sandbox_id,
            "egress": [
                {
                    "event": e.event,
                    "host": e.host,
                    "address": e.address,
                    "port": e.port,
                    "method": e.method,
                    "path": e.path,
                    "reason": e.reason,
                    "bytes_out": e.bytes_out,
                    "bytes_in": e.bytes_in,
                    "started_ms": e.started_ms,
                    "ended_ms": e.ended_ms,
                }
                for e in entries
            ],
        }

    @server.tool()
    async def kill_sandbox(sandbox_id: str) -> dict[str, Any]:
        """Stop and remove a sandbox."""
        try:
            killed = await session.sandbox(sandbox_id).kill()
        except ZygoteError as e:
            raise _tool_error(e) from e
        session.created.discard(sandbox_id)
        return {"sandbox_id": sandbox_id, "killed": killed}

    @server.tool()
    async def sandbox_metrics(
        sandbox_id: str,
        start: Optional[int] = None,
        end: Optional[int] = None,
        limit: int = 60,
    ) -> dict[str, Any]:
        """A sandbox's resource use over time: the samples the daemon took (every few
        seconds while it runs; none while paused) between start and end (unix seconds,
        both optional), oldest first, at most the newest `limit`. Each has the time,
        cpu_count, cpu_used_pct (of all its CPUs, since the previous sample), and
        mem_total/mem_used/mem_cache and disk_total/disk_used in bytes."""
        if limit < 1:
            raise ToolError("limit must be at least 1 [invalid_argument]")
        try:
            samples = await session.sandbox(sandbox_id).metrics(start, end)
        except ZygoteError as e:
            raise _tool_error(e) from e
        except ValueError as e:
            raise ToolError(f"{e} [invalid_argument]") from e
        return {"sandbox_id": sandbox_id, "metrics": [dataclasses.asdict(m) for m in samples[-limit:]]}

    @server.tool()
    async def create_volume(name: str, size_mib: Optional[int] = None) -> dict[str, Any]:
        """Make a named volume (an empty ext4 filesystem that outlives sandboxes; 1024 MiB
        unless size_mib says otherwise); mount it with create_sandbox's volumes."""
        try:
            v = await session.client.create_volume(name, size_mib=size_mib)
        except ZygoteError as e:
            raise _tool_error(e) from e
        return {"volume_id": v.id, "name": v.name, "size_mib": v.size_mib}

    @server.tool()
    async def list_volumes() -> dict[str, Any]:
        """List named volumes and the sandbox each is mounted in (null: none)."""
        try:
            vols = await session.client.volumes()
        except ZygoteError as e:
            raise _tool_error(e) from e
        return {
            "volumes": [
                {"volume_id": v.id, "name": v.name, "size_mib": v.size_mib, "mounted_in": v.attached_to}
                for v in vols
            ]
        }

    @server.tool()
    async def delete_volume(name: str) -> dict[str, Any]:
        """Delete a volume (by name or id) and its data; refused while a sandbox has it mounted."""
        try:
            await session.client.delete_volume(name)
        except ZygoteError as e:
            raise _tool_error(e) from e
        return {"deleted": name}

    @server.tool()
    async def list_sandboxes(metadata: Optional[dict[str, str]] = None) -> dict[str, Any]:
        """List the daemon's sandboxes with their state and metadata; with metadata
        (key -> value), only those having every one of those pairs, e.g.
        {"zygote.parent": "<id>"} for the children branched from a sandbox."""
        try:
            infos = await session.client.sandboxes(metadata)
        except ZygoteError as e:
            raise _tool_error(e) from e
        except ValueError as e:
            raise ToolError(f"{e} [invalid_argument]") from e
        return {
            "sandboxes": [
                {"sandbox_id": i.id, "state": i.state, "name": i.name, "metadata": dict(i.metadata)} for i in infos
            ]
        }

    @server.tool()
    async def start_background_command(
        sandbox_id: str,
        command: str,
        stdin: Optional[str] = None,
        timeout_seconds: Optional[float] = None,
        user: Optional[str] = None,
    ) -> dict[str, Any]:
        """Start a shell command (sh -c) in the background and return its pid at once; it
        runs on (with no time limit unless timeout_seconds) with its stdin open (stdin is
        written first). Read its output with read_process_output. user: as for exec."""
        try:
            started = await session.client.call(
                _process.start(sandbox_id, command, timeout=timeout_seconds, stdin=stdin, user=user)
            )
            return _proc(started)
        except ZygoteError as e:
            raise _tool_error(e) from e
        except ValueError as e:
            raise ToolError(f"{e} [invalid_argument]") from e

    @server.tool()
    async def read_process_output(
        sandbox_id: str, pid: int, offset: int = 0, wait_seconds: float = 0.0
    ) -> dict[str, Any]:
        """What a background process printed from byte offset `offset` (stdout and stderr
        counted together; pass the last answer's next_offset to read only what is new),
        with the process's state and exit status. With wait_seconds (at most 30), waits
        that long for new output or the end when there is none yet."""
        try:
            with _process.pid_errors():
                out = await session.client.call(_process.output(sandbox_id, pid, offset, wait_seconds))
        except ZygoteError as e:
            raise _tool_error(e) from e
        except ValueError as e:
            raise ToolError(f"{e} [invalid_argument]") from e
        return {
            "stdout": out.stdout,
            "stderr": out.stderr,
            "offset": out.offset,
            "next_offset": out.next_offset,
            "dropped_bytes": out.dropped_bytes,
            "process": _proc(out.process),
        }

    @server.tool()
    async def send_process_input(sandbox_id: str, pid: int, data: str, eof: bool = False) -> dict[str, Any]:
        """Write text to a background process's stdin; eof=true closes it afterwards."""
        try:
            await session.sandbox(sandbox_id).commands.send_stdin(pid, data, eof=eof)
        except ZygoteError as e:
            raise _tool_error(e) from e
        return {"pid": pid, "written": len(data.encode()), "closed": eof}

    @server.tool()
    async def kill_process(sandbox_id: str, pid: int, signal: str = "SIGKILL") -> dict[str, Any]:
        """Send a signal (SIGKILL by default; SIGTERM, SIGINT, SIGHUP...) to a background
        process. signalled is false when it had already ended."""
        try:
            await session.sandbox(sandbox_id).commands.signal(pid, signal)
        except (ProcessExited, ProcessNotFound):
            return {"pid": pid, "signalled": False}
        except ZygoteError as e:
            raise _tool_error(e) from e
        return {"pid": pid, "signalled": True}

    @server.tool()
    async def list_processes(sandbox_id: str) -> dict[str, Any]:
        """The background processes of a sandbox (running and ended), oldest first."""
        try:
            procs = await session.sandbox(sandbox_id).commands.list()
        except ZygoteError as e:
            raise _tool_error(e) from e
        return {"processes": [_proc(p) for p in procs]}

    _mcp_code.register(server, session.sandbox)
    return server


def main(argv: Optional[list[str]] = None) -> None:
    p = argparse.ArgumentParser(prog="zygote-mcp", description="MCP server (stdio) for zygote sandboxes")
    p.add_argument("--url", help="zygoted URL (default $ZYGOTE_URL, else http://127.0.0.1:7420)")
    p.add_argument("--token", help="API token (default $ZYGOTE_TOKEN, else the daemon's token file)")
    p.add_argument(
        "--keep-sandboxes", action="store_true", help="leave sandboxes this session created running on exit"
    )
    args = p.parse_args(argv)
    build_server(args.url, args.token, args.keep_sandboxes).run("stdio")


if __name__ == "__main__":
    main()
