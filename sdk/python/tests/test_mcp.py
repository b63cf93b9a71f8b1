"""The MCP server driven over stdio the way an MCP host does it:
initialize, tools/list, tools/call (JSON-RPC 2.0, one message per line)."""

from __future__ import annotations

import json
import queue
import socket
import subprocess
import sys
import threading
from typing import Any, Iterator, Optional

import pytest

from zygote import Client

from .fake_daemon import FakeDaemon, FakeFiles
from .fake_oci import FakeOci, RegistryImage
from .fake_processes import FakeProcesses

EXPECTED_TOOLS = {
    "create_sandbox",
    "create_volume",
    "list_volumes",
    "delete_volume",
    "exec",
    "write_file",
    "read_file",
    "list_files",
    "branch_sandbox",
    "sandbox_tree",
    "keep_branch",
    "diff_sandboxes",
    "merge_sandboxes",
    "snapshot_sandbox",
    "restore_snapshot",
    "kill_sandbox",
    "list_sandboxes",
    "start_background_command",
    "read_process_output",
    "send_process_input",
    "kill_process",
    "list_processes",
    "pause_sandbox",
    "resume_sandbox",
    "sandbox_events",
    "sandbox_egress",
    "pull_image",
    "push_snapshot",
    "pull_snapshot",
    "sandbox_metrics",
    "run_code",
}


class McpSession:
    """A zygote-mcp subprocess and a minimal JSON-RPC client for it."""

    def __init__(self, *args: str) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "zygote.mcp_server", *args],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self._lines: "queue.Queue[Optional[str]]" = queue.Queue()
        self._next_id = 0
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self._lines.put(line)
        self._lines.put(None)

    def send(self, msg: dict[str, Any]) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(msg) + "\n")
        self.proc.stdin.flush()

    def request(self, method: str, params: Optional[dict[str, Any]] = None, timeout: float = 120) -> dict[str, Any]:
        self._next_id += 1
        rid = self._next_id
        msg: dict[str, Any] = {"jsonrpc": "2.0", "id": rid, "method": method}
        if params is not None:
            msg["params"] = params
        self.send(msg)
        while True:
            line = self._lines.get(timeout=timeout)
            if line is None:
                raise AssertionError(f"server exited: {self.stderr()}")
            reply = json.loads(line)
            assert reply.get("jsonrpc") == "2.0"
            if reply.get("id") == rid:
                return dict(reply)
            # Anything else is a notification (e.g. logging); not a reply to us.
            assert "id" not in reply or "method" in reply, f"reply to an unknown request: {reply}"

    def initialize(self) -> dict[str, Any]:
        reply = self.request(
            "initialize",
            {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "zygote-tests", "version": "0"}},
        )
        self.send({"jsonrpc": "2.0", "method": "notifications/initialized"})
        return dict(reply["result"])

    def call(self, tool: str, **arguments: Any) -> dict[str, Any]:
        reply = self.request("tools/call", {"name": tool, "arguments": arguments})
        assert "result" in reply, reply
        return dict(reply["result"])

    def close(self, timeout: float = 60) -> int:
        """Ends the session the way a host does: closes stdin."""
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        return self.proc.wait(timeout=timeout)

    def stderr(self) -> str:
        return self.proc.stderr.read() if self.proc.stderr and self.proc.poll() is not None else ""

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def structured(result: dict[str, Any]) -> dict[str, Any]:
    assert not result.get("isError"), result
    data = dict(result["structuredContent"])
    # The text content carries the same data for hosts that only read text.
    assert json.loads(result["content"][0]["text"]) == data
    return data


