"""Background processes (``commands.run(..., background=True)``, the handle,
``commands.list/connect/kill/signal/send_stdin``), sync and async, against the fake
daemon's model of the process routes (tests/fake_processes.py). No VM involved."""

from __future__ import annotations

import json
import threading
import time
from typing import Iterator

import pytest

import zygote
from zygote import AsyncClient, AsyncSandbox, Client, Sandbox
from zygote.errors import error_for

from .fake_daemon import FakeDaemon
from .fake_processes import FakeProcesses

SID = "sb-aaaaaaaaaaaa"


@pytest.fixture
def fake() -> Iterator[FakeDaemon]:
    f = FakeDaemon(processes=FakeProcesses()).start()
    yield f
    f.stop()


@pytest.fixture
def sb(fake: FakeDaemon) -> Iterator[Sandbox]:
    with Client(fake.url, "t") as c:
        yield Sandbox(SID, client=c)


def test_run_in_the_background_sends_exec_with_background_and_answers_a_handle(fake: FakeDaemon, sb: Sandbox) -> None:
    h = sb.commands.run("talk", background=True, stdin="first\n", env={"A": "1"}, cwd="/tmp", timeout=30)
    assert isinstance(h, zygote.CommandHandle)
    sent = fake.requests[0]
    assert (sent.method, sent.path) == ("POST", f"/v1/sandboxes/{SID}/exec")
    assert json.loads(sent.body) == {
        "argv": ["sh", "-c", "talk"],
        "env": {"A": "1"},
        "cwd": "/tmp",
        "stdin": "first\n",
        "timeout_ms": 30000,
        "background": True,
    }
    info = h.info()
    assert (info.pid, info.state, info.running, info.stdin_open) == (h.pid, "running", True, True)
    assert info.argv == ("sh", "-c", "talk")
    assert h.kill() is True


def test_stdin_text_and_bytes_then_wait_follows_to_the_exit_with_callbacks(sb: Sandbox) -> None:
    out: list[str] = []
    err: list[str] = []
    h = sb.commands.run("talk", background=True, on_stdout=out.append, on_stderr=err.append)
    h.send_stdin("hello\n")
    h.send_stdin(b"world\n", eof=True)
    r = h.wait()
    assert (r.stdout, r.stderr, r.exit_code, r.signal, r.timed_out) == (
        "start\ngot hello\ngot world\n", "bye\n", 3, None, False,
    )
    assert "".join(out) == r.stdout and err == ["bye\n"]
    assert (h.stdout, h.stderr, h.exit_code) == (r.stdout, r.stderr, 3)
    assert h.offset == len(r.stdout) + len(r.stderr)
    # Waiting again answers the same without reading again; the ended process
    # takes no more stdin or signals.
    assert h.wait() == r
    with pytest.raises(zygote.ProcessExited) as e:
        h.send_stdin("late")
    assert (e.value.code, e.value.status) == ("process_exited", 409)
    assert h.kill() is False
    assert sb.commands.kill(h.pid) is False


def test_wait_raises_command_failed_with_check_like_a_foreground_run(sb: Sandbox) -> None:
    h = sb.commands.run("talk", background=True, check=True)
    h.close_stdin()
    with pytest.raises(zygote.CommandFailed) as e:
        h.wait()
    assert e.value.result.exit_code == 3 and e.value.result.stdout == "start\n"


def test_kill_ends_it_with_sigkill_and_wait_returns_the_signal(sb: Sandbox) -> None:
    h = sb.commands.run(["sleep", "1000"], background=True)
    assert h.kill() is True
    r = h.wait()
    assert (r.exit_code, r.signal, r.ok) == (None, 9, False)
    assert h.kill() is False


def test_signal_by_name_and_a_bad_name_is_invalid_argument(sb: Sandbox) -> None:
    h = sb.commands.run("sleep 1000", background=True)
    with pytest.raises(zygote.InvalidArgument):
        h.signal("NOPE")
    with pytest.raises(TypeError):
        h.signal(True)
    sb.commands.signal(h.pid, "interrupt")
    assert h.wait().signal == 2


def test_its_own_timeout_kills_it_and_wait_raises_command_timeout(sb: Sandbox) -> None:
    h = sb.commands.run("sleep 1000", background=True, timeout=0.2)
    with pytest.raises(zygote.CommandTimeout) as e:
        h.wait(timeout=10)
    assert e.value.result.timed_out and e.value.result.signal == 9


