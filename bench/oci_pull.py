#!/usr/bin/env python3
"""Pull + convert an OCI image with zygote vs. the same by hand, in the same run.

Builds a multi-layer image of about --mib MiB (compressed; most of it incompressible
data, plus many small files) with umoci, pushes it with skopeo to Debian's
docker-registry on 127.0.0.1, then per round, in alternating order:

  zygote cold   `zygote image pull REF` into an empty cache (download, check, apply
                the layers, add the agent, mkfs.ext4 -d, hash, store)
  zygote hit    the same pull again (the registry is asked what the tag means; nothing
                is downloaded or converted)
  by hand       `skopeo copy docker://REF oci:DIR` + `umoci unpack` + `mkfs.ext4 -d` of
                the same size zygote chose

Prints a line per round, a table of medians, and as its last line one JSON object.
Needs root (umoci unpack keeps owners), docker-registry, skopeo, umoci and a built
`zygote` (make build). Traffic stays on 127.0.0.1.

    python3 bench/oci_pull.py [--mib 100] [--rounds 5]
"""
from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
ZYGOTE = ROOT / "target/release/zygote"


def run(*cmd: str, env: dict | None = None, cwd: str | None = None) -> str:
    p = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=cwd)
    if p.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed ({p.returncode}): {p.stderr.strip()[-2000:]}")
    return p.stdout


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def make_layer(dest: Path, big_mib: int, small_files: int, seed: int) -> None:
    rng = random.Random(seed)
    dest.mkdir(parents=True)
    with open(dest / "blob.bin", "wb") as f:
        for _ in range(big_mib):
            f.write(rng.randbytes(1 << 20))
    small = dest / "small"
    small.mkdir()
    for i in range(small_files):
        (small / f"f{i:05}.txt").write_text(f"file {i} of layer {seed}\n" * rng.randint(1, 40))


