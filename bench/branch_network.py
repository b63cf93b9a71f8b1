#!/usr/bin/env python3
"""A branch child's network set-up with namespaces made ahead vs made on demand (issue 36).

Starts two private zygoted (isolated network, qemu runtime by default), one with
`--network-spares 0` (each child's namespace, veth pair, tap, sysctls, host route and
nftables rules made when the branch asks) and one with `--network-spares N` (a spare
taken: renamed, its rules already the default policy's), a `minimal` sandbox on each,
then per round a 1-child branch on each daemon in turn (the order alternates: the
machine is shared and noisy). Reports the daemon's own `phases.network_ms` (the
children's network set-up, on the branch's critical path) and the reply time, medians
per daemon and their ratio, then one JSON line. Needs root, ip, nft and QEMU:

    python3 bench/branch_network.py [--rounds 10] [--spares 4] [--runtime qemu]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from private_daemon import Daemon  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rounds", type=int, default=10)
    p.add_argument("--spares", type=int, default=4)
    p.add_argument("--runtime", default="qemu")
    args = p.parse_args()
    if os.geteuid() != 0:
        sys.exit("needs root (network namespaces, nftables)")
    tmp = tempfile.TemporaryDirectory(prefix="zb-branchnet-")
    daemons: list[Daemon] = []
    samples = {k: {"network_ms": [], "reply_ms": []} for k in ("on_demand", "ahead")}
    try:
        for key, spares in (("on_demand", 0), ("ahead", args.spares)):
            d = Daemon(Path(tmp.name) / key, "--runtime", args.runtime, "--network", "isolated",
                       "--proxy-listen", "none", "--network-spares", str(spares))
            d.key = key  # type: ignore[attr-defined]
            d.parent = d.call("POST", "/v1/sandboxes", {"image": "minimal"})["sandboxes"][0]["id"]  # type: ignore[attr-defined]
            daemons.append(d)
        for r in range(args.rounds):
            for d in daemons if r % 2 == 0 else daemons[::-1]:
                # The spares taken last round are made again by now.
                time.sleep(0.5)
                t = time.monotonic()
                out = d.call("POST", f"/v1/sandboxes/{d.parent}/branch", {"count": 1})  # type: ignore[attr-defined]
                reply = (time.monotonic() - t) * 1000
                s = samples[d.key]  # type: ignore[attr-defined]
                s["network_ms"].append(out["phases"]["network_ms"])
                s["reply_ms"].append(reply)
                for child in out["children"]:
                    d.call("DELETE", f"/v1/sandboxes/{child}")
                print(f"round {r + 1} {d.key}: network {s['network_ms'][-1]:.1f} ms, "  # type: ignore[attr-defined]
                      f"reply {reply:.0f} ms", file=sys.stderr, flush=True)
    finally:
        for d in daemons:
            # A daemon's stop leaves its VMs running (by design): delete the parent first.
            try:
                d.call("DELETE", f"/v1/sandboxes/{d.parent}")  # type: ignore[attr-defined]
            except Exception as e:  # noqa: BLE001 - clean-up goes on
                print(f"deleting {d.parent}: {e}", file=sys.stderr)  # type: ignore[attr-defined]
            d.stop()
        tmp.cleanup()
    med = {k: {m: round(statistics.median(v), 2) for m, v in s.items()} for k, s in samples.items()}
    print("| 1-child branch, p50 | made on demand | made ahead | ratio |\n|---|---:|---:|---:|")
    for m in ("network_ms", "reply_ms"):
        a, b = med["on_demand"][m], med["ahead"][m]
        print(f"| {m} | {a} | {b} | x{b / a:.3f} |")
    print(json.dumps({"runtime": args.runtime, "rounds": args.rounds, "spares": args.spares,
                      **{f"{k}_{m}_p50": v for k, ms in med.items() for m, v in ms.items()}}))


if __name__ == "__main__":
    main()
