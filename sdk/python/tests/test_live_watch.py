"""Watching a guest directory against a real zygoted and a real guest
(scripts/sdk-test.sh): events as they happen with relative names, recursion into
a new directory, a missing directory, and stop(), sync and asyncio."""

from __future__ import annotations

import asyncio
import time
from typing import Iterator

import pytest

import zygote
from zygote import AsyncClient, AsyncSandbox, Client, Sandbox

pytestmark = pytest.mark.live


@pytest.fixture(scope="module")
def client(live_env: dict[str, str]) -> Iterator[Client]:
    with Client(live_env["url"], live_env["token"]) as c:
        yield c


@pytest.fixture(scope="module")
def sb(client: Client) -> Iterator[Sandbox]:
    with Sandbox.create(image="minimal", memory_mib=128, client=client) as s:
        yield s


def until_seen(events: Iterator[zygote.WatchEvent], want: list[tuple[str, str]]) -> list[zygote.WatchEvent]:
    """Events until every (name, kind) of ``want`` was seen, in order."""
    seen: list[zygote.WatchEvent] = []
    i = 0
    for ev in events:
        seen.append(ev)
        if i < len(want) and (ev.name, ev.kind) == want[i]:
            i += 1
        if i == len(want):
            return seen
    raise AssertionError(f"the watch ended before {want[i:]}; saw {seen}")


def test_changes_arrive_as_they_happen_and_stop_ends_the_watch(sb: Sandbox) -> None:
    sb.commands.run("mkdir -p /w/sub")
    h = sb.files.watch("/w", recursive=True)
    sb.files.write("/w/a.txt", "1")
    sb.commands.run("mkdir /w/new && echo x > /w/new/f && mv /w/a.txt /w/b.txt && rm /w/b.txt")
    seen = until_seen(
        h,
        [
            ("a.txt", "create"),
            ("new", "create"),
            ("new/f", "create"),
            ("a.txt", "rename"),
            ("b.txt", "create"),
            ("b.txt", "remove"),
        ],
    )
    assert all(not e.name.startswith("/") for e in seen), seen
    h.stop()
    assert list(h) == []


def test_a_missing_directory_is_file_not_found(sb: Sandbox) -> None:
    with pytest.raises(zygote.errors.FileNotFound):
        sb.files.watch("/no/such/dir")


def test_async_watch(live_env: dict[str, str], sb: Sandbox) -> None:
    async def main() -> None:
        async with AsyncClient(live_env["url"], live_env["token"]) as ac:
            asb = AsyncSandbox(sb.id, client=ac)
            await asb.commands.run("mkdir -p /aw")
            h = await asb.files.watch("/aw")
            await asb.files.write("/aw/x", "1")
            got = []
            deadline = time.monotonic() + 30
            async for ev in h:
                got.append((ev.name, ev.kind))
                if ("x", "create") in got or time.monotonic() > deadline:
                    break
            await h.stop()
            assert ("x", "create") in got, got

    asyncio.run(main())
