"""Watching a guest directory: ``sb.files.watch(path, recursive=...)``.

It reads ``GET /v1/sandboxes/{id}/files/watch``, an NDJSON stream: the watch is in
place once the call returns (the daemon's ``started`` line has been read), so every
change made afterwards is reported. Iterate the handle for :class:`WatchEvent`\\ s as
they happen; ``stop()`` (or leaving a ``with`` block) closes the stream, which ends
the watch in the guest. Keepalive lines are skipped.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, AsyncIterator, Iterator, Optional

import httpx

from . import _api
from ._client import DEFAULT_HTTP_TIMEOUT, AsyncClient, Client, _transport_errors
from .errors import ZygoteError, error_for

__all__ = ["WatchEvent", "WatchHandle", "AsyncWatchHandle"]

# Reads wait as long as the directory stays quiet (the daemon sends a keepalive
# line every 15 s, so a dead connection is still noticed).
_STREAM_TIMEOUT = httpx.Timeout(
    connect=DEFAULT_HTTP_TIMEOUT.connect,
    read=None,
    write=DEFAULT_HTTP_TIMEOUT.write,
    pool=DEFAULT_HTTP_TIMEOUT.pool,
)


@dataclass(frozen=True)
class WatchEvent:
    """One change: ``name`` relative to the watched directory (``""`` for the
    directory itself), ``kind`` one of ``create``, ``write``, ``remove``,
    ``rename``, ``chmod``, or ``overflow`` (events were lost)."""

    name: str
    kind: str


def _request(sid: str, path: str, recursive: bool) -> tuple[str, dict[str, str]]:
    params = {"path": path}
    if recursive:
        params["recursive"] = "true"
    return f"/v1/sandboxes/{_api.seg(sid)}/files/watch", params


def _parse(line: str) -> Optional[WatchEvent]:
    """The event a line holds; None for lines that are not changes. Raises at the
    end of the stream (StopIteration) or for an ``error`` line."""
    ev: Any = json.loads(line)
    kind = ev.get("type")
    if kind == "event":
        return WatchEvent(name=str(ev.get("name", "")), kind=str(ev.get("kind", "")))
    if kind == "end":
        raise StopIteration
    if kind == "error":
        raise error_for(str(ev.get("code", "error")), str(ev.get("message", "")))
    return None


class WatchHandle:
    """A running watch (see the module docs)."""

    def __init__(self, client: Client, sid: str, path: str, recursive: bool) -> None:
        route, params = _request(sid, path, recursive)
        self._cfg = client.config
        with _transport_errors(self._cfg):
            self._cm = client._http.stream("GET", route, params=params, timeout=_STREAM_TIMEOUT)
            resp = self._cm.__enter__()
            try:
                if resp.status_code >= 400:
                    resp.read()
                    _api.raise_for_error(resp)
                self._lines = resp.iter_lines()
                first = json.loads(next(self._lines))
            except BaseException:
                self._cm.__exit__(None, None, None)
                raise
        self._stopped = False
        if first.get("type") != "started":
            self.stop()
            raise ZygoteError(f"the watch stream began with {first!r}, not 'started'")

    def __iter__(self) -> Iterator[WatchEvent]:
        return self

    def __next__(self) -> WatchEvent:
        while not self._stopped:
            try:
                with _transport_errors(self._cfg):
                    line = next(self._lines)
            except (StopIteration, httpx.StreamClosed):
                break
            try:
                ev = _parse(line) if line else None
            except StopIteration:
                break
            if ev is not None:
                return ev
        self.stop()
        raise StopIteration

    def stop(self) -> None:
        """Ends the watch (closes the stream)."""
        if not self._stopped:
            self._stopped = True
            self._cm.__exit__(None, None, None)

    def __enter__(self) -> "WatchHandle":
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


class AsyncWatchHandle:
    """The asyncio :class:`WatchHandle`: ``handle = await sb.files.watch(...)``,
    then ``async for ev in handle``."""

    def __init__(self, client: AsyncClient, sid: str, path: str, recursive: bool) -> None:
        self._client = client
        self._route, self._params = _request(sid, path, recursive)
        self._stopped = False

    async def _open(self) -> "AsyncWatchHandle":
        with _transport_errors(self._client.config):
            self._cm = self._client._http.stream(
                "GET", self._route, params=self._params, timeout=_STREAM_TIMEOUT
            )
            resp = await self._cm.__aenter__()
            try:
                if resp.status_code >= 400:
                    await resp.aread()
                    _api.raise_for_error(resp)
                self._lines = resp.aiter_lines()
                first = json.loads(await self._lines.__anext__())
            except BaseException:
                await self._cm.__aexit__(None, None, None)
                raise
        if first.get("type") != "started":
            await self.stop()
            raise ZygoteError(f"the watch stream began with {first!r}, not 'started'")
        return self

    def __aiter__(self) -> AsyncIterator[WatchEvent]:
        return self

    async def __anext__(self) -> WatchEvent:
        while not self._stopped:
            try:
                with _transport_errors(self._client.config):
                    line = await self._lines.__anext__()
            except (StopAsyncIteration, httpx.StreamClosed):
                break
            try:
                ev = _parse(line) if line else None
            except StopIteration:
                break
            if ev is not None:
                return ev
        await self.stop()
        raise StopAsyncIteration

    async def stop(self) -> None:
        """Ends the watch (closes the stream)."""
        if not self._stopped:
            self._stopped = True
            await self._cm.__aexit__(None, None, None)

    async def __aenter__(self) -> "AsyncWatchHandle":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()
