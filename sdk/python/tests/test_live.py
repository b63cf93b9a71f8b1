"""The SDK against a real zygoted booting real guests (qemu runtime here).

Boots are the expensive part, so one sandbox (``sb``) is shared by the
checks in this module; branches, restores and the async checks add a few
more. Everything created here is killed, and snapshots deleted, at the end.
"""

from __future__ import annotations

import time
from typing import Iterator, List

import pytest

import zygote
from zygote import AsyncClient, AsyncSandbox, Client, Sandbox

pytestmark = pytest.mark.live

MISSING = "sb-000000000000"
# The shared sandbox's labels; the value has characters a query string gives meaning to.
METADATA = {"suite": "python-live", "run/id": "a=b&c d+e"}


@pytest.fixture(scope="module")
def client(live_env: dict[str, str]) -> Iterator[Client]:
    with Client(live_env["url"], live_env["token"]) as c:
        yield c


@pytest.fixture(scope="module")
def snapshots(client: Client) -> Iterator[list[zygote.Snapshot]]:
    """Snapshots taken by the tests; deleted after every sandbox is gone."""
    taken: list[zygote.Snapshot] = []
    yield taken
    for snap in taken:
        client.delete_snapshot(snap)


@pytest.fixture(scope="module")
def sb(client: Client, snapshots: list[zygote.Snapshot]) -> Iterator[Sandbox]:
    # `snapshots` is requested first so it is torn down after this one:
    # a sandbox reads its snapshots' disk layers until it is killed.
    with Sandbox.create(image="minimal", memory_mib=128, metadata=METADATA, client=client) as s:
        yield s


def test_create_gives_a_running_sandbox(sb: Sandbox, client: Client) -> None:
    info = sb.info()
    assert info.id == sb.id
    assert info.state == "running"
    assert info.metadata == METADATA
    assert info.runtime == client.info()["runtime"]["name"]
    assert info.memory_mib == 128
    assert sb.id in [s.id for s in Sandbox.list(client=client)]
    assert Sandbox.connect(sb.id, client=client).id == sb.id


def test_run_returns_output_and_exit_code(sb: Sandbox) -> None:
    r = sb.commands.run("echo out; echo err >&2; exit 3")
    assert (r.exit_code, r.stdout, r.stderr, r.timed_out) == (3, "out\n", "err\n", False)
    r = sb.commands.run(["cat"], stdin="piped", env={"X": "1"}, cwd="/tmp")
    assert (r.exit_code, r.stdout) == (0, "piped")
    assert sb.commands.run("echo $X; pwd", env={"X": "42"}, cwd="/root").stdout == "42\n/root\n"
    with pytest.raises(zygote.CommandFailed) as e:
        sb.commands.run("exit 4", check=True)
    assert e.value.result.exit_code == 4


def test_output_is_streamed_while_the_command_runs(sb: Sandbox) -> None:
    seen: list[tuple[float, str]] = []
    errs: list[str] = []
    r = sb.commands.run(
        "for i in 1 2 3; do echo line$i; sleep 0.4; done; echo done >&2",
        on_stdout=lambda t: seen.append((time.monotonic(), t)),
        on_stderr=errs.append,
    )
    end = time.monotonic()
    assert "".join(t for _, t in seen) == r.stdout == "line1\nline2\nline3\n"
    assert "".join(errs) == "done\n"
    # line1 arrived while the program still had ~0.8 s of sleeping to do.
    assert end - seen[0][0] >= 0.6, f"first output only {end - seen[0][0]:.2f}s before the end: not streamed"


def test_files_write_read_list(sb: Sandbox) -> None:
    w = sb.files.write("/root/work/notes.txt", "hello from the sdk\n")
    assert (w.path, w.size) == ("/root/work/notes.txt", 19)
    assert sb.files.read("/root/work/notes.txt") == "hello from the sdk\n"
    blob = bytes(range(256)) * 4
    sb.files.write("/root/work/blob.bin", blob)
    assert sb.files.read_bytes("/root/work/blob.bin") == blob
    entries = {e.name: e for e in sb.files.list("/root/work")}
    assert set(entries) == {"notes.txt", "blob.bin"}
    assert (entries["blob.bin"].kind, entries["blob.bin"].size) == ("file", 1024)
    assert any(e.name == "work" and e.is_dir for e in sb.files.list("/root"))
    sb.files.write("/root/work/run.sh", "#!/bin/sh\necho ran\n", mode=0o755)
    assert sb.commands.run(["/root/work/run.sh"]).stdout == "ran\n"
    # Files written through the API are visible to programs and vice versa.
    sb.commands.run("echo from-shell > /root/work/shell.txt", check=True)
    assert sb.files.read("/root/work/shell.txt") == "from-shell\n"
    # A device file is refused unless asked for (reading /dev/zero used to buffer
    # without end); asked for, it is read, bounded by the daemon.
    with pytest.raises(zygote.InvalidArgument):
        sb.files.read_bytes("/dev/null")
    assert sb.files.read_bytes("/dev/null", special=True) == b""


