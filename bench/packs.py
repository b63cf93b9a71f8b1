#!/usr/bin/env python3
"""Snapshot packs (issue 15): size and throughput, against `tar | zstd` of the same files.

Starts Debian's docker-registry on 127.0.0.1 and two private zygoted daemons on the qemu
runtime (A, and B with an image cache of its own, standing in for another host). On A, a
sandbox of --mem-mib (a quarter of it filled in tmpfs: half random, half text) is
snapshotted; then per round:

  export      GET /v1/snapshots/{id}/export to a file (A packs what it has not packed)
  import      POST the file to B's /v1/snapshots/import (B decodes and checks it all)
  push        POST /v1/snapshots/{id}/push to a new repository (every blob uploaded)
  pull        B pulls it (its blob store emptied first, so every blob is downloaded)
  tar | zstd  `tar -c` of the snapshot's state file, disk layer and base image piped to
              `zstd -3 -T1` (the baseline), and `zstd -d | tar -x` back

Throughput is MiB of the pack per second. Prints a line per round, a table of medians
and ratios, and as its last line one JSON object.

    python3 bench/packs.py [--mem-mib 512] [--rounds 5]
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
ZYGOTED = ROOT / "target/release/zygoted"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Daemon:
    def __init__(self, state: Path, cache: Path) -> None:
        env = dict(os.environ, ZYGOTE_CACHE_DIR=str(cache), ZYGOTE_LOG="warn")
        self.proc = subprocess.Popen(
            [str(ZYGOTED), "--state-dir", str(state), "--listen", "127.0.0.1:0",
             "--runtime", "qemu", "--proxy-listen", "none", "--network", "user"],
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env)
        for line in self.proc.stdout:
            if line.startswith("zygoted listening on "):
                self.url = line.split()[-1]
                break
        else:
            sys.exit("zygoted did not start")
        self.token = (state / "token").read_text().strip()

    def call(self, method: str, path: str, body=None, data: bytes | None = None,
             ctype: str = "application/json", timeout: float = 1800):
        if body is not None:
            data = json.dumps(body).encode()
        req = urllib.request.Request(self.url + path, data=data, method=method)
        req.add_header("Authorization", f"Bearer {self.token}")
        req.add_header("Content-Type", ctype)
        return urllib.request.urlopen(req, timeout=timeout)

    def json(self, method: str, path: str, body=None):
        with self.call(method, path, body) as r:
            raw = r.read()
        return json.loads(raw) if raw else None

    def stream(self, path: str, body) -> dict:
        last = None
        with self.call("POST", path, body) as r:
            for line in r:
                last = json.loads(line)
        if last is None or last["type"] == "error":
            sys.exit(f"{path}: {last}")
        return last

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait()


def timed(f):
    t = time.monotonic()
    out = f()
    return (time.monotonic() - t) * 1000, out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mem-mib", type=int, default=512)
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    for tool in ["docker-registry", "zstd", "qemu-system-x86_64"]:
        if not shutil.which(tool):
            sys.exit(f"{tool} is not installed (scripts/setup.sh installs it)")
    if not ZYGOTED.exists():
        sys.exit("build zygote first (make build)")
    real_cache = Path(os.environ.get("ZYGOTE_CACHE_DIR") or Path.home() / ".cache/zygote")
    with tempfile.TemporaryDirectory(prefix="zygote-packs-bench.") as tmp:
        work = Path(tmp)
        port = free_port()
        (work / "registry.yml").write_text(
            "version: 0.1\nlog: {level: error}\n"
            f"storage: {{filesystem: {{rootdirectory: {work / 'registry'}}}, delete: {{enabled: true}}}}\n"
            f"http: {{addr: 127.0.0.1:{port}}}\n")
        registry = subprocess.Popen(["docker-registry", "serve", str(work / "registry.yml")],
                                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        caches = {}
        for name, images in [("a", True), ("b", False)]:
            c = work / f"cache-{name}"
            c.mkdir()
            (c / "kernel").symlink_to(real_cache / "kernel")
            if images:
                (c / "images").symlink_to(real_cache / "images")
            caches[name] = c
        a = Daemon(work / "state-a", caches["a"])
        b = Daemon(work / "state-b", caches["b"])
        try:
            sb = a.json("POST", "/v1/sandboxes", {"image": "minimal", "mem_mib": args.mem_mib})["sandboxes"][0]
            fill = args.mem_mib // 4
            script = (f"head -c {(fill // 2) << 20} /dev/urandom > /dev/shm/random; "
                      f"yes zygote | head -c {(fill - fill // 2) << 20} > /dev/shm/text; sync")
            r = a.json("POST", f"/v1/sandboxes/{sb['id']}/exec", {"argv": ["sh", "-c", script]})
            assert r["exit_code"] == 0, r
            snap = a.json("POST", "/v1/snapshots", {"sandbox": sb["id"]})
            sdir = work / "state-a/snapshots" / snap["id"]
            state_file = next(p for p in sdir.iterdir() if p.is_file())
            # The sandbox's writable layer reads the snapshot's frozen one, which reads
            # the base image: the files a tar of the snapshot must hold.
            newest = max((work / "state-a/layers").glob("*.qcow2"), key=lambda p: p.stat().st_mtime)
            chain = json.loads(subprocess.run(
                ["qemu-img", "info", "--backing-chain", "--output=json", "-U", str(newest)],
                capture_output=True, text=True, check=True).stdout)
            files = [state_file] + [Path(c["filename"]) for c in chain[1:]]
            raw = sum(f.stat().st_blocks * 512 for f in files)
            print(f"guest {args.mem_mib} MiB ({fill} MiB filled); snapshot files "
                  f"{raw / 2**20:.1f} MiB allocated", file=sys.stderr)
            res: dict[str, list[float]] = {k: [] for k in
                                           ["export", "import", "push", "pull", "tar_zstd", "unzstd_untar"]}
            pack_bytes = tar_bytes = 0
            for r_ in range(args.rounds):
                out = work / f"pack{r_}.tar"

                def export() -> None:
                    with a.call("GET", f"/v1/snapshots/{snap['id']}/export") as resp, open(out, "wb") as f:
                        shutil.copyfileobj(resp, f, 1 << 20)

                ms, _ = timed(export)
                res["export"].append(ms)
                pack_bytes = out.stat().st_size
                def import_() -> dict:
                    with b.call("POST", "/v1/snapshots/import", data=out.read_bytes(),
                                ctype="application/x-tar") as resp:
                        return json.loads(resp.read())

                ms, imported = timed(import_)
                res["import"].append(ms)
                b.json("DELETE", f"/v1/snapshots/{imported['id']}")
                ref = f"127.0.0.1:{port}/bench/round{r_}:1"
                ms, _ = timed(lambda: a.stream(f"/v1/snapshots/{snap['id']}/push", {"reference": ref}))
                res["push"].append(ms)
                shutil.rmtree(caches["b"] / "oci", ignore_errors=True)
                ms, done = timed(lambda: b.stream("/v1/snapshots/pull", {"reference": ref}))
                res["pull"].append(ms)
                b.json("DELETE", f"/v1/snapshots/{done['snapshot']['id']}")
                tz = work / f"tar{r_}.tar.zst"
                cmd = (f"tar -cf - --sparse {' '.join(str(f) for f in files)} 2>/dev/null"
                       f" | zstd -3 -T1 -q -o {tz}")
                ms, _ = timed(lambda: subprocess.run(cmd, shell=True, check=True))
                res["tar_zstd"].append(ms)
                tar_bytes = tz.stat().st_size
                dest = work / f"untar{r_}"
                dest.mkdir()
                ms, _ = timed(lambda: subprocess.run(
                    f"zstd -d -q -c {tz} | tar -xf - -C {dest}", shell=True, check=True))
                res["unzstd_untar"].append(ms)
                shutil.rmtree(dest)
                out.unlink()
                tz.unlink()
                print(f"round {r_ + 1}/{args.rounds}: " + ", ".join(
                    f"{k} {v[-1]:.0f} ms" for k, v in res.items()), file=sys.stderr)
            a.json("DELETE", f"/v1/sandboxes/{sb['id']}")
        finally:
            a.stop()
            b.stop()
            registry.terminate()
            registry.wait()
    med = {k: statistics.median(v) for k, v in res.items()}
    mib = pack_bytes / 2**20
    print(f"\npack {mib:.1f} MiB = {pack_bytes / (args.mem_mib << 20):.3f}x guest RAM, "
          f"{pack_bytes / raw:.3f}x the snapshot's files ({raw / 2**20:.1f} MiB); "
          f"tar|zstd {tar_bytes / 2**20:.1f} MiB ({pack_bytes / tar_bytes:.2f}x)")
    print(f"{'':14} {'p50 ms':>9} {'MiB/s':>8}")
    for k, v in med.items():
        print(f"{k:14} {v:9.0f} {mib / (v / 1000):8.1f}")
    print(json.dumps({
        "mem_mib": args.mem_mib, "rounds": args.rounds, "snapshot_mib": round(raw / 2**20, 1),
        "pack_mib": round(mib, 1), "tar_zstd_mib": round(tar_bytes / 2**20, 1),
        **{f"{k}_ms_p50": round(v) for k, v in med.items()},
        "export_over_tar_zstd": round(med["export"] / med["tar_zstd"], 3),
        "import_over_untar": round(med["import"] / med["unzstd_untar"], 3),
    }))


if __name__ == "__main__":
    main()
