"""Interactive terminals: ``sandbox.pty.create(cols, rows, on_data)``.

The daemon's ``GET /v1/sandboxes/{id}/pty`` is a WebSocket: binary messages
carry the terminal's bytes both ways, text messages JSON control (``resize``
from us; ``error`` and, when the program ends, ``exit`` from the daemon). A
background thread reads the socket and hands output to ``on_data``; closing
the socket (:meth:`PtyHandle.kill`) makes the daemon kill the program.
"""

from __future__ import annotations

import json
import ssl
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Dict, List, Mapping, Optional, Sequence, Tuple, Union
from urllib.parse import urlencode

from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.sync.client import ClientConnection, connect, unix_connect
from websockets.typing import Subprotocol

from ._config import Config
from .errors import ConnectionFailed, ZygoteError, error_for

if TYPE_CHECKING:
    from .sandbox import Sandbox

PTY_PROTOCOL = "zygote.pty.v1"
"""The WebSocket subprotocol the daemon selects."""

OPEN_TIMEOUT = 60.0
"""Seconds to wait for the upgrade (the program is started before it)."""


@dataclass(frozen=True)
class PtyExit:
    """How the terminal's program ended: exactly one of the two is set."""

    exit_code: Optional[int]
    signal: Optional[int]


def pty_query(
    cols: int,
    rows: int,
    cmd: Optional[Sequence[str]],
    env: Optional[Mapping[str, str]],
    cwd: Optional[str],
) -> str:
    """The route's query string (``cmd`` and ``env`` repeat)."""
    q: List[Tuple[str, str]] = [("cols", str(cols)), ("rows", str(rows))]
    q += [("cmd", c) for c in cmd or []]
    q += [("env", f"{k}={v}") for k, v in (env or {}).items()]
    if cwd is not None:
        q.append(("cwd", cwd))
    return urlencode(q)


def parse_control(text: str) -> Union[PtyExit, ZygoteError]:
    """A daemon text message: the exit, or a refused control message / failure."""
    msg = json.loads(text)
    if msg.get("type") == "exit":
        return PtyExit(exit_code=msg.get("exit_code"), signal=msg.get("signal"))
    return error_for(str(msg.get("code", "error")), str(msg.get("message", text)))


def http_error(e: InvalidStatus) -> ZygoteError:
    """The daemon's JSON error body of a refused upgrade as a ZygoteError."""
    status = e.response.status_code
    try:
        err = json.loads(e.response.body or b"{}")["error"]
        return error_for(err["code"], err["message"], status)
    except (ValueError, KeyError, TypeError):
        return error_for("error", f"HTTP {status} instead of a WebSocket", status)


def ws_target(cfg: Config, sandbox_id: str, query: str) -> Tuple[str, Optional[ssl.SSLContext], Dict[str, str]]:
    """The pty route's WebSocket URL, TLS context (wss only) and headers."""
    path = f"/v1/sandboxes/{sandbox_id}/pty?{query}"
    headers = {"Authorization": f"Bearer {cfg.token}"} if cfg.token else {}
    if cfg.unix_socket:
        return f"ws://zygoted{path}", None, headers
    base = cfg.url.rstrip("/")
    if not base.startswith("https://"):
        return "ws://" + base[len("http://") :] + path, None, headers
    tls = ssl.create_default_context(cafile=cfg.verify if isinstance(cfg.verify, str) else None)
    if cfg.verify is False:
        tls.check_hostname = False
        tls.verify_mode = ssl.CERT_NONE
    return "wss://" + base[len("https://") :] + path, tls, headers


