"""Unit tests beyond the shared vectors: configuration, transport errors,
context managers, async callbacks, Unix sockets. No VM involved."""

from __future__ import annotations

import json
import os
import socket
import socketserver
import tempfile
import threading
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any, Iterator
from urllib.parse import parse_qsl

import pytest

import zygote
from zygote import AsyncClient, AsyncSandbox, Client, Sandbox, _api
from zygote._config import DEFAULT_URL, resolve

from .fake_daemon import FakeDaemon, FakeFiles

SANDBOX = {"id": "sb-aaaaaaaaaaaa", "state": "running"}


@pytest.fixture
def fake() -> Iterator[FakeDaemon]:
    f = FakeDaemon().start()
    yield f
    f.stop()


def test_config_prefers_arguments_then_env_then_token_file(tmp_path: Path) -> None:
    state = tmp_path / "state"
    state.mkdir()
    (state / "token").write_text("from-file\n")
    env = {"ZYGOTE_STATE_DIR": str(state)}
    assert resolve(env=env) == resolve(url=DEFAULT_URL, token="from-file", env={})
    env["ZYGOTE_TOKEN"] = "from-env"
    env["ZYGOTE_URL"] = "http://10.0.0.1:9"
    cfg = resolve(env=env)
    assert (cfg.url, cfg.token) == ("http://10.0.0.1:9", "from-env")
    cfg = resolve(url="http://127.0.0.1:1", token="arg", env=env)
    assert (cfg.url, cfg.token) == ("http://127.0.0.1:1", "arg")


def test_token_file_follows_the_daemons_state_dir_rules(tmp_path: Path) -> None:
    xdg = tmp_path / "xdg"
    (xdg / "zygote").mkdir(parents=True)
    (xdg / "zygote" / "token").write_text("xdg-token")
    assert resolve(env={"XDG_STATE_HOME": str(xdg)}).token == "xdg-token"
    home = tmp_path / "home"
    (home / ".local/state/zygote").mkdir(parents=True)
    (home / ".local/state/zygote/token").write_text("home-token")
    assert resolve(env={"HOME": str(home)}).token == "home-token"
    # No file anywhere: no token (the daemon will answer 401).
    assert resolve(env={"HOME": str(tmp_path / "nobody")}).token is None


def test_bad_url_and_unix_urls() -> None:
    with pytest.raises(ValueError, match="bad zygoted URL"):
        resolve(url="ftp://x", env={})
    cfg = resolve(url="unix:///run/zygote.sock", token="t", env={})
    assert cfg.unix_socket == "/run/zygote.sock"
    assert cfg.base_url.startswith("http://")


def test_ca_cert_from_env() -> None:
    assert resolve(url="https://h:1", token="t", env={"ZYGOTE_CA_CERT": "/ca.pem"}).verify == "/ca.pem"


def test_unreachable_daemon_is_connection_failed() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    # Nothing listens on that port now.
    with Client(f"http://127.0.0.1:{port}", "t") as c:
        with pytest.raises(zygote.ConnectionFailed) as e:
            Sandbox.create(client=c)
    assert e.value.code == "connection_failed"
    assert "is it running" in str(e.value)


def test_client_and_url_are_exclusive() -> None:
    with Client("http://127.0.0.1:1", "t") as c, pytest.raises(ValueError):
        Sandbox.create(client=c, url="http://127.0.0.1:2")


def test_empty_and_nonpositive_commands_are_refused_locally(fake: FakeDaemon) -> None:
    with Client(fake.url, "t") as c:
        sb = Sandbox("sb-aaaaaaaaaaaa", client=c)
        with pytest.raises(ValueError):
            sb.commands.run([])
        with pytest.raises(ValueError):
            sb.commands.run("true", timeout=0)
    assert fake.requests == []


def test_a_single_cidr_string_is_refused_locally(fake: FakeDaemon) -> None:
    # A str is a Sequence[str] too: sent as is it would be a list of characters.
    with Client(fake.url, "t") as c:
        with pytest.raises(TypeError, match="allow_out takes a list"):
            Sandbox.create(client=c, allow_out="10.0.0.0/8")
        with pytest.raises(TypeError, match="deny_out takes a list"):
            Sandbox.create(client=c, deny_out="1.2.3.4")
    assert fake.requests == []


@pytest.mark.anyio
async def test_async_create_sends_the_network_policy_given(fake: FakeDaemon) -> None:
    fake.load([{"status": 201, "json": {"sandboxes": [SANDBOX]}}])
    async with AsyncClient(fake.url, "t") as c:
        sb = await AsyncSandbox.create(client=c, network="egress", deny_out=("169.254.0.0/16",))
    assert sb.id == SANDBOX["id"]
    assert json.loads(fake.requests[0].body) == {
        "image": "minimal",
        "network": "egress",
        "deny_out": ["169.254.0.0/16"],
    }


def test_exposed_port_host_is_the_url_without_its_scheme() -> None:
    p = zygote.ExposedPort.from_json(
        {
            "port": 8080,
            "public": False,
            "url": "http://8080-sb-aaaaaaaaaaaa.localhost:7421",
            "path_url": "http://127.0.0.1:7421/sandboxes/sb-aaaaaaaaaaaa/ports/8080/",
        }
    )
    assert p.host == "8080-sb-aaaaaaaaaaaa.localhost:7421"
    assert (p.port, p.public) == (8080, False)


