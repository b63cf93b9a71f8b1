"""The README's tree-search example runs to completion against the live
daemon and leaves no sandbox behind."""

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
