#!/usr/bin/env python3
"""The nested lane: zygote's own VMM running Linux guests, under test on a host whose
/dev/kvm cannot boot Linux.

QEMU TCG (a software CPU) exposes AMD SVM with nested paging to an L1 Linux built with
KVM + kvm_amd (zygote's one kernel, guest/kernel/build.sh); inside L1, /dev/kvm has hardware
virtualization semantics and zygote's VMM boots real Linux guests (L2). This driver:

  1. builds (or finds in ~/.cache/zygote/kernel) the kernel, whose bzImage is L1's and
     whose vmlinux is the guests',
  2. stages a root disk for L1: busybox, guest/nested/init.sh as /init, the release
     binaries and test executables at the same absolute paths as here (so paths baked in
     at compile time resolve), their shared libraries, the guest kernel and the `minimal`
     image as L1's zygote cache, and the lane's plan,
  3. boots L1 (QEMU TCG, -cpu max, 2 vCPUs) and follows its serial console, where
     init.sh runs the plan's steps and frames them with `@@zy` lines,
  4. for `serve` steps runs a host-side client (the Python SDK's tree-search example, or
     the E2B SDK suites of scripts/e2b-test.sh) against the daemon inside L1 through QEMU
     port forwards on 127.0.0.1 (its API and its sandbox proxy),
  5. prints a report (per step and per test), keeps every step's log under
     target/nested/<lane>/, and exits non-zero if anything failed or L1 itself broke.

Lanes: `smoke` (part of `make test`: Linux boot, the minimal image with its agent,
a 3-way BRANCH with isolation), `full` (`make test-kvm-nested`: every suite that needs
hardware virtualization, the daemon on the kvm runtime, the SDK example) and `bench`
(`make bench-nested`). Usage: scripts/nested-lane.py [--lane smoke|full|bench].
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import re
import shutil
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RELEASE = ROOT / "target" / "release"
PROBE_ELF = ROOT / "guest/probe/target/x86_64-unknown-none/release/zygote-probe"
CACHE = Path(os.environ.get("ZYGOTE_CACHE_DIR") or Path.home() / ".cache" / "zygote")
# L1's view: the zygote cache it gets (read by tests and the daemon; never built in L1).
L1_CACHE = "/zygote-cache"
L1_DAEMON_PORT = 7420
L1_PROXY_PORT = 7421
T0 = time.monotonic()


def say(msg: str) -> None:
    print(f"== [{time.monotonic() - T0:6.1f}s] {msg}", flush=True)


def die(msg: str) -> None:
    print(f"nested-lane: {msg}", file=sys.stderr, flush=True)
    sys.exit(2)


# --- what runs in L1 ----------------------------------------------------------


@dataclass
class Step:
    """One line of L1's plan: a test executable (by cargo package and target), or a
    `serve` step (zygoted on the kvm runtime, exercised from the host)."""

    name: str
    limit_s: int
    package: str = ""
    target: str = ""  # test target name; "" = the package's unit tests
    args: list[str] = field(default_factory=list)
    serve: bool = False
    # A `zygote` subcommand instead of a test executable (e.g. ["bench", "linux"]).
    zygote: list[str] = field(default_factory=list)
    # A serve step's host client: a key of CLIENTS.
    client: str = "tree_search"


SMOKE = [
    Step("vmm/linux_boot", 300, "zygote-vmm", "linux_boot"),
    Step("vmm/devices_linux", 420, "zygote-vmm", "devices_linux"),
    # --nocapture: their timings (pauses, first answers) end up in the step logs.
    Step("vmm/linux_branch", 600, "zygote-vmm", "linux_branch", ["--nocapture"]),
]
FULL = SMOKE + [
    Step("vmm/linux_snapshot", 900, "zygote-vmm", "linux_snapshot", ["--nocapture"]),
    Step("vmm/linux_warm", 900, "zygote-vmm", "linux_warm", ["--nocapture"]),
    Step("vmm/unit", 600, "zygote-vmm", "", ["--test-threads=2"]),
    *[
        Step(f"vmm/{t}", 600, "zygote-vmm", t)
        for t in [
            "probe_boot",
            "branch",
            "snapshot",
            "devices_blk",
            "devices_branch",
            "devices_rng",
            "devices_vsock",
            "kernel_images",
            "pause_io",
        ]
    ],
    Step("cli/vm_serve", 600, "zygote-cli", "vm_serve"),
    Step("daemon/kvm_runtime", 900, "zygote-daemon", "kvm_runtime"),
    Step(
        "daemon/e2e_kvm", 1200, "zygote-daemon", "e2e", ["--exact", "kvm_runtime_end_to_end"]
    ),
    Step(
        "daemon/crash_kvm", 1200, "zygote-daemon", "crash",
        ["--exact", "kvm_runtime_survives_a_crash_at_every_step", "--nocapture"],
    ),
    Step("daemon/kvm_branch_stress", 1800, "zygote-daemon", "kvm_branch_stress"),
    Step("daemon/volumes_kvm", 1200, "zygote-daemon", "volumes", ["kvm_", "--nocapture"]),
    # E2B's unchanged SDKs (issue 35) against the daemon on the kvm runtime.
    Step("sdk/e2b", 5400, serve=True, client="e2b"),
    Step(
        "daemon/network_kvm", 900, "zygote-daemon", "network",
        ["--exact", "kvm_sandbox_networking", "--nocapture"],
    ),
    # Issue 39 on the kvm runtime: DNS under the policy, rules by name, secrets bound to
    # hosts (the last one in the `python` image, staged like `base`).
    Step(
        "daemon/network_dns_kvm", 900, "zygote-daemon", "network_dns",
        ["--exact", "kvm_dns_is_the_daemons_and_obeys_the_policy", "--nocapture"],
    ),
    Step(
        "daemon/network_names_kvm", 900, "zygote-daemon", "network_names",
        ["--exact", "kvm_rules_by_name", "--nocapture"],
    ),
    Step(
        "daemon/network_secrets_kvm", 900, "zygote-daemon", "network_secrets",
        ["--exact", "kvm_secrets_bound_to_hosts", "--nocapture"],
    ),
    # Issue 37 on the kvm runtime: the code interpreter's whole live suite (state, figures,
    # envs, interrupts, contexts, a 50 MiB DataFrame branched into 4, snapshot/restore).
    Step(
        "daemon/code_interpreter_kvm", 2400, "zygote-daemon", "code_interpreter",
        ["--exact", "kvm_code_interpreter_live", "--nocapture"],
    ),
    Step("sdk/tree_search", 1200, serve=True),
    Step("cli/doctor", 120, zygote=["doctor"]),
]
# `make bench-nested`: the Linux-guest figures of the kvm runtime (issue 22's targets), and
# issue 17's streamed fan-out through the daemon (64 children, then the API's 256; small
# guests so that L1's memory holds the children's own pages).
FANOUT = ["bench", "api-fanout", "--runtime", "kvm", "--rounds", "1", "--mem-mib", "128"]
BENCH = [
    Step("bench/linux", 3600, zygote=["bench", "linux", "--rounds", "10"]),
    # The same with warm spawners (issue 36): 1-child branches skip the fork and VM build.
    Step("bench/linux_warm", 3600,
         zygote=["bench", "linux", "--rounds", "10", "--warm-spawners", "1", "--fanout", "0"]),
    Step("bench/api-fanout-64", 1200, zygote=FANOUT + ["--count", "64"]),
    Step("bench/api-fanout-256", 2400, zygote=FANOUT + ["--count", "256"]),
]
LANES = {"smoke": SMOKE, "full": FULL, "bench": BENCH}


# --- building and locating what L1 needs ----------------------------------------


def run(cmd: list[str], **kw) -> str:
    r = subprocess.run(cmd, stdout=subprocess.PIPE, text=True, **kw)
    if r.returncode != 0:
        die(f"{' '.join(map(str, cmd))} failed (exit {r.returncode})")
    return r.stdout


def kernel_build() -> Path:
    """guest/kernel/build.sh: cached by input hash; its progress goes to our stderr.
    The directory holding vmlinux (the guests') and bzImage (L1's)."""
    out = run(["bash", str(ROOT / "guest/kernel/build.sh")])
    return Path(out.strip().splitlines()[-1]).parent


def cached_image(name: str = "minimal", hint: str = "run `make guest` first") -> tuple[Path, Path]:
    """The newest image `name` in the cache made with this tree's agent (the cache is
    shared: other worktrees' builds of the same name carry their own agents), and its
    metadata file."""
    import hashlib
    agent = ROOT / "target/x86_64-unknown-linux-musl/release/zygote-agent"
    if not agent.is_file():
        die(f"{agent} missing: run `make build` first")
    agent_sha = hashlib.sha256(agent.read_bytes()).hexdigest()
    best = None
    for meta in (CACHE / "images").glob(f"{name}-*.json"):
        info = json.loads(meta.read_text())
        img = meta.with_suffix(".ext4")
        if info.get("name") != name or info.get("agent_sha256") != agent_sha or not img.is_file():
            continue
        if best is None or info.get("built_at", 0) > best[0]:
            best = (info.get("built_at", 0), img, meta)
    if best is None:
        die(f"no {name} image made with this tree's agent in the cache: {hint}")
    return best[1], best[2]


def test_executables(steps: list[Step]) -> dict[tuple[str, str], Path]:
    """(package, target) -> test executable, from cargo's build plan (builds if needed)."""
    # --workspace, not -p per package: the dependencies' features are then those `make
    # test-rust` built with, so this finds its executables instead of compiling a second
    # set (a -p build resolves features for those packages alone).
    cmd = ["cargo", "test", "--release", "--workspace", "--no-run", "--message-format=json"]
    packages = sorted({s.package for s in steps if s.package})
    say(f"test executables: {' '.join(cmd[1:])}")
    out = run(cmd, cwd=ROOT, stderr=subprocess.DEVNULL)
    found: dict[tuple[str, str], Path] = {}
    for line in out.splitlines():
        try:
            msg = json.loads(line)
        except json.JSONDecodeError:
            continue
        if msg.get("reason") != "compiler-artifact" or not msg.get("executable"):
            continue
        if not msg.get("profile", {}).get("test"):
            continue
        pkg = msg["package_id"]
        name = next((p for p in packages if re.search(rf"[/#]{re.escape(p)}[@#]", pkg)), None)
        if name is None:
            continue
        kinds = msg["target"]["kind"]
        target = "" if "lib" in kinds else msg["target"]["name"]
        found[(name, target)] = Path(msg["executable"])
    for s in steps:
        if s.package and (s.package, s.target) not in found:
            die(f"cargo built no test executable for {s.package} {s.target or '(unit tests)'}")
    return found


