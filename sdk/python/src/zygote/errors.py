"""Typed exceptions.

Every error the daemon returns is ``{"error": {"code", "message"}}`` with a
stable ``code``; :func:`error_for` maps that code to an exception class so
callers can ``except SandboxNotFound`` instead of comparing strings. Every
class carries the original ``code`` (and the HTTP ``status`` when there was
one), so code not listed here still surfaces as a plain :class:`ZygoteError`
with its code intact.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Generic, Optional, TypeVar

if TYPE_CHECKING:
    from .models import BranchFailure, CommandResult, MergeConflict, MergeReport

# The kind of sandbox handle a BranchIncomplete carries (Sandbox or AsyncSandbox).
_S = TypeVar("_S")

__all__ = [
    "ZygoteError",
    "ConnectionFailed",
    "RequestTimeout",
    "Unauthorized",
    "InvalidArgument",
    "NotFoundError",
    "SandboxNotFound",
    "SnapshotNotFound",
    "FileNotFound",
    "ProcessNotFound",
    "ConflictError",
    "SandboxNotRunning",
    "SandboxBusy",
    "SnapshotInUse",
    "ProcessExited",
    "PermissionDenied",
    "PayloadTooLarge",
    "Unsupported",
    "SpawnFailed",
    "ImageNotFound",
    "RegistryUnauthorized",
    "BadImage",
    "UnsupportedPlatform",
    "ImageTooLarge",
    "RegistryError",
    "CommandTimeout",
    "CommandFailed",
    "BranchIncomplete",
    "MergeConflictError",
    "ServerError",
    "error_for",
]


class ZygoteError(Exception):
    """Base class: ``code`` is the API's stable error code (or an SDK code
    such as ``command_timeout`` / ``connection_failed``), ``status`` the
    HTTP status when the daemon answered."""

    default_code = "error"

    def __init__(self, message: str, *, code: Optional[str] = None, status: Optional[int] = None) -> None:
        super().__init__(message)
        self.message = message
        self.code: str = code or self.default_code
        self.status = status

    def __str__(self) -> str:
        where = f", HTTP {self.status}" if self.status is not None else ""
        return f"{self.message} ({self.code}{where})"

    def __repr__(self) -> str:
        return f"{type(self).__name__}(code={self.code!r}, status={self.status!r}, message={self.message!r})"


class ConnectionFailed(ZygoteError):
    """The daemon could not be reached (not running, wrong URL, TLS failure)."""

    default_code = "connection_failed"


class RequestTimeout(ZygoteError):
    """The daemon did not answer within the client's HTTP timeout."""

    default_code = "request_timeout"


class Unauthorized(ZygoteError):
    """Missing or wrong bearer token."""

    default_code = "unauthorized"


class InvalidArgument(ZygoteError):
    """The request was rejected as invalid (400)."""

    default_code = "invalid_argument"


class NotFoundError(ZygoteError):
    """Something named in the request does not exist (404)."""

    default_code = "not_found"


class SandboxNotFound(NotFoundError):
    pass


class SnapshotNotFound(NotFoundError):
    pass


class FileNotFound(NotFoundError):
    """A path inside the guest does not exist (``guest_not_found``)."""

    default_code = "guest_not_found"


class ProcessNotFound(NotFoundError):
    """No background process with that pid in the sandbox (the guest keeps the
    256 most recent)."""


class ConflictError(ZygoteError):
    """The request conflicts with the current state (409)."""

    default_code = "conflict"


class SandboxNotRunning(ConflictError):
    default_code = "sandbox_not_running"


class SandboxPaused(SandboxNotRunning):
    """The sandbox is paused: ``sb.resume()`` it first (or create it with
    ``auto_resume=True`` so that commands and file calls resume it)."""

    default_code = "sandbox_paused"


class WrongState(ConflictError):
    """Pause of a sandbox that is not running, or resume of one that is not paused."""

    default_code = "wrong_state"


class SandboxBusy(ConflictError):
    """Another branch, snapshot, restore or delete is in progress on it."""

    default_code = "sandbox_busy"


class SnapshotInUse(ConflictError):
    default_code = "snapshot_in_use"


class ProcessExited(ConflictError):
    """The background process has exited: it takes no more stdin or signals."""

    default_code = "process_exited"


class PermissionDenied(ZygoteError):
    default_code = "guest_permission_denied"


class PayloadTooLarge(ZygoteError):
    default_code = "payload_too_large"


class Unsupported(ZygoteError):
    """The runtime cannot do this (e.g. a snapshot kind it lacks)."""

    default_code = "unsupported"


class SpawnFailed(ZygoteError):
    """The program could not be started in the guest (e.g. not found)."""

    default_code = "guest_spawn_failed"


class ServerError(ZygoteError):
    """The daemon or the guest agent failed (5xx: ``internal``,
    ``runtime_error``, ``agent_unreachable``, ``guest_error``, ...)."""

    default_code = "internal"


class ImageNotFound(NotFoundError):
    """The registry has no such image or snapshot pack (``image_not_found``):
    a wrong repository, tag or digest, or one the credentials may not see."""

    default_code = "image_not_found"


class RegistryUnauthorized(ZygoteError):
    """The registry refused the credentials, or wants some
    (``registry_unauthorized``, HTTP 403: the API token itself is fine). Pass
    ``username``/``password``, or log the daemon's user in (its docker config)."""

    default_code = "registry_unauthorized"


