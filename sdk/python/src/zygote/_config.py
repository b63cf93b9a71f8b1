"""Where the daemon is and how to authenticate, resolved the same way the
``zygote`` CLI does: explicit arguments, then ``ZYGOTE_URL`` /
``ZYGOTE_TOKEN`` / ``ZYGOTE_CA_CERT``, then the token file the daemon writes
into its state directory."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Optional, Union

DEFAULT_URL = "http://127.0.0.1:7420"

# What httpx accepts for TLS verification: a bool or a CA bundle path.
Verify = Union[bool, str]


@dataclass(frozen=True)
class Config:
    url: str
    """As given: ``http://host:port``, ``https://host:port`` or ``unix:///path``."""
    token: Optional[str]
    verify: Verify = True

    @property
    def unix_socket(self) -> Optional[str]:
        return self.url[len("unix://") :] if self.url.startswith("unix://") else None

    @property
    def base_url(self) -> str:
        # httpx needs an http URL even when the bytes go over a Unix socket;
        # the host part is then only a Host header.
        return "http://zygoted" if self.unix_socket else self.url.rstrip("/")


def state_dir(env: Mapping[str, str]) -> Path:
    """The daemon's default state directory (mirrors ``zygoted --state-dir``'s
    default): ``$ZYGOTE_STATE_DIR``, ``$XDG_STATE_HOME/zygote``, ``~/.local/state/zygote``."""
    if env.get("ZYGOTE_STATE_DIR"):
        return Path(env["ZYGOTE_STATE_DIR"])
    if env.get("XDG_STATE_HOME"):
        return Path(env["XDG_STATE_HOME"]) / "zygote"
    home = env.get("HOME") or "/root"
    return Path(home) / ".local/state/zygote"


def resolve(
    url: Optional[str] = None,
    token: Optional[str] = None,
    verify: Optional[Verify] = None,
    env: Optional[Mapping[str, str]] = None,
) -> Config:
    env = os.environ if env is None else env
    url = url or env.get("ZYGOTE_URL") or DEFAULT_URL
    if not url.startswith(("http://", "https://", "unix://")):
        raise ValueError(f"bad zygoted URL {url!r} (want http://HOST:PORT, https://HOST:PORT or unix:///PATH)")
    if token is None:
        token = env.get("ZYGOTE_TOKEN") or None
    if token is None:
        token = _read_token(state_dir(env) / "token")
    if verify is None:
        verify = env.get("ZYGOTE_CA_CERT") or True
    return Config(url=url, token=token, verify=verify)


def _read_token(path: Path) -> Optional[str]:
    # A missing or unreadable token file is not an error here: the daemon
    # answers 401 and the caller gets Unauthorized with a clear message.
    try:
        t = path.read_text().strip()
    except OSError:
        return None
    return t or None
