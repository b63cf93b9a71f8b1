"""E2B's Python SDK, unchanged (e2b==2.63.0): watching directories (issue 35).

The sync SDK polls a watcher (CreateWatcher / GetWatcherEvents / RemoveWatcher), the
async SDK streams WatchDir; both run on zygote's native watch (inotify in the guest's
agent). Run by scripts/e2b-test.sh (see test_e2b_python.py for the variables).
"""
import asyncio
import os
import time

import pytest
from e2b import AsyncSandbox, Sandbox
from e2b.exceptions import (
    FileNotFoundException,
    InvalidArgumentException,
    NotFoundException,
    RateLimitException,
    SandboxException,
)
from e2b.sandbox.filesystem.watch_handle import FilesystemEventType as T

TEMPLATE = os.environ.get("E2B_TEST_TEMPLATE", "base")
# zygote's per-sandbox cap on CreateWatcher watchers (crates/daemon/src/e2b/envd/watch.rs).
MAX_WATCHERS_PER_SANDBOX = 16


@pytest.fixture
def sbx():
    s = Sandbox.create(template=TEMPLATE, timeout=600, metadata={"suite": "e2b-watch"})
    yield s
    s.kill()


def poll_until(handle, want, timeout=30):
    """get_new_events() until every (name, type) of `want` was seen; all events seen."""
    seen = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        seen += [(e.name, e.type) for e in handle.get_new_events()]
        if all(w in seen for w in want):
            return seen
        time.sleep(0.2)
    raise AssertionError(f"never saw {[w for w in want if w not in seen]}; saw {seen}")


def test_sync_watcher_reports_changes_recursively_and_stops(sbx):
    sbx.commands.run("mkdir -p /tmp/w/sub")
    h = sbx.files.watch_dir("/tmp/w", recursive=True)
    sbx.files.write("/tmp/w/a.txt", "1")
    sbx.commands.run("echo 2 > /tmp/w/sub/b.txt; mkdir /tmp/w/new; echo 3 > /tmp/w/new/c.txt; "
                     "chmod 600 /tmp/w/a.txt; mv /tmp/w/a.txt /tmp/w/d.txt; rm /tmp/w/d.txt")
    seen = poll_until(h, [
        ("a.txt", T.CREATE),
        ("sub/b.txt", T.CREATE),
        ("sub/b.txt", T.WRITE),
        ("new", T.CREATE),
        ("new/c.txt", T.CREATE),
        ("a.txt", T.CHMOD),
        ("a.txt", T.RENAME),
        ("d.txt", T.CREATE),
        ("d.txt", T.REMOVE),
    ])
    assert all(not name.startswith("/") for name, _ in seen), seen
    # Taken events are gone: the next poll has only what happened since.
    assert h.get_new_events() == []
    h.stop()
    with pytest.raises(SandboxException, match="already stopped"):
        h.get_new_events()
    # The watcher is gone in zygote too: removing it again is envd's not_found.
    with pytest.raises(NotFoundException):
        h.stop()


def test_watching_a_missing_path_or_a_file_fails_as_envd_does(sbx):
    with pytest.raises(FileNotFoundException):
        sbx.files.watch_dir("/tmp/no/such/dir")
    sbx.files.write("/tmp/plain.txt", "x")
    with pytest.raises(InvalidArgumentException, match="not a directory"):
        sbx.files.watch_dir("/tmp/plain.txt")


def test_too_many_watchers_is_resource_exhausted_until_one_is_removed(sbx):
    sbx.commands.run("mkdir -p /tmp/many")
    handles = [sbx.files.watch_dir("/tmp/many") for _ in range(MAX_WATCHERS_PER_SANDBOX)]
    with pytest.raises(RateLimitException, match="watchers"):
        sbx.files.watch_dir("/tmp/many")
    handles.pop().stop()
    handles.append(sbx.files.watch_dir("/tmp/many"))
    sbx.files.write("/tmp/many/x", "1")
    poll_until(handles[-1], [("x", T.CREATE)])
    for h in handles:
        h.stop()


def test_async_watch_dir_streams_events_as_they_happen_until_stop():
    async def main():
        s = await AsyncSandbox.create(template=TEMPLATE, timeout=600, metadata={"suite": "e2b-watch"})
        try:
            await s.commands.run("mkdir -p /tmp/aw")
            got = []
            seen_x = asyncio.Event()

            def on_event(e):
                got.append((e.name, e.type))
                if (e.name, e.type) == ("deep/x", T.CREATE):
                    seen_x.set()

            h = await s.files.watch_dir("/tmp/aw", on_event, recursive=True)
            await s.commands.run("mkdir /tmp/aw/deep && echo 1 > /tmp/aw/deep/x")
            await asyncio.wait_for(seen_x.wait(), 30)
            assert ("deep", T.CREATE) in got, got
            await h.stop()
            n = len(got)
            await s.files.write("/tmp/aw/late", "1")
            await asyncio.sleep(1)
            assert len(got) == n, f"events after stop: {got[n:]}"
            with pytest.raises(FileNotFoundException):
                await s.files.watch_dir("/tmp/aw/missing", on_event)
        finally:
            await s.kill()

    asyncio.run(main())
