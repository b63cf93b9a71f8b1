"""run_code and code contexts (issue 37) against the scripted fake daemon: the request
sent, the events turned into callbacks and an Execution, errors. No VM involved (the
live path is crates/daemon/tests/code_interpreter.rs and the E2B SDK's test)."""

from __future__ import annotations

import asyncio
import base64
import json
from typing import Any, Iterator

import pytest

from zygote import AsyncSandbox, Client, Execution, Result, Sandbox
from zygote.errors import NotFoundError, ZygoteError

from .fake_daemon import FakeDaemon

SID = "sb-aaaaaaaaaaaa"
PNG = base64.b64encode(b"\x89PNG\r\n\x1a\n" + b"\0" * 25).decode()
EVENTS: list[dict[str, Any]] = [
    {"type": "stdout", "text": "hi\n"},
    {"type": "result", "main": False, "data": {"image/png": PNG, "text/plain": "<Figure>"}},
    {"type": "result", "main": True, "data": {"text/plain": "42"}},
    {"type": "done", "execution_count": 3},
]


@pytest.fixture
def fake() -> Iterator[FakeDaemon]:
    f = FakeDaemon().start()
    yield f
    f.stop()


def test_run_code_sends_the_request_and_gathers_the_execution(fake: FakeDaemon) -> None:
    fake.load([{"status": 200, "ndjson": EVENTS}])
    sb = Sandbox(SID, client=Client(fake.url, "t"))
    out: list[str] = []
    results: list[Result] = []
    ex = sb.run_code(
        "print('hi')\n42",
        context="c1",
        timeout=5,
        envs={"ZYG_A": "1"},
        on_stdout=out.append,
        on_result=results.append,
    )
    req = fake.requests[0]
    assert (req.method, req.path) == ("POST", f"/v1/sandboxes/{SID}/code")
    assert json.loads(req.body) == {
        "code": "print('hi')\n42",
        "language": "python",
        "context": "c1",
        "timeout_ms": 5000,
        "envs": {"ZYG_A": "1"},
    }
    assert isinstance(ex, Execution)
    assert out == ["hi\n"] and ex.logs.stdout == ["hi\n"]
    assert len(results) == 2 and ex.text == "42" and ex.execution_count == 3
    assert (ex.results[0].png_bytes() or b"")[:4] == b"\x89PNG"
    assert ex.error is None


def test_errors_and_broken_streams(fake: FakeDaemon) -> None:
    err = {"type": "error", "name": "ZeroDivisionError", "value": "division by zero", "traceback": ["t"]}
    fake.load(
        [
            {"status": 200, "ndjson": [err, {"type": "done", "execution_count": 1}]},
            {"status": 200, "ndjson": [{"type": "stdout", "text": "x"}]},
            {"status": 404, "json": {"error": {"code": "code_context_not_found", "message": "no code context"}}},
        ]
    )
    sb = Sandbox(SID, client=Client(fake.url, "t"))
    seen: list[Any] = []
    ex = sb.run_code("1/0", envs={}, on_error=seen.append)
    assert "envs" not in json.loads(fake.requests[0].body), "empty envs are not sent"
    assert ex.error is not None and ex.error.name == "ZeroDivisionError" and seen == [ex.error]
    with pytest.raises(ZygoteError, match="without a done"):
        sb.run_code("print('x')")
    with pytest.raises(NotFoundError):
        sb.run_code("1", context="gone")


def test_contexts(fake: FakeDaemon) -> None:
    ctx = {"id": "abc", "language": "python", "cwd": "/home/user"}
    fake.load(
        [
            {"status": 201, "json": ctx},
            {"status": 200, "json": {"contexts": [{"id": "default", "language": "python", "cwd": "/root"}, ctx]}},
            {"status": 204},
            {"status": 204},
        ]
    )
    sb = Sandbox(SID, client=Client(fake.url, "t"))
    made = sb.create_code_context(cwd="/home/user")
    assert made.id == "abc"
    assert [c.id for c in sb.list_code_contexts()] == ["default", "abc"]
    sb.restart_code_context(made)
    sb.remove_code_context("abc")
    sent = [(r.method, r.path) for r in fake.requests]
    base = f"/v1/sandboxes/{SID}/code/contexts"
    assert sent == [("POST", base), ("GET", base), ("POST", f"{base}/abc/restart"), ("DELETE", f"{base}/abc")]
    assert json.loads(fake.requests[0].body) == {"language": "python", "cwd": "/home/user"}


def test_async_run_code_awaits_coroutine_callbacks(fake: FakeDaemon) -> None:
    fake.load([{"status": 200, "ndjson": EVENTS}])
    got: list[str] = []

    async def on_stdout(text: str) -> None:
        got.append(text)

    async def main() -> Execution:
        from zygote import AsyncClient

        async with AsyncClient(fake.url, "t") as client:
            return await AsyncSandbox(SID, client=client).run_code("x", envs={"K": "v"}, on_stdout=on_stdout)

    ex = asyncio.run(main())
    assert got == ["hi\n"] and ex.text == "42"
    assert json.loads(fake.requests[0].body)["envs"] == {"K": "v"}