# --- L1's root disk -------------------------------------------------------------


def shared_libraries(binary: Path) -> set[Path]:
    out = subprocess.run(["ldd", str(binary)], stdout=subprocess.PIPE, text=True).stdout
    libs = set()
    for line in out.splitlines():
        m = re.search(r"(/\S+) \(0x", line)
        if m:
            libs.add(Path(m.group(1)))
    return libs


class Stage:
    """A directory that becomes L1's root filesystem."""

    def __init__(self, root: Path):
        self.root = root
        self.libs: set[Path] = set()

    def path(self, abs_path: str | Path) -> Path:
        p = self.root / str(abs_path).lstrip("/")
        p.parent.mkdir(parents=True, exist_ok=True)
        return p

    def copy(self, src: Path, dest: str | Path | None = None) -> None:
        shutil.copy2(src, self.path(dest or src), follow_symlinks=True)

    def binary(self, src: Path, dest: str | Path | None = None) -> None:
        """An ELF executable without debug info, plus the libraries it loads."""
        out = self.path(dest or src)
        subprocess.run(["strip", "--strip-debug", "-o", str(out), str(src)], check=True)
        self.libs |= shared_libraries(src)

    def write(self, dest: str, text: str, mode: int = 0o644) -> None:
        p = self.path(dest)
        p.write_text(text)
        p.chmod(mode)

    def finish_libraries(self) -> None:
        for lib in sorted(self.libs):
            self.copy(lib)

    def to_ext4(self, image: Path) -> None:
        used = sum(
            (p.stat().st_blocks * 512)
            for p in self.root.rglob("*")
            if p.is_file() and not p.is_symlink()
        )
        size = int(used * 1.3) + (256 << 20)
        image.unlink(missing_ok=True)
        with open(image, "wb") as f:
            f.truncate(size)
        run(
            ["mke2fs", "-q", "-F", "-t", "ext4", "-L", "zylane", "-E", "root_owner=0:0",
             "-d", str(self.root), str(image)]
        )