@pytest.fixture
def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_protocol_and_tool_schemas_without_a_daemon(closed_port: int) -> None:
    session = McpSession("--url", f"http://127.0.0.1:{closed_port}", "--token", "t")
    try:
        init = session.initialize()
        assert init["serverInfo"]["name"] == "zygote"
        assert "tools" in init["capabilities"]
        tools = {t["name"]: t for t in session.request("tools/list")["result"]["tools"]}
        assert set(tools) == EXPECTED_TOOLS
        exec_schema = tools["exec"]["inputSchema"]
        assert set(exec_schema["required"]) == {"sandbox_id", "command"}
        assert exec_schema["properties"]["timeout_seconds"]["type"] == "number"
        assert tools["branch_sandbox"]["inputSchema"]["properties"]["n"]["type"] == "integer"
        assert tools["sandbox_tree"]["inputSchema"]["required"] == ["sandbox_id"]
        keep_schema = tools["keep_branch"]["inputSchema"]
        assert keep_schema["required"] == ["sandbox_id"]
        assert keep_schema["properties"]["promote"]["type"] == "boolean"
        assert keep_schema["properties"]["promote"]["default"] is False
        assert tools["branch_sandbox"]["inputSchema"]["properties"]["mergeable"]["default"] is False
        merge_schema = tools["merge_sandboxes"]["inputSchema"]
        assert merge_schema["required"] == ["sandbox_id", "from_sandbox_id"]
        assert merge_schema["properties"]["on_conflict"]["enum"] == ["fail", "theirs", "ours"]
        assert merge_schema["properties"]["dry_run"]["default"] is False
        assert tools["pull_image"]["inputSchema"]["required"] == ["reference"]
        assert set(tools["push_snapshot"]["inputSchema"]["required"]) == {"snapshot_id", "reference"}
        assert tools["pull_snapshot"]["inputSchema"]["required"] == ["reference"]
        assert "user" in exec_schema["properties"]
        assert tools["create_sandbox"]["inputSchema"]["properties"]["volumes"]["anyOf"][0]["type"] == "object"
        assert tools["create_volume"]["inputSchema"]["required"] == ["name"]
        assert "user" in tools["start_background_command"]["inputSchema"]["properties"]
        # A daemon that is down is a tool error the model can read, not a crash.
        res = session.call("exec", sandbox_id="sb-000000000000", command="true")
        assert res["isError"] is True
        assert "[connection_failed]" in res["content"][0]["text"]
        unknown = session.request("tools/call", {"name": "no_such_tool", "arguments": {}})
        assert "error" in unknown or unknown["result"].get("isError") is True
        assert session.close() == 0
    finally:
        session.kill()


def test_sandbox_tree_and_keep_branch_against_a_fake_daemon() -> None:
    tree = {
        "root": "sb-aaaaaaaaaaaa",
        "sandboxes": [
            {
                "id": "sb-aaaaaaaaaaaa",
                "name": "agent",
                "state": "running",
                "parent": None,
                "started_from": None,
                "children": ["sb-c00000000001"],
                "unique_memory_bytes": 2048,
                "disk_bytes": None,
            },
            {
                "id": "sb-c00000000001",
                "name": None,
                "state": "running",
                "parent": "sb-aaaaaaaaaaaa",
                "started_from": "snap-bbbbbbbbbbbb",
                "children": [],
                "unique_memory_bytes": None,
                "disk_bytes": 512,
            },
        ],
        "snapshots": [
            {"id": "snap-bbbbbbbbbbbb", "kind": "branch", "source_sandbox": "sb-aaaaaaaaaaaa", "size_bytes": 9}
        ],
    }
    fake = FakeDaemon().start()
    fake.load(
        [
            {"status": 200, "json": tree},
            {"status": 200, "json": {"kept": "sb-c00000000001", "deleted": ["sb-aaaaaaaaaaaa"], "name": "agent"}},
            {"status": 409, "json": {"error": {"code": "conflict", "message": "sb-c00000000001 has no siblings left"}}},
        ]
    )
    session = McpSession("--url", fake.url, "--token", "t")
    try:
        session.initialize()
        assert structured(session.call("sandbox_tree", sandbox_id="sb-c00000000001")) == {
            "root": "sb-aaaaaaaaaaaa",
            "sandboxes": [
                {
                    "sandbox_id": "sb-aaaaaaaaaaaa",
                    "name": "agent",
                    "state": "running",
                    "parent": None,
                    "started_from": None,
                    "children": ["sb-c00000000001"],
                    "unique_memory_bytes": 2048,
                    "disk_bytes": None,
                },
                {
                    "sandbox_id": "sb-c00000000001",
                    "name": None,
                    "state": "running",
                    "parent": "sb-aaaaaaaaaaaa",
                    "started_from": "snap-bbbbbbbbbbbb",
                    "children": [],
                    "unique_memory_bytes": None,
                    "disk_bytes": 512,
                },
            ],
            "snapshots": [
                {
                    "snapshot_id": "snap-bbbbbbbbbbbb",
                    "kind": "branch",
                    "source_sandbox": "sb-aaaaaaaaaaaa",
                    "size_bytes": 9,
                }
            ],
        }
        assert structured(session.call("keep_branch", sandbox_id="sb-c00000000001", promote=True)) == {
            "kept": "sb-c00000000001",
            "deleted": ["sb-aaaaaaaaaaaa"],
            "name": "agent",
        }
        refused = session.call("keep_branch", sandbox_id="sb-c00000000001")
        assert refused["isError"] is True and "[conflict]" in refused["content"][0]["text"]
        assert session.close() == 0
    finally:
        session.kill()
        fake.stop()
    assert [(r.method, r.path, json.loads(r.body or b"null")) for r in fake.requests] == [
        ("GET", "/v1/sandboxes/sb-c00000000001/tree", None),
        ("POST", "/v1/sandboxes/sb-c00000000001/keep", {"promote": True}),
        ("POST", "/v1/sandboxes/sb-c00000000001/keep", {"promote": False}),
    ]