def test_context_manager_kills_on_exit_and_keeps_the_original_error(fake: FakeDaemon) -> None:
    fake.load(
        [
            {"status": 201, "json": {"sandboxes": [SANDBOX]}},
            # The clean-up fails too; the block's own error must win.
            {"status": 500, "json": {"error": {"code": "internal", "message": "boom"}}},
        ]
    )
    with Client(fake.url, "t") as c:
        with pytest.raises(KeyError):
            with Sandbox.create(client=c):
                raise KeyError("the real problem")
    assert [(r.method, r.path) for r in fake.requests] == [
        ("POST", "/v1/sandboxes"),
        ("DELETE", "/v1/sandboxes/sb-aaaaaaaaaaaa"),
    ]


def test_context_manager_raises_a_failed_cleanup_when_the_block_succeeded(fake: FakeDaemon) -> None:
    fake.load(
        [
            {"status": 201, "json": {"sandboxes": [SANDBOX]}},
            {"status": 500, "json": {"error": {"code": "internal", "message": "boom"}}},
        ]
    )
    with Client(fake.url, "t") as c, pytest.raises(zygote.ServerError):
        with Sandbox.create(client=c):
            pass


@pytest.mark.anyio
async def test_async_context_manager_and_coroutine_callbacks(fake: FakeDaemon) -> None:
    out = {"type": "output", "stream": "stdout", "data": "aGkK"}  # "hi\n"
    fake.load(
        [
            {"status": 201, "json": {"sandboxes": [SANDBOX]}},
            {"status": 200, "ndjson": [{"type": "started", "pid": 1}, out,
                                       {"type": "exit", "exit_code": 0, "timed_out": False, "duration_ms": 1}]},
            {"status": 204},
        ]
    )
    seen: list[str] = []

    async def on_stdout(text: str) -> None:
        seen.append(text)

    async with AsyncClient(fake.url, "t") as c:
        async with await AsyncSandbox.create(client=c) as sb:
            r = await sb.commands.run("echo hi", on_stdout=on_stdout)
    assert (r.stdout, r.exit_code, seen) == ("hi\n", 0, ["hi\n"])
    assert fake.requests[-1].method == "DELETE"


PARENT = "sb-aaaaaaaaaaaa"


def branch_answer(failed: list[dict[str, Any]]) -> dict[str, Any]:
    """A 201 branch answer: children 0 and 2 run; ``failed`` as given."""
    return {
        "status": 201,
        "json": {
            "parent": PARENT,
            "branch_point": "snap-bbbbbbbbbbbb",
            "children": ["sb-c00000000001", "sb-c00000000003"],
            "failed": failed,
            "duration_ms": 900,
            "pause_ms": 7.5,
        },
    }


LOST_CHILD = [{"index": 1, "error": "the agent did not answer"}]


def test_branch_with_a_lost_child_raises_branch_incomplete_with_the_running_ones(fake: FakeDaemon) -> None:
    fake.load([branch_answer(LOST_CHILD)])
    with Client(fake.url, "t") as c:
        with pytest.raises(zygote.BranchIncomplete) as e:
            Sandbox(PARENT, client=c).branch(n=3)
    err = e.value
    assert isinstance(err, zygote.ZygoteError) and err.code == "branch_incomplete"
    assert all(type(k) is Sandbox and k.client is c for k in err.children)
    assert [k.id for k in err.children] == ["sb-c00000000001", "sb-c00000000003"]
    assert err.failures == [zygote.BranchFailure(index=1, error="the agent did not answer")]
    assert err.parent == PARENT
    assert "2 of 3" in str(err) and "child 1 failed: the agent did not answer" in str(err)


def test_branch_allow_partial_returns_the_running_children(fake: FakeDaemon) -> None:
    fake.load([branch_answer(LOST_CHILD)])
    with Client(fake.url, "t") as c:
        kids = Sandbox(PARENT, client=c).branch(n=3, allow_partial=True)
    assert [k.id for k in kids] == ["sb-c00000000001", "sb-c00000000003"]
    # allow_partial is the SDK's choice: the request is the same.
    assert json.loads(fake.requests[0].body) == {"count": 3}


def test_envs_secrets_and_per_child_env_are_sent_as_the_api_takes_them(fake: FakeDaemon) -> None:
    fake.load([{"status": 201, "json": {"sandboxes": [SANDBOX]}}, branch_answer([])])
    with Client(fake.url, "t") as c:
        sb = Sandbox.create(
            client=c,
            envs={"TASK": "root"},
            secrets={
                "TOKEN": {"value": "s3cret", "inherit": False},
                "KEY": "k",
                "API": {"value": "sk", "hosts": ["api.openai.com"]},
            },
        )
        sb.branch(n=2, env=[{"SEED": "1"}, {"SEED": "2"}])
        with pytest.raises(ValueError, match="one mapping per child"):
            sb.branch(n=2, env=[{"SEED": "1"}])
        with pytest.raises(TypeError, match="secret 'X'"):
            Sandbox.create(client=c, secrets={"X": 3})
        with pytest.raises(TypeError, match="hosts is a list"):
            Sandbox.create(client=c, secrets={"X": {"value": "v", "hosts": "api.openai.com"}})
    assert json.loads(fake.requests[0].body) == {
        "image": "minimal",
        "envs": {"TASK": "root"},
        "secrets": {
            "TOKEN": {"value": "s3cret", "inherit": False},
            "KEY": {"value": "k"},
            "API": {"value": "sk", "hosts": ["api.openai.com"]},
        },
    }
    assert json.loads(fake.requests[1].body) == {"count": 2, "env": [{"SEED": "1"}, {"SEED": "2"}]}
    assert len(fake.requests) == 2