def stage_l1(lane: str, steps: list[Step], work: Path) -> Path:
    kernel_dir = kernel_build()
    images = [cached_image()]
    if needs_base_image(steps):
        # L1 cannot build it (no package mirror there): E2B's default template, as here.
        images.append(cached_image(
            "base", "build it first: `zygote image build base` (or scripts/e2b-test.sh)"))
    if needs_code_interpreter_image(steps):
        images.append(cached_image(
            "code-interpreter", "build it first: `zygote image build code-interpreter` (or the "
            "code_interpreter test, which builds it)"))
    if needs_python_image(steps):
        images.append(cached_image(
            "python", "build it first: `zygote image build python` (or the network_secrets "
            "test, which builds it)"))
    exes = test_executables(steps)
    for b in ["zygote", "zygoted"]:
        if not (RELEASE / b).is_file():
            die(f"{RELEASE / b} missing: run `make build` first")
    if not PROBE_ELF.is_file():
        die(f"{PROBE_ELF} missing: run `make build` first")

    stage_dir = work / "root"
    shutil.rmtree(stage_dir, ignore_errors=True)
    st = Stage(stage_dir)
    for d in ["dev", "proc", "sys", "tmp", "run", "root", "sbin", "usr/bin", "usr/sbin"]:
        (stage_dir / d).mkdir(parents=True, exist_ok=True)
    st.copy(Path("/bin/busybox"), "/bin/busybox")
    st.copy(ROOT / "guest/nested/init.sh", "/init")
    st.path("/init").chmod(0o755)
    st.write("/etc/passwd", "root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/:/bin/false\n")
    st.write("/etc/group", "root:x:0:\nnogroup:x:65534:\n")
    st.write("/etc/hosts", "127.0.0.1 localhost l1\n")
    for b in ["zygote", "zygoted"]:
        st.binary(RELEASE / b)
    # Isolated sandbox networking: iproute2 and nftables as on a host (`ip netns` keeps
    # namespaces in /var/run/netns, which is /run/netns as on Debian).
    # mkfs.ext4 makes named volumes (daemon/volumes_kvm, the E2B volume tests).
    for tool in ["ip", "nft", "mke2fs"]:
        found = shutil.which(tool, path="/usr/sbin:/sbin:/usr/bin:/bin")
        if not found:
            die(f"`{tool}` is missing here: run scripts/setup.sh")
        # In /bin, where busybox would otherwise install its own (much smaller) `ip`.
        st.binary(Path(found), f"/bin/{tool}")
    st.binary(Path(shutil.which("mke2fs", path="/usr/sbin:/sbin")), "/bin/mkfs.ext4")
    (stage_dir / "var").mkdir(exist_ok=True)
    (stage_dir / "var/run").symlink_to("../run")
    st.copy(PROBE_ELF)
    for (_, _), exe in sorted(exes.items()):
        st.binary(exe)
    for f in ["vmlinux", "bzImage", "info", "config"]:
        st.copy(kernel_dir / f, f"{L1_CACHE}/kernel/{kernel_dir.name}/{f}")
    for image, image_meta in images:
        st.copy(image, f"{L1_CACHE}/images/{image.name}")
        st.copy(image_meta, f"{L1_CACHE}/images/{image_meta.name}")
    st.finish_libraries()

    env = {
        "HOME": "/root",
        "ZYGOTE_CACHE_DIR": L1_CACHE,
        "ZYGOTE_PREBUILT": "1",
        "ZYGOTE_REQUIRE_HW_VIRT": "1",
        "ZYGOTE_BIN": str(RELEASE / "zygote"),
        "ZYGOTE_PROBE": str(PROBE_ELF),
        "RUST_BACKTRACE": "1",
        "ZYGOTE_LOG": "warn",
    }
    st.write("/lane/env", "".join(f"export {k}='{v}'\n" for k, v in env.items()))
    plan = []
    for s in steps:
        if s.serve:
            cmd = f"ZYGOTE_LOG=info {RELEASE / 'zygoted'} --runtime kvm"
            plan.append(f"{s.name}\t{s.limit_s}\tserve\t{cmd}")
        elif s.zygote:
            cmd = " ".join([str(RELEASE / "zygote"), *s.zygote])
            plan.append(f"{s.name}\t{s.limit_s}\trun\t{cmd}")
        else:
            exe = exes[(s.package, s.target)]
            threads = [] if any("test-threads" in a for a in s.args) else ["--test-threads=1"]
            cmd = " ".join([str(exe), *threads, *s.args])
            plan.append(f"{s.name}\t{s.limit_s}\trun\t{cmd}")
    st.write("/lane/plan", "\n".join(plan) + "\n")

    disk = work / "l1-root.ext4"
    st.to_ext4(disk)
    say(f"L1 root disk {disk} ({disk.stat().st_blocks * 512 >> 20} MiB used)")
    return disk