def test_merge_sandboxes_reports_conflicts_as_a_result_against_a_fake_daemon() -> None:
    parent = "sb-aaaaaaaaaaaa"
    fake = FakeDaemon().start()
    fake.files = FakeFiles(sandboxes={parent: {"/root/work/calc.sh": "a - b"}})
    # The two children the session made are killed when it ends.
    fake.load([{"status": 204}, {"status": 204}])
    session = McpSession("--url", fake.url, "--token", "t")
    try:
        session.initialize()
        branched = structured(session.call("branch_sandbox", sandbox_id=parent, n=2, mergeable=True))
        child, _ = branched["children"]
        structured(session.call("write_file", sandbox_id=child, path="/root/work/calc.sh", content="a + b"))
        structured(session.call("write_file", sandbox_id=child, path="/root/work/test.sh", content="test"))
        structured(session.call("write_file", sandbox_id=parent, path="/root/work/calc.sh", content="a * b"))

        stopped = structured(session.call("merge_sandboxes", sandbox_id=parent, from_sandbox_id=child))
        unchanged = session.call("read_file", sandbox_id=parent, path="/root/work/calc.sh")
        settled = structured(
            session.call(
                "merge_sandboxes",
                sandbox_id=parent,
                from_sandbox_id=child,
                paths=["/root/work"],
                on_conflict="theirs",
            )
        )
        merged = session.call("read_file", sandbox_id=parent, path="/root/work/test.sh")
        assert session.close() == 0
    finally:
        session.kill()
        fake.stop()
    calc = {"path": "/root/work/calc.sh", "ours": "modified", "theirs": "modified"}
    assert (stopped["applied"], stopped["conflicts"]) == (False, [calc | {"resolution": None}])
    assert (stopped["sandbox_id"], stopped["from_sandbox_id"], stopped["paths"]) == (parent, child, ["/root"])
    assert unchanged["content"][0]["text"] == "a * b"
    assert settled["applied"] is True and settled["conflicts"] == [calc | {"resolution": "theirs"}]
    assert [(c["path"], c["action"]) for c in settled["changes"]] == [
        ("/root/work/calc.sh", "modify"),
        ("/root/work/test.sh", "add"),
    ]
    assert settled["bytes_copied"] == len("a + b") + len("test")
    assert merged["content"][0]["text"] == "test"
    sent = [(r.method, r.path, json.loads(r.body)) for r in fake.requests if r.method == "POST"]
    assert sent == [
        ("POST", f"/v1/sandboxes/{parent}/branch", {"count": 2, "mergeable": True}),
        ("POST", f"/v1/sandboxes/{parent}/merge", {"from": child, "on_conflict": "fail", "dry_run": False}),
        (
            "POST",
            f"/v1/sandboxes/{parent}/merge",
            {"from": child, "paths": ["/root/work"], "on_conflict": "theirs", "dry_run": False},
        ),
    ]


