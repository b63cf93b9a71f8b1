"""A private zygoted for the Python benches: started on a state directory of its own,
talked to over its REST API with plain urllib (no SDK needed), stopped at the end."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
ZYGOTED = ROOT / "target/release/zygoted"


class Daemon:
    def __init__(self, state: Path, *args: str) -> None:
        """`zygoted --state-dir STATE --listen 127.0.0.1:0 ARGS...`, once it listens."""
        self.proc = subprocess.Popen(
            [str(ZYGOTED), "--state-dir", str(state), "--listen", "127.0.0.1:0", *args],
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
            env=dict(os.environ, ZYGOTE_LOG="warn"))
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            if line.startswith("zygoted listening on "):
                self.url = line.split()[-1].rstrip("/")
                self.token = (state / "token").read_text().strip()
                return
        sys.exit("zygoted did not announce its address")

    def call(self, method: str, path: str, body: object = None) -> object:
        req = urllib.request.Request(
            self.url + path, method=method,
            data=None if body is None else json.dumps(body).encode(),
            headers={"Authorization": f"Bearer {self.token}", "Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=600) as r:
            text = r.read()
        return json.loads(text) if text else None

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
