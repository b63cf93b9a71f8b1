"""Python SDK for zygote: copy-on-write microVM sandboxes for AI agents.

>>> from zygote import Sandbox
>>> with Sandbox.create(image="minimal") as sb:
...     print(sb.commands.run("uname -r").stdout)

See README.md for the full surface; :mod:`zygote.errors` for exceptions.
"""

from ._client import AsyncClient, Client
from ._version import __version__
from .aio import AsyncCommands, AsyncFiles, AsyncSandbox
from .errors import (
    BranchIncomplete,
    CommandFailed,
    CommandTimeout,
    ConflictError,
    ConnectionFailed,
    FileNotFound,
    InvalidArgument,
    NotFoundError,
    PayloadTooLarge,
    PermissionDenied,
    RequestTimeout,
    SandboxBusy,
    SandboxNotFound,
    SandboxNotRunning,
    ServerError,
    SnapshotInUse,
    SnapshotNotFound,
    SpawnFailed,
    Unauthorized,
    Unsupported,
    ZygoteError,
)
from .models import (
    BranchFailure,
    BranchResult,
    CommandResult,
    ExposedPort,
    FileEntry,
    ForkHook,
    KeepResult,
    NetworkInfo,
    SandboxInfo,
    SandboxTree,
    Snapshot,
    TreeNode,
    TreeSnapshot,
    WriteResult,
)
from .sandbox import Commands, Files, Sandbox

__all__ = [
    "__version__",
    "Sandbox",
    "AsyncSandbox",
    "Client",
    "AsyncClient",
    "Commands",
    "Files",
    "AsyncCommands",
    "AsyncFiles",
    "CommandResult",
    "FileEntry",
    "WriteResult",
    "SandboxInfo",
    "ForkHook",
    "NetworkInfo",
    "ExposedPort",
    "Snapshot",
    "BranchResult",
    "BranchFailure",
    "SandboxTree",
    "TreeNode",
    "TreeSnapshot",
    "KeepResult",
    "ZygoteError",
    "ConnectionFailed",
    "RequestTimeout",
    "Unauthorized",
    "InvalidArgument",
    "NotFoundError",
    "SandboxNotFound",
    "SnapshotNotFound",
    "FileNotFound",
    "ConflictError",
    "SandboxNotRunning",
    "SandboxBusy",
    "SnapshotInUse",
    "PermissionDenied",
    "PayloadTooLarge",
    "Unsupported",
    "SpawnFailed",
    "CommandTimeout",
    "CommandFailed",
    "BranchIncomplete",
    "ServerError",
]
