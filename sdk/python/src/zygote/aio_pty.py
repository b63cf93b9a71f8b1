"""asyncio terminals: ``await sandbox.pty.create(cols, rows, on_data)``; the same
protocol as :mod:`zygote.pty`, on websockets' asyncio client. Output is handed to
``on_data`` by a reader task."""

from __future__ import annotations

import asyncio
import json
from typing import TYPE_CHECKING, Callable, Mapping, Optional, Sequence, Union

from websockets.asyncio.client import ClientConnection, connect, unix_connect
from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.typing import Subprotocol

from .errors import ConnectionFailed, ZygoteError
from .pty import OPEN_TIMEOUT, PTY_PROTOCOL, PtyExit, PtyState, http_error, pty_query, ws_target

if TYPE_CHECKING:
    from .aio import AsyncSandbox


class AsyncPtyHandle:
    """A running terminal; see :class:`zygote.PtyHandle`."""

    def __init__(self, ws: ClientConnection, on_data: Callable[[bytes], None]) -> None:
        self._ws = ws
        self._state = PtyState(on_data)
        self.errors = self._state.errors
        """Control messages the daemon refused (the session went on)."""
        self._reader = asyncio.create_task(self._read())

    async def _read(self) -> None:
        try:
            while True:
                self._state.take(await self._ws.recv())
        except ConnectionClosed:
            pass
        except Exception as e:  # an on_data callback failed, or a bad message
            self._state.failure = ZygoteError(f"terminal reader stopped: {e}")
            await self._ws.close()

    async def send_input(self, data: Union[bytes, str]) -> None:
        await self._ws.send(data.encode() if isinstance(data, str) else bytes(data))

    async def resize(self, cols: int, rows: int) -> None:
        await self._ws.send(json.dumps({"type": "resize", "cols": cols, "rows": rows}))

    async def wait(self) -> PtyExit:
        await self._reader
        return self._state.outcome()

    async def kill(self) -> None:
        await self._ws.close()
        await asyncio.wait([self._reader], timeout=10)


class AsyncPty:
    """``sandbox.pty`` of an :class:`zygote.AsyncSandbox`."""

    def __init__(self, sandbox: "AsyncSandbox") -> None:
        self._sandbox = sandbox

    async def create(
        self,
        cols: int,
        rows: int,
        on_data: Callable[[bytes], None],
        cmd: Optional[Sequence[str]] = None,
        *,
        env: Optional[Mapping[str, str]] = None,
        cwd: Optional[str] = None,
    ) -> AsyncPtyHandle:
        cfg = self._sandbox.client.config
        url, tls, headers = ws_target(cfg, self._sandbox.id, pty_query(cols, rows, cmd, env, cwd))
        protocols = [Subprotocol(PTY_PROTOCOL)]
        try:
            if cfg.unix_socket:
                ws = await unix_connect(
                    cfg.unix_socket, url, additional_headers=headers, subprotocols=protocols, open_timeout=OPEN_TIMEOUT
                )
            else:
                ws = await connect(
                    url, ssl=tls, additional_headers=headers, subprotocols=protocols, open_timeout=OPEN_TIMEOUT
                )
        except InvalidStatus as e:
            raise http_error(e) from None
        except (OSError, TimeoutError) as e:
            raise ConnectionFailed(f"cannot open a terminal at {cfg.url}: {e}") from e
        return AsyncPtyHandle(ws, on_data)
