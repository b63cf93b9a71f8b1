#!/usr/bin/env python3
"""Egress by name (issue 39): the daemon's egress proxy vs direct CIDR rules, same run.

Makes a "remote host" of its own (a network namespace on a veth pair, 10.79.<x>.0/24;
nothing leaves this machine) running a DNS server (every name under bench.test -> the
remote), a tiny HTTP server on port 80 and a sink on port 9000 that times first byte to
EOF. Starts a private zygoted (isolated network, qemu runtime, `--dns-upstream` the
remote) and three `minimal` sandboxes:

  open    no lists                      (DNS: the daemon's resolver forwards every name)
  cidr    allow_out [remote/32]         (TCP straight through nftables)
  names   allow_out [*.bench.test, sink.bench.test:9000]   (TCP through the egress proxy)

Per round (the order of cidr/names alternates: the machine is shared and noisy):

  dns ms        in the guest, --queries lookups of fresh names (busybox nslookup via
                10.0.2.3), total / n; also the same lookups sent by this script straight
                to the remote DNS from the host (the upstream's own cost)
  connect ms    in the guest, --queries HTTP/1.0 GETs to the remote's address with
                `Host: web.bench.test` (nc), total / n: connection set-up plus one tiny
                exchange; the names sandbox resolved the name first (the proxy lets an
                address out only when this sandbox's DNS answers vouch for it)
  MiB/s         --mib MiB from the guest to the sink (an HTTP/1.0 POST head, then zeros:
                the proxy needs a Host to judge), timed at the sink, first byte to EOF

  spawn ms      in the guest, --queries runs of `busybox true`: what each loop iteration
                above pays to start its process (large under TCG)

In-guest times come from /proc/uptime (10 ms ticks) over the whole loop. Prints a line
per round, a table of medians and, as its last line, one JSON object. Needs root, ip,
nft and QEMU:

    python3 bench/egress.py [--rounds 5] [--queries 40] [--mib 16]
"""
from __future__ import annotations

import argparse
import json
import os
import random
import socket
import statistics
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import private_daemon  # noqa: E402

# Runs inside the remote namespace (`ip netns exec`): DNS on :53/udp, HTTP on :80, sink on
# :9000 (prints "sink <bytes> <seconds>" per connection).
REMOTE = r'''
import socket, sys, threading, time
addr = sys.argv[1]
def dns():
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.bind((addr, 53))
    ip = bytes(int(x) for x in addr.split("."))
    while True:
        q, peer = s.recvfrom(512)
        end = 12
        while end < len(q) and q[end] != 0:
            end += 1 + q[end]
        question = q[12:end + 5]
        is_a = q[end + 1:end + 3] == b"\x00\x01"
        a = q[:2] + b"\x81\x80\x00\x01" + (b"\x00\x01" if is_a else b"\x00\x00") + b"\x00\x00\x00\x00" + question
        if is_a:
            a += b"\xc0\x0c\x00\x01\x00\x01\x00\x00\x00\x3c\x00\x04" + ip
        s.sendto(a, peer)
def http():
    l = socket.socket(); l.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    l.bind((addr, 80)); l.listen(64)
    while True:
        c, _ = l.accept()
        def one(c=c):
            c.settimeout(5)
            try:
                c.recv(4096); c.sendall(b"HTTP/1.0 200 OK\r\nContent-Length: 2\r\n\r\nok")
            except OSError:
                pass
            c.close()
        threading.Thread(target=one, daemon=True).start()
def sink():
    l = socket.socket(); l.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    l.bind((addr, 9000)); l.listen(8)
    while True:
        c, _ = l.accept()
        n, t0 = 0, None
        while True:
            b = c.recv(1 << 16)
            if not b:
                break
            if t0 is None:
                t0 = time.monotonic()
            n += len(b)
        c.close()
        print(f"sink {n} {time.monotonic() - (t0 or time.monotonic()):.6f}", flush=True)
for f in (dns, http):
    threading.Thread(target=f, daemon=True).start()
print("ready", flush=True)
sink()
'''


def sh(*argv: str) -> None:
    subprocess.run(argv, check=True, capture_output=True)