def _until(chunks: List[bytes], needle: bytes, timeout: float = 60) -> None:
    end = time.time() + timeout
    while needle not in b"".join(chunks):
        assert time.time() < end, f"{needle!r} not in {b''.join(chunks)!r}"
        time.sleep(0.05)


def test_pty_round_trip(sb: Sandbox) -> None:
    chunks: List[bytes] = []
    term = sb.pty.create(80, 24, chunks.append, ["sh"], env={"PS1": "$ "})
    term.send_input("echo pty-$((6*7)); tty; stty size\n")
    _until(chunks, b"pty-42")
    _until(chunks, b"/dev/pts/")
    _until(chunks, b"24 80")
    term.resize(100, 30)
    term.send_input(b"stty size\n")
    _until(chunks, b"30 100")
    term.resize(0, 5)  # refused: an error message, nothing changes
    term.send_input("exit 3\n")
    assert term.wait(60) == zygote.PtyExit(exit_code=3, signal=None)
    assert [e.code for e in term.errors] == ["invalid_argument"]


@pytest.mark.anyio
async def test_async_pty_round_trip(sb: Sandbox, live_env: dict[str, str]) -> None:
    chunks: List[bytes] = []
    async with AsyncClient(live_env["url"], live_env["token"]) as ac:
        term = await AsyncSandbox(sb.id, client=ac).pty.create(80, 24, chunks.append, ["sh"])
        await term.send_input("echo apty-$((6*7)); exit 4\n")
        assert await term.wait() == zygote.PtyExit(exit_code=4, signal=None)
    assert b"apty-42" in b"".join(chunks)


def test_error_cases(sb: Sandbox, client: Client, live_env: dict[str, str]) -> None:
    t0 = time.monotonic()
    with pytest.raises(zygote.CommandTimeout) as timeout:
        sb.commands.run("echo before; sleep 30", timeout=1.5)
    assert time.monotonic() - t0 < 15
    assert timeout.value.code == "command_timeout"
    assert timeout.value.result.timed_out and timeout.value.result.stdout == "before\n"
    # The sandbox is fine afterwards.
    assert sb.commands.run("echo alive").stdout == "alive\n"

    with pytest.raises(zygote.FileNotFound) as nf:
        sb.files.read("/root/does-not-exist")
    assert (nf.value.code, nf.value.status) == ("guest_not_found", 404)

    with pytest.raises(zygote.SpawnFailed):
        sb.commands.run(["/no/such/program"])

    with pytest.raises(zygote.InvalidArgument):
        sb.files.read("relative/path")
    # Refused before anything boots: a bad key, a reserved one, a bad filter key.
    for refused in ({"no spaces": "x"}, {"zygote.parent": sb.id}):
        with pytest.raises(zygote.InvalidArgument) as inv:
            Sandbox.create(metadata=refused, client=client)
        assert (inv.value.code, inv.value.status) == ("invalid_argument", 400)
    with pytest.raises(zygote.InvalidArgument):
        client.sandboxes(metadata={"no spaces": "x"})

    ghost = Sandbox(MISSING, client=client)
    for action in (lambda: ghost.commands.run("true"), ghost.info, lambda: ghost.files.read("/etc/hostname")):
        with pytest.raises(zygote.SandboxNotFound) as e:
            action()
        assert (e.value.code, e.value.status) == ("not_found", 404)
    with pytest.raises(zygote.SandboxNotFound):
        Sandbox.connect(MISSING, client=client)
    assert ghost.kill() is False

    with Client(live_env["url"], "not-the-token") as bad:
        with pytest.raises(zygote.Unauthorized) as unauthorized:
            Sandbox.list(client=bad)
        assert (unauthorized.value.code, unauthorized.value.status) == ("unauthorized", 401)
        with pytest.raises(zygote.Unauthorized):
            Sandbox(sb.id, client=bad).commands.run("true")