def test_diff_sends_the_query_and_parses_the_answer(fake: FakeDaemon) -> None:
    answer = {
        "sandbox": "sb-b",
        "against": "sb-c",
        "path": "/root",
        "added": [{"path": "new.txt", "kind": "file", "size": 3, "mode": 420}],
        "removed": [],
        "modified": [
            {
                "path": "x",
                "kind_before": "file",
                "kind": "file",
                "size_before": 1,
                "size": 2,
                "mode_before": 420,
                "mode": 420,
                "unified": "--- a\n+++ b\n",
            }
        ],
        "entries": 2,
        "against_entries": 1,
    }
    fake.load([{"status": 200, "json": answer}])
    with Client(fake.url, "t") as c:
        d = Sandbox("sb-b", client=c).diff(Sandbox("sb-c", client=c), "/srv", content=True)
    assert fake.requests[0].method == "GET"
    assert fake.requests[0].path == "/v1/sandboxes/sb-b/diff"
    assert fake.requests[0].query == {"against": "sb-c", "content": "true", "path": "/srv"}
    assert [e.path for e in d.added] == ["new.txt"] and not d.identical
    assert d.modified[0].unified == "--- a\n+++ b\n"


def test_branch_without_failures_returns_the_children(fake: FakeDaemon) -> None:
    fake.load([branch_answer([])])
    with Client(fake.url, "t") as c:
        kids = Sandbox(PARENT, client=c).branch(n=2)
    assert [k.id for k in kids] == ["sb-c00000000001", "sb-c00000000003"]


@pytest.mark.anyio
async def test_async_branch_with_a_lost_child_raises_branch_incomplete(fake: FakeDaemon) -> None:
    fake.load([branch_answer(LOST_CHILD), branch_answer(LOST_CHILD), branch_answer([])])
    async with AsyncClient(fake.url, "t") as c:
        sb = AsyncSandbox(PARENT, client=c)
        with pytest.raises(zygote.BranchIncomplete) as e:
            await sb.branch(n=3)
        partial = await sb.branch(n=3, allow_partial=True)
        complete = await sb.branch(n=2)
    assert all(type(k) is AsyncSandbox and k.client is c for k in e.value.children)
    assert [k.id for k in e.value.children] == ["sb-c00000000001", "sb-c00000000003"]
    assert [(f.index, f.error) for f in e.value.failures] == [(1, "the agent did not answer")]
    assert e.value.parent == PARENT
    assert [k.id for k in partial] == [k.id for k in complete] == ["sb-c00000000001", "sb-c00000000003"]


TREE: dict[str, Any] = {
    "root": PARENT,
    "sandboxes": [
        {
            "id": PARENT,
            "name": "agent",
            "state": "running",
            "parent": None,
            "started_from": None,
            "children": ["sb-c00000000001", "sb-c00000000002"],
            "unique_memory_bytes": 52428800,
            "disk_bytes": 4096,
        },
        {
            "id": "sb-c00000000001",
            "name": None,
            "state": "running",
            "parent": PARENT,
            "started_from": "snap-bbbbbbbbbbbb",
            "children": [],
            "unique_memory_bytes": 1048576,
            "disk_bytes": None,
        },
        {
            "id": "sb-c00000000002",
            "name": None,
            "state": "dead",
            "parent": PARENT,
            "started_from": "snap-bbbbbbbbbbbb",
            "children": [],
            "unique_memory_bytes": None,
            "disk_bytes": None,
        },
    ],
    "snapshots": [
        {"id": "snap-bbbbbbbbbbbb", "kind": "branch", "source_sandbox": PARENT, "size_bytes": 134217728},
    ],
}


def test_tree_gets_the_lineage_and_parses_every_field(fake: FakeDaemon) -> None:
    fake.load([{"status": 200, "json": TREE}])
    with Client(fake.url, "t") as c:
        tree = Sandbox("sb-c00000000001", client=c).tree()
    assert [(r.method, r.path, r.body) for r in fake.requests] == [("GET", "/v1/sandboxes/sb-c00000000001/tree", b"")]
    assert isinstance(tree, zygote.SandboxTree) and tree.root == PARENT
    root, kept, dead = tree.sandboxes
    assert root == zygote.TreeNode(
        id=PARENT,
        name="agent",
        state="running",
        parent=None,
        started_from=None,
        children=("sb-c00000000001", "sb-c00000000002"),
        unique_memory_bytes=52428800,
        disk_bytes=4096,
        raw=TREE["sandboxes"][0],
    )
    assert (kept.parent, kept.started_from, kept.unique_memory_bytes, kept.disk_bytes) == (
        PARENT,
        "snap-bbbbbbbbbbbb",
        1048576,
        None,
    )
    assert (dead.name, dead.state, dead.children, dead.unique_memory_bytes, dead.disk_bytes) == (
        None,
        "dead",
        (),
        None,
        None,
    )
    assert tree.snapshots == (
        zygote.TreeSnapshot(
            id="snap-bbbbbbbbbbbb", kind="branch", source_sandbox=PARENT, size_bytes=134217728, raw={}
        ),
    )


