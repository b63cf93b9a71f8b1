#!/usr/bin/env python3
"""E2B's SDK against zygote vs zygote's own SDK, same daemon, same run (issue 35).

Starts a private zygoted (qemu runtime, proxy on loopback) and, per round and per SDK:

  command     `true` run in a sandbox, until its exit code is back (as E2B's SDK runs
              every command: `/bin/bash -l -c true`, on both sides)
  file 10M    a 10 MiB file written, then read back (checked)
  fork x4     fork(count=4) / branch(n=4) of a sandbox, until every child has answered
              a command (`echo $i`)

E2B's SDK is the unchanged `e2b` wheel (E2B_API_URL / E2B_API_KEY / E2B_SANDBOX_URL
pointed at the daemon); zygote's is sdk/python. Prints a line per round, a table of
medians and the E2B/zygote ratio per operation (issue 35's bar: within 1.5x), and as its
last line one JSON object. Run with the E2B venv (it has both SDKs' dependencies):

    python=$(bash scripts/e2b-venv.sh); $python bench/e2b_sdk.py [--rounds 7] [--image base] [--ops ...]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
ZYGOTED = ROOT / "target/release/zygoted"
sys.path.insert(0, str(ROOT / "sdk/python/src"))

BIG = os.urandom(10 << 20)


def start_daemon(state: Path) -> tuple[subprocess.Popen, str, str, str]:
    proc = subprocess.Popen(
        [str(ZYGOTED), "--state-dir", str(state), "--listen", "127.0.0.1:0",
         "--proxy-listen", "127.0.0.1:0", "--runtime", "qemu"],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
        env=dict(os.environ, ZYGOTE_LOG="warn"))
    url = proxy = None
    for line in proc.stdout:
        if line.startswith("zygoted listening on "):
            url = line.split()[-1]
        elif line.startswith("zygoted proxy listening on "):
            proxy = line.split()[-1]
        if url and proxy:
            break
    if not (url and proxy):
        sys.exit("zygoted did not announce its addresses")
    return proc, url, proxy, (state / "token").read_text().strip()


def ms(f) -> float:
    t = time.monotonic()
    f()
    return (time.monotonic() - t) * 1000


def e2b_ops(image: str):
    from e2b import Sandbox

    sbx = Sandbox.create(image, timeout=1800)

    def command():
        assert sbx.commands.run("true").exit_code == 0

    def file_10m():
        sbx.files.write("/tmp/bench.bin", BIG)
        assert sbx.files.read("/tmp/bench.bin", format="bytes") == BIG

    def fork4():
        kids = sbx.fork(count=4)
        try:
            for i, kid in enumerate(kids):
                if isinstance(kid, Exception):
                    raise kid
                assert kid.commands.run(f"echo {i}").stdout == f"{i}\n"
        finally:
            for kid in kids:
                if not isinstance(kid, Exception):
                    kid.kill()

    return sbx.kill, {"command": command, "file 10M": file_10m, "fork x4": fork4}


def zygote_ops(image: str, url: str, token: str):
    from zygote import Sandbox

    sb = Sandbox.create(image, ttl_secs=1800, url=url, token=token)

    def command():
        # The argv E2B's SDK sends for `commands.run("true")`, so both sides run the
        # same program and the ratio is the SDK and protocol path alone.
        assert sb.commands.run(["/bin/bash", "-l", "-c", "true"]).exit_code == 0

    def file_10m():
        sb.files.write("/tmp/bench.bin", BIG)
        assert sb.files.read_bytes("/tmp/bench.bin") == BIG

    def fork4():
        kids = sb.branch(4)
        try:
            for i, kid in enumerate(kids):
                assert kid.commands.run(["echo", str(i)]).stdout == f"{i}\n"
        finally:
            for kid in kids:
                kid.kill()

    return sb.kill, {"command": command, "file 10M": file_10m, "fork x4": fork4}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--image", default="base")
    ap.add_argument("--ops", default="command,file 10M,fork x4",
                    help="comma-separated subset of: command, file 10M, fork x4")
    args = ap.parse_args()
    if not ZYGOTED.is_file():
        sys.exit(f"no {ZYGOTED}: cargo build --release -p zygote-daemon")
    with tempfile.TemporaryDirectory(prefix="zygote-bench-e2b.") as tmp:
        proc, url, proxy, token = start_daemon(Path(tmp))
        try:
            os.environ.update(E2B_API_URL=f"{url}/e2b", E2B_API_KEY=token,
                              E2B_SANDBOX_URL=proxy)
            results = run(args, url, token)
        finally:
            proc.terminate()
            proc.wait()
    report(results)


def run(args, url: str, token: str) -> dict[str, dict[str, list[float]]]:
    kill_e2b, e2b = e2b_ops(args.image)
    kill_zy, zy = zygote_ops(args.image, url, token)
    wanted = [op.strip() for op in args.ops.split(",")]
    unknown = [op for op in wanted if op not in e2b]
    if unknown:
        sys.exit(f"unknown --ops {unknown}: choose from {list(e2b)}")
    e2b = {op: e2b[op] for op in wanted}
    results: dict[str, dict[str, list[float]]] = {"e2b": {}, "zygote": {}}
    try:
        for op in e2b:
            ms(e2b[op])  # warm-up: first-call costs (connections, page faults) out
            ms(zy[op])
        for r in range(args.rounds):
            for op in e2b:
                # Alternating which SDK goes first, so drift on a shared machine
                # does not favour one of them.
                pair = [("e2b", e2b[op]), ("zygote", zy[op])]
                for sdk, f in pair if r % 2 == 0 else reversed(pair):
                    results[sdk].setdefault(op, []).append(ms(f))
            print(f"round {r + 1}: " + "  ".join(
                f"{op} e2b {results['e2b'][op][-1]:.0f} ms / zygote {results['zygote'][op][-1]:.0f} ms"
                for op in e2b), flush=True)
    finally:
        kill_e2b()
        kill_zy()
    return results


def report(results: dict[str, dict[str, list[float]]]) -> None:
    summary = {}
    print(f"\n{'operation':<10} {'e2b SDK ms':>11} {'zygote SDK ms':>14} {'ratio':>6}")
    for op, times in results["e2b"].items():
        e2b_med = statistics.median(times)
        zy_med = statistics.median(results["zygote"][op])
        ratio = e2b_med / zy_med
        summary[op] = {"e2b_median_ms": round(e2b_med, 2), "zygote_median_ms": round(zy_med, 2),
                       "ratio": round(ratio, 3), "rounds": len(times)}
        print(f"{op:<10} {e2b_med:>11.1f} {zy_med:>14.1f} {ratio:>6.2f}")
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
