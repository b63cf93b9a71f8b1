"""``run_code`` and code contexts on :class:`~zygote.Sandbox` and
:class:`~zygote.AsyncSandbox` (a sandbox of image ``code-interpreter``)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, List, Mapping, Optional, Union

from . import _code
from ._code import CodeContext, Execution, ExecutionError, Result

if TYPE_CHECKING:
    from ._client import AsyncClient, Client


class CodeInterpreter:
    """Stateful Python: variables, imports and figures stay between calls, and a
    branch's children each continue from the parent's."""

    id: str
    client: "Client"

    def run_code(
        self,
        code: str,
        *,
        context: Optional[Union[str, CodeContext]] = None,
        timeout: Optional[float] = None,
        envs: Optional[Mapping[str, str]] = None,
        on_stdout: Optional[Callable[[str], None]] = None,
        on_stderr: Optional[Callable[[str], None]] = None,
        on_result: Optional[Callable[[Result], None]] = None,
        on_error: Optional[Callable[[ExecutionError], None]] = None,
    ) -> Execution:
        """Runs ``code`` in ``context`` (``default`` when absent); ``timeout`` seconds
        (default 300) interrupt it, keeping the context's state. ``envs`` are
        environment variables for this execution only: set in the kernel before the
        code runs, and as they were again after (also when it raised or timed out).
        Output and results
        reach the callbacks as they happen; the :class:`~zygote.Execution` holds them
        all, and ``.error`` what the code raised."""
        return self.client.run_code(
            self.id,
            code,
            context=context,
            timeout=timeout,
            envs=envs,
            on_stdout=on_stdout,
            on_stderr=on_stderr,
            on_result=on_result,
            on_error=on_error,
        )

    def create_code_context(self, cwd: Optional[str] = None) -> CodeContext:
        """A new context: a kernel of its own, started before this returns."""
        return self.client.call(_code.create_context(self.id, cwd))

    def list_code_contexts(self) -> List[CodeContext]:
        return self.client.call(_code.list_contexts(self.id))

    def restart_code_context(self, context: Union[str, CodeContext] = "default") -> None:
        """A fresh kernel for ``context`` (its state is lost): also how one whose kernel
        died (``KernelDied``) comes back."""
        self.client.call(_code.restart_context(self.id, context))

    def remove_code_context(self, context: Union[str, CodeContext]) -> None:
        self.client.call(_code.remove_context(self.id, context))


class AsyncCodeInterpreter:
    """As :class:`CodeInterpreter`, for :class:`~zygote.AsyncSandbox`."""

    id: str
    client: "AsyncClient"

    async def run_code(self, code: str, **kwargs: Any) -> Execution:
        """As :meth:`CodeInterpreter.run_code`; callbacks may be coroutine functions."""
        return await self.client.run_code(self.id, code, **kwargs)

    async def create_code_context(self, cwd: Optional[str] = None) -> CodeContext:
        return await self.client.call(_code.create_context(self.id, cwd))

    async def list_code_contexts(self) -> List[CodeContext]:
        return await self.client.call(_code.list_contexts(self.id))

    async def restart_code_context(self, context: Union[str, CodeContext] = "default") -> None:
        await self.client.call(_code.restart_context(self.id, context))

    async def remove_code_context(self, context: Union[str, CodeContext]) -> None:
        await self.client.call(_code.remove_context(self.id, context))