def test_create_and_list_sandboxes_with_metadata_against_a_fake_daemon() -> None:
    fake = FakeDaemon().start()
    fake.files = FakeFiles()
    session = McpSession("--url", fake.url, "--token", "t")
    try:
        session.initialize()
        made = structured(session.call("create_sandbox", metadata={"team": "search", "q": "a=b&c d"}))
        sid = made["sandbox_id"]
        assert made["metadata"] == {"team": "search", "q": "a=b&c d"}
        other = structured(session.call("create_sandbox"))["sandbox_id"]
        [child] = structured(session.call("branch_sandbox", sandbox_id=sid, n=1))["children"]
        kids = structured(session.call("list_sandboxes", metadata={"zygote.parent": sid}))
        tagged = structured(session.call("list_sandboxes", metadata={"q": "a=b&c d"}))
        everything = structured(session.call("list_sandboxes"))
        bad = session.call("create_sandbox", metadata={"zygote.parent": "x"})
        bad_filter = session.call("list_sandboxes", metadata={"a=b": "c"})
        assert session.close() == 0
    finally:
        session.kill()
        fake.stop()
    assert kids == {
        "sandboxes": [
            {
                "sandbox_id": child,
                "state": "running",
                "name": None,
                "metadata": {"team": "search", "q": "a=b&c d", "zygote.parent": sid},
            }
        ]
    }
    assert sorted(x["sandbox_id"] for x in tagged["sandboxes"]) == sorted([sid, child])
    assert sorted(x["sandbox_id"] for x in everything["sandboxes"]) == sorted([sid, child, other])
    assert bad["isError"] is True and "[invalid_argument]" in bad["content"][0]["text"]
    assert bad_filter["isError"] is True and "[invalid_argument]" in bad_filter["content"][0]["text"]
    assert json.loads(fake.requests[0].body) == {"image": "minimal", "metadata": {"team": "search", "q": "a=b&c d"}}
    # The session killed the three sandboxes it made on exit.
    assert sorted(r.path for r in fake.requests if r.method == "DELETE") == sorted(
        f"/v1/sandboxes/{x}" for x in (sid, child, other)
    )


def test_background_process_tools_against_a_fake_daemon() -> None:
    fake = FakeDaemon(processes=FakeProcesses()).start()
    sid = "sb-aaaaaaaaaaaa"
    session = McpSession("--url", fake.url, "--token", "t")
    try:
        session.initialize()
        started = structured(session.call("start_background_command", sandbox_id=sid, command="talk", stdin="a\n"))
        pid = started["pid"]
        first = structured(session.call("read_process_output", sandbox_id=sid, pid=pid))
        fed = structured(session.call("send_process_input", sandbox_id=sid, pid=pid, data="b\n", eof=True))
        rest = structured(
            session.call("read_process_output", sandbox_id=sid, pid=pid, offset=first["next_offset"], wait_seconds=5)
        )
        listed = structured(session.call("list_processes", sandbox_id=sid))
        sleeper = structured(session.call("start_background_command", sandbox_id=sid, command="sleep 100"))
        killed = structured(session.call("kill_process", sandbox_id=sid, pid=sleeper["pid"], signal="TERM"))
        again = structured(session.call("kill_process", sandbox_id=sid, pid=sleeper["pid"]))
        late = session.call("send_process_input", sandbox_id=sid, pid=pid, data="c\n")
        unknown = session.call("read_process_output", sandbox_id=sid, pid=424242)
        too_long = session.call("read_process_output", sandbox_id=sid, pid=pid, wait_seconds=60)
        assert session.close() == 0
    finally:
        session.kill()
        fake.stop()
    assert started == {
        "pid": pid,
        "command": ["sh", "-c", "talk"],
        "state": "running",
        "exit_code": None,
        "signal": None,
        "timed_out": False,
        "output_bytes": 12,
        "stdin_open": True,
    }
    assert json.loads(fake.requests[0].body) == {"argv": ["sh", "-c", "talk"], "stdin": "a\n", "background": True}
    assert (first["stdout"], first["stderr"], first["offset"], first["next_offset"]) == ("start\ngot a\n", "", 0, 12)
    assert fed == {"pid": pid, "written": 2, "closed": True}
    assert (rest["stdout"], rest["stderr"], rest["offset"]) == ("got b\n", "bye\n", 12)
    assert (rest["process"]["state"], rest["process"]["exit_code"]) == ("exited", 3)
    assert [p["pid"] for p in listed["processes"]] == [pid]
    assert (killed, again) == ({"pid": sleeper["pid"], "signalled": True}, {"pid": sleeper["pid"], "signalled": False})
    assert late["isError"] is True and "[process_exited]" in late["content"][0]["text"]
    assert unknown["isError"] is True and "[guest_not_found]" in unknown["content"][0]["text"]
    assert too_long["isError"] is True and "[invalid_argument]" in too_long["content"][0]["text"]