def test_branch_into_three_children_that_diverge(sb: Sandbox) -> None:
    sb.files.write("/root/base.txt", "shared base")
    # A background process, to see that live processes (not just files)
    # carry over into every child.
    sb.commands.run("(while true; do sleep 1; done) >/dev/null 2>&1 & echo $! > /root/loop.pid", check=True)
    children = sb.branch(n=3)
    try:
        assert len(children) == 3 and len({c.id for c in children}) == 3
        # Children inherit the metadata, name their parent, and are found by it.
        for c in children:
            assert c.info().metadata == {**METADATA, "zygote.parent": sb.id}
        found = Sandbox.list(metadata={"zygote.parent": sb.id}, client=sb.client)
        assert sorted(f.id for f in found) == sorted(c.id for c in children)
        family = sb.client.sandboxes(metadata={"run/id": METADATA["run/id"], "suite": "python-live"})
        assert sorted(f.id for f in family) == sorted([sb.id] + [c.id for c in children])
        assert sb.client.sandboxes(metadata={"run/id": "a=b"}) == []
        for c in children:
            assert c.files.read("/root/base.txt") == "shared base"
            pid = c.files.read("/root/loop.pid").strip()
            assert c.commands.run(f"kill -0 {pid}").exit_code == 0, "the parent's background process lives on"
            assert c.commands.run("hostname").stdout.strip() == c.id
        # Each child changes the same file differently...
        for i, c in enumerate(children):
            c.commands.run(f"echo {i} > /root/counter", check=True)
        for i, c in enumerate(children):
            assert c.commands.run("cat /root/counter").stdout == f"{i}\n"
        # ...and what one child creates exists nowhere else.
        children[0].files.write("/root/only-in-0.txt", "child 0")
        assert children[0].files.read("/root/only-in-0.txt") == "child 0"
        for other in (sb, children[1], children[2]):
            with pytest.raises(zygote.FileNotFound):
                other.files.read("/root/only-in-0.txt")
        # The parent keeps running and diverges from its children too.
        sb.files.write("/root/after-branch.txt", "parent only")
        for c in children:
            with pytest.raises(zygote.FileNotFound):
                c.files.read("/root/after-branch.txt")
    finally:
        for c in children:
            c.kill()


def test_branch_with_progress_reports_each_child_as_it_runs(sb: Sandbox) -> None:
    seen: list[zygote.BranchProgress[Sandbox]] = []
    hostnames: dict[str, str] = {}

    def on_progress(p: zygote.BranchProgress[Sandbox]) -> None:
        assert p.sandbox is not None, p.error
        if not seen:
            # Its siblings are listed too, each creating or already running.
            family = sb.client.sandboxes(metadata={"zygote.parent": sb.id})
            states = {f.id: f.state for f in family}
            assert states[p.sandbox_id] == "running", states
            assert set(states.values()) <= {"creating", "running"}, states
        seen.append(p)
        # Usable at once, while its siblings may still be coming up.
        hostnames[p.sandbox_id] = p.sandbox.commands.run("hostname").stdout.strip()

    children = sb.branch(4, on_progress=on_progress)
    try:
        assert sorted(c.id for c in children) == sorted(p.sandbox_id for p in seen)
        assert [p.ready for p in seen] == [1, 2, 3, 4] and {p.total for p in seen} == {4}
        assert sorted(p.index for p in seen) == [0, 1, 2, 3]
        assert [p.ms for p in seen] == sorted(p.ms for p in seen)
        assert hostnames == {c.id: c.id for c in children}
    finally:
        for c in children:
            c.kill()


def test_merge_a_childs_changes_back_and_a_conflict_changes_nothing(sb: Sandbox) -> None:
    work = "/root/merge"
    sb.commands.run(f"mkdir -p {work} && echo v1 > {work}/calc.txt && echo keep > {work}/keep.txt", check=True)
    [child] = sb.branch(n=1, mergeable=True)
    try:
        child.files.write(f"{work}/new.txt", "from the child\n")
        child.commands.run(f"echo v2 > {work}/calc.txt && rm {work}/keep.txt", check=True)
        sb.files.write(f"{work}/parent.txt", "the parent's own\n")

        report = sb.merge(child, paths=[work])
        assert report.applied and report.conflicts == () and (report.sandbox, report.from_) == (sb.id, child.id)
        assert report.base == child.info().origin["branch"]["branch_point"]
        assert sorted((c.path, c.action) for c in report.changes) == [
            (f"{work}/calc.txt", "modify"),
            (f"{work}/keep.txt", "remove"),
            (f"{work}/new.txt", "add"),
        ]
        assert report.bytes_copied == len("v2\n") + len("from the child\n")
        assert sb.files.read(f"{work}/new.txt") == "from the child\n"
        assert sb.files.read(f"{work}/calc.txt") == "v2\n"
        assert sb.files.read(f"{work}/parent.txt") == "the parent's own\n"
        with pytest.raises(zygote.FileNotFound):
            sb.files.read(f"{work}/keep.txt")

        # Both change calc.txt now: the merge stops and changes nothing, the child's
        # other new file included.
        child.files.write(f"{work}/calc.txt", "child v3\n")
        child.files.write(f"{work}/later.txt", "later\n")
        sb.files.write(f"{work}/calc.txt", "parent v3\n")
        with pytest.raises(zygote.MergeConflictError) as e:
            sb.merge(child, [work])
        assert [(c.path, c.ours, c.theirs, c.resolution) for c in e.value.conflicts] == [
            (f"{work}/calc.txt", "modified", "modified", None)
        ]
        assert not e.value.report.applied and f"{work}/calc.txt" in str(e.value)
        assert sb.files.read(f"{work}/calc.txt") == "parent v3\n"
        with pytest.raises(zygote.FileNotFound):
            sb.files.read(f"{work}/later.txt")
    finally:
        child.kill()


