"""Image pulls and snapshot packs, without I/O.

``POST /v1/images`` (pull an OCI image), ``POST /v1/snapshots/{id}/push`` and
``POST /v1/snapshots/pull`` answer with NDJSON: progress lines, then one line
that ends the stream (``done`` with the image or snapshot, ``pushed``, or
``error``). :class:`TransferCollector` turns the lines into
:class:`~zygote.models.TransferProgress` reports for the caller's callback
and the final line into the result (or the error), so the sync and async
clients share the parsing. Snapshot export and import move a tar file: the
request shapes are here, the streaming is the clients'.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Awaitable, Callable, Generic, Mapping, Optional, TypeVar, Union

from ._api import seg
from .errors import ServerError, error_for
from .models import Image, PushResult, Snapshot, TransferProgress

__all__ = ["TransferCollector", "TransferCallback", "Transfer", "pull_image", "push_snapshot", "pull_snapshot"]

T = TypeVar("T")

# A progress callback; an async client may also pass a coroutine function.
TransferCallback = Callable[[TransferProgress], Union[None, Awaitable[None]]]

# Bytes read from a file (import) or written to one (export) at a time.
CHUNK = 1 << 20


@dataclass(frozen=True)
class Transfer(Generic[T]):
    """A streamed request: where, what, and which final line makes the result."""

    path: str
    body: dict[str, Any]
    what: str
    """For messages: ``pull of REF``, ``push of SNAP to REF``."""
    final: str
    """The type of the line that carries the result (``done`` or ``pushed``)."""
    parse: Callable[[Mapping[str, Any]], T]


class TransferCollector(Generic[T]):
    """Feeds on the stream's lines; :meth:`result` is the final line's value."""

    def __init__(self, transfer: Transfer[T]) -> None:
        self._t = transfer
        self._result: Optional[T] = None
        self._ended = False
        self._error: Optional[tuple[str, str]] = None

    def feed(self, line: str) -> Optional[TransferProgress]:
        """The report for a progress line (None for the final one)."""
        if not line.strip():
            return None
        try:
            ev: dict[str, Any] = json.loads(line)
            kind = ev["type"]
        except (ValueError, KeyError, TypeError) as e:
            raise ServerError(f"unexpected line in the {self._t.what} stream: {line[:200]!r}", code="bad_response") from e
        if kind == self._t.final:
            try:
                self._result = self._t.parse(ev)
            except (KeyError, TypeError, ValueError) as e:
                raise ServerError(f"unexpected final line of the {self._t.what}: {line[:200]!r}", code="bad_response") from e
            self._ended = True
            return None
        if kind == "error":
            self._error = (str(ev.get("code", "error")), str(ev.get("message", "")))
            self._ended = True
            return None
        return TransferProgress.from_json(ev)

    def result(self) -> T:
        """The result, or the error the stream ended with."""
        if self._error is not None:
            code, message = self._error
            raise error_for(code, message)
        if not self._ended or self._result is None:
            raise ServerError(f"the {self._t.what} stream ended without a result", code="stream_ended")
        return self._result


def _credentials(body: dict[str, Any], username: Optional[str], password: Optional[str]) -> dict[str, Any]:
    # The daemon refuses one without the other; say so before anything is sent.
    if (username is None) != (password is None):
        raise ValueError("username and password go together: give both or neither")
    if username is not None:
        body["username"] = username
        body["password"] = password
    return body


def pull_image(reference: str, username: Optional[str] = None, password: Optional[str] = None) -> Transfer[Image]:
    body = _credentials({"reference": reference}, username, password)
    return Transfer("/v1/images", body, f"pull of {reference}", "done", lambda ev: Image.from_json(ev["image"]))


def push_snapshot(
    snapshot_id: str, reference: str, username: Optional[str] = None, password: Optional[str] = None
) -> Transfer[PushResult]:
    body = _credentials({"reference": reference}, username, password)
    return Transfer(
        f"/v1/snapshots/{seg(snapshot_id)}/push",
        body,
        f"push of {snapshot_id} to {reference}",
        "pushed",
        PushResult.from_json,
    )


def pull_snapshot(
    reference: str, name: Optional[str] = None, username: Optional[str] = None, password: Optional[str] = None
) -> Transfer[Snapshot]:
    body = _credentials({"reference": reference}, username, password)
    if name is not None:
        body["name"] = name
    return Transfer(
        "/v1/snapshots/pull", body, f"pull of {reference}", "done", lambda ev: Snapshot.from_json(ev["snapshot"])
    )


def export_path(snapshot_id: str) -> str:
    return f"/v1/snapshots/{seg(snapshot_id)}/export"


IMPORT_PATH = "/v1/snapshots/import"


def import_params(name: Optional[str]) -> dict[str, str]:
    return {} if name is None else {"name": name}