def test_keep_posts_promote_and_parses_the_result(fake: FakeDaemon) -> None:
    fake.load(
        [
            {"status": 200, "json": {"kept": "sb-c00000000001", "deleted": ["sb-c00000000002"], "name": None}},
            {
                "status": 200,
                "json": {"kept": "sb-c00000000001", "deleted": ["sb-c00000000003", PARENT], "name": "agent"},
            },
        ]
    )
    with Client(fake.url, "t") as c:
        sb = Sandbox("sb-c00000000001", client=c)
        plain = sb.keep()
        promoted = sb.keep(promote=True)
    assert [(r.method, r.path, json.loads(r.body)) for r in fake.requests] == [
        ("POST", "/v1/sandboxes/sb-c00000000001/keep", {"promote": False}),
        ("POST", "/v1/sandboxes/sb-c00000000001/keep", {"promote": True}),
    ]
    assert plain == zygote.KeepResult(kept="sb-c00000000001", deleted=("sb-c00000000002",), name=None)
    assert promoted == zygote.KeepResult(kept="sb-c00000000001", deleted=("sb-c00000000003", PARENT), name="agent")


def test_keep_refused_is_a_conflict_error_and_a_missing_sandbox_not_found(fake: FakeDaemon) -> None:
    message = "sb-aaaaaaaaaaaa is not a branch child: there are no siblings to drop"
    fake.load(
        [
            {"status": 409, "json": {"error": {"code": "conflict", "message": message}}},
            {"status": 404, "json": {"error": {"code": "not_found", "message": 'sandbox "sb-x" not found'}}},
        ]
    )
    with Client(fake.url, "t") as c:
        with pytest.raises(zygote.ConflictError) as e:
            Sandbox(PARENT, client=c).keep(promote=True)
        with pytest.raises(zygote.SandboxNotFound):
            Sandbox("sb-x", client=c).tree()
    assert type(e.value) is zygote.ConflictError
    assert (e.value.code, e.value.status, e.value.message) == ("conflict", 409, message)


@pytest.mark.anyio
async def test_async_tree_and_keep(fake: FakeDaemon) -> None:
    conflict = {"error": {"code": "conflict", "message": "sb-c00000000001 has no siblings left"}}
    fake.load(
        [
            {"status": 200, "json": TREE},
            {"status": 200, "json": {"kept": "sb-c00000000001", "deleted": ["sb-c00000000002"], "name": None}},
            {"status": 409, "json": conflict},
        ]
    )
    async with AsyncClient(fake.url, "t") as c:
        sb = AsyncSandbox("sb-c00000000001", client=c)
        tree = await sb.tree()
        kept = await sb.keep()
        with pytest.raises(zygote.ConflictError) as e:
            await sb.keep()
    assert [n.id for n in tree.sandboxes] == [PARENT, "sb-c00000000001", "sb-c00000000002"]
    assert tree.sandboxes[2].unique_memory_bytes is None and tree.snapshots[0].kind == "branch"
    assert kept.deleted == ("sb-c00000000002",) and kept.name is None
    assert e.value.status == 409
    assert [(r.method, r.path) for r in fake.requests] == [
        ("GET", "/v1/sandboxes/sb-c00000000001/tree"),
        ("POST", "/v1/sandboxes/sb-c00000000001/keep"),
        ("POST", "/v1/sandboxes/sb-c00000000001/keep"),
    ]
    assert json.loads(fake.requests[1].body) == {"promote": False}


WORK = "/root/work"


def project(fake: FakeDaemon, *, keeps_points: bool = False) -> None:
    """The parent holds a small project (and a file outside it) in the fake's file model."""
    fake.files = FakeFiles(
        sandboxes={PARENT: {f"{WORK}/calc.sh": "a - b", f"{WORK}/README": "calc", "/root/notes": "n"}},
        keeps_points=keeps_points,
    )


