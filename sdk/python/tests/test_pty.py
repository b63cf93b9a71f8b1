"""``sandbox.pty`` against a fake pty endpoint (a websockets server speaking the
daemon's protocol): query, token, subprotocol, output, input, resize, refused
control messages, exit, HTTP errors before the upgrade, kill."""

from __future__ import annotations

import json
import threading
from typing import Iterator, List, Optional
from urllib.parse import parse_qs, urlsplit

import pytest
from websockets.datastructures import Headers
from websockets.http11 import Request, Response
from websockets.sync.server import Server, ServerConnection, serve

from zygote import AsyncClient, AsyncSandbox, Client, PtyExit, Sandbox
from zygote.errors import InvalidArgument, SandboxNotFound, Unauthorized, ZygoteError
from zygote.pty import pty_query

TOKEN = "t0k"


def _json_error(status: int, code: str, message: str) -> Response:
    body = json.dumps({"error": {"code": code, "message": message}}).encode()
    return Response(status, "error", Headers([("Content-Type", "application/json")]), body)


def _check(conn: ServerConnection, request: Request) -> Optional[Response]:
    """What the daemon checks before the upgrade."""
    if request.headers.get("Authorization") != f"Bearer {TOKEN}":
        return _json_error(401, "unauthorized", "missing or wrong bearer token")
    url = urlsplit(request.path)
    if not url.path.startswith("/v1/sandboxes/sb-1/"):
        return _json_error(404, "not_found", 'sandbox "sb-x" not found')
    q = parse_qs(url.query)
    if q.get("cols") == ["0"]:
        return _json_error(400, "invalid_argument", "cols must be an integer in 1..=1000, got 0")
    return None


def _terminal(conn: ServerConnection) -> None:
    """Echoes input, reports sizes, exits on "exit N"."""
    assert conn.subprotocol == "zygote.pty.v1"
    q = parse_qs(urlsplit(conn.request.path if conn.request else "").query)
    conn.send(f"cmd={q.get('cmd')} env={q.get('env')} size={q['cols'][0]}x{q['rows'][0]}\r\n".encode())
    for msg in conn:
        if isinstance(msg, str):
            m = json.loads(msg)
            if m["cols"] < 1 or m["rows"] < 1:
                conn.send(json.dumps({"type": "error", "code": "invalid_argument", "message": "bad size"}))
            else:
                conn.send(f"resized {m['cols']}x{m['rows']}\r\n".encode())
            continue
        conn.send(msg)
        if msg.startswith(b"exit "):
            conn.send(json.dumps({"type": "exit", "exit_code": int(msg[5:]), "signal": None}))
            conn.close()
            return


@pytest.fixture
def server() -> Iterator[Server]:
    with serve(_terminal, "127.0.0.1", 0, process_request=_check, subprotocols=["zygote.pty.v1"]) as s:  # type: ignore[list-item]
        t = threading.Thread(target=s.serve_forever, daemon=True)
        t.start()
        yield s
        s.shutdown()


def _sandbox(server: Server, sandbox_id: str = "sb-1", token: str = TOKEN) -> Sandbox:
    host, port = server.socket.getsockname()[:2]
    return Sandbox(sandbox_id, client=Client(f"http://{host}:{port}", token))


def _until(chunks: List[bytes], needle: bytes) -> None:
    done = threading.Event()
    for _ in range(500):
        if needle in b"".join(chunks):
            return
        done.wait(0.01)
    raise AssertionError(f"{needle!r} not in {b''.join(chunks)!r}")


def test_query_repeats_cmd_and_env() -> None:
    q = pty_query(80, 24, ["sh", "-c", "a&b"], {"K": "v=1"}, "/tmp")
    assert parse_qs(q) == {"cols": ["80"], "rows": ["24"], "cmd": ["sh", "-c", "a&b"], "env": ["K=v=1"], "cwd": ["/tmp"]}
    assert pty_query(1, 2, None, None, None) == "cols=1&rows=2"


def test_a_session_round_trip(server: Server) -> None:
    chunks: List[bytes] = []
    term = _sandbox(server).pty.create(100, 30, chunks.append, ["sh"], env={"A": "1"})
    _until(chunks, b"cmd=['sh'] env=['A=1'] size=100x30")
    term.send_input("echo hi\n")
    _until(chunks, b"echo hi\n")
    term.resize(120, 40)
    _until(chunks, b"resized 120x40")
    term.resize(0, 40)
    term.send_input(b"exit 3")
    assert term.wait(10) == PtyExit(exit_code=3, signal=None)
    assert [e.code for e in term.errors] == ["invalid_argument"]


def test_errors_before_the_upgrade(server: Server) -> None:
    with pytest.raises(Unauthorized):
        _sandbox(server, token="wrong").pty.create(80, 24, lambda _: None)
    with pytest.raises(SandboxNotFound):
        _sandbox(server, sandbox_id="sb-x").pty.create(80, 24, lambda _: None)
    with pytest.raises(InvalidArgument):
        _sandbox(server).pty.create(0, 24, lambda _: None)


def test_kill_closes_the_terminal(server: Server) -> None:
    chunks: List[bytes] = []
    term = _sandbox(server).pty.create(80, 24, chunks.append)
    _until(chunks, b"size=80x24")
    term.kill()
    with pytest.raises(Exception, match="closed before its program ended"):
        term.wait(5)


@pytest.mark.anyio
async def test_the_async_surface(server: Server) -> None:
    host, port = server.socket.getsockname()[:2]
    async with AsyncClient(f"http://{host}:{port}", TOKEN) as client:
        sb = AsyncSandbox("sb-1", client=client)
        chunks: List[bytes] = []
        term = await sb.pty.create(90, 20, chunks.append, ["sh"])
        await term.send_input(b"echo hi\n")
        await term.resize(0, 1)
        await term.send_input("exit 4")
        assert await term.wait() == PtyExit(exit_code=4, signal=None)
        assert b"size=90x20" in b"".join(chunks) and b"echo hi\n" in b"".join(chunks)
        assert [e.code for e in term.errors] == ["invalid_argument"]
        with pytest.raises(SandboxNotFound):
            await AsyncSandbox("sb-x", client=client).pty.create(80, 24, chunks.append)
        term = await sb.pty.create(80, 24, chunks.append)
        await term.kill()
        with pytest.raises(ZygoteError, match="closed before its program ended"):
            await term.wait()
