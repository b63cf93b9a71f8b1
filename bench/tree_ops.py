#!/usr/bin/env python3
"""Branch-tree operations on a tree of many files (issue 20's "Measure").

Through a running daemon (ZYGOTE_URL / ZYGOTE_TOKEN or the token file):

1. one sandbox gets FILES files under /root/tree (FILES/100 directories);
2. it is branched into 2 children; one child changes CHANGED of the files;
3. `diff` of that child against its sibling is timed ROUNDS times (median, p90), with
   and without the per-file text diffs, next to a `walk` baseline: `find | sha256sum`
   of the same tree run as an exec in each guest (what a client could do without the
   API);
4. `merge` of the changed child into the parent: ROUNDS dry runs (the common state
   started in a short-lived sandbox, three walks, the plan), then the real merge once
   (the same plus copying the changed files and applying them);
5. `keep` of the changed child is timed, and so is the time until the siblings' VM
   processes are gone and the host's MemAvailable has grown back.

    python3 bench/tree_ops.py [--files 10000] [--changed 100] [--rounds 5]

The last line printed is one JSON object with the medians.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "sdk" / "python" / "src"))

from zygote import Client, Sandbox  # noqa: E402


def mem_available_kib() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1])
    return 0


def ms(f) -> float:
    t = time.perf_counter()
    f()
    return (time.perf_counter() - t) * 1e3


def summary(xs: list[float]) -> dict[str, float]:
    xs = sorted(xs)
    return {"p50": round(statistics.median(xs), 1), "p90": round(xs[int(0.9 * (len(xs) - 1))], 1)}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--files", type=int, default=10_000)
    p.add_argument("--changed", type=int, default=100)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--memory-mib", type=int, default=256)
    a = p.parse_args()
    dirs = max(1, a.files // 100)
    with Client() as client:
        parent = Sandbox.create(image="minimal", memory_mib=a.memory_mib, client=client)
        made = [parent]
        try:
            t = time.perf_counter()
            make = (
                f"mkdir -p /root/tree && cd /root/tree && i=0; while [ $i -lt {a.files} ]; do "
                f"d=d$((i % {dirs})); [ -d $d ] || mkdir $d; echo \"file $i\" > $d/f$i; i=$((i+1)); done"
            )
            parent.commands.run(make, timeout=1800, check=True)
            print(f"{a.files} files in {dirs} directories made in {time.perf_counter() - t:.1f} s", file=sys.stderr)
            children = parent.branch(n=2, mergeable=True)
            made += children
            changed, sibling = children
            change = (
                f"cd /root/tree && i=0; while [ $i -lt {a.changed} ]; do "
                f"echo changed >> d$((i % {dirs}))/f$i; i=$((i+1)); done"
            )
            changed.commands.run(change, timeout=600, check=True)
            baseline = "cd /root/tree && find . -type f | sort | xargs sha256sum | sha256sum"
            d = changed.diff(sibling, "/root/tree")
            assert len(d.modified) == a.changed and not d.added and not d.removed, d
            diff_ms, text_ms, walk_ms = [], [], []
            for r in range(a.rounds):
                diff_ms.append(ms(lambda: changed.diff(sibling, "/root/tree")))
                text_ms.append(ms(lambda: changed.diff(sibling, "/root/tree", content=True)))

                def both() -> None:
                    with ThreadPoolExecutor(2) as pool:
                        list(pool.map(lambda s: s.commands.run(baseline, timeout=600, check=True), children))

                walk_ms.append(ms(both))
                print(f"round {r + 1}/{a.rounds}: diff {diff_ms[-1]:.0f} ms, with text {text_ms[-1]:.0f} ms, "
                      f"find|sha256sum in both guests {walk_ms[-1]:.0f} ms", file=sys.stderr)
            merge_dry_ms = []
            for r in range(a.rounds):
                merge_dry_ms.append(ms(lambda: parent.merge(changed, paths=["/root/tree"], dry_run=True)))
                print(f"round {r + 1}/{a.rounds}: merge dry run {merge_dry_ms[-1]:.0f} ms", file=sys.stderr)
            t = time.perf_counter()
            merged = parent.merge(changed, paths=["/root/tree"])
            merge_ms = (time.perf_counter() - t) * 1e3
            assert merged.applied and len(merged.changes) == a.changed, merged
            print(f"merge: {merge_ms:.0f} ms ({len(merged.changes)} files, {merged.bytes_copied} bytes)",
                  file=sys.stderr)
            # keep: the sibling and the parent go; how soon is their memory back?
            pids = [s.info().pid for s in (sibling, parent)]
            avail_before = mem_available_kib()
            t = time.perf_counter()
            kept = changed.keep(promote=True)
            keep_ms = (time.perf_counter() - t) * 1e3
            while any(pid and Path(f"/proc/{pid}").exists() for pid in pids):
                time.sleep(0.005)
            gone_ms = (time.perf_counter() - t) * 1e3
            time.sleep(0.5)
            freed_mib = (mem_available_kib() - avail_before) / 1024
            made = [changed]
            print(f"keep: {keep_ms:.0f} ms (deleted {kept.deleted}); VM processes gone after {gone_ms:.0f} ms; "
                  f"MemAvailable +{freed_mib:.0f} MiB", file=sys.stderr)
            print(json.dumps({
                "files": a.files,
                "changed": a.changed,
                "rounds": a.rounds,
                "diff_ms": summary(diff_ms),
                "diff_with_text_ms": summary(text_ms),
                "find_sha256sum_both_guests_ms": summary(walk_ms),
                "merge_dry_run_ms": summary(merge_dry_ms),
                "merge_ms": round(merge_ms, 1),
                "keep_ms": round(keep_ms, 1),
                "siblings_gone_ms": round(gone_ms, 1),
                "mem_available_gain_mib": round(freed_mib, 1),
                "runtime": changed.info().runtime,
            }))
            return 0
        finally:
            for s in made:
                s.kill()


if __name__ == "__main__":
    sys.exit(main())
