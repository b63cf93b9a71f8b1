"""Try several fixes from one live state, merge the one that passes back.

An agent-style search over a branch tree: a sandbox holds a small project with a
failing test. It is branched four ways (``mergeable``, so a child's changes can be
merged back); each child gets its own candidate (through the per-child ``env`` of the
branch), applies it and runs the test. The example shows the winner's change against
the parent (``diff``), merges it into the parent (``merge``: only the project
directory, and only what the winner changed since the branch), deletes the four
branches and runs the test in the parent, which now passes.

    python examples/fix_search.py

It talks to the daemon given by ZYGOTE_URL / ZYGOTE_TOKEN (or the daemon's token file)
and deletes every sandbox it made, even on errors.
"""

from __future__ import annotations

import sys
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Optional

from zygote import Client, Sandbox

PROJECT = "/root/work"
CALC = "#!/bin/sh\n# add A B: print A+B\nadd() { echo $(( $1 - $2 )); }\nadd \"$@\"\n"
TEST = (
    "#!/bin/sh\n"
    "set -e\n"
    'test "$(sh calc.sh 2 3)" = 5\n'
    'test "$(sh calc.sh 10 -4)" = 6\n'
    "echo ok\n"
)
# The candidate fixes: what each tries, and the sed expression it applies to calc.sh.
CANDIDATES = [
    ("multiply", "s/\\$1 - \\$2/$1 * $2/"),
    ("swap the operands", "s/\\$1 - \\$2/$2 - $1/"),
    ("add", "s/\\$1 - \\$2/$1 + $2/"),
    ("rename the comment", "s/# add/# sum/"),
]


def main() -> int:
    t0 = time.monotonic()
    with Client() as client:
        parent = Sandbox.create(image="minimal", memory_mib=128, name="fix-search", client=client)
        made = [parent]
        try:
            parent.commands.run(f"mkdir -p {PROJECT}", check=True)
            parent.files.write(f"{PROJECT}/calc.sh", CALC)
            parent.files.write(f"{PROJECT}/test.sh", TEST)
            failing = parent.commands.run(f"cd {PROJECT} && sh test.sh")
            print(f"[{time.monotonic() - t0:5.1f}s] {parent.id}: the test fails (exit {failing.exit_code})")

            env = [{"CANDIDATE": sed} for _, sed in CANDIDATES]
            children = parent.branch(n=len(CANDIDATES), env=env, mergeable=True)
            made += children

            def attempt(child: Sandbox) -> Optional[int]:
                # Each child reads its own candidate from its environment.
                fixed = child.commands.run(f'cd {PROJECT} && sed -i "$CANDIDATE" calc.sh && sh test.sh')
                return fixed.exit_code  # None when killed by a signal

            with ThreadPoolExecutor(max_workers=len(children)) as pool:
                codes = list(pool.map(attempt, children))
            for child, (label, _), code in zip(children, CANDIDATES, codes):
                verdict = "passes" if code == 0 else f"fails ({code})"
                print(f"[{time.monotonic() - t0:5.1f}s]   {child.id} tries {label}: {verdict}")
            passing = [c for c, code in zip(children, codes) if code == 0]
            if not passing:
                print("no candidate passes")
                return 1
            winner = passing[0]

            change = winner.diff(parent, PROJECT, content=True)
            print(f"[{time.monotonic() - t0:5.1f}s] {winner.id} against {parent.id}:")
            for m in change.modified:
                print(f"M {m.path}")
                print(m.unified or "", end="")

            # The parent did not touch the project since the branch, so nothing can
            # conflict; if it had, MergeConflictError would say where and change nothing.
            merged = parent.merge(winner, paths=[PROJECT])
            print(f"[{time.monotonic() - t0:5.1f}s] merged {winner.id} into {parent.id}:")
            for c in merged.changes:
                print(f"  {c.action} {c.path} ({c.size} bytes)")
            for child in children:
                child.kill()
            made = [parent]
            print(f"[{time.monotonic() - t0:5.1f}s] deleted {len(children)} branches")

            check = parent.commands.run(f"cd {PROJECT} && sh test.sh")
            verdict = "passes" if check.exit_code == 0 else f"fails ({check.exit_code})"
            print(f"[{time.monotonic() - t0:5.1f}s] {parent.id}: the test now {verdict}")
            tree = parent.tree()
            print(f"tree now: {[n.id for n in tree.sandboxes]}")
            return 0 if check.exit_code == 0 else 1
        finally:
            for sb in made:
                sb.kill()


if __name__ == "__main__":
    sys.exit(main())
