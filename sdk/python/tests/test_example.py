"""The examples run to completion against the live
daemon and leave no sandbox behind."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from zygote import Client

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "tree_search.py"


@pytest.mark.live
def test_tree_search_example(live_env: dict[str, str]) -> None:
    with Client(live_env["url"], live_env["token"]) as c:
        before = {s.id for s in c.sandboxes()}
        env = dict(os.environ, ZYGOTE_URL=live_env["url"], ZYGOTE_TOKEN=live_env["token"])
        proc = subprocess.run(
            [sys.executable, str(EXAMPLE), "--start", "3", "--target", "40", "--depth", "3", "--width", "3"],
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert proc.returncode == 0, proc.stdout + proc.stderr
        lines = proc.stdout.splitlines()
        # Three levels of three tries each, then the winner found greedily.
        assert sum(" tries " in line for line in lines) == 9, proc.stdout
        assert lines[-1] == "best: +7 *2 *2 -> 40 (target 40, distance 0)", proc.stdout
        assert {s.id for s in c.sandboxes()} == before, "the example left sandboxes behind"


FIX_SEARCH = EXAMPLE.with_name("fix_search.py")


@pytest.mark.live
def test_fix_search_example(live_env: dict[str, str]) -> None:
    """Branch four ways with per-child env, diff the passing child against the
    parent, merge its change into the parent, drop the branches; the parent then
    passes the test and nothing is left behind."""
    with Client(live_env["url"], live_env["token"]) as c:
        before = {s.id for s in c.sandboxes()}
        env = dict(os.environ, ZYGOTE_URL=live_env["url"], ZYGOTE_TOKEN=live_env["token"])
        proc = subprocess.run(
            [sys.executable, str(FIX_SEARCH)], env=env, capture_output=True, text=True, timeout=300
        )
        assert proc.returncode == 0, proc.stdout + proc.stderr
        out = proc.stdout
        assert sum(" tries " in line for line in out.splitlines()) == 4, out
        assert "tries add: passes" in out and out.count(": passes") == 1, out
        assert "-add() { echo $(( $1 - $2 )); }" in out, out
        assert "+add() { echo $(( $1 + $2 )); }" in out, out
        assert "\n  modify /root/work/calc.sh (" in out, out
        assert "deleted 4 branches" in out, out
        assert ": the test now passes" in out, out
        # Only the parent is left of the tree.
        assert out.splitlines()[-1].count("sb-") == 1, out
        assert {s.id for s in c.sandboxes()} == before, "the example left sandboxes behind"