def build_image(work: Path, mib: int) -> str:
    """An OCI layout with four layers; returns its path:tag for skopeo."""
    layout = work / "layout"
    run("umoci", "init", "--layout", str(layout))
    run("umoci", "new", "--image", f"{layout}:bench")
    sizes = [mib * 4 // 10, mib * 3 // 10, mib * 2 // 10, mib - mib * 9 // 10]
    for i, size in enumerate(sizes):
        tree = work / f"tree{i}"
        make_layer(tree, size, 2000, i)
        tar = work / f"layer{i}.tar"
        run("tar", "-C", str(tree), "-cf", str(tar), ".")
        run("umoci", "raw", "add-layer", "--image", f"{layout}:bench", str(tar))
        shutil.rmtree(tree)
        tar.unlink()
    run("umoci", "config", "--image", f"{layout}:bench", "--config.env=BENCH=1",
        "--architecture=amd64", "--os=linux")
    run("umoci", "gc", "--layout", str(layout))
    return f"{layout}:bench"


def timed(f) -> float:
    t = time.monotonic()
    f()
    return (time.monotonic() - t) * 1000


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mib", type=int, default=100, help="compressed image size (MiB)")
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    for tool in ["docker-registry", "skopeo", "umoci", "mkfs.ext4"]:
        if not shutil.which(tool):
            sys.exit(f"{tool} is not installed (scripts/setup.sh installs it)")
    if os.geteuid() != 0:
        sys.exit("needs root (umoci unpack keeps owners)")
    if not ZYGOTE.exists():
        sys.exit("build zygote first (make build)")
    agent = subprocess.run(
        ["cargo", "build", "--release", "-q", "-p", "zygote-agent", "--target",
         "x86_64-unknown-linux-musl"], cwd=ROOT)
    if agent.returncode != 0:
        sys.exit("building the agent failed")
    agent_bin = ROOT / "target/x86_64-unknown-linux-musl/release/zygote-agent"

    with tempfile.TemporaryDirectory(prefix="zygote-oci-bench.") as tmp:
        work = Path(tmp)
        port = free_port()
        storage = work / "registry"
        config = work / "registry.yml"
        config.write_text(
            "version: 0.1\nlog: {level: error}\n"
            f"storage: {{filesystem: {{rootdirectory: {storage}}}}}\n"
            f"http: {{addr: 127.0.0.1:{port}}}\n")
        registry = subprocess.Popen(["docker-registry", "serve", str(config)],
                                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            t = time.monotonic()
            source = build_image(work, args.mib)
            print(f"image built in {time.monotonic() - t:.1f}s", file=sys.stderr)
            ref = f"127.0.0.1:{port}/bench/image:1"
            for _ in range(100):
                try:
                    socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                    break
                except OSError:
                    time.sleep(0.1)
            run("skopeo", "--insecure-policy", "copy", "--quiet", "--dest-tls-verify=false",
                f"oci:{source}", f"docker://{ref}")
            blobs = sum(f.stat().st_size for f in storage.rglob("data"))
            print(f"pushed {ref}: {blobs / 2**20:.1f} MiB in the registry", file=sys.stderr)
            results: dict[str, list[float]] = {"cold": [], "hit": [], "by_hand": []}
            size_mib = None
            for r in range(args.rounds):
                cache = work / f"cache{r}"
                cache.mkdir()
                env = dict(os.environ, ZYGOTE_CACHE_DIR=str(cache), ZYGOTE_AGENT_BIN=str(agent_bin))

                def zygote_cold() -> None:
                    nonlocal size_mib
                    out = run(str(ZYGOTE), "image", "pull", "--json", ref, env=env)
                    size_mib = json.loads(out)["size_bytes"] >> 20

                def zygote_hit() -> None:
                    run(str(ZYGOTE), "image", "pull", "--json", ref, env=env)

                def by_hand() -> None:
                    d = work / f"hand{r}"
                    d.mkdir()
                    run("skopeo", "--insecure-policy", "copy", "--quiet", "--src-tls-verify=false",
                        f"docker://{ref}", f"oci:{d}/oci:1")
                    run("umoci", "unpack", "--image", f"{d}/oci:1", str(d / "bundle"))
                    run("mkfs.ext4", "-q", "-F", "-b", "4096", "-m", "0", "-d",
                        str(d / "bundle/rootfs"), str(d / "img.ext4"), f"{size_mib or 2048}M")
                    shutil.rmtree(d)

                steps = [("cold", zygote_cold), ("hit", zygote_hit), ("by_hand", by_hand)]
                if r % 2:
                    steps = [steps[2], steps[0], steps[1]]
                line = []
                for name, f in steps:
                    ms = timed(f)
                    results[name].append(ms)
                    line.append(f"{name} {ms:.0f} ms")
                shutil.rmtree(cache)
                print(f"round {r + 1}/{args.rounds}: " + ", ".join(line), file=sys.stderr)
        finally:
            registry.terminate()
            registry.wait()
    med = {k: statistics.median(v) for k, v in results.items()}
    print(f"\n{'':10} {'p50 ms':>9} {'min':>8} {'max':>8}")
    for k, v in results.items():
        print(f"{k:10} {med[k]:9.0f} {min(v):8.0f} {max(v):8.0f}")
    print(f"\nzygote cold / by hand: {med['cold'] / med['by_hand']:.2f}x; "
          f"cache hit / cold: {med['hit'] / med['cold']:.3f}x")
    print(json.dumps({
        "mib": args.mib, "registry_mib": round(blobs / 2**20, 1), "rounds": args.rounds,
        "cold_ms_p50": round(med["cold"]), "hit_ms_p50": round(med["hit"]),
        "by_hand_ms_p50": round(med["by_hand"]), "ext4_mib": size_mib,
        "cold_over_by_hand": round(med["cold"] / med["by_hand"], 3),
    }))


if __name__ == "__main__":
    main()
