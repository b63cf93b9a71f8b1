"""Background processes against a real zygoted and a real guest (scripts/sdk-test.sh):
fed through stdin and waited on, killed, listed, connected from a second client, and
run on in a branch child as the child's own copy. One sandbox for the module (plus
one branch child), killed at the end."""

from __future__ import annotations

import time
from typing import Iterator

import pytest

import zygote
from zygote import AsyncClient, AsyncSandbox, Client, Sandbox

pytestmark = pytest.mark.live

TALK = 'echo start; while read l; do echo "got $l"; done; echo bye >&2; exit 3'
COUNTER = "i=0; while :; do i=$((i+1)); echo $i; sleep 0.2; done"


@pytest.fixture(scope="module")
def client(live_env: dict[str, str]) -> Iterator[Client]:
    with Client(live_env["url"], live_env["token"]) as c:
        yield c


@pytest.fixture(scope="module")
def sb(client: Client) -> Iterator[Sandbox]:
    with Sandbox.create(image="minimal", memory_mib=128, client=client) as s:
        yield s


def last_count(h: zygote.CommandHandle, above: int) -> int:
    """The counter's last number once it printed more than ``above`` (polling its output)."""
    deadline = time.monotonic() + 60
    while True:
        h.poll(wait=1)
        lines = h.stdout.split()
        if lines and int(lines[-1]) > above:
            return int(lines[-1])
        assert time.monotonic() < deadline, f"{h} stuck at {lines[-1:]}"


def test_fed_through_stdin_and_waited_on(sb: Sandbox) -> None:
    out: list[str] = []
    err: list[str] = []
    h = sb.commands.run(TALK, background=True, stdin="first\n", on_stdout=out.append, on_stderr=err.append)
    assert h.pid > 0 and h.info().running and h.info().stdin_open
    h.send_stdin("hello\n")
    h.send_stdin("wörld\n".encode(), eof=True)
    r = h.wait(timeout=60)
    assert (r.stdout, r.stderr, r.exit_code, r.signal) == (
        "start\ngot first\ngot hello\ngot wörld\n", "bye\n", 3, None,
    )
    assert "".join(out) == r.stdout and "".join(err) == "bye\n"
    info = h.info()
    assert (info.state, info.exit_code, info.stdin_open, info.output_bytes) == ("exited", 3, False, h.offset)
    with pytest.raises(zygote.ProcessExited):
        h.send_stdin("late\n")
    assert h.kill() is False


def test_kill_list_and_its_own_timeout(sb: Sandbox) -> None:
    sleeper = sb.commands.run("exec sleep 1000", background=True, timeout=None)
    listed = {p.pid: p for p in sb.commands.list()}
    assert listed[sleeper.pid].running and listed[sleeper.pid].argv == ("sh", "-c", "exec sleep 1000")
    with pytest.raises(zygote.RequestTimeout) as e:
        sleeper.wait(timeout=1)
    assert e.value.code == "wait_timeout" and sleeper.info().running
    assert sleeper.kill() is True
    r = sleeper.wait(timeout=60)
    assert (r.exit_code, r.signal) == (None, 9)
    assert sb.commands.kill(sleeper.pid) is False
    assert not {p.pid: p for p in sb.commands.list()}[sleeper.pid].running

    timed = sb.commands.run("exec sleep 1000", background=True, timeout=1)
    with pytest.raises(zygote.CommandTimeout) as t:
        timed.wait(timeout=60)
    assert t.value.result.timed_out

    failing = sb.commands.run("exit 5", background=True, check=True)
    with pytest.raises(zygote.CommandFailed) as f:
        failing.wait(timeout=60)
    assert f.value.result.exit_code == 5

    with pytest.raises(zygote.ProcessNotFound):
        sb.commands.connect(999999)
    with pytest.raises(zygote.ProcessNotFound):
        sb.commands.send_stdin(999999, "x")
    with pytest.raises(zygote.InvalidArgument):
        sb.commands.signal(timed.pid, "NOPE")


def test_connect_from_a_second_sandbox_object(sb: Sandbox, live_env: dict[str, str]) -> None:
    h = sb.commands.run('echo ready; read x; echo "x=$x"', background=True)
    with Client(live_env["url"], live_env["token"]) as other:
        seen: list[str] = []
        again = Sandbox.connect(sb.id, client=other).commands.connect(h.pid, on_stdout=seen.append)
        assert again.pid == h.pid
        h.send_stdin("go\n")
        r = again.wait(timeout=60)
    assert (r.stdout, r.exit_code) == ("ready\nx=go\n", 0)
    assert "".join(seen) == r.stdout
    assert h.wait(timeout=60).stdout == r.stdout


def test_a_branch_child_runs_its_own_copy_under_the_same_pid(sb: Sandbox) -> None:
    counter = sb.commands.run(COUNTER, background=True, timeout=None)
    before = last_count(counter, 3)
    (child,) = sb.branch(1)
    try:
        in_child = child.commands.connect(counter.pid)
        assert in_child.info().running
        after = last_count(in_child, before)
        assert after > before
        assert in_child.kill() is True
        assert in_child.wait(timeout=60).signal == 9
        # The parent's goes on.
        assert last_count(counter, after) > after
    finally:
        child.kill()
    assert counter.kill() is True
    assert counter.wait(timeout=60).signal == 9


@pytest.mark.anyio
async def test_async_background_process(sb: Sandbox, live_env: dict[str, str]) -> None:
    seen: list[str] = []

    async def on_stdout(text: str) -> None:
        seen.append(text)

    async with AsyncClient(live_env["url"], live_env["token"]) as c:
        asb = AsyncSandbox(sb.id, client=c)
        h = await asb.commands.run(TALK, background=True, on_stdout=on_stdout)
        assert h.pid in [p.pid for p in await asb.commands.list()]
        await h.send_stdin("a\n")
        await h.close_stdin()
        r = await h.wait(timeout=60)
        assert (r.stdout, r.exit_code) == ("start\ngot a\n", 3)
        assert "".join(seen) == r.stdout
        sleeper = await asb.commands.run("exec sleep 1000", background=True)
        assert await asb.commands.kill(sleeper.pid) is True
        assert (await sleeper.wait(timeout=60)).signal == 9
