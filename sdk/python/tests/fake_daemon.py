"""A scripted stand-in for zygoted: answers requests with the responses of
a test-vector case, in order, and records what it was sent so the test can
compare it with the expected requests."""

from __future__ import annotations

import base64
import json
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Optional
from urllib.parse import parse_qs, urlsplit


@dataclass
class Recorded:
    method: str
    path: str
    query: dict[str, str]
    headers: dict[str, str]
    body: bytes


@dataclass
class FakeDaemon:
    responses: list[dict[str, Any]] = field(default_factory=list)
    requests: list[Recorded] = field(default_factory=list)
    _server: Optional[ThreadingHTTPServer] = None

    @property
    def url(self) -> str:
        assert self._server is not None
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def load(self, responses: list[dict[str, Any]]) -> None:
        """Script the next exchanges (and forget earlier requests)."""
        self.responses = list(responses)
        self.requests = []

    def start(self) -> "FakeDaemon":
        fake = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:  # keep pytest output clean
                pass

            def _handle(self) -> None:
                parts = urlsplit(self.path)
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                fake.requests.append(
                    Recorded(
                        method=self.command,
                        path=parts.path,
                        query={k: v[-1] for k, v in parse_qs(parts.query, keep_blank_values=True).items()},
                        headers={k.lower(): v for k, v in self.headers.items()},
                        body=body,
                    )
                )
                index = len(fake.requests) - 1
                if index >= len(fake.responses):
                    self._send(599, "application/json", b'{"error":{"code":"fake_exhausted","message":"unexpected request"}}')
                    return
                self._respond(fake.responses[index])

            def _respond(self, r: dict[str, Any]) -> None:
                status = r["status"]
                if "ndjson" in r:
                    # Chunked, one event per chunk, as the daemon streams them.
                    self.send_response(status)
                    self.send_header("Content-Type", "application/x-ndjson")
                    self.send_header("Transfer-Encoding", "chunked")
                    self.end_headers()
                    for ev in r["ndjson"]:
                        line = json.dumps(ev).encode() + b"\n"
                        self.wfile.write(b"%x\r\n%s\r\n" % (len(line), line))
                        self.wfile.flush()
                    self.wfile.write(b"0\r\n\r\n")
                elif "json" in r:
                    self._send(status, "application/json", json.dumps(r["json"]).encode())
                elif "body_text" in r:
                    self._send(status, r.get("content_type", "text/plain"), r["body_text"].encode())
                elif "body_base64" in r:
                    self._send(status, r.get("content_type", "application/octet-stream"), base64.b64decode(r["body_base64"]))
                else:
                    self._send(status, None, b"")

            def _send(self, status: int, ctype: Optional[str], body: bytes) -> None:
                self.send_response(status)
                if ctype:
                    self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            do_GET = do_POST = do_PUT = do_DELETE = _handle

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
