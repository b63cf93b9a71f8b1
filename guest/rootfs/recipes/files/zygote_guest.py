"""zygote_guest: keep a long-running Python process fork-safe inside a zygote sandbox.

A branch child (or a sandbox restored from a snapshot) starts as an exact copy of its
parent: every process keeps the state it had, including the seed of Python's ``random``
module and of numpy's global generator, so three children of one parent draw the same
"random" numbers. The kernel side is handled by zygote (fresh entropy, CRNG reseed,
clock, machine-id); this module handles the interpreter side.

Each branch or restore increments ``/run/zygote/generation``. Importing this module
starts a daemon thread that notices a new generation within ``POLL_SECONDS`` and then
reseeds ``random`` and, if numpy is imported, ``numpy.random``'s global generator from
``os.urandom``, and calls the functions registered with :func:`on_fork`. Code that must
not draw a single number from the old state right after a fork calls :func:`check`
first (a ``stat`` when nothing changed).

    import zygote_guest                      # starts watching
    zygote_guest.on_fork(lambda gen: print("forked, generation", gen))
    zygote_guest.check()                     # reseed now if a fork happened
"""

from __future__ import annotations

import os
import random
import sys
import threading
from typing import Callable, List, Optional, Tuple

GENERATION_FILE = "/run/zygote/generation"
POLL_SECONDS = 0.02

_lock = threading.Lock()
_callbacks: List[Callable[[int], None]] = []
_seen: Optional[Tuple[int, int]] = None  # (inode, generation) last acted on
_started = False


def _read() -> Tuple[int, int]:
    """(inode, generation) of the counter file; (0, 0) outside a zygote sandbox. The
    agent replaces the file by a rename, so its inode changes with every generation."""
    try:
        st = os.stat(GENERATION_FILE)
        with open(GENERATION_FILE, encoding="ascii") as f:
            return st.st_ino, int(f.read().strip() or 0)
    except (OSError, ValueError):
        return 0, 0


def generation() -> int:
    """The sandbox's current generation (0 outside a zygote sandbox)."""
    return _read()[1]


def reseed() -> None:
    """Reseed ``random`` and numpy's global generator (if numpy is imported) from the
    kernel, whose CRNG zygote reseeds before a child is reported ready."""
    random.seed(os.urandom(32))
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        numpy.random.seed(int.from_bytes(os.urandom(4), "little"))


def on_fork(callback: Callable[[int], None]) -> Callable[[int], None]:
    """Call ``callback(generation)`` after each branch or restore (after reseeding).
    Usable as a decorator."""
    with _lock:
        _callbacks.append(callback)
    return callback


def check() -> bool:
    """Reseed and run the callbacks now if the generation changed since last seen;
    returns whether it did."""
    global _seen
    current = _read()
    with _lock:
        if _seen is None:
            _seen = current
            return False
        if current == _seen:
            return False
        _seen = current
        callbacks = list(_callbacks)
    reseed()
    for cb in callbacks:
        try:
            cb(current[1])
        except Exception as e:  # a failing callback must not stop the watcher
            print(f"zygote_guest: on_fork callback {cb!r} failed: {e}", file=sys.stderr)
    return True


def _watch() -> None:
    stop = threading.Event()
    while not stop.wait(POLL_SECONDS):
        check()


def start() -> None:
    """Start the watcher thread (done on import; calling it again does nothing)."""
    global _started
    with _lock:
        if _started:
            return
        _started = True
    check()  # remember the generation we start in
    threading.Thread(target=_watch, name="zygote-guest", daemon=True).start()


start()