class Remote:
    def __init__(self) -> None:
        x = os.getpid() % 200 + 20
        self.ns, self.link = f"zbe-remote-{os.getpid()}", f"zbe{os.getpid() % 100000}"
        self.host, self.addr = f"10.79.{x}.1", f"10.79.{x}.2"
        self.cleanup()
        sh("ip", "netns", "add", self.ns)
        sh("ip", "link", "add", self.link, "type", "veth", "peer", "name", "eth0", "netns", self.ns)
        sh("ip", "addr", "add", f"{self.host}/24", "dev", self.link)
        sh("ip", "link", "set", self.link, "up")
        sh("ip", "-n", self.ns, "addr", "add", f"{self.addr}/24", "dev", "eth0")
        for dev in ("eth0", "lo"):
            sh("ip", "-n", self.ns, "link", "set", dev, "up")
        sh("ip", "-n", self.ns, "route", "add", "default", "via", self.host)
        self.proc = subprocess.Popen(
            ["ip", "netns", "exec", self.ns, sys.executable, "-c", REMOTE, self.addr],
            stdout=subprocess.PIPE, text=True)
        assert self.proc.stdout is not None
        if self.proc.stdout.readline().strip() != "ready":
            sys.exit("the remote's servers did not start")

    def sink_result(self) -> tuple[int, float]:
        assert self.proc.stdout is not None
        _, n, secs = self.proc.stdout.readline().split()
        return int(n), float(secs)

    def cleanup(self) -> None:
        if getattr(self, "proc", None):
            self.proc.kill()
        subprocess.run(["ip", "link", "del", self.link], capture_output=True)
        subprocess.run(["ip", "netns", "del", self.ns], capture_output=True)


class Daemon(private_daemon.Daemon):
    def __init__(self, state: Path, dns: str) -> None:
        super().__init__(state, "--runtime", "qemu", "--network", "isolated",
                         "--proxy-listen", "none", "--dns-upstream", dns)

    def create(self, **body: object) -> str:
        return self.call("POST", "/v1/sandboxes", {"image": "minimal", **body})["sandboxes"][0]["id"]

    def sh(self, sb: str, script: str) -> str:
        r = self.call("POST", f"/v1/sandboxes/{sb}/exec", {"argv": ["sh", "-c", script]})
        if r["exit_code"] != 0:
            raise SystemExit(f"{sb}: {script[:60]}...: exit {r['exit_code']}: {r['stderr']}")
        return r["stdout"]


def loop_ms(d: Daemon, sb: str, n: int, body: str) -> float:
    """Runs `body` n times in the guest ($i is the iteration); ms per iteration."""
    out = d.sh(sb, f"""t0=$(cut -d' ' -f1 /proc/uptime); i=0
while [ $i -lt {n} ]; do {body}; i=$((i+1)); done
t1=$(cut -d' ' -f1 /proc/uptime); echo $t0 $t1""")
    t0, t1 = (float(x) for x in out.split())
    return (t1 - t0) * 1000 / n


def host_dns_ms(server: str, n: int) -> float:
    """The same lookups straight from the host to the remote's DNS server."""
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.settimeout(2)
    t = time.monotonic()
    for i in range(n):
        qid = random.randrange(65536)
        name = b"".join(bytes([len(p)]) + p for p in f"h{i}.bench.test".encode().split(b".")) + b"\0"
        s.sendto(struct.pack(">HHHHHH", qid, 0x0100, 1, 0, 0, 0) + name + b"\0\x01\0\x01", (server, 53))
        s.recvfrom(512)
    return (time.monotonic() - t) * 1000 / n


