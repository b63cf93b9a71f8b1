"""A real OCI registry on 127.0.0.1 for the live tests, and a tiny image to push
to it (as crates/oci/tests/common does for the Rust tests): Debian's
``docker-registry`` with filesystem storage in a temporary directory, an image
layout made with ``umoci`` whose one layer holds the host's static busybox (and
``sh`` and a few applets linked to it), pushed with ``skopeo``.

The image's config sets ``Env`` (``PATH=/bin``, ``GREETING``), ``WorkingDir``
``/app`` and ``User`` ``1000:1000``: what a sandbox made from it runs commands
with unless told otherwise."""

from __future__ import annotations

import io
import os
import shutil
import socket
import subprocess
import tarfile
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Optional

TOOLS = ("docker-registry", "skopeo", "umoci")
BUSYBOX = Path("/bin/busybox")
APPLETS = ("sh", "id", "cat", "echo", "pwd", "ls", "sleep", "env")
GREETING = "hello from an OCI image"
APP_FILE = "shipped in the image\n"


def unavailable() -> Optional[str]:
    """Why this host cannot run the OCI live tests (None: it can)."""
    for tool in TOOLS:
        if shutil.which(tool) is None:
            return f"`{tool}` is not installed (scripts/setup.sh installs docker-registry, skopeo and umoci)"
    if not BUSYBOX.is_file():
        return f"no static {BUSYBOX} (busybox-static)"
    return None


def _run(*argv: str) -> str:
    p = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    if p.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)}: exit {p.returncode}: {p.stderr.strip() or p.stdout.strip()}")
    return p.stdout


class LocalRegistry:
    """``docker-registry serve`` on a free 127.0.0.1 port; :meth:`stop` kills it and
    removes its storage."""

    def __init__(self) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="zygote-sdk-registry-"))
        self.proc: Optional[subprocess.Popen[bytes]] = None
        self.port = 0
        try:
            self._start()
        except BaseException:
            self.stop()
            raise

    def _start(self) -> None:
        last = ""
        # A free port can be taken between probing and binding: a few tries.
        for _ in range(3):
            with socket.socket() as s:
                s.bind(("127.0.0.1", 0))
                self.port = s.getsockname()[1]
            config = self.dir / "config.yml"
            config.write_text(
                "version: 0.1\n"
                "log:\n  level: warn\n"
                f"storage:\n  filesystem:\n    rootdirectory: {self.dir / 'storage'}\n"
                f"http:\n  addr: 127.0.0.1:{self.port}\n  secret: zygote-sdk-test\n"
            )
            env = {k: v for k, v in os.environ.items() if not k.startswith("REGISTRY_")}
            log = open(self.dir / "registry.log", "wb")
            self.proc = subprocess.Popen(
                ["docker-registry", "serve", str(config)], stdin=subprocess.DEVNULL, stdout=log, stderr=log, env=env
            )
            log.close()
            deadline = time.monotonic() + 15
            while time.monotonic() < deadline and self.proc.poll() is None:
                try:
                    with urllib.request.urlopen(f"http://{self.host}/v2/", timeout=2) as r:
                        if r.status == 200:
                            return
                except (urllib.error.URLError, OSError):
                    time.sleep(0.05)
            last = (self.dir / "registry.log").read_text(errors="replace")
            self._kill()
        raise RuntimeError(f"docker-registry did not come up on 127.0.0.1: {last[-2000:]}")

    @property
    def host(self) -> str:
        return f"127.0.0.1:{self.port}"

    def _kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None

    def stop(self) -> None:
        self._kill()
        shutil.rmtree(self.dir, ignore_errors=True)

    def push(self, layout: Path, tag: str, repo: str) -> str:
        """Copies ``layout:tag`` to ``repo`` here; returns the manifest digest."""
        digest = self.dir / "digest"
        _run(
            "skopeo",
            "--insecure-policy",
            "copy",
            "--quiet",
            "--dest-tls-verify=false",
            "--digestfile",
            str(digest),
            f"oci:{layout}:{tag}",
            f"docker://{self.host}/{repo}",
        )
        return digest.read_text().strip()


def _layer() -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as t:

        def add(name: str, kind: bytes, mode: int, data: bytes = b"", link: str = "") -> None:
            info = tarfile.TarInfo(name)
            info.type, info.mode, info.mtime, info.linkname = kind, mode, 1700000000, link
            info.size = len(data)
            t.addfile(info, io.BytesIO(data) if data else None)

        add("bin", tarfile.DIRTYPE, 0o755)
        add("bin/busybox", tarfile.REGTYPE, 0o755, BUSYBOX.read_bytes())
        for applet in APPLETS:
            add(f"bin/{applet}", tarfile.SYMTYPE, 0o777, link="busybox")
        add("etc", tarfile.DIRTYPE, 0o755)
        add("etc/passwd", tarfile.REGTYPE, 0o644, b"root:x:0:0:root:/root:/bin/sh\napp:x:1000:1000::/app:/bin/sh\n")
        add("etc/group", tarfile.REGTYPE, 0o644, b"root:x:0:\napp:x:1000:\n")
        add("app", tarfile.DIRTYPE, 0o777)
        add("app/hello.txt", tarfile.REGTYPE, 0o644, APP_FILE.encode())
        add("root", tarfile.DIRTYPE, 0o700)
        add("tmp", tarfile.DIRTYPE, 0o1777)
    return out.getvalue()


def build_layout(dest: Path, tag: str = "v1") -> Path:
    """An OCI image layout at ``dest`` holding the test image as ``tag``."""
    layout = dest / "layout"
    image = f"{layout}:{tag}"
    _run("umoci", "init", "--layout", str(layout))
    _run("umoci", "new", "--image", image)
    layer = dest / "layer.tar"
    layer.write_bytes(_layer())
    _run("umoci", "raw", "add-layer", "--image", image, str(layer))
    _run(
        "umoci",
        "config",
        "--image",
        image,
        "--os=linux",
        "--architecture=amd64",
        "--config.env=PATH=/bin",
        f"--config.env=GREETING={GREETING}",
        "--config.workingdir=/app",
        "--config.user=1000:1000",
    )
    _run("umoci", "gc", "--layout", str(layout))
    return layout