def test_a_wait_timeout_leaves_it_running_and_a_later_wait_goes_on(sb: Sandbox) -> None:
    out: list[str] = []
    h = sb.commands.run("cat", background=True, on_stdout=out.append)
    h.send_stdin("one\n")
    t0 = time.monotonic()
    with pytest.raises(zygote.RequestTimeout) as e:
        h.wait(timeout=0.3)
    assert e.value.code == "wait_timeout" and time.monotonic() - t0 < 5
    assert h.info().running and h.stdout == "one\n"
    h.send_stdin("two\n", eof=True)
    r = h.wait(timeout=10)
    assert (r.stdout, r.exit_code, out) == ("one\ntwo\n", 0, ["one\n", "two\n"])
    with pytest.raises(ValueError):
        h.wait(timeout=0)


def test_output_arriving_while_waiting_reaches_the_callbacks(sb: Sandbox) -> None:
    seen: list[str] = []
    h = sb.commands.run("cat", background=True, on_stdout=seen.append)

    def feed() -> None:
        with Client(sb.client.config.url, "t") as other:
            for word in ("a\n", "b\n"):
                time.sleep(0.1)
                Sandbox(SID, client=other).commands.send_stdin(h.pid, word)
            Sandbox(SID, client=other).commands.send_stdin(h.pid, "", eof=True)

    t = threading.Thread(target=feed)
    t.start()
    r = h.wait(timeout=10)
    t.join()
    assert (seen, r.stdout) == (["a\n", "b\n"], "a\nb\n")


def test_a_follow_that_ended_in_an_error_raises_it_and_a_later_wait_goes_on(fake: FakeDaemon, sb: Sandbox) -> None:
    out: list[str] = []
    h = sb.commands.run("talk", background=True, on_stdout=out.append)
    assert fake.processes is not None
    fake.processes.follow_errors.append({"code": "agent_unreachable", "message": "lost the agent"})
    with pytest.raises(zygote.ServerError) as e:
        h.wait()
    assert e.value.code == "agent_unreachable" and h.stdout == "start\n"
    h.send_stdin("x\n", eof=True)
    r = h.wait()
    assert (r.stdout, r.exit_code, out) == ("start\ngot x\n", 3, ["start\n", "got x\n"])
    assert fake.requests[-1].query == {"follow": "true", "offset": "6"}


def test_a_character_split_across_writes_is_decoded_whole(sb: Sandbox) -> None:
    seen: list[str] = []
    h = sb.commands.run("cat", background=True, on_stdout=seen.append)
    h.send_stdin("é".encode()[:1])
    h.send_stdin("é\n".encode()[1:], eof=True)
    assert h.wait().stdout == "é\n"
    assert "".join(seen) == "é\n" and "\ufffd" not in "".join(seen)


def test_poll_reads_what_is_new_and_wait_goes_on_from_there(sb: Sandbox) -> None:
    out: list[str] = []
    h = sb.commands.run("talk", background=True, on_stdout=out.append)
    info = h.poll()
    assert (h.stdout, h.offset, info.running, info.output_bytes) == ("start\n", 6, True, 6)
    assert h.poll().output_bytes == 6 and h.stdout == "start\n"
    h.send_stdin("x\n")
    h.poll(wait=5)
    assert h.stdout == "start\ngot x\n"
    h.close_stdin()
    r = h.wait()
    assert r.stdout == "start\ngot x\n" and out == ["start\n", "got x\n"]
    with pytest.raises(ValueError):
        h.poll(wait=31)


def test_list_connect_from_another_client_and_unknown_pids(fake: FakeDaemon, sb: Sandbox) -> None:
    first = sb.commands.run("talk", background=True)
    second = sb.commands.run("echo done", background=True)
    listed = sb.commands.list()
    assert [p.pid for p in listed] == [first.pid, second.pid]
    assert [p.state for p in listed] == ["running", "exited"]
    assert listed[1].exit_code == 0 and isinstance(listed[1], zygote.ProcessInfo)

    seen: list[str] = []
    with Client(fake.url, "t") as other:
        again = Sandbox(SID, client=other).commands.connect(first.pid, on_stdout=seen.append)
        first.send_stdin("hi\n", eof=True)
        r = again.wait()
    # A handle from connect reads the output from the start.
    assert r.stdout == "start\ngot hi\n" and "".join(seen) == r.stdout and r.exit_code == 3

    with pytest.raises(zygote.ProcessNotFound) as e:
        sb.commands.connect(999999)
    assert (e.value.code, e.value.status) == ("not_found", 404)
    # The process routes' guest_not_found is a missing process, not a missing file.
    with pytest.raises(zygote.ProcessNotFound) as e:
        sb.commands.send_stdin(999999, "x")
    assert e.value.code == "guest_not_found" and not isinstance(e.value, zygote.FileNotFound)
    with pytest.raises(zygote.ProcessNotFound):
        sb.commands.signal(999999, 9)
    assert sb.commands.kill(999999) is False


