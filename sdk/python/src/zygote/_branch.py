"""Streamed branches, without I/O.

``branch(n, on_progress=...)`` asks the daemon for ``"stream": true``: it
answers at once with NDJSON lines (the branch point, then one line per child
as it comes up or fails, then the summary). :class:`BranchCollector` turns
those lines into :class:`BranchProgress` reports for the caller's callback
and, at the end, the same :class:`~zygote.models.BranchResult` the plain
request answers, so both clients (sync and async) share the parsing.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Awaitable, Callable, Generic, Optional, TypeVar, Union

from .errors import ServerError, error_for
from .models import BranchResult

__all__ = ["BranchProgress", "BranchCollector", "ProgressCallback"]

S = TypeVar("S")


@dataclass(frozen=True)
class BranchProgress(Generic[S]):
    """One child of a streamed branch, reported as soon as it runs (or
    failed). ``sandbox`` is a handle on it, usable at once while its siblings
    still come up (None when it failed: nothing of it is left)."""

    index: int
    """Its position among the requested children (0-based)."""
    sandbox_id: str
    sandbox: Optional[S]
    error: Optional[str]
    """Why it did not come up (None: it runs)."""
    ms: int
    """Milliseconds from the daemon taking the request to this child's report."""
    ready: int
    """Children running so far, this one included."""
    failed: int
    """Children that failed so far, this one included."""
    total: int
    """Children requested."""
    branch_point: str

    @property
    def ok(self) -> bool:
        return self.error is None


# A progress callback; an async sandbox may also pass a coroutine function.
ProgressCallback = Callable[[BranchProgress[Any]], Union[None, Awaitable[None]]]


class BranchCollector(Generic[S]):
    """Feeds on the stream's lines; ``make`` turns a child's id into a handle."""

    def __init__(self, n: int, make: Callable[[str], S]) -> None:
        self._make = make
        self._total = n
        self._point = ""
        self._ready = 0
        self._failed = 0
        self._done: Optional[BranchResult] = None
        self._error: Optional[tuple[str, str]] = None

    def feed(self, line: str) -> Optional[BranchProgress[S]]:
        """The report for a child's line (None for the other lines)."""
        if not line.strip():
            return None
        try:
            ev: dict[str, Any] = json.loads(line)
            kind = ev["type"]
        except (ValueError, KeyError, TypeError) as e:
            raise ServerError(f"unexpected line in the branch stream: {line[:200]!r}", code="bad_response") from e
        if kind == "point":
            self._point = ev["branch_point"]
            self._total = len(ev.get("children") or ()) or self._total
        elif kind == "child":
            self._ready += 1
            return self._progress(ev, self._make(ev["id"]), None)
        elif kind == "child_failed":
            self._failed += 1
            return self._progress(ev, None, str(ev.get("error", "")))
        elif kind == "done":
            self._done = BranchResult.from_json(ev)
        elif kind == "error":
            self._error = (str(ev.get("code", "error")), str(ev.get("message", "")))
        # Unknown kinds (a newer daemon's) are skipped.
        return None

    def _progress(self, ev: dict[str, Any], sandbox: Optional[S], error: Optional[str]) -> BranchProgress[S]:
        return BranchProgress(
            index=int(ev["index"]),
            sandbox_id=ev["id"],
            sandbox=sandbox,
            error=error,
            ms=int(ev.get("ms", 0)),
            ready=self._ready,
            failed=self._failed,
            total=self._total,
            branch_point=self._point,
        )

    def result(self) -> BranchResult:
        """The summary line, or the error the stream ended with."""
        if self._error is not None:
            code, message = self._error
            raise error_for(code, message)
        if self._done is None:
            raise ServerError("the branch stream ended without a summary", code="bad_response")
        return self._done
