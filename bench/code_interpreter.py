#!/usr/bin/env python3
"""The code interpreter (issue 37): branching a loaded interpreter vs loading it again.

Starts a private zygoted (qemu runtime) and, per round, with zygote's Python SDK:

  first run_code    a sandbox of image code-interpreter is created (untimed), then the
                    first run_code (`1`) is timed: the code server and the kernel start
  round trip        a trivial run_code (`1`), median of 10
  load              the "dataset" load: a 50 MiB DataFrame built in the kernel
  branch xN         branch(n=N) of the loaded sandbox, until every child has answered a
                    run_code that reads the DataFrame (its first one)
  fresh xN          what users do elsewhere: N fresh sandboxes, each created, loaded and
                    answering the same read (create included)

Prints a line per round, a table of medians, and as its last line one JSON object. Run
with any python that has httpx (e.g. the E2B venv):

    python=$(bash scripts/e2b-venv.sh); $python bench/code_interpreter.py [--rounds 3] [--children 1,4,16] [--mem-mib 1024]

Every child holds its own copy of the VM's memory on the qemu runtime: N x mem-mib must fit.
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
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
ZYGOTED = ROOT / "target/release/zygoted"
sys.path.insert(0, str(ROOT / "sdk/python/src"))

LOAD = (
    "import pandas as pd, numpy as np\n"
    "df = pd.DataFrame({'v': np.arange(6553600, dtype='float64')})\n"
    "int(df.memory_usage().sum())"
)
READ = "float(df['v'].sum())"


def start_daemon(state: Path) -> tuple[subprocess.Popen, str, str]:
    proc = subprocess.Popen(
        [str(ZYGOTED), "--state-dir", str(state), "--listen", "127.0.0.1:0", "--runtime", "qemu"],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
        env=dict(os.environ, ZYGOTE_LOG="warn"))
    assert proc.stdout is not None
    for line in proc.stdout:
        if line.startswith("zygoted listening on "):
            return proc, line.split()[-1], (state / "token").read_text().strip()
    sys.exit("zygoted did not announce its address")


def timed(f) -> tuple[float, object]:
    t = time.monotonic()
    out = f()
    return (time.monotonic() - t) * 1000, out


GUEST_STATE = (
    "tail -n 20 /run/zygote/codeint/server.log; dmesg | tail -n 15; free -m; uptime"
)


# Every execution may take this long: at N=16 the fresh sandboxes' first executions (the
# kernel's start, pandas' import, the load) share 2 cores with 15 other emulated guests and
# pass the default 300 s.
RUN_TIMEOUT_S = 1800


def value(sb, code: str) -> str:
    try:
        ex = sb.run_code(code, timeout=RUN_TIMEOUT_S)
    except Exception:
        # What the guest knows of it (the code server's log, the kernel's, its memory),
        # printed before the failure is raised: a failed run is worth its diagnosis.
        try:
            state = sb.client.exec(sb.id, ["sh", "-c", GUEST_STATE], timeout=60)
            print(f"{sb.id}: guest state after the failure:\n{state.stdout}", file=sys.stderr)
        except Exception as e:  # noqa: BLE001 - diagnosis only
            print(f"{sb.id}: guest state unavailable: {e}", file=sys.stderr)
        raise
    if ex.error is not None or ex.text is None:
        raise SystemExit(f"{sb.id}: {code!r}: {ex}")
    return ex.text


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--children", default="1,4")
    p.add_argument("--mem-mib", type=int, default=1024)
    args = p.parse_args()
    ns = [int(n) for n in args.children.split(",")]
    from zygote import Client, Sandbox

    with tempfile.TemporaryDirectory(prefix="zygote-bench-code-") as tmp:
        proc, url, token = start_daemon(Path(tmp) / "state")
        client = Client(url, token)
        try:
            subprocess.run(
                ["curl", "-sS", "-N", "-H", f"Authorization: Bearer {token}", "-H", "Content-Type: application/json",
                 "-d", '{"name": "code-interpreter"}', f"{url}/v1/images/build"],
                check=True, stdout=subprocess.DEVNULL)
            rows: dict[str, list[float]] = {}

            def new() -> Sandbox:
                return Sandbox.create(image="code-interpreter", memory_mib=args.mem_mib, client=client)

            def fresh_load_read() -> str:
                sb = new()
                try:
                    value(sb, LOAD)
                    return value(sb, READ)
                finally:
                    sb.kill()

            for r in range(args.rounds):
                line = {}
                sb = new()
                try:
                    line["first run_code"], _ = timed(lambda: value(sb, "1"))
                    trips = [timed(lambda: value(sb, "1"))[0] for _ in range(10)]
                    line["round trip"] = statistics.median(trips)
                    line["load"], _ = timed(lambda: value(sb, LOAD))
                    want = value(sb, READ)
                    for n in ns:
                        def branch_and_read() -> list[str]:
                            children = sb.branch(n)
                            try:
                                with ThreadPoolExecutor(max_workers=n) as pool:
                                    return list(pool.map(lambda c: value(c, READ), children))
                            finally:
                                for c in children:
                                    c.kill()
                        line[f"branch x{n}"], got = timed(branch_and_read)
                        assert got == [want] * n, got
                        def fresh() -> list[str]:
                            with ThreadPoolExecutor(max_workers=n) as pool:
                                return list(pool.map(lambda _: fresh_load_read(), range(n)))
                        line[f"fresh x{n}"], got = timed(fresh)
                        assert got == [want] * n, got
                finally:
                    sb.kill()
                for k, v in line.items():
                    rows.setdefault(k, []).append(v)
                print(f"round {r + 1}: " + ", ".join(f"{k} {v:.0f} ms" for k, v in line.items()), flush=True)
            medians = {k: statistics.median(v) for k, v in rows.items()}
            print(f"{'operation':<16} {'median ms':>10}")
            for k, v in medians.items():
                print(f"{k:<16} {v:>10.0f}")
            for n in ns:
                print(f"fresh x{n} / branch x{n}: {medians[f'fresh x{n}'] / medians[f'branch x{n}']:.1f}x")
            print(json.dumps({"rounds": args.rounds, "mem_mib": args.mem_mib, "median_ms": medians}))
        finally:
            client.close()
            proc.terminate()
            proc.wait(timeout=30)


if __name__ == "__main__":
    main()
