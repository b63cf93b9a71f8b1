"""Tree search with branching sandboxes: grow a state step by step, and at
every step branch the current best sandbox into N children, let each try a
different continuation, score them, keep the best and kill the rest.

The toy problem: reach a target number from a start value with the
operations ``+7``, ``*2`` and ``-3``. The state lives *inside* the sandbox
(a file the guest updates and a history of the moves), so a child starts
from exactly what its ancestors computed, which is the point of branching
instead of replaying: with real agents the "state" is an installed
toolchain, a half-built project, a warmed cache or a running server.

    python examples/tree_search.py --start 3 --target 40 --depth 3

It talks to the daemon given by ZYGOTE_URL / ZYGOTE_TOKEN (or the daemon's
token file), and kills every sandbox it made, even on errors.
"""

from __future__ import annotations

import argparse
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from zygote import BranchIncomplete, Client, Sandbox

# One continuation per child: a shell step that updates the in-guest state.
MOVES = {
    "+7": "$((v + 7))",
    "*2": "$((v * 2))",
    "-3": "$((v - 3))",
}


def step_command(move: str) -> str:
    expr = MOVES[move]
    return f'v=$(cat /root/value); v={expr}; echo "$v" > /root/value; echo "{move}" >> /root/moves; echo "$v"'


@dataclass
class Node:
    sandbox: Sandbox
    value: int
    moves: list[str]


def score(value: int, target: int) -> int:
    """Higher is better: minus the distance to the target."""
    return -abs(target - value)


def search(client: Client, start: int, target: int, depth: int, width: int, memory_mib: int) -> Node:
    moves = list(MOVES)[:width]
    t0 = time.monotonic()
    root = Sandbox.create(image="minimal", memory_mib=memory_mib, client=client)
    alive: set[str] = {root.id}  # everything still to kill if we stop early
    try:
        # Step 0: the root computes the initial state.
        root.commands.run(f"echo {start} > /root/value; : > /root/moves", check=True)
        best = Node(root, start, [])
        print(f"[{time.monotonic() - t0:5.1f}s] root {root.id}: value {start}, target {target}")
        for level in range(1, depth + 1):
            if best.value == target:
                break
            try:
                children = best.sandbox.branch(n=len(moves))
            except BranchIncomplete as e:
                alive.update(c.id for c in e.children)  # the children that did come up die below too
                raise
            alive.update(c.id for c in children)
            # The children are independent VMs: try the continuations concurrently.
            with ThreadPoolExecutor(max_workers=len(children)) as pool:
                outs = list(pool.map(
                    lambda mc: mc[1].commands.run(step_command(mc[0]), timeout=30, check=True).stdout,
                    zip(moves, children),
                ))
            scored = [Node(c, int(out.strip()), best.moves + [m]) for m, c, out in zip(moves, children, outs)]
            for node in scored:
                print(f"[{time.monotonic() - t0:5.1f}s]   level {level} {node.sandbox.id} tries "
                      f"{node.moves[-1]:>3}: {node.value} (score {score(node.value, target)})")
            winner = max(scored, key=lambda n: score(n.value, target))
            # Keep the winner; the losers and the previous best are done.
            for node in scored + [best]:
                if node is not winner:
                    node.sandbox.kill()
                    alive.discard(node.sandbox.id)
            best = winner
            print(f"[{time.monotonic() - t0:5.1f}s] level {level}: keep {best.sandbox.id} "
                  f"({' '.join(best.moves)} -> {best.value})")
        # The winner's own record of how it got there, read from the guest.
        recorded = best.sandbox.files.read("/root/moves").split()
        assert recorded == best.moves, (recorded, best.moves)
        return best
    except BaseException:
        for sid in alive:
            Sandbox(sid, client=client).kill()
        raise


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--start", type=int, default=3)
    p.add_argument("--target", type=int, default=40)
    p.add_argument("--depth", type=int, default=3, help="levels to search (default 3)")
    p.add_argument("--width", type=int, default=3, choices=range(1, len(MOVES) + 1),
                   help="continuations tried per level (default 3)")
    p.add_argument("--memory-mib", type=int, default=128)
    args = p.parse_args()
    with Client() as client:
        best = search(client, args.start, args.target, args.depth, args.width, args.memory_mib)
        try:
            print(f"best: {' '.join(best.moves) or '(no moves)'} -> {best.value} "
                  f"(target {args.target}, distance {abs(args.target - best.value)})")
        finally:
            best.sandbox.kill()
    return 0


if __name__ == "__main__":
    sys.exit(main())