@pytest.fixture
def live_session(live_env: dict[str, str]) -> Iterator[McpSession]:
    session = McpSession("--url", live_env["url"], "--token", live_env["token"])
    try:
        yield session
    finally:
        session.kill()


@pytest.mark.live
def test_create_exec_files_branch_kill_over_mcp(live_session: McpSession, live_env: dict[str, str]) -> None:
    s = live_session
    s.initialize()
    assert {t["name"] for t in s.request("tools/list")["result"]["tools"]} == EXPECTED_TOOLS

    made = structured(s.call("create_sandbox", image="minimal", memory_mib=128, metadata={"suite": "mcp-live"}))
    sid = made["sandbox_id"]
    assert made["state"] == "running" and made["metadata"] == {"suite": "mcp-live"}

    out = structured(s.call("exec", sandbox_id=sid, command="echo hello; echo oops >&2; exit 2"))
    assert out == {"stdout": "hello\n", "stderr": "oops\n", "exit_code": 2, "timed_out": False}
    slow = structured(s.call("exec", sandbox_id=sid, command="echo started; sleep 30", timeout_seconds=1))
    assert slow["timed_out"] is True and slow["stdout"] == "started\n"

    assert structured(s.call("write_file", sandbox_id=sid, path="/root/mcp.txt", content="via mcp"))["size"] == 7
    read = s.call("read_file", sandbox_id=sid, path="/root/mcp.txt")
    assert not read.get("isError") and read["content"][0]["text"] == "via mcp"
    names = [e["name"] for e in structured(s.call("list_files", sandbox_id=sid, path="/root"))["entries"]]
    assert "mcp.txt" in names
    missing = s.call("read_file", sandbox_id=sid, path="/root/nope")
    assert missing["isError"] is True and "[guest_not_found]" in missing["content"][0]["text"]

    bg = structured(s.call("start_background_command", sandbox_id=sid, command="echo up; read x; echo got $x"))
    structured(s.call("send_process_input", sandbox_id=sid, pid=bg["pid"], data="it\n"))
    done = structured(s.call("read_process_output", sandbox_id=sid, pid=bg["pid"], wait_seconds=10))
    while done["process"]["state"] == "running":
        done = structured(s.call("read_process_output", sandbox_id=sid, pid=bg["pid"], wait_seconds=10))
    assert done["process"]["exit_code"] == 0
    final = structured(s.call("read_process_output", sandbox_id=sid, pid=bg["pid"]))
    assert final["stdout"] == "up\ngot it\n"
    assert bg["pid"] in [p["pid"] for p in structured(s.call("list_processes", sandbox_id=sid))["processes"]]

    [child] = structured(s.call("branch_sandbox", sandbox_id=sid, n=1))["children"]
    assert structured(s.call("exec", sandbox_id=child, command="cat /root/mcp.txt"))["stdout"] == "via mcp"
    kids = structured(s.call("list_sandboxes", metadata={"zygote.parent": sid}))["sandboxes"]
    assert [(k["sandbox_id"], k["metadata"]) for k in kids] == [(child, {"suite": "mcp-live", "zygote.parent": sid})]

    assert structured(s.call("kill_sandbox", sandbox_id=sid)) == {"sandbox_id": sid, "killed": True}
    gone = s.call("exec", sandbox_id=sid, command="true")
    assert gone["isError"] is True and "[not_found]" in gone["content"][0]["text"]

    # The child was left running on purpose: ending the session kills what
    # the server created.
    assert s.close() == 0
    with Client(live_env["url"], live_env["token"]) as c:
        left = {x.id for x in c.sandboxes()}
    assert sid not in left and child not in left