def open_socket(cfg: Config, sandbox_id: str, query: str) -> ClientConnection:
    """Connects the pty WebSocket (http, https or unix URLs, the bearer token)."""
    url, tls, headers = ws_target(cfg, sandbox_id, query)
    protocols = [Subprotocol(PTY_PROTOCOL)]
    try:
        if cfg.unix_socket:
            ws = unix_connect(
                cfg.unix_socket, url, additional_headers=headers, subprotocols=protocols, open_timeout=OPEN_TIMEOUT
            )
        else:
            ws = connect(url, ssl=tls, additional_headers=headers, subprotocols=protocols, open_timeout=OPEN_TIMEOUT)
    except InvalidStatus as e:
        raise http_error(e) from None
    except (OSError, TimeoutError) as e:
        raise ConnectionFailed(f"cannot open a terminal at {cfg.url}: {e}") from e
    # The handle owns the connection as a `with` block would (it is closed by kill()
    # or when the program ends).
    return ws.__enter__()


class PtyState:
    """What a terminal's reader collected: shared by the sync and async handles."""

    def __init__(self, on_data: Callable[[bytes], None]) -> None:
        self.on_data = on_data
        self.exit: Optional[PtyExit] = None
        self.failure: Optional[ZygoteError] = None
        self.errors: List[ZygoteError] = []

    def take(self, msg: Union[str, bytes]) -> None:
        """One message from the daemon."""
        if isinstance(msg, bytes):
            self.on_data(msg)
            return
        got = parse_control(msg)
        if isinstance(got, PtyExit):
            self.exit = got
        else:
            self.errors.append(got)

    def outcome(self) -> PtyExit:
        """The exit, once the socket closed; raises if there was none."""
        if self.exit is not None:
            return self.exit
        if self.failure is not None:
            raise self.failure
        raise self.errors[-1] if self.errors else ZygoteError("the terminal closed before its program ended")


class PtyHandle:
    """A running terminal. Output goes to ``on_data`` from a background thread."""

    def __init__(self, ws: ClientConnection, on_data: Callable[[bytes], None]) -> None:
        self._ws = ws
        self._state = PtyState(on_data)
        self._done = threading.Event()
        self.errors = self._state.errors
        """Control messages the daemon refused (the session went on)."""
        self._reader = threading.Thread(target=self._read, name="zygote-pty", daemon=True)
        self._reader.start()

    def _read(self) -> None:
        try:
            while True:
                self._state.take(self._ws.recv())
        except ConnectionClosed:
            pass
        except Exception as e:  # an on_data callback failed, or a bad message
            self._state.failure = ZygoteError(f"terminal reader stopped: {e}")
            self._ws.close()
        finally:
            self._done.set()

    def send_input(self, data: Union[bytes, str]) -> None:
        """Keystrokes (raw bytes; str is sent as UTF-8)."""
        self._ws.send(data.encode() if isinstance(data, str) else bytes(data))

    def resize(self, cols: int, rows: int) -> None:
        """A new terminal size; a bad one lands in :attr:`errors`, nothing changes."""
        self._ws.send(json.dumps({"type": "resize", "cols": cols, "rows": rows}))

    def wait(self, timeout: Optional[float] = None) -> PtyExit:
        """Waits for the program to end; raises if the terminal closed without an exit."""
        if not self._done.wait(timeout):
            raise TimeoutError(f"the terminal's program did not end within {timeout}s")
        return self._state.outcome()

    def kill(self) -> None:
        """Closes the terminal: the daemon kills the program (and its session)."""
        self._ws.close()
        self._done.wait(10)


class Pty:
    """``sandbox.pty``: interactive terminals in the sandbox."""

    def __init__(self, sandbox: "Sandbox") -> None:
        self._sandbox = sandbox

    def create(
        self,
        cols: int,
        rows: int,
        on_data: Callable[[bytes], None],
        cmd: Optional[Sequence[str]] = None,
        *,
        env: Optional[Mapping[str, str]] = None,
        cwd: Optional[str] = None,
    ) -> PtyHandle:
        """Starts ``cmd`` (default: the guest user's login shell) on a terminal of
        ``cols`` x ``rows`` (each 1..1000). Errors before the start (bad size,
        unknown sandbox, a program that cannot start) raise here."""
        query = pty_query(cols, rows, cmd, env, cwd)
        ws = open_socket(self._sandbox.client.config, self._sandbox.id, query)
        return PtyHandle(ws, on_data)
