"""E2B's Python SDK, unchanged (e2b==2.63.0), against zygote: terminals (issue 35).

`sbx.pty.create` is envd's Start with `pty` set (`/bin/bash -i -l` on a terminal),
`send_stdin` is SendInput with `pty` input, `resize` is Update, `kill` is SendSignal,
`connect` is Connect. Run by scripts/e2b-test.sh (see test_e2b_python.py).
"""
import os
import threading
import time

import pytest
from e2b import Sandbox
from e2b.exceptions import NotFoundException, TimeoutException
from e2b.sandbox.commands.command_handle import CommandExitException, PtySize

TEMPLATE = os.environ.get("E2B_TEST_TEMPLATE", "base")


@pytest.fixture
def sbx():
    s = Sandbox.create(template=TEMPLATE, timeout=600, metadata={"suite": "e2b-pty"})
    yield s
    s.kill()


class Terminal:
    """A handle's output gathered by a thread (the sync handle blocks while it reads)."""

    def __init__(self, handle):
        self.handle = handle
        self.out = bytearray()
        self.lock = threading.Lock()
        self.error = None
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self):
        try:
            self.handle.wait(on_pty=self._add)
        except Exception as e:  # the end (killed: CommandExitException) or a failure
            self.error = e

    def _add(self, data):
        with self.lock:
            self.out.extend(data)

    def text(self):
        with self.lock:
            return self.out.decode("utf-8", "replace")

    def expect(self, needle, timeout=30):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if needle in self.text():
                return
            time.sleep(0.05)
        raise AssertionError(f"{needle!r} never appeared in {self.text()!r}")

    def ended(self, timeout=30):
        self.thread.join(timeout)
        return not self.thread.is_alive()


def test_interactive_bash_on_a_terminal(sbx):
    h = sbx.pty.create(PtySize(rows=24, cols=80), envs={"ZY": "pty"}, cwd="/tmp", timeout=120)
    term = Terminal(h)
    sbx.pty.send_stdin(h.pid, b"echo $((6*7))\n")
    term.expect("42\r\n")
    sbx.pty.send_stdin(h.pid, b"stty size; pwd; echo $ZY-$TERM\n")
    term.expect("24 80\r\n")
    term.expect("/tmp\r\npty-xterm-256color\r\n")

    sbx.pty.resize(h.pid, PtySize(rows=33, cols=101))
    sbx.pty.send_stdin(h.pid, b"stty size\n")
    term.expect("33 101\r\n")

    listed = {p.pid: p for p in sbx.commands.list()}
    assert h.pid in listed, listed
    info = listed[h.pid]
    assert (info.cmd, info.args, info.cwd) == ("/bin/bash", ["-i", "-l"], "/tmp")
    assert info.envs["ZY"] == "pty" and info.envs["TERM"] == "xterm-256color"

    assert sbx.pty.kill(h.pid) is True
    assert term.ended(), "the handle kept reading after kill"
    assert isinstance(term.error, CommandExitException), term.error
    assert term.error.exit_code == -1
    assert sbx.pty.kill(h.pid) is False
    assert h.pid not in {p.pid for p in sbx.commands.list()}
    with pytest.raises(NotFoundException):
        sbx.pty.send_stdin(h.pid, b"echo late\n")


def test_connect_to_a_terminal_sees_new_output_and_its_end(sbx):
    h = sbx.pty.create(PtySize(rows=24, cols=80), timeout=120)
    first = Terminal(h)
    sbx.pty.send_stdin(h.pid, b"echo one-$((1+1))\n")
    first.expect("one-2\r\n")

    second = Terminal(sbx.pty.connect(h.pid))
    time.sleep(0.5)
    sbx.pty.send_stdin(h.pid, b"echo two-$((2+1))\n")
    second.expect("two-3\r\n")
    first.expect("two-3\r\n")
    assert "one-2" not in second.text(), "Connect replayed earlier output"

    sbx.pty.send_stdin(h.pid, b"exit 3\n")
    assert first.ended() and second.ended()
    for t in (first, second):
        assert isinstance(t.error, CommandExitException), t.error
        assert t.error.exit_code == 3
    with pytest.raises(NotFoundException):
        sbx.pty.connect(h.pid)


def test_a_terminal_is_killed_at_its_timeout(sbx):
    h = sbx.pty.create(PtySize(rows=24, cols=80), timeout=3)
    term = Terminal(h)
    sbx.pty.send_stdin(h.pid, b"echo alive\n")
    term.expect("alive\r\n")
    assert term.ended(timeout=30)
    assert isinstance(term.error, TimeoutException), term.error
    # The client's own timeout may end the stream first: the kill follows at once.
    deadline = time.monotonic() + 10
    while h.pid in {p.pid for p in sbx.commands.list()}:
        assert time.monotonic() < deadline, "the terminal outlived its timeout"
        time.sleep(0.2)
    assert sbx.pty.kill(h.pid) is False


def test_commands_list_shows_the_envs_and_cwd_a_command_started_with(sbx):
    h = sbx.commands.run("sleep 60", background=True, envs={"ZY_A": "1"}, cwd="/tmp")
    listed = {p.pid: p for p in sbx.commands.list()}
    info = listed[h.pid]
    assert (info.cmd, info.args) == ("/bin/bash", ["-l", "-c", "sleep 60"])
    assert (info.envs, info.cwd, info.tag) == ({"ZY_A": "1"}, "/tmp", None)
    assert h.kill() is True


def test_stream_input_feeds_a_command_and_a_terminal(sbx):
    h = sbx.commands.run("while read l; do echo got:$l; done", background=True, stdin=True)

    def chunks():
        yield "one\n"
        time.sleep(0.3)  # the stream is read as it comes
        yield b"two\n"

    sbx.commands.stream_input(h.pid, chunks())
    h.close_stdin()
    assert h.wait().stdout == "got:one\ngot:two\n"
    with pytest.raises(NotFoundException):
        sbx.commands.stream_input(h.pid, ["late\n"])

    t = sbx.pty.create(PtySize(rows=24, cols=80), timeout=60)
    term = Terminal(t)
    sbx.pty.stream_input(t.pid, [b"echo streamed-", b"$((3*4))\n"])
    term.expect("streamed-12\r\n")
    assert sbx.pty.kill(t.pid) is True


def test_a_command_past_its_timeout_raises_and_is_killed(sbx):
    with pytest.raises(TimeoutException):
        sbx.commands.run("echo started; sleep 30", timeout=2)
    deadline = time.monotonic() + 10
    while any("sleep 30" in " ".join(p.args) for p in sbx.commands.list()):
        assert time.monotonic() < deadline, "the command outlived its timeout"
        time.sleep(0.2)


def test_a_terminal_runs_as_the_acting_user_in_its_home(sbx):
    # `base` has E2B's `user`: the default user of terminals as of commands.
    h = sbx.pty.create(PtySize(rows=24, cols=80), timeout=120)
    term = Terminal(h)
    sbx.pty.send_stdin(h.pid, b"echo who=$(id -un):$(id -u) home=$HOME at=$(pwd)\n")
    term.expect("who=user:1000 home=/home/user at=/home/user\r\n")
    root = sbx.pty.create(PtySize(rows=24, cols=80), user="root", timeout=120)
    as_root = Terminal(root)
    sbx.pty.send_stdin(root.pid, b"echo who=$(id -un)\n")
    as_root.expect("who=root\r\n")
    assert sbx.pty.kill(h.pid) and sbx.pty.kill(root.pid)