# --- running L1 -----------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class StepResult:
    name: str
    rc: int | None = None
    ms: int = 0
    tests: dict[str, str] = field(default_factory=dict)
    log: list[str] = field(default_factory=list)
    note: str = ""

    @property
    def ok(self) -> bool:
        return self.rc == 0 and not any(v == "FAILED" for v in self.tests.values())


TEST_LINE = re.compile(r"^test (\S+) \.\.\. (ok|FAILED|ignored)")
TEST_STARTED = re.compile(r"^test (\S+) \.\.\. ")
# The L1 kernel itself breaking is an infrastructure failure, reported as such.
L1_TROUBLE = re.compile(r"(Kernel panic|Oops:|BUG: |general protection fault|Call Trace:)")


def sdk_tree_search(port: int, token: str, log: list[str]) -> int:
    """The Python SDK's tree-search example against the daemon inside L1."""
    py = run(["bash", str(ROOT / "scripts/sdk-venv.sh")]).strip()
    env = dict(os.environ, ZYGOTE_URL=f"http://127.0.0.1:{port}", ZYGOTE_TOKEN=token)
    cmd = [py, str(ROOT / "sdk/python/examples/tree_search.py"),
           "--start", "3", "--target", "40", "--depth", "3"]
    log.append(f"host$ {' '.join(cmd[1:])}")
    p = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                       text=True, timeout=1100)
    log.extend(p.stdout.splitlines())
    return p.returncode