def test_snapshot_restore_and_rollback(sb: Sandbox, client: Client, snapshots: list[zygote.Snapshot]) -> None:
    sb.files.write("/root/version.txt", "v1")
    snap = sb.snapshot(mode="full")
    snapshots.append(snap)
    assert (snap.kind, snap.source_sandbox) == ("full", sb.id)
    assert snap.id in [s.id for s in client.snapshots()]
    sb.files.write("/root/version.txt", "v2")

    restored = Sandbox.restore(snap, client=client)
    try:
        assert restored.id != sb.id
        assert restored.files.read("/root/version.txt") == "v1"
        assert restored.info().origin == {"snapshot": {"id": snap.id}}
        # Independent of its source from here on.
        restored.files.write("/root/version.txt", "restored")
        assert sb.files.read("/root/version.txt") == "v2"
    finally:
        assert restored.kill() is True

    info = sb.rollback(snap)
    assert (info.id, info.state) == (sb.id, "running")
    assert sb.files.read("/root/version.txt") == "v1"

    with pytest.raises(zygote.SnapshotNotFound):
        Sandbox.restore("snap-000000000000", client=client)


def test_kill(client: Client) -> None:
    # A sandbox of its own, so killing it does not disturb the shared one;
    # the context manager's kill is covered by `sb` itself.
    victim = Sandbox.create(memory_mib=128, client=client)
    assert victim.kill() is True
    assert victim.kill() is False
    with pytest.raises(zygote.SandboxNotFound):
        victim.info()
    with pytest.raises(zygote.SandboxNotFound):
        victim.commands.run("true")
    assert victim.id not in [s.id for s in client.sandboxes()]


def test_metrics_are_sampled_while_running(client: Client) -> None:
    import time

    sb = Sandbox.create(memory_mib=128, ttl_secs=600, client=client)
    try:
        samples: List[zygote.MetricSample] = []
        deadline = time.monotonic() + 30  # the daemon samples every 5 s by default
        while not samples and time.monotonic() < deadline:
            samples = sb.metrics()
            time.sleep(0.5)
        assert samples, "no metrics sample within 30 s"
        last = samples[-1]
        assert last.cpu_count >= 1 and 0.0 <= last.cpu_used_pct <= 100.0
        assert 0 < last.mem_used <= last.mem_total <= 128 << 20
        assert 0 < last.disk_used <= last.disk_total
        assert sb.metrics(start=last.timestamp_unix, end=last.timestamp_unix)[-1] == last
        assert sb.metrics(end=last.timestamp_unix - 3600) == []
        with pytest.raises(zygote.SandboxNotFound):
            Sandbox("sb-000000000000", client=client).metrics()
    finally:
        sb.kill()


def test_network_policy_changes_while_running(client: Client) -> None:
    sb = Sandbox.create(memory_mib=128, ttl_secs=600, client=client)
    try:
        net = sb.info().network
        if net is None or not net.isolated:
            pytest.skip("the live daemon runs without the isolated network: lists are refused")
        info = sb.set_network(deny_out=["192.0.2.0/24"])
        assert info.network is not None and info.network.deny_out == ("192.0.2.0/24",)
        again = sb.info().network
        assert again is not None and again.deny_out == ("192.0.2.0/24",)
        closed = sb.set_network(network="none").network
        assert closed is not None and closed.mode == "none"
        cleared = sb.set_network().network
        assert cleared is not None
        assert (cleared.mode, cleared.allow_out, cleared.deny_out) == ("egress", (), ())
        with pytest.raises(zygote.InvalidArgument, match="10.0.0.0/8"):
            sb.set_network(deny_out=["10.0.0.1/8"])
    finally:
        sb.kill()