class BadImage(ZygoteError):
    """The image or snapshot pack cannot be used (``bad_image``): a digest or
    size mismatch, a damaged or hostile layer, not a pack."""

    default_code = "bad_image"


class UnsupportedPlatform(ZygoteError):
    """The image has no linux/amd64 variant (``unsupported_platform``; the
    message names the platforms it has)."""

    default_code = "unsupported_platform"


class ImageTooLarge(ZygoteError):
    """The image is over one of the daemon's size limits (``image_too_large``)."""

    default_code = "image_too_large"


class RegistryError(ServerError):
    """The registry failed or could not be reached (``registry_error``, 502)."""

    default_code = "registry_error"


class CommandTimeout(ZygoteError):
    """The command ran past its timeout and was killed. ``result`` holds
    what it printed until then."""

    default_code = "command_timeout"

    def __init__(self, message: str, *, result: "CommandResult") -> None:
        super().__init__(message)
        self.result = result


class CommandFailed(ZygoteError):
    """``run(..., check=True)`` and the command exited non-zero (or by a
    signal). ``result`` holds its output and exit status."""

    default_code = "command_failed"

    def __init__(self, message: str, *, result: "CommandResult") -> None:
        super().__init__(message)
        self.result = result


class BranchIncomplete(ZygoteError, Generic[_S]):
    """``branch(n)`` brought up only some of the ``n`` children. ``children``
    are the ones that run (handles like those ``branch`` returns: use or kill
    them), ``failures`` the :class:`~zygote.models.BranchFailure` of each one
    that did not (the daemon left nothing of those), ``parent`` the branched
    sandbox's id. ``branch(n, allow_partial=True)`` returns the running
    children instead of raising this."""

    default_code = "branch_incomplete"

    def __init__(
        self,
        message: str,
        *,
        parent: str,
        children: "list[_S]",
        failures: "list[BranchFailure]",
    ) -> None:
        super().__init__(message)
        self.parent = parent
        self.children = children
        self.failures = failures


class MergeConflictError(ZygoteError):
    """``merge()`` stopped because both sandboxes changed the same paths
    differently since their common branch point (``on_conflict="fail"``):
    nothing was changed. ``report`` is the daemon's
    :class:`~zygote.models.MergeReport` (what the merge would have changed,
    and why it did not), ``conflicts`` its conflicts. Merge again with
    ``on_conflict="theirs"`` or ``"ours"`` to settle them, or first make the
    two sides agree."""

    default_code = "merge_conflict"

    def __init__(self, message: str, *, report: "MergeReport") -> None:
        super().__init__(message)
        self.report = report

    @property
    def conflicts(self) -> "tuple[MergeConflict, ...]":
        return self.report.conflicts


# Stable API codes -> classes. `not_found` is resolved by `error_for` from
# what the request was about, since the daemon uses one code for every kind
# of missing object.
_BY_CODE: dict[str, type[ZygoteError]] = {
    "unauthorized": Unauthorized,
    "malformed_body": InvalidArgument,
    "invalid_argument": InvalidArgument,
    "guest_bad_request": InvalidArgument,
    "route_not_found": NotFoundError,
    "method_not_allowed": InvalidArgument,
    "guest_not_found": FileNotFound,
    "sandbox_not_running": SandboxNotRunning,
    "sandbox_busy": SandboxBusy,
    "sandbox_paused": SandboxPaused,
    "wrong_state": WrongState,
    "snapshot_in_use": SnapshotInUse,
    "process_exited": ProcessExited,
    "guest_busy": ConflictError,
    "conflict": ConflictError,
    "guest_already_exists": ConflictError,
    "guest_permission_denied": PermissionDenied,
    "payload_too_large": PayloadTooLarge,
    "guest_response_too_large": PayloadTooLarge,
    "unsupported": Unsupported,
    "guest_spawn_failed": SpawnFailed,
    "image_not_found": ImageNotFound,
    "registry_unauthorized": RegistryUnauthorized,
    "bad_image": BadImage,
    "unsupported_platform": UnsupportedPlatform,
    "image_too_large": ImageTooLarge,
    "registry_error": RegistryError,
    # The code interpreter (run_code and its contexts).
    "code_context_not_found": NotFoundError,
    "no_code_interpreter": Unsupported,
    "code_envs_unsupported": Unsupported,
    "code_context_limit": ConflictError,
}

_SERVER_CODES = frozenset(
    {
        "internal",
        "runtime_error",
        "image_error",
        "agent_unreachable",
        "guest_error",
        "code_server_error",
        "code_server_malformed",
    }
)


def error_for(code: str, message: str, status: Optional[int] = None) -> ZygoteError:
    """The exception for an API error ``code``.

    The daemon words a missing object as ``<kind> "<id>" not found``; the kind
    picks :class:`SandboxNotFound` or :class:`SnapshotNotFound` (other
    missing things, e.g. images, stay :class:`NotFoundError`).
    """
    cls: type[ZygoteError]
    if code == "not_found":
        if message.startswith("sandbox "):
            cls = SandboxNotFound
        elif message.startswith("snapshot "):
            cls = SnapshotNotFound
        elif message.startswith("process "):
            cls = ProcessNotFound
        else:
            cls = NotFoundError
    elif code in _BY_CODE:
        cls = _BY_CODE[code]
    elif code in _SERVER_CODES or (status is not None and status >= 500):
        cls = ServerError
    else:
        cls = ZygoteError
    return cls(message, code=code, status=status)
