"""E2B's Python SDK, unchanged (e2b==2.63.0), against zygote (issue 35, slices 1-2).

Run by scripts/e2b-test.sh, which starts a private zygoted and sets E2B_API_URL
(http://127.0.0.1:<api>/e2b), E2B_API_KEY (the daemon token), E2B_SANDBOX_URL
(http://127.0.0.1:<proxy>) and E2B_TEST_TEMPLATE (a zygote image with bash: the SDK
runs every command as `/bin/bash -l -c <cmd>`).
"""
import os

import pytest
from e2b import Sandbox
from e2b.exceptions import AuthenticationException, FileNotFoundException, NotFoundException
from e2b.sandbox.commands.command_handle import CommandExitException

TEMPLATE = os.environ.get("E2B_TEST_TEMPLATE", "base")


@pytest.fixture
def sbx():
    s = Sandbox.create(template=TEMPLATE, timeout=600, metadata={"suite": "e2b-compat"})
    yield s
    s.kill()


def test_commands_run_echo(sbx):
    r = sbx.commands.run("echo hi")
    assert r.stdout == "hi\n"
    assert r.stderr == ""
    assert r.exit_code == 0


def test_a_failing_command_raises_from_its_end_event(sbx):
    with pytest.raises(CommandExitException) as e:
        sbx.commands.run("echo out; echo bad >&2; exit 7")
    assert e.value.exit_code == 7
    assert e.value.stdout == "out\n"
    assert e.value.stderr == "bad\n"


def test_files_write_then_read(sbx):
    info = sbx.files.write("/tmp/e2b/a.txt", "x\ny")
    assert info.path == "/tmp/e2b/a.txt"
    assert info.name == "a.txt"
    assert sbx.files.read("/tmp/e2b/a.txt") == "x\ny"
    assert sbx.commands.run("cat /tmp/e2b/a.txt").stdout == "x\ny"
    with pytest.raises(FileNotFoundException):
        sbx.files.read("/tmp/e2b/missing")


def test_get_info_connect_and_kill():
    s = Sandbox.create(template=TEMPLATE, timeout=600, metadata={"suite": "e2b-compat"})
    try:
        info = s.get_info()
        assert info.sandbox_id == s.sandbox_id
        assert info.template_id == TEMPLATE
        assert info.metadata == {"suite": "e2b-compat"}
        assert info.state.value == "running"
        assert s.is_running()
        again = Sandbox.connect(s.sandbox_id)
        assert again.commands.run("echo $((6 * 7))").stdout == "42\n"
    finally:
        assert s.kill() is True
    assert not s.is_running()
    assert Sandbox.kill(s.sandbox_id) is False, "a second kill finds nothing"


def test_a_wrong_api_key_is_refused():
    with pytest.raises(AuthenticationException):
        Sandbox.create(template=TEMPLATE, api_key="e2b_wrong")


def test_background_command_is_listed_then_killed(sbx):
    h = sbx.commands.run("sleep 30", background=True)
    assert h.pid > 0
    listed = {p.pid: p for p in sbx.commands.list()}
    assert h.pid in listed, listed
    assert listed[h.pid].cmd == "/bin/bash"
    assert "sleep 30" in listed[h.pid].args
    assert sbx.commands.kill(h.pid) is True
    with pytest.raises(CommandExitException) as e:
        h.wait()
    assert e.value.exit_code == -1
    assert h.pid not in {p.pid for p in sbx.commands.list()}
    assert sbx.commands.kill(h.pid) is False, "a gone pid is not found"
    assert sbx.commands.kill(999999) is False


def test_send_stdin_then_close_it(sbx):
    h = sbx.commands.run("read line; echo got:$line; cat", background=True, stdin=True)
    sbx.commands.send_stdin(h.pid, "data\n")
    h.send_stdin("more")
    h.close_stdin()
    r = h.wait()
    assert r.exit_code == 0
    assert r.stdout == "got:data\nmore"


def test_handle_kill_ends_wait(sbx):
    h = sbx.commands.run("sleep 30", background=True)
    assert h.kill() is True
    with pytest.raises(CommandExitException):
        h.wait()
    assert h.kill() is False


def test_connect_to_a_running_command_sees_its_new_output(sbx):
    h = sbx.commands.run("read x; echo after:$x", background=True, stdin=True)
    h.disconnect()
    again = sbx.commands.connect(h.pid)
    assert again.pid == h.pid
    sbx.commands.send_stdin(h.pid, "go\n")
    r = again.wait()
    assert r.exit_code == 0
    assert r.stdout == "after:go\n"
    with pytest.raises(NotFoundException):
        sbx.commands.connect(999999)
    with pytest.raises(NotFoundException):
        sbx.commands.send_stdin(999999, "x")