def test_event_log_shows_commands_and_lifecycle(client: Client) -> None:
    sb = Sandbox.create(memory_mib=128, ttl_secs=600, client=client)
    try:
        sb.commands.run("true")
        sb.commands.run("exit 4")
        got = sb.events()
        assert [e.message for e in got][:5] == [
            "sandbox started",
            "command started",
            "command ended",
            "command started",
            "command ended",
        ]
        assert got[4].level == "warn" and got[4].fields["exit_code"] == "4"
        newest = sb.events(newest_first=True, limit=1)
        assert [e.message for e in newest] == ["command ended"]
        assert [e.message for e in sb.events(level="warn")] == ["command ended"]
    finally:
        sb.kill()


def test_ttl_set_cleared_and_expiring(client: Client) -> None:
    # Its own sandbox: the last step lets the daemon delete it.
    doomed = Sandbox.create(memory_mib=128, ttl_secs=600, client=client)
    try:
        info = doomed.info()
        assert info.ttl_secs == 600
        assert info.expires_at is not None and info.expires_at >= info.created_at + 600
        assert doomed.set_ttl(None).expires_at is None
        assert (doomed.info().ttl_secs, doomed.info().expires_at) == (None, None)
        with pytest.raises(zygote.InvalidArgument):
            doomed.set_ttl(0)
        deadline = doomed.set_ttl(1).expires_at
        assert deadline is not None and deadline >= int(time.time()) + 1
        # Until the record is gone: "not running" comes first (state `deleting`).
        def exists() -> bool:
            try:
                doomed.info()
                return True
            except zygote.SandboxNotFound:
                return False

        t0 = time.monotonic()
        while exists() and time.monotonic() - t0 < 15:
            time.sleep(0.2)
        with pytest.raises(zygote.SandboxNotFound):
            doomed.info()
        assert time.time() >= deadline, "deleted before its deadline"
    finally:
        doomed.kill()


@pytest.mark.anyio
async def test_async_surface(live_env: dict[str, str]) -> None:
    async with AsyncClient(live_env["url"], live_env["token"]) as ac:
        async with await AsyncSandbox.create(memory_mib=128, metadata={"suite": "python-async"}, client=ac) as asb:
            seen: list[str] = []

            async def on_stdout(text: str) -> None:
                seen.append(text)

            r = await asb.commands.run("echo a; sleep 0.2; echo b", on_stdout=on_stdout)
            assert (r.exit_code, r.stdout, "".join(seen)) == (0, "a\nb\n", "a\nb\n")
            await asb.files.write("/root/async.txt", "async ok")
            assert await asb.files.read("/root/async.txt") == "async ok"
            assert "async.txt" in [e.name for e in await asb.files.list("/root")]
            with pytest.raises(zygote.CommandTimeout):
                await asb.commands.run("sleep 20", timeout=1)
            info = await asb.set_ttl(900)
            assert info.ttl_secs == 900 and info.expires_at is not None
            ready: list[str] = []

            async def on_progress(p: zygote.BranchProgress[AsyncSandbox]) -> None:
                assert p.sandbox is not None, p.error
                ready.append((await p.sandbox.commands.run("hostname")).stdout.strip())

            pair = await asb.branch(2, on_progress=on_progress)
            assert sorted(ready) == sorted(k.id for k in pair)
            for k in pair:
                assert await k.kill()
            [child] = await asb.branch(n=1, mergeable=True)
            try:
                # Children inherit the parent's TTL length and metadata.
                child_info = await child.info()
                assert child_info.ttl_secs == 900
                assert child_info.metadata == {"suite": "python-async", "zygote.parent": asb.id}
                found = await AsyncSandbox.list(metadata={"zygote.parent": asb.id}, client=ac)
                assert [f.id for f in found] == [child.id]
                assert (await asb.set_ttl(None)).ttl_secs is None
                assert await child.files.read("/root/async.txt") == "async ok"
                await child.files.write("/root/async.txt", "child")
                assert await asb.files.read("/root/async.txt") == "async ok"
                # The child's change, merged back with theirs over the parent's own.
                await asb.files.write("/root/async.txt", "parent")
                merged = await asb.merge(child, on_conflict="theirs")
                assert [(c.path, c.resolution) for c in merged.conflicts] == [("/root/async.txt", "theirs")]
                assert merged.applied and await asb.files.read("/root/async.txt") == "child"
            finally:
                assert await child.kill()
            sid = asb.id
        # The context manager killed it.
        assert not await AsyncSandbox(sid, client=ac).is_running()