def test_merge_brings_a_childs_changes_into_the_parent_and_keeps_the_parents_own(fake: FakeDaemon) -> None:
    project(fake)
    with Client(fake.url, "t") as c:
        parent = Sandbox(PARENT, client=c)
        [child] = parent.branch(mergeable=True)
        child.files.write(f"{WORK}/calc.sh", "a + b")
        child.files.write(f"{WORK}/test.sh", "test")
        child.files.write("/root/notes", "outside the merged directory")
        parent.files.write(f"{WORK}/parent.txt", "the parent's own")

        preview = parent.merge(child, [WORK], dry_run=True)
        assert not preview.applied and parent.files.read(f"{WORK}/calc.sh") == "a - b"

        report = parent.merge(child, paths=[WORK])
        paths = (f"{WORK}/calc.sh", f"{WORK}/test.sh", f"{WORK}/parent.txt", "/root/notes")
        after = {p: parent.files.read(p) for p in paths}
    assert json.loads(fake.requests[0].body) == {"count": 1, "mergeable": True}
    merges = [json.loads(r.body) for r in fake.requests if r.path.endswith("/merge")]
    assert merges == [
        {"from": child.id, "paths": [WORK], "on_conflict": "fail", "dry_run": True},
        {"from": child.id, "paths": [WORK], "on_conflict": "fail", "dry_run": False},
    ]
    assert isinstance(report, zygote.MergeReport) and report.applied
    assert (report.sandbox, report.from_, report.paths, report.conflicts) == (PARENT, child.id, (WORK,), ())
    assert [(ch.path, ch.action, ch.kind, ch.size) for ch in report.changes] == [
        (f"{WORK}/calc.sh", "modify", "file", 5),
        (f"{WORK}/test.sh", "add", "file", 4),
    ]
    assert preview.changes == report.changes and report.bytes_copied == 9
    assert after == {
        f"{WORK}/calc.sh": "a + b",
        f"{WORK}/test.sh": "test",
        f"{WORK}/parent.txt": "the parent's own",
        "/root/notes": "n",
    }


def test_a_merge_stopped_by_conflicts_raises_merge_conflict_error_and_changes_nothing(fake: FakeDaemon) -> None:
    project(fake, keeps_points=True)
    with Client(fake.url, "t") as c:
        parent = Sandbox(PARENT, client=c)
        [child] = parent.branch()
        child.files.write(f"{WORK}/calc.sh", "a + b")
        child.files.write(f"{WORK}/test.sh", "test")
        parent.files.write(f"{WORK}/calc.sh", "a * b")
        with pytest.raises(zygote.MergeConflictError) as e:
            parent.merge(child.id, [WORK])
        with pytest.raises(zygote.FileNotFound):
            parent.files.read(f"{WORK}/test.sh")
        unchanged = parent.files.read(f"{WORK}/calc.sh")
        # A dry run reports the conflict without raising; `theirs` settles it.
        dry = parent.merge(child, [WORK], dry_run=True)
        theirs = parent.merge(child, [WORK], on_conflict="theirs")
        settled = parent.files.read(f"{WORK}/calc.sh")
    err = e.value
    assert isinstance(err, zygote.ZygoteError) and not isinstance(err, zygote.ConflictError)
    assert (err.code, err.status) == ("merge_conflict", None)
    assert not err.report.applied and err.report.from_ == child.id
    assert err.conflicts == (
        zygote.MergeConflict(path=f"{WORK}/calc.sh", ours="modified", theirs="modified", resolution=None),
    )
    assert f"{WORK}/calc.sh (ours modified, theirs modified)" in str(err) and "nothing was changed" in str(err)
    assert unchanged == "a * b"
    assert not dry.applied and dry.unresolved == err.conflicts
    assert theirs.applied and [k.resolution for k in theirs.conflicts] == ["theirs"] and theirs.unresolved == ()
    assert settled == "a + b"


def test_merge_refusals_are_conflict_errors_and_paths_must_be_a_list(fake: FakeDaemon) -> None:
    project(fake)  # the kvm runtime: a branch point is kept only when asked
    with Client(fake.url, "t") as c:
        parent = Sandbox(PARENT, client=c)
        [child] = parent.branch()
        with pytest.raises(TypeError, match="paths takes a list"):
            parent.merge(child, WORK)
        with pytest.raises(zygote.ConflictError, match="was not saved") as e:
            parent.merge(child)
    assert type(e.value) is zygote.ConflictError and e.value.status == 409
    assert json.loads(fake.requests[-1].body) == {"from": child.id, "on_conflict": "fail", "dry_run": False}


@pytest.mark.anyio
async def test_async_merge_between_siblings_with_ours_and_a_conflict(fake: FakeDaemon) -> None:
    project(fake)
    async with AsyncClient(fake.url, "t") as c:
        parent = AsyncSandbox(PARENT, client=c)
        x, y = await parent.branch(2, mergeable=True)
        await x.files.write(f"{WORK}/calc.sh", "a + b")
        await x.files.write(f"{WORK}/test.sh", "test")
        await y.files.write(f"{WORK}/calc.sh", "b + a")
        with pytest.raises(zygote.MergeConflictError) as e:
            await y.merge(x, [WORK])
        ours = await y.merge(x, [WORK], on_conflict="ours")
        kept = await y.files.read(f"{WORK}/calc.sh")
        added = await y.files.read(f"{WORK}/test.sh")
    assert [ch.path for ch in e.value.report.changes] == [f"{WORK}/test.sh"]
    assert ours.applied and [(k.path, k.resolution) for k in ours.conflicts] == [(f"{WORK}/calc.sh", "ours")]
    assert [ch.path for ch in ours.changes] == [f"{WORK}/test.sh"]
    assert (kept, added) == ("b + a", "test")


def test_stream_without_exit_event_is_an_error(fake: FakeDaemon) -> None:
    fake.load([{"status": 200, "ndjson": [{"type": "started", "pid": 1}]}])
    with Client(fake.url, "t") as c:
        with pytest.raises(zygote.ServerError) as e:
            Sandbox("sb-aaaaaaaaaaaa", client=c).commands.run("true")
    assert e.value.code == "stream_ended"