def test_sandbox_metrics_against_a_fake_daemon() -> None:
    sample = {
        "timestamp": "2026-01-01T00:00:05Z",
        "timestamp_unix": 1767225605,
        "cpu_count": 2,
        "cpu_used_pct": 12.5,
        "mem_total": 536870912,
        "mem_used": 104857600,
        "mem_cache": 10485760,
        "disk_total": 1073741824,
        "disk_used": 314572800,
    }
    older = {**sample, "timestamp": "2026-01-01T00:00:00Z", "timestamp_unix": 1767225600}
    fake = FakeDaemon().start()
    fake.load([{"status": 200, "json": {"metrics": [older, sample]}}])
    session = McpSession("--url", fake.url, "--token", "t")
    try:
        session.initialize()
        got = structured(session.call("sandbox_metrics", sandbox_id="sb-aaaaaaaaaaaa", start=1767225600, limit=1))
        backwards = session.call("sandbox_metrics", sandbox_id="sb-aaaaaaaaaaaa", start=5, end=1)
        assert session.close() == 0
    finally:
        session.kill()
        fake.stop()
    assert got == {"sandbox_id": "sb-aaaaaaaaaaaa", "metrics": [sample]}
    assert backwards["isError"] is True and "[invalid_argument]" in backwards["content"][0]["text"]
    assert [(r.path, r.query) for r in fake.requests] == [
        ("/v1/sandboxes/sb-aaaaaaaaaaaa/metrics", {"start": "1767225600"})
    ]


def test_pause_and_resume_tools_against_a_fake_daemon() -> None:
    fake = FakeDaemon().start()
    fake.files = FakeFiles()
    session = McpSession("--url", fake.url, "--token", "t")
    try:
        session.initialize()
        sid = structured(session.call("create_sandbox"))["sandbox_id"]
        paused = structured(session.call("pause_sandbox", sandbox_id=sid))
        refused = session.call("read_file", sandbox_id=sid, path="/root/x")
        again = session.call("pause_sandbox", sandbox_id=sid)
        resumed = structured(session.call("resume_sandbox", sandbox_id=sid))
        assert session.close() == 0
    finally:
        session.kill()
        fake.stop()
    assert paused == {"sandbox_id": sid, "state": "paused"}
    assert refused["isError"] is True and "[sandbox_paused]" in refused["content"][0]["text"]
    assert again["isError"] is True and "[wrong_state]" in again["content"][0]["text"]
    assert resumed == {"sandbox_id": sid, "state": "running"}


def test_events_tool_against_a_fake_daemon() -> None:
    fake = FakeDaemon().start()
    newest_first = [
        {"ts_ms": 2, "level": "warn", "message": "command ended", "fields": {"exit_code": "1"}},
        {"ts_ms": 1, "level": "info", "message": "sandbox started", "fields": {"image": "minimal"}},
    ]
    fake.load([{"status": 200, "json": {"events": newest_first}}])
    session = McpSession("--url", fake.url, "--token", "t")
    try:
        session.initialize()
        got = structured(session.call("sandbox_events", sandbox_id="sb-aaaaaaaaaaaa", level="info", limit=2))
        bad = session.call("sandbox_events", sandbox_id="sb-aaaaaaaaaaaa", level="loud")
        assert session.close() == 0
    finally:
        session.kill()
        fake.stop()
    assert [e["message"] for e in got["events"]] == ["sandbox started", "command ended"], "oldest first"
    assert got["events"][1]["fields"] == {"exit_code": "1"}
    assert bad["isError"] is True and "level must be one of" in bad["content"][0]["text"]
    asked = [r for r in fake.requests if r.path.endswith("/events")]
    assert len(asked) == 1 and asked[0].query == {"limit": "2", "order": "desc", "level": "info"}


def test_egress_tool_against_a_fake_daemon() -> None:
    fake = FakeDaemon().start()
    entry = {
        "sandbox": "sb-aaaaaaaaaaaa",
        "event": "refused",
        "host": "pypi.org",
        "address": "192.0.2.9",
        "port": 443,
        "protocol": "tls",
        "reason": "192.0.2.9 is not in this sandbox's DNS answers for pypi.org",
        "started_ms": 5,
    }
    fake.load([{"status": 200, "json": {"entries": [entry]}}])
    session = McpSession("--url", fake.url, "--token", "t")
    try:
        session.initialize()
        got = structured(session.call("sandbox_egress", sandbox_id="sb-aaaaaaaaaaaa", limit=7))
        assert session.close() == 0
    finally:
        session.kill()
        fake.stop()
    [e] = got["egress"]
    assert (e["event"], e["host"], e["port"], e["bytes_in"], e["ended_ms"]) == ("refused", "pypi.org", 443, 0, None)
    asked = [r for r in fake.requests if r.path.endswith("/egress")]
    assert len(asked) == 1 and asked[0].query == {"limit": "7"}