def e2b_suites(ports: dict[str, int], token: str, log: list[str]) -> int:
    """scripts/e2b-test.sh (E2B's Python and JS SDKs) against the daemon inside L1."""
    env = dict(os.environ, E2B_TEST_DAEMON_URL=f"http://127.0.0.1:{ports['api']}",
               E2B_TEST_PROXY_URL=f"http://127.0.0.1:{ports['proxy']}", E2B_TEST_TOKEN=token)
    cmd = ["bash", str(ROOT / "scripts/e2b-test.sh")]
    log.append(f"host$ {' '.join(cmd)}")
    p = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                       text=True, timeout=5300)
    log.extend(p.stdout.splitlines())
    return p.returncode


# A serve step's host client, by `Step.client`: (what it is, how it is run).
CLIENTS = {
    "tree_search": ("sdk tree_search example",
                    lambda ports, token, log: sdk_tree_search(ports["api"], token, log)),
    "e2b": ("E2B SDK suites", e2b_suites),
}


def needs_base_image(steps: list[Step]) -> bool:
    return any(s.serve and s.client == "e2b" for s in steps)


def needs_code_interpreter_image(steps: list[Step]) -> bool:
    return any(s.target == "code_interpreter" for s in steps)


def needs_python_image(steps: list[Step]) -> bool:
    return any(s.target == "network_secrets" for s in steps)