def test_a_program_that_cannot_start_raises_spawn_failed(sb: Sandbox) -> None:
    with pytest.raises(zygote.SpawnFailed):
        sb.commands.run(["/no/such/program"], background=True)


def test_stdin_a_program_does_not_read_ends_in_guest_busy(sb: Sandbox) -> None:
    h = sb.commands.run("sleep 1000", background=True)
    with pytest.raises(zygote.ConflictError) as e:
        h.send_stdin(b"x" * 70000)
    assert (e.value.code, e.value.status) == ("guest_busy", 409)
    assert h.kill()


def test_a_branch_childs_copy_is_connected_and_killed_apart_from_the_parents(fake: FakeDaemon, sb: Sandbox) -> None:
    h = sb.commands.run("talk", background=True)
    assert fake.processes is not None
    fake.processes.branch(SID, "sb-child0000001")
    child = Sandbox("sb-child0000001", client=sb.client)
    in_child = child.commands.connect(h.pid)
    assert in_child.kill() is True
    assert in_child.wait().signal == 9
    assert h.info().running
    h.close_stdin()
    assert h.wait().exit_code == 3


def test_error_codes_of_the_process_routes() -> None:
    assert isinstance(error_for("process_exited", "process 5 has exited", 409), zygote.ProcessExited)
    assert isinstance(error_for("process_exited", "x", 409), zygote.ConflictError)
    assert isinstance(error_for("not_found", 'process "5" not found', 404), zygote.ProcessNotFound)
    assert type(error_for("guest_busy", "did not read", 409)) is zygote.ConflictError


# --- async -------------------------------------------------------------------


@pytest.mark.anyio
async def test_async_background_stdin_wait_with_coroutine_callbacks(fake: FakeDaemon) -> None:
    seen: list[str] = []

    async def on_stdout(text: str) -> None:
        seen.append(text)

    async with AsyncClient(fake.url, "t") as c:
        sb = AsyncSandbox(SID, client=c)
        h = await sb.commands.run("talk", background=True, on_stdout=on_stdout)
        assert isinstance(h, zygote.AsyncCommandHandle)
        await h.send_stdin("hello\n")
        assert (await h.poll(wait=5)).running and h.stdout == "start\ngot hello\n"
        await h.send_stdin(b"world\n", eof=True)
        r = await h.wait(timeout=10)
        assert (r.stdout, r.stderr, r.exit_code) == ("start\ngot hello\ngot world\n", "bye\n", 3)
        assert "".join(seen) == r.stdout
        with pytest.raises(zygote.ProcessExited):
            await h.send_stdin("late")
        assert await h.kill() is False


@pytest.mark.anyio
async def test_async_list_connect_kill_timeouts_and_errors(fake: FakeDaemon) -> None:
    async with AsyncClient(fake.url, "t") as c:
        sb = AsyncSandbox(SID, client=c)
        sleeper = await sb.commands.run("sleep 1000", background=True)
        with pytest.raises(zygote.RequestTimeout):
            await sleeper.wait(timeout=0.2)
        assert [p.pid for p in await sb.commands.list()] == [sleeper.pid]
        again = await sb.commands.connect(sleeper.pid)
        assert (await again.info()).running
        await sb.commands.signal(sleeper.pid, "TERM")
        assert (await again.wait()).signal == 15
        assert await sb.commands.kill(sleeper.pid) is False
        with pytest.raises(zygote.ProcessNotFound):
            await sb.commands.connect(424242)
        with pytest.raises(zygote.ProcessNotFound):
            await sb.commands.send_stdin(424242, "x")
        timed = await sb.commands.run("sleep 1000", background=True, timeout=0.2, check=True)
        with pytest.raises(zygote.CommandTimeout):
            await timed.wait()
        killed = await sb.commands.run("cat", background=True)
        await killed.signal(9)
        assert (await killed.wait()).signal == 9
        cat = await sb.commands.run("cat", background=True)
        await cat.send_stdin("x\n")
        await cat.close_stdin()
        assert (await cat.wait()).stdout == "x\n"