def test_error_str_carries_code_and_status() -> None:
    e = zygote.errors.error_for("sandbox_not_running", "sandbox sb-1 is dead, not running", 409)
    assert isinstance(e, zygote.SandboxNotRunning) and isinstance(e, zygote.ConflictError)
    assert str(e) == "sandbox sb-1 is dead, not running (sandbox_not_running, HTTP 409)"
    unknown = zygote.errors.error_for("brand_new_code", "something", 418)
    assert type(unknown) is zygote.ZygoteError and unknown.code == "brand_new_code"


class _UnixHTTPServer(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True


def test_unix_socket_urls_work() -> None:
    seen: dict[str, Any] = {}

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:
            pass

        def do_GET(self) -> None:
            seen["auth"] = self.headers.get("Authorization")
            body = json.dumps({"sandboxes": [SANDBOX]}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    # A short path: Unix socket paths are limited to ~108 bytes.
    with tempfile.TemporaryDirectory(dir="/tmp") as d:
        path = os.path.join(d, "z.sock")
        server = _UnixHTTPServer(path, Handler)
        threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
        try:
            with Client(f"unix://{path}", "sock-token") as c:
                ids = [s.id for s in Sandbox.list(client=c)]
        finally:
            server.shutdown()
            server.server_close()
    assert ids == ["sb-aaaaaaaaaaaa"]
    assert seen["auth"] == "Bearer sock-token"


# --- metadata ------------------------------------------------------------------

# A value with the characters a query string gives meaning to.
TRICKY = "a=b&c d+e%f?"


def test_metadata_is_sent_at_create_inherited_by_branches_and_filters_the_list(fake: FakeDaemon) -> None:
    fake.files = FakeFiles()
    with Client(fake.url, "t") as c:
        sb = Sandbox.create(client=c, metadata={"team": "search", "run/id": TRICKY})
        other = Sandbox.create(client=c, metadata={"team": "infra"})
        assert json.loads(fake.requests[0].body) == {"image": "minimal", "metadata": {"team": "search", "run/id": TRICKY}}
        assert sb.info().metadata == {"team": "search", "run/id": TRICKY}
        kids = sb.branch(n=2)
        assert all(k.info().metadata == {"team": "search", "run/id": TRICKY, "zygote.parent": sb.id} for k in kids)

        by_parent = Sandbox.list(client=c, metadata={"zygote.parent": sb.id})
        assert sorted(s.id for s in by_parent) == sorted(k.id for k in kids)
        assert all(type(s) is Sandbox and s.client is c for s in by_parent)
        # Several pairs are ANDed; the value travels intact.
        both = c.sandboxes(metadata={"team": "search", "run/id": TRICKY})
        assert sorted(s.id for s in both) == sorted([sb.id] + [k.id for k in kids])
        assert [s.id for s in c.sandboxes(metadata={"team": "infra"})] == [other.id]
        assert c.sandboxes(metadata={"team": "search", "run/id": "a=b"}) == []
        assert len(c.sandboxes()) == 4 and len(c.sandboxes(metadata={})) == 4
    listed = [r for r in fake.requests if (r.method, r.path) == ("GET", "/v1/sandboxes")]
    # One metadata=key=value parameter per pair, each encoded: '=', '&', ' ', '+', '%' survive.
    assert parse_qsl(listed[1].raw_query) == [("metadata", "team=search"), ("metadata", f"run/id={TRICKY}")]
    assert "&metadata=" in listed[1].raw_query and TRICKY not in listed[1].raw_query
    assert listed[-1].raw_query == "" and listed[-2].raw_query == ""


def test_invalid_metadata_and_filters_raise_invalid_argument(fake: FakeDaemon) -> None:
    fake.files = FakeFiles()
    with Client(fake.url, "t") as c:
        for bad in ({"sp ace": "x"}, {"zygote.parent": "sb-1"}, {"k": "v" * 1025}, {f"k{i}": "v" for i in range(64)}):
            with pytest.raises(zygote.InvalidArgument) as e:
                Sandbox.create(client=c, metadata=bad)
            assert (e.value.code, e.value.status) == ("invalid_argument", 400)
        with pytest.raises(zygote.InvalidArgument):
            c.sandboxes(metadata={"bad key": "x"})
        sent = len(fake.requests)
        # A key with '=' would be split there by the daemon: refused before sending.
        with pytest.raises(ValueError, match="without '='"):
            Sandbox.list(client=c, metadata={"a=b": "c"})
        with pytest.raises(TypeError):
            c.sandboxes(metadata="team=search")  # type: ignore[arg-type]
        assert len(fake.requests) == sent
        assert c.sandboxes() == []


def test_the_fake_refuses_filters_the_daemon_refuses(fake: FakeDaemon) -> None:
    # Raw queries the SDK never sends, checked against the daemon's rules.
    fake.files = FakeFiles()
    with Client(fake.url, "t") as c:
        for params in ({"metadata": "novalue"}, {"state": "running"}):
            with pytest.raises(zygote.InvalidArgument, match="key=value|unknown query parameter"):
                c.call(_api.Call("GET", "/v1/sandboxes", _api._sandboxes, params=params))


def test_sandbox_info_without_metadata_has_an_empty_mapping() -> None:
    old = zygote.SandboxInfo.from_json({"id": "sb-1", "state": "running"})
    assert old.metadata == {}
    new = zygote.SandboxInfo.from_json({"id": "sb-1", "state": "running", "metadata": {"k": "v"}})
    assert new.metadata == {"k": "v"}


@pytest.mark.anyio
async def test_async_metadata_create_branch_and_list(fake: FakeDaemon) -> None:
    fake.files = FakeFiles()
    async with AsyncClient(fake.url, "t") as c:
        sb = await AsyncSandbox.create(client=c, metadata={"task": TRICKY})
        [kid] = await sb.branch()
        assert (await kid.info()).metadata == {"task": TRICKY, "zygote.parent": sb.id}
        found = await AsyncSandbox.list(client=c, metadata={"zygote.parent": sb.id})
        assert [s.id for s in found] == [kid.id] and type(found[0]) is AsyncSandbox
        assert {s.id for s in await c.sandboxes(metadata={"task": TRICKY})} == {sb.id, kid.id}
        with pytest.raises(zygote.InvalidArgument):
            await AsyncSandbox.create(client=c, metadata={"zygote.x": "y"})
        assert await kid.kill() is True
        assert [s.id for s in await c.sandboxes()] == [sb.id]


def test_pause_resume_and_auto_resume(fake: FakeDaemon) -> None:
    fake.files = FakeFiles()
    with Client(fake.url, "t") as c:
        sb = Sandbox.create(client=c)
        sb.files.write("/root/f", "kept")
        paused = sb.pause()
        assert (paused.state, paused.pid) == ("paused", None) and paused.paused_at is not None
        assert [(r.method, r.path, r.body) for r in fake.requests[-1:]] == [("POST", f"/v1/sandboxes/{sb.id}/pause", b"")]
        with pytest.raises(zygote.SandboxPaused) as e:
            sb.files.read("/root/f")
        assert (e.value.code, e.value.status) == ("sandbox_paused", 409)
        # A paused sandbox is also "not running" to code that catches that.
        assert isinstance(e.value, zygote.SandboxNotRunning)
        with pytest.raises(zygote.WrongState):
            sb.pause()
        assert sb.resume().state == "running"
        assert sb.files.read("/root/f") == "kept"
        with pytest.raises(zygote.WrongState):
            sb.resume()

        auto = Sandbox.create(client=c, auto_resume=True, ttl_action="pause", ttl_secs=60)
        assert json.loads(fake.requests[-1].body) == {
            "image": "minimal",
            "ttl_secs": 60,
            "ttl_action": "pause",
            "auto_resume": True,
        }
        info = auto.info()
        assert (info.auto_resume, info.ttl_action) == (True, "pause")
        auto.files.write("/root/g", "x")
        auto.pause()
        assert auto.files.read("/root/g") == "x"
        assert auto.info().state == "running"


def test_set_network_replaces_the_policy_with_what_is_given(fake: FakeDaemon) -> None:
    fake.load([{"status": 200, "json": SANDBOX}, {"status": 200, "json": SANDBOX}])
    with Client(fake.url, "t") as c:
        sb = Sandbox("sb-aaaaaaaaaaaa", client=c)
        sb.set_network(deny_out=["10.0.0.0/8"], allow_out=[])
        sb.set_network()
        with pytest.raises(TypeError, match="not one string"):
            sb.set_network(deny_out="10.0.0.0/8")
    assert [(r.method, r.path) for r in fake.requests] == [("PUT", "/v1/sandboxes/sb-aaaaaaaaaaaa/network")] * 2
    assert [json.loads(r.body) for r in fake.requests] == [
        {"allow_out": [], "deny_out": ["10.0.0.0/8"]},
        {},
    ]


METRIC = {
    "timestamp": "2026-01-01T00:00:05Z",
    "timestamp_unix": 1767225605,
    "cpu_count": 2,
    "cpu_used_pct": 12.5,
    "mem_total": 512 << 20,
    "mem_used": 100 << 20,
    "mem_cache": 10 << 20,
    "disk_total": 1 << 30,
    "disk_used": 300 << 20,
}


def test_metrics_sends_the_time_bounds_and_reads_the_samples(fake: FakeDaemon) -> None:
    import datetime

    fake.load([{"status": 200, "json": {"metrics": [METRIC]}}, {"status": 200, "json": {"metrics": []}}])
    with Client(fake.url, "t") as c:
        sb = Sandbox("sb-aaaaaaaaaaaa", client=c)
        got = sb.metrics(start=1767225600, end=datetime.datetime(2026, 1, 1, 0, 1, tzinfo=datetime.timezone.utc))
        assert sb.metrics() == []
        with pytest.raises(ValueError, match="must not be after end"):
            sb.metrics(start=10, end=5)
        with pytest.raises(ValueError, match="unix seconds"):
            sb.metrics(start=-1)
    assert got == [zygote.MetricSample.from_json(METRIC)]
    assert (got[0].cpu_used_pct, got[0].disk_used, got[0].timestamp_unix) == (12.5, 300 << 20, 1767225605)
    assert [(r.method, r.path) for r in fake.requests] == [("GET", "/v1/sandboxes/sb-aaaaaaaaaaaa/metrics")] * 2
    assert [r.query for r in fake.requests] == [{"start": "1767225600", "end": "1767225660"}, {}]


@pytest.mark.anyio
async def test_async_metrics(fake: FakeDaemon) -> None:
    fake.load([{"status": 200, "json": {"metrics": [METRIC]}}])
    async with AsyncClient(fake.url, "t") as c:
        got = await AsyncSandbox("sb-aaaaaaaaaaaa", client=c).metrics(end=1767225700)
    assert [m.cpu_count for m in got] == [2]
    assert fake.requests[0].query == {"end": "1767225700"}


def test_ttl_action_is_sent_and_checked_locally(fake: FakeDaemon) -> None:
    fake.load([{"status": 200, "json": SANDBOX}, {"status": 200, "json": SANDBOX}])
    with Client(fake.url, "t") as c:
        sb = Sandbox("sb-aaaaaaaaaaaa", client=c)
        sb.set_ttl(30, ttl_action="pause")
        sb.set_ttl(None)
        with pytest.raises(ValueError, match="ttl_action"):
            sb.set_ttl(30, ttl_action="stop")
        with pytest.raises(ValueError, match="ttl_action"):
            Sandbox.create(client=c, ttl_action="later")
    assert [json.loads(r.body) for r in fake.requests] == [
        {"ttl_secs": 30, "ttl_action": "pause"},
        {"ttl_secs": None},
    ]
    # Daemons from before pause/resume: the defaults.
    old = zygote.SandboxInfo.from_json({"id": "sb-1", "state": "running"})
    assert (old.auto_resume, old.ttl_action, old.paused_at, old.ttl_left_secs) == (False, "delete", None, None)


@pytest.mark.anyio
async def test_async_pause_and_resume(fake: FakeDaemon) -> None:
    fake.files = FakeFiles()
    async with AsyncClient(fake.url, "t") as c:
        sb = await AsyncSandbox.create(client=c)
        assert (await sb.pause()).state == "paused"
        with pytest.raises(zygote.SandboxPaused):
            await sb.files.read("/root/none")
        assert (await sb.resume()).state == "running"
        with pytest.raises(zygote.WrongState):
            await sb.resume()


def test_events_ask_for_their_filters_and_parse_the_log(fake: FakeDaemon) -> None:
    log = {
        "events": [
            {"ts_ms": 1700000000123, "level": "warn", "message": "command ended", "fields": {"exit_code": "3"}},
            {"ts_ms": 1700000000456, "level": "info", "message": "paused"},
        ]
    }
    fake.load([{"status": 200, "json": log}, {"status": 200, "json": {"events": []}}])
    with Client(fake.url, "t") as c:
        sb = Sandbox("sb-aaaaaaaaaaaa", client=c)
        got = sb.events(since_ms=5, limit=2, newest_first=True, level="warn", search="command")
        assert [(e.ts_ms, e.level, e.message, dict(e.fields)) for e in got] == [
            (1700000000123, "warn", "command ended", {"exit_code": "3"}),
            (1700000000456, "info", "paused", {}),
        ]
        assert sb.events() == []
        with pytest.raises(ValueError, match="level must be one of"):
            sb.events(level="fatal")
    assert [(r.method, r.path) for r in fake.requests] == [("GET", "/v1/sandboxes/sb-aaaaaaaaaaaa/events")] * 2
    assert fake.requests[0].query == {
        "since_ms": "5",
        "limit": "2",
        "order": "desc",
        "level": "warn",
        "search": "command",
    }
    assert fake.requests[1].query == {}


def test_volume_calls_and_mounts_are_sent_as_the_api_takes_them() -> None:
    vol = zygote.Volume.from_json({"id": "vol-1", "name": "data", "size_mib": 64, "created_at": 1})
    create = _api.create_sandboxes(image="minimal", volumes={"/data": "other", "/v": vol})
    assert create.json["volumes"] == [{"name": "other", "path": "/data"}, {"name": "data", "path": "/v"}]
    assert "volumes" not in _api.create_sandboxes(image="minimal").json
    made = _api.create_volume("data", 64)
    assert (made.method, made.path, made.json) == ("POST", "/v1/volumes", {"name": "data", "size_mib": 64})
    assert _api.create_volume("data").json == {"name": "data"}
    assert _api.get_volume("a/b").path == "/v1/volumes/a%2Fb"
    assert (_api.delete_volume("data").method, _api.list_volumes().path) == ("DELETE", "/v1/volumes")
    assert vol.attached_to is None and vol.size_mib == 64


def test_sandbox_info_carries_its_disk_and_newest_metrics_sample() -> None:
    sb = zygote.SandboxInfo.from_json(
        {"id": "sb-1", "state": "running", "disk_bytes": 4096, "metrics": METRIC}
    )
    assert sb.disk_bytes == 4096
    assert sb.metrics is not None and sb.metrics.mem_used == 100 << 20
    old = zygote.SandboxInfo.from_json({"id": "sb-1", "state": "paused", "disk_bytes": None})
    assert old.disk_bytes is None and old.metrics is None