def test_image_and_snapshot_pack_tools_against_a_fake_daemon() -> None:
    app, warm = "127.0.0.1:5000/team/app:1", "127.0.0.1:5000/team/warm:v1"
    oci = FakeOci(registry={app: RegistryImage(layers=[100])})
    exit_ok = {"type": "exit", "exit_code": 0, "signal": None, "timed_out": False, "duration_ms": 1}
    fake = FakeDaemon(files=FakeFiles(), oci=oci).start()
    fake.load([{"status": 200, "ndjson": [{"type": "output", "stream": "stdout", "data": "MTAwMAo="}, exit_ok]}])
    session = McpSession("--url", fake.url, "--token", "t")
    try:
        session.initialize()
        pulled = structured(session.call("pull_image", reference=app))
        missing = session.call("pull_image", reference="127.0.0.1:5000/team/missing:1")
        sid = structured(session.call("create_sandbox", image=app))["sandbox_id"]
        ran = structured(session.call("exec", sandbox_id=sid, command="id -u", user="1000"))
        snap = structured(session.call("snapshot_sandbox", sandbox_id=sid, name="warm"))["snapshot_id"]
        pushed = structured(session.call("push_snapshot", snapshot_id=snap, reference=warm))
        got = structured(session.call("pull_snapshot", reference=warm, name="warm-2"))
        restored = structured(session.call("restore_snapshot", snapshot_id=got["snapshot_id"]))
        unknown = session.call("pull_snapshot", reference="127.0.0.1:5000/team/none:v1")
        assert session.close() == 0
    finally:
        session.kill()
        fake.stop()
    assert pulled == {"image": app, "source": app, "digest": oci.registry[app].manifest(app), "size_bytes": 1 << 30}
    assert missing["isError"] is True and "[image_not_found]" in missing["content"][0]["text"]
    assert ran["stdout"] == "1000\n"
    [exec_req] = [r for r in fake.requests if r.path.endswith("/exec/stream")]
    assert json.loads(exec_req.body)["user"] == "1000"
    assert pushed == {"reference": warm, "digest": oci.packs[warm].digest, "size_bytes": 6000}
    assert got["name"] == "warm-2" and got["pack"] == {"source": f"oci://{warm}", "digest": pushed["digest"]}
    assert restored["sandbox_id"].startswith("sb-")
    assert unknown["isError"] is True and "[image_not_found]" in unknown["content"][0]["text"]


def test_run_code_tool_against_a_fake_daemon() -> None:
    png = "iVBORw0KGgo="
    events = [
        {"type": "stdout", "text": "hi\n"},
        {"type": "result", "main": False, "data": {"image/png": png, "text/plain": "<Figure>"}},
        {"type": "result", "main": True, "data": {"text/plain": "42"}},
        {"type": "done", "execution_count": 2},
    ]
    fake = FakeDaemon().start()
    fake.load(
        [
            {"status": 200, "ndjson": events},
            {"status": 422, "json": {"error": {"code": "no_code_interpreter", "message": "no interpreter"}}},
        ]
    )
    session = McpSession("--url", fake.url, "--token", "t")
    try:
        session.initialize()
        got = structured(
            session.call("run_code", sandbox_id="sb-aaaaaaaaaaaa", code="x", timeout_seconds=2, envs={"ZYG_A": "1"})
        )
        refused = session.call("run_code", sandbox_id="sb-aaaaaaaaaaaa", code="x")
        assert session.close() == 0
    finally:
        session.kill()
        fake.stop()
    assert got["stdout"] == "hi\n" and got["execution_count"] == 2 and got["error"] is None
    assert got["results"][0]["images"] == [{"mime": "image/png", "data": png}]
    assert got["results"][1] == {"main": True, "formats": ["text/plain"], "text": "42"}
    sent = json.loads(fake.requests[0].body)
    assert sent == {"code": "x", "language": "python", "timeout_ms": 2000, "envs": {"ZYG_A": "1"}}
    assert refused["isError"] is True and "[no_code_interpreter]" in refused["content"][0]["text"]