def median(xs: list[float]) -> float:
    return round(statistics.median(xs), 2) if xs else float("nan")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--queries", type=int, default=40)
    p.add_argument("--mib", type=int, default=16)
    args = p.parse_args()
    if os.geteuid() != 0:
        sys.exit("needs root (network namespaces, nftables)")
    remote = Remote()
    tmp = tempfile.TemporaryDirectory(prefix="zb-egress-")
    daemon = None
    samples: dict[str, list[float]] = {k: [] for k in (
        "spawn", "dns_open", "dns_names", "dns_host", "connect_cidr", "connect_names",
        "mib_s_cidr", "mib_s_names")}
    try:
        daemon = Daemon(Path(tmp.name) / "state", remote.addr)
        sbs = {
            "open": daemon.create(),
            "cidr": daemon.create(allow_out=[f"{remote.addr}/32"]),
            "names": daemon.create(allow_out=["*.bench.test", "sink.bench.test:9000"]),
        }
        get = (f"printf 'GET / HTTP/1.0\\r\\nHost: web.bench.test\\r\\n\\r\\n' "
               f"| nc -w 3 {remote.addr} 80 >/dev/null")
        post_head = ("POST / HTTP/1.0\\r\\nHost: sink.bench.test\\r\\n"
                     f"Content-Length: {args.mib << 20}\\r\\n\\r\\n")
        send = (f"{{ printf '{post_head}'; dd if=/dev/zero bs=64k count={args.mib * 16} "
                f"2>/dev/null; }} | nc -w 10 {remote.addr} 9000")
        # The names sandbox's address must come from its own DNS answers.
        daemon.sh(sbs["names"], "nslookup web.bench.test 10.0.2.3 >/dev/null; "
                                "nslookup sink.bench.test 10.0.2.3 >/dev/null")
        for r in range(args.rounds):
            order = ["cidr", "names"] if r % 2 == 0 else ["names", "cidr"]
            lookup = "nslookup -type=a q$i-$RANDOM.bench.test 10.0.2.3 >/dev/null 2>&1"
            # What starting a busybox process costs in this guest (TCG): part of each loop.
            samples["spawn"].append(loop_ms(daemon, sbs["open"], args.queries, "busybox true"))
            samples["dns_open"].append(loop_ms(daemon, sbs["open"], args.queries, lookup))
            samples["dns_names"].append(loop_ms(daemon, sbs["names"], args.queries, lookup))
            samples["dns_host"].append(host_dns_ms(remote.addr, args.queries))
            for kind in order:
                if kind == "names":
                    # Keep the vouching fresh (answers vouch at least 30 s).
                    daemon.sh(sbs["names"], "nslookup web.bench.test 10.0.2.3 >/dev/null; "
                                            "nslookup sink.bench.test 10.0.2.3 >/dev/null")
                samples[f"connect_{kind}"].append(loop_ms(daemon, sbs[kind], args.queries, get))
                daemon.sh(sbs[kind], send)
                n, secs = remote.sink_result()
                if n < args.mib << 20:
                    raise SystemExit(f"{kind}: the sink got {n} bytes of {args.mib} MiB")
                samples[f"mib_s_{kind}"].append(n / (1 << 20) / max(secs, 1e-6))
            print(f"round {r + 1}: " + ", ".join(f"{k} {v[-1]:.2f}" for k, v in samples.items()),
                  file=sys.stderr, flush=True)
        for sb in sbs.values():
            daemon.call("DELETE", f"/v1/sandboxes/{sb}")
    finally:
        if daemon:
            daemon.stop()
        remote.cleanup()
        tmp.cleanup()
    med = {k: median(v) for k, v in samples.items()}
    rows = [
        ("starting a busybox process in the guest, ms (part of every loop below)", med["spawn"], None),
        ("DNS answer in the guest, ms (open / names)", med["dns_open"], med["dns_names"]),
        ("DNS straight from the host to the upstream, ms", med["dns_host"], None),
        ("HTTP connect + GET, ms (cidr / names)", med["connect_cidr"], med["connect_names"]),
        (f"guest -> remote MiB/s, {args.mib} MiB (cidr / names)", med["mib_s_cidr"], med["mib_s_names"]),
    ]
    print("| | direct or open | through the egress proxy |\n|---|---:|---:|")
    for label, a, b in rows:
        print(f"| {label} | {a} | {'' if b is None else b} |")
    summary = {
        **{f"{k}_p50": v for k, v in med.items()},
        "connect_ratio": round(med["connect_names"] / med["connect_cidr"], 2),
        "throughput_ratio": round(med["mib_s_names"] / med["mib_s_cidr"], 2),
        "rounds": args.rounds, "queries": args.queries, "mib": args.mib,
    }
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