def l1_registers(sock: Path) -> str:
    """L1's vCPU registers through QEMU's monitor (QMP), for a report on a wedged L1."""
    try:
        with socket.socket(socket.AF_UNIX) as s:
            s.settimeout(10)
            s.connect(str(sock))
            f = s.makefile("rw")
            f.readline()  # greeting
            for cmd in [{"execute": "qmp_capabilities"},
                        {"execute": "human-monitor-command",
                         "arguments": {"command-line": "info registers -a"}}]:
                f.write(json.dumps(cmd) + "\n")
                f.flush()
                while True:
                    reply = json.loads(f.readline())
                    if "return" in reply or "error" in reply:
                        break
            return str(reply.get("return", reply))
    except (OSError, ValueError) as e:
        return f"(no registers: {e})"


# Time L1 gets to come up, and beyond a step's own limit (which L1 enforces) before the
# host declares L1 wedged.
BOOT_GRACE_S = 300
STEP_GRACE_S = 90


def boot_l1(bzimage: Path, disk: Path, steps: list[Step], opts: argparse.Namespace,
            outdir: Path):
    ports = {"api": free_port(), "proxy": free_port()}
    forwards = ",".join(
        f"hostfwd=tcp:127.0.0.1:{ports[k]}-10.0.2.15:{p}"
        for k, p in [("api", L1_DAEMON_PORT), ("proxy", L1_PROXY_PORT)])
    cmd = [
        "qemu-system-x86_64", "-nodefaults", "-no-user-config",
        "-machine", "pc", "-accel", f"tcg,thread={opts.tcg_thread}", "-cpu", "max",
        "-smp", str(opts.l1_smp), "-m", str(opts.l1_mem_mib),
        "-display", "none", "-no-reboot", "-monitor", "none",
        # For a report on L1's CPUs should it wedge.
        "-qmp", f"unix:{outdir / 'qmp.sock'},server=on,wait=off",
        # ttyS0: the lane's channel (init.sh's output, the host's replies);
        # ttyS1: L1's kernel console.
        "-serial", "stdio", "-serial", f"file:{outdir / 'l1-kernel.log'}",
        "-kernel", str(bzimage),
        "-append", "console=ttyS1 root=/dev/vda rw rootfstype=ext4 init=/init panic=5 "
                   + ("" if opts.l1_npt else "kvm_amd.npt=0 ") + opts.l1_append,
        "-drive", f"file={disk},if=virtio,format=raw,snapshot=on",
        "-netdev", f"user,id=n0,restrict=on,{forwards}",
        "-device", "virtio-net-pci,netdev=n0",
    ]
    budget = BOOT_GRACE_S + sum(s.limit_s + STEP_GRACE_S for s in steps)
    say(f"booting L1 (QEMU TCG, -cpu max with SVM; time limit {budget}s)")
    console = open(outdir / "lane.log", "w")
    qemu = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, errors="replace", bufsize=1)
    lines: queue.Queue[str | None] = queue.Queue()

    def pump():
        for line in qemu.stdout:
            lines.put(line.rstrip("\r\n"))
        lines.put(None)

    threading.Thread(target=pump, daemon=True).start()
    deadline = time.monotonic() + budget
    # Until L1 shows a sign of life for the current phase (boot, or the step running).
    watchdog = time.monotonic() + BOOT_GRACE_S
    phase = "boot"
    facts: dict[str, str] = {}
    results: list[StepResult] = []
    current: StepResult | None = None
    boot_log: list[str] = []
    pending: str | None = None
    done = False
    ended = "L1 ended before the lane finished"
    while True:
        try:
            line = lines.get(timeout=max(0.1, min(deadline, watchdog) - time.monotonic()))
        except queue.Empty:
            if time.monotonic() >= deadline:
                ended = f"time limit ({budget}s) reached"
            else:
                ended = f"L1 stopped responding during {phase} (its own time limit passed)"
            break
        if line is None:
            break
        console.write(line + "\n")
        console.flush()
        if line.startswith("@@zy "):
            words = line.split()
            kind = words[1]
            if kind == "l1":
                facts = dict(w.split("=", 1) for w in words[2:] if "=" in w)
                say("L1 up: " + " ".join(words[2:]))
            elif kind == "begin":
                pending = None
                current = StepResult(words[2])
                limit = next((st.limit_s for st in steps if st.name == current.name), 600)
                watchdog = time.monotonic() + limit + STEP_GRACE_S
                phase = current.name
                results.append(current)
                print(f"   {current.name} ...", end="", flush=True)
            elif kind == "end" and current is not None:
                kv = dict(w.split("=", 1) for w in words[3:] if "=" in w)
                current.rc = int(kv.get("rc", "-1"))
                current.ms = int(kv.get("ms", "0"))
                status = "ok" if current.ok else "FAILED"
                print(f" {status} ({current.ms / 1000:.1f} s)", flush=True)
                current = None
            elif kind == "serve" and current is not None:
                step = next(st for st in steps if st.name == current.name)
                what, client = CLIENTS[step.client]
                rc = client(ports, words[3], current.log)
                current.note = f"host client exit {rc}"
                current.tests[what] = "ok" if rc == 0 else "FAILED"
                qemu.stdin.write("done\n")
                qemu.stdin.flush()
            elif kind == "lane-done":
                done = True
                watchdog = time.monotonic() + STEP_GRACE_S
                phase = "power-off"
            continue
        if current is not None:
            current.log.append(line)
            m = TEST_LINE.match(line)
            if m:
                current.tests[m.group(1)] = m.group(2)
            elif (m := TEST_STARTED.match(line)) is not None:
                # A test that prints to stderr while it runs splits libtest's line:
                # its result comes on a later line of its own.
                pending = m.group(1)
            elif pending and line.strip() in ("ok", "FAILED", "ignored"):
                current.tests[pending] = line.strip()
                pending = None
        else:
            boot_log.append(line)
    if qemu.poll() is None and not done:
        (outdir / "l1-registers.txt").write_text(l1_registers(outdir / "qmp.sock"))
    if qemu.poll() is None:
        try:
            qemu.wait(timeout=30 if done else 1)
        except subprocess.TimeoutExpired:
            qemu.kill()
            qemu.wait()
    console.close()
    kernel_log = (outdir / "l1-kernel.log").read_text(errors="replace").splitlines()
    trouble = [line for line in kernel_log if L1_TROUBLE.search(line)]
    if not facts:
        # L1 never reached init.sh: its kernel log says why.
        boot_log = kernel_log
    return facts, results, boot_log, trouble, (None if done else ended)


