"""The MCP server's code interpreter tool, ``run_code`` (issue 37): Python in a
sandbox of image ``code-interpreter``, its state kept between calls (and carried into
branch children)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Dict, Optional

from mcp.server.mcpserver.exceptions import ToolError

from ._code import Execution, Result
from .errors import ZygoteError

if TYPE_CHECKING:
    from mcp.server import MCPServer

    from .aio import AsyncSandbox

# Images a result may carry, passed on as base64 for the host to show.
_IMAGE_TYPES = ("image/png", "image/jpeg", "image/svg+xml")


def _result(r: Result) -> dict[str, Any]:
    out: dict[str, Any] = {"main": r.is_main_result, "formats": r.formats(), "text": r.text}
    images = [{"mime": m, "data": r.data[m]} for m in _IMAGE_TYPES if m in r.data]
    if images:
        out["images"] = images
    return out


def execution_json(ex: Execution) -> dict[str, Any]:
    return {
        "stdout": "".join(ex.logs.stdout),
        "stderr": "".join(ex.logs.stderr),
        "results": [_result(r) for r in ex.results],
        "error": None
        if ex.error is None
        else {"name": ex.error.name, "value": ex.error.value, "traceback": ex.error.traceback},
        "execution_count": ex.execution_count,
    }


def register(server: "MCPServer[Any]", sandbox: "Any") -> None:
    """Adds ``run_code``; ``sandbox(id)`` gives the :class:`AsyncSandbox` for an id."""

    @server.tool()
    async def run_code(
        sandbox_id: str,
        code: str,
        context: Optional[str] = None,
        timeout_seconds: Optional[float] = None,
        envs: Optional[Dict[str, str]] = None,
    ) -> dict[str, Any]:
        """Run Python in a sandbox created from image code-interpreter (numpy, pandas,
        matplotlib): a Jupyter kernel whose variables, imports and figures stay between
        calls, and that branch_sandbox copies into every child with its data loaded.
        Returns stdout, stderr, results (the last expression's value as text, displayed
        figures as base64 images), error (name, value, traceback) and execution_count.
        timeout_seconds (default 300) interrupts it, keeping the state; context names a
        context other than the default one; envs are environment variables for this
        execution only (as they were again after it)."""
        sb: AsyncSandbox = sandbox(sandbox_id)
        try:
            ex = await sb.run_code(code, context=context, timeout=timeout_seconds, envs=envs)
        except ZygoteError as e:
            raise ToolError(f"{e.message} [{e.code}]") from e
        return execution_json(ex)
