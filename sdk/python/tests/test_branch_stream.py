"""branch(n, on_progress=...): the streaming endpoint, against the fake daemon
(the shared vectors cover the usual answers; these the edges)."""

from __future__ import annotations

import json
from typing import Any, Iterator

import pytest

import zygote
from zygote import AsyncClient, AsyncSandbox, BranchProgress, Client, Sandbox
from zygote._branch import BranchCollector

from .fake_daemon import FakeDaemon

PARENT = "sb-aaaaaaaaaaaa"
KIDS = [f"sb-c0000000000{i}" for i in range(1, 4)]
POINT = {"type": "point", "parent": PARENT, "branch_point": "snap-b", "pause_ms": 3.0, "children": KIDS, "ms": 5}
DONE = {"type": "done", "parent": PARENT, "branch_point": "snap-b", "children": KIDS, "failed": [], "duration_ms": 90}


def child(i: int, ms: int) -> dict[str, Any]:
    return {"type": "child", "index": i, "id": KIDS[i], "ms": ms}


def stream(*lines: dict[str, Any]) -> dict[str, Any]:
    return {"status": 200, "ndjson": list(lines)}


@pytest.fixture
def fake() -> Iterator[FakeDaemon]:
    f = FakeDaemon().start()
    yield f
    f.stop()


def test_a_child_can_be_used_from_the_callback_while_its_siblings_come_up(fake: FakeDaemon) -> None:
    info = {"status": 200, "json": {"id": KIDS[2], "state": "running"}}
    fake.load([stream(POINT, child(2, 40), child(0, 50), child(1, 60), DONE), info])
    states: list[str] = []

    def on_progress(p: BranchProgress[Sandbox]) -> None:
        if p.ready == 1:
            assert p.sandbox is not None
            states.append(p.sandbox.info().state)

    with Client(fake.url, "t") as c:
        kids = Sandbox(PARENT, client=c).branch(3, on_progress=on_progress)
    assert [k.id for k in kids] == KIDS and states == ["running"]
    assert json.loads(fake.requests[0].body) == {"count": 3, "stream": True}
    assert (fake.requests[1].method, fake.requests[1].path) == ("GET", f"/v1/sandboxes/{KIDS[2]}")


def test_a_callback_that_raises_stops_the_call(fake: FakeDaemon) -> None:
    fake.load([stream(POINT, child(0, 40), child(1, 50), child(2, 60), DONE)])

    def on_progress(p: BranchProgress[Sandbox]) -> None:
        raise RuntimeError(f"stop at {p.index}")

    with Client(fake.url, "t") as c:
        with pytest.raises(RuntimeError, match="stop at 0"):
            Sandbox(PARENT, client=c).branch(3, on_progress=on_progress)


def test_a_stream_without_a_summary_is_a_server_error(fake: FakeDaemon) -> None:
    fake.load([stream(POINT, child(0, 40))])
    with Client(fake.url, "t") as c:
        with pytest.raises(zygote.ServerError) as e:
            Sandbox(PARENT, client=c).branch(3, on_progress=lambda p: None)
    assert e.value.code == "bad_response"


def test_the_collector_skips_unknown_lines_and_refuses_garbage() -> None:
    col: BranchCollector[str] = BranchCollector(3, lambda sid: sid.upper())
    assert col.feed(json.dumps(POINT)) is None
    assert col.feed(json.dumps({"type": "newer_kind", "x": 1})) is None
    assert col.feed("") is None
    p = col.feed(json.dumps(child(1, 70)))
    assert p is not None and (p.index, p.sandbox, p.ready, p.total, p.ok) == (1, KIDS[1].upper(), 1, 3, True)
    with pytest.raises(zygote.ServerError):
        col.feed("not json")
    col.feed(json.dumps(DONE))
    assert col.result().children == tuple(KIDS)


@pytest.mark.anyio
async def test_async_callbacks_may_be_coroutines_or_plain(fake: FakeDaemon) -> None:
    fake.load([stream(POINT, child(1, 40), child(0, 50), child(2, 60), DONE)] * 2)
    seen: list[int] = []

    async def coro(p: BranchProgress[AsyncSandbox]) -> None:
        assert isinstance(p.sandbox, AsyncSandbox)
        seen.append(p.index)

    async with AsyncClient(fake.url, "t") as c:
        sb = AsyncSandbox(PARENT, client=c)
        kids = await sb.branch(3, on_progress=coro)
        await sb.branch(3, on_progress=lambda p: seen.append(p.ready))
    assert [k.id for k in kids] == KIDS
    assert seen == [1, 0, 2, 1, 2, 3]