def report(lane: str, steps: list[Step], facts, results, boot_log, trouble, broken, outdir: Path) -> int:
    by_name = {r.name: r for r in results}
    failed = 0
    print()
    say(f"nested lane '{lane}': L1 " + " ".join(f"{k}={v}" for k, v in facts.items()))
    for s in steps:
        r = by_name.get(s.name)
        if r is None:
            print(f"  NOT RUN  {s.name}")
            failed += 1
            continue
        (outdir / (s.name.replace("/", "__") + ".log")).write_text("\n".join(r.log) + "\n")
        passed = sum(1 for v in r.tests.values() if v == "ok")
        word = "PASS" if r.ok else "FAIL"
        print(f"  {word:8} {s.name:24} {passed}/{len(r.tests)} tests, {r.ms / 1000:.1f} s"
              + (f", rc={r.rc}" if r.rc not in (0, None) else "")
              + (" (killed at its time limit)" if r.rc == 124 else ""))
        for t, v in sorted(r.tests.items()):
            if v != "ok":
                print(f"           {v}: {t}")
        if not r.ok:
            failed += 1
            tail = r.log[-150:]
            print(f"  --- {s.name}: last {len(tail)} lines of output ---")
            for line in tail:
                print(f"  | {line}")
    if not facts.get("kvm") == "yes":
        print("  L1 has no /dev/kvm: the lane cannot run (see l1-kernel.log)")
        failed += 1
    if trouble:
        print("  the L1 kernel reported trouble (an infrastructure failure, not a test's):")
        for t in trouble[:20]:
            print(f"  | {t}")
        failed += 1
    if broken:
        print(f"  L1 broke off: {broken}; last console lines:")
        tail = (results[-1].log if results else boot_log)[-40:]
        for line in tail:
            print(f"  | {line}")
        if (outdir / "l1-registers.txt").exists():
            print(f"  L1's registers at that moment: {outdir / 'l1-registers.txt'}")
        failed += 1
    # A benchmark step's last line is its JSON summary: it ends the report too.
    bench = {}
    for r in results:
        last = next((line for line in reversed(r.log) if line.startswith("{")), None)
        if r.name.startswith("bench/") and last:
            try:
                bench[r.name] = json.loads(last)
            except json.JSONDecodeError:
                pass
    summary = {
        "lane": lane,
        "l1": facts,
        "passed": failed == 0,
        "broken": broken,
        "l1_trouble": trouble,
        "steps": [
            {"name": r.name, "rc": r.rc, "ms": r.ms, "ok": r.ok, "tests": r.tests, "note": r.note}
            for r in results
        ],
    }
    summary["bench"] = bench
    (outdir / "report.json").write_text(json.dumps(summary, indent=2) + "\n")
    say(f"{'PASSED' if failed == 0 else 'FAILED'}: logs and report.json in {outdir}")
    for figures in bench.values():
        print(json.dumps(figures))
    return 0 if failed == 0 else 1


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--lane", choices=sorted(LANES), default="smoke")
    ap.add_argument("--only", action="append", default=[],
                    help="run only the steps whose name contains this (repeatable)")
    ap.add_argument("--repeat", type=int, default=1,
                    help="run the (selected) steps this many times in one L1 boot (flake hunting)")
    ap.add_argument("--l1-mem-mib", type=int, default=6144)
    ap.add_argument("--l1-npt", action="store_true",
                    help="let L1's kvm_amd use nested paging (emulated by TCG); by default it "
                         "uses shadow paging, see guest/nested/README.md")
    ap.add_argument("--l1-append", default="", help="extra L1 kernel parameters")
    ap.add_argument("--l1-smp", type=int, default=2, help="L1 vCPUs")
    ap.add_argument("--tcg-thread", choices=["multi", "single"], default="multi",
                    help="QEMU TCG: one host thread per L1 vCPU (multi) or one for all")
    args = ap.parse_args()
    if not shutil.which("qemu-system-x86_64"):
        die("qemu-system-x86_64 not found: run scripts/setup.sh")
    steps = LANES[args.lane]
    if args.only:
        steps = [s for s in steps if any(o in s.name for o in args.only)]
        if not steps:
            die(f"no step of lane {args.lane} matches {args.only}")
    if args.repeat > 1:
        steps = [
            Step(f"{s.name}#{k}", s.limit_s, s.package, s.target, s.args, s.serve, s.zygote,
                 s.client)
            for k in range(1, args.repeat + 1)
            for s in steps
        ]
    outdir = ROOT / "target" / "nested" / args.lane
    shutil.rmtree(outdir, ignore_errors=True)
    outdir.mkdir(parents=True)
    say(f"kernel (guest/kernel/build.sh; cached in {CACHE}/kernel): bzImage for L1")
    bzimage = kernel_build() / "bzImage"
    disk = stage_l1(args.lane, steps, ROOT / "target" / "nested" / "work")
    facts, results, boot_log, trouble, broken = boot_l1(bzimage, disk, steps, args, outdir)
    return report(args.lane, steps, facts, results, boot_log, trouble, broken, outdir)


if __name__ == "__main__":
    sys.exit(main())
