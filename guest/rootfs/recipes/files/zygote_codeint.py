"""zygote_codeint: the code interpreter's in-guest server (image `code-interpreter`).

Contexts are Jupyter kernels (ipykernel, driven through jupyter_client, one kernel per
context) that live as long as the sandbox: variables, imports and open figures stay
between executions, and survive pause/resume, snapshots and branches because the kernel
and this server are ordinary guest processes copied with the VM.

The daemon reaches the server through its agent, never through the network: each
request runs ``zygote-codeint`` (a shell relay that starts this server once, then joins
its stdin/stdout to the Unix socket ``/run/zygote/codeint/server.sock``). A request is
one JSON line; the answer is JSON lines, the connection's end closes it:

    {"op": "execute", "code": "...", "context": "default", "timeout_ms": 60000,
     "envs": {"NAME": "value"}}   (envs optional)
      -> {"type": "started"}   (the context exists and its kernel runs; with
                                 "envs": true when the request had envs)
         {"type": "stdout"|"stderr", "text": "..."}*
         {"type": "result", "main": bool, "data": {"text/plain": "...", "image/png": "<b64>"}}*
         {"type": "error", "name": "...", "value": "...", "traceback": ["..."]}?
         {"type": "done", "execution_count": N}
    {"op": "list"}                      -> {"type": "contexts", "contexts": [{id, language, cwd}]}
    {"op": "create", "cwd": "/root"}    -> {"type": "context", "id", "language", "cwd"}
    {"op": "restart"|"delete", "context": "ID"} -> {"type": "ok"}
    any failure                         -> {"type": "failure", "code": "...", "message": "..."}

An execution is interrupted (SIGINT to the kernel, as Jupyter's interrupt does) when its
``timeout_ms`` passes or the connection closes (the daemon kills the relay when its
client goes away); a kernel that does not become idle within ``INTERRUPT_GRACE`` is
restarted. A kernel that dies (``os._exit``, out of memory) is reported as an error and
stays dead until the context is restarted, so that nothing runs on silently lost state.

An execution's ``envs`` are set in the kernel's ``os.environ`` (so also for the
subprocesses it starts) just before its code runs, and what those names held before is
put back (a name that did not exist is removed) once it is over: after an error, a
timeout or a disconnect too. Both steps are silent (no execution counted, nothing left
in the user's namespace). A kernel that died or was restarted meanwhile has nothing to
restore.

After a branch or restore (a new ``/run/zygote/generation``), each kernel reseeds
``random`` and numpy before its next execution (``zygote_guest.check()``), so children
draw different numbers.
"""

from __future__ import annotations

import ast
import json
import os
import queue
import secrets
import select
import socket
import sys
import threading
import time
from typing import Dict, Optional

SOCKET_DIR = "/run/zygote/codeint"
SOCKET_PATH = SOCKET_DIR + "/server.sock"
GENERATION_FILE = "/run/zygote/generation"
DEFAULT_CONTEXT = "default"
MAX_CONTEXTS = 16
MAX_REQUEST_BYTES = 4 << 20
KERNEL_READY_SECONDS = 300
INTERRUPT_GRACE = 10.0
POLL = 0.1
# The mime types passed on; the daemon checks them again and drops the rest.
MIME_TYPES = (
    "text/plain",
    "text/html",
    "text/markdown",
    "text/latex",
    "image/png",
    "image/jpeg",
    "image/svg+xml",
    "application/json",
    "application/javascript",
    "application/pdf",
)
# Silent setup run in each kernel before an execution after a fork (and at start).
RESEED = "import zygote_guest as __zygote_guest\n__zygote_guest.check()\n"
# A user expression (evaluated silently in the kernel, leaving no name behind) that sets
# the environment variables of a JSON object (null: remove the name) and gives back, as
# JSON, what those names held before. The object travels as a Python string literal
# (%r of json.dumps), so no value can become code.
SWAP_ENV = (
    "(lambda os, json, new: (json.dumps({k: os.environ.get(k) for k in new}), "
    "[os.environ.pop(k, None) if v is None else os.environ.__setitem__(k, v) "
    "for k, v in new.items()])[0])(__import__('os'), __import__('json'), "
    "__import__('json').loads(%r))"
)


def generation() -> int:
    try:
        with open(GENERATION_FILE, encoding="ascii") as f:
            return int(f.read().strip() or 0)
    except (OSError, ValueError):
        return 0


class Failure(Exception):
    def __init__(self, code: str, message: str):
        super().__init__(message)
        self.code = code
        self.message = message


class Context:
    """One kernel and its client; ``lock`` serializes executions on it."""

    def __init__(self, ident: str, cwd: str):
        self.id = ident
        self.cwd = cwd
        self.language = "python"
        self.lock = threading.Lock()
        self.km = None
        self.kc = None
        self.dead = False
        self.generation = -1
        # Bumped by every (re)start: what an execution set in one kernel is not
        # restored into another.
        self.epoch = 0

    def describe(self) -> dict:
        return {"id": self.id, "language": self.language, "cwd": self.cwd}

    def start(self) -> None:
        from jupyter_client.manager import KernelManager

        env = dict(os.environ)
        env["MPLBACKEND"] = "module://matplotlib_inline.backend_inline"
        env.setdefault("HOME", "/root")
        self.km = KernelManager(kernel_name="python3")
        self.km.start_kernel(cwd=self.cwd, env=env)
        self._connect()

    def _connect(self) -> None:
        if self.kc is not None:
            self.kc.stop_channels()
        self.kc = self.km.client()
        self.kc.start_channels()
        self.kc.wait_for_ready(timeout=KERNEL_READY_SECONDS)
        self.dead = False
        self.generation = -1
        self.epoch += 1

    def restart(self) -> None:
        if self.km is None:
            self.start()
            return
        self.km.restart_kernel(now=True)
        self._connect()

    def shutdown(self) -> None:
        if self.kc is not None:
            self.kc.stop_channels()
        if self.km is not None:
            try:
                self.km.shutdown_kernel(now=True)
            except Exception:  # already gone
                pass

    def alive(self) -> bool:
        return self.km is not None and self.km.is_alive()


class Server:
    def __init__(self):
        self.contexts: Dict[str, Context] = {}
        self.lock = threading.Lock()

    # ---- contexts -------------------------------------------------------------------

    def context(self, ident: Optional[str]) -> Context:
        ident = ident or DEFAULT_CONTEXT
        with self.lock:
            ctx = self.contexts.get(ident)
            if ctx is None and ident == DEFAULT_CONTEXT:
                ctx = Context(DEFAULT_CONTEXT, default_cwd())
                self.contexts[ident] = ctx
        if ctx is None:
            raise Failure("unknown_context", f"no context {ident!r}")
        return ctx

    def create(self, cwd: Optional[str]) -> Context:
        cwd = cwd or default_cwd()
        if not os.path.isdir(cwd):
            raise Failure("bad_request", f"cwd {cwd!r} is not a directory in the sandbox")
        with self.lock:
            if len(self.contexts) >= MAX_CONTEXTS:
                raise Failure(
                    "limit_reached",
                    f"a sandbox has at most {MAX_CONTEXTS} contexts: remove one first",
                )
            ctx = Context(secrets.token_hex(8), cwd)
            self.contexts[ctx.id] = ctx
        with ctx.lock:
            try:
                ctx.start()
            except Exception as e:
                with self.lock:
                    self.contexts.pop(ctx.id, None)
                raise Failure("kernel_failed", f"the kernel did not start: {e}")
        return ctx

    def delete(self, ident: str) -> None:
        ctx = self.context(ident)
        with self.lock:
            self.contexts.pop(ctx.id, None)
        ctx.shutdown()

    def restart(self, ident: str) -> None:
        ctx = self.context(ident)
        if not ctx.lock.acquire(timeout=INTERRUPT_GRACE):
            # An execution holds it: its kernel is killed, which ends it.
            if ctx.km is not None:
                ctx.km.interrupt_kernel()
            ctx.lock.acquire()
        try:
            ctx.restart()
        except Exception as e:
            raise Failure("kernel_failed", f"the kernel did not restart: {e}")
        finally:
            ctx.lock.release()

    # ---- execution ------------------------------------------------------------------

    def execute(self, conn: socket.socket, send, req: dict) -> None:
        code = req.get("code")
        if not isinstance(code, str) or not code.strip():
            raise Failure("bad_request", "code must be a non-empty string")
        envs = req.get("envs") or {}
        if not isinstance(envs, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in envs.items()
        ):
            raise Failure("bad_request", "envs must map names to strings")
        timeout_ms = req.get("timeout_ms")
        deadline = None
        if isinstance(timeout_ms, int) and timeout_ms > 0:
            deadline = time.monotonic() + timeout_ms / 1000.0
        ctx = self.context(req.get("context"))
        with ctx.lock:
            if ctx.km is None:
                try:
                    ctx.start()
                except Exception as e:
                    ctx.km = None
                    raise Failure("kernel_failed", f"the kernel did not start: {e}")
            # "envs": this server applies them (the daemon stops an older one's execution).
            send({"type": "started", "envs": True} if envs else {"type": "started"})
            if ctx.dead or not ctx.alive():
                ctx.dead = True
                send(dead_kernel_error())
                send({"type": "done", "execution_count": 0})
                return
            gen = generation()
            if gen != ctx.generation:
                run_silently(ctx, RESEED)
                ctx.generation = gen
            saved = None
            if envs:
                saved = swap_env(ctx, envs)
                if saved is None:
                    send(env_error())
                    send({"type": "done", "execution_count": 0})
                    return
            epoch = ctx.epoch
            try:
                Execution(ctx, conn, send, deadline).run(code)
            finally:
                if saved is not None and ctx.epoch == epoch and not ctx.dead and ctx.alive():
                    swap_env(ctx, saved)


def error_line(name: str, value: str) -> dict:
    """An error of the server's own (no traceback)."""
    return {"type": "error", "name": name, "value": value, "traceback": []}


def dead_kernel_error() -> dict:
    return error_line(
        "KernelDied",
        "the context's kernel exited (os._exit, a crash or out of memory); "
        "its state is lost: restart the context",
    )


def env_error() -> dict:
    return error_line(
        "EnvError", "the execution's envs could not be set in the kernel: the code did not run"
    )


def swap_env(ctx: Context, values: dict) -> Optional[dict]:
    """Sets ``values`` (None: remove) in the kernel's environment; what those names held
    before, or None if the kernel did not say."""
    expr = SWAP_ENV % json.dumps(values)
    reply = run_silently(ctx, "pass", {"before": expr})
    try:
        got = reply["user_expressions"]["before"]
        before = json.loads(ast.literal_eval(got["data"]["text/plain"]))
    except (TypeError, KeyError, ValueError, SyntaxError):
        return None
    return before if isinstance(before, dict) else None


def run_silently(ctx: Context, code: str, user_expressions: Optional[dict] = None) -> Optional[dict]:
    """Runs ``code`` without counting an execution or showing output; the reply, if
    the kernel gave one."""
    msg_id = ctx.kc.execute(
        code,
        silent=True,
        store_history=False,
        user_expressions=user_expressions or {},
        stop_on_error=False,
    )
    end = time.monotonic() + 60
    while time.monotonic() < end:
        try:
            msg = ctx.kc.get_iopub_msg(timeout=POLL)
        except queue.Empty:
            if not ctx.alive():
                return None
            continue
        if (
            msg.get("parent_header", {}).get("msg_id") == msg_id
            and msg["msg_type"] == "status"
            and msg["content"].get("execution_state") == "idle"
        ):
            break
    return drain_reply(ctx, msg_id, 5)


def drain_reply(ctx: Context, msg_id: str, seconds: float) -> Optional[dict]:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        try:
            msg = ctx.kc.get_shell_msg(timeout=POLL)
        except queue.Empty:
            continue
        if msg.get("parent_header", {}).get("msg_id") == msg_id:
            return msg["content"]
    return None


class Execution:
    """One execute_request: relays its iopub messages until the kernel is idle."""

    def __init__(self, ctx: Context, conn: socket.socket, send, deadline):
        self.ctx = ctx
        self.conn = conn
        self._send = send
        self.deadline = deadline
        self.interrupted_at = None
        self.why = None
        self.count = None
        self.errored = False

    def send(self, obj: dict) -> None:
        """Sends a line; a client gone while its execution runs interrupts it (the
        execution still ends as usual: its envs are restored after)."""
        if self.why == "disconnect":
            return
        try:
            self._send(obj)
        except OSError:
            if self.interrupted_at is None:
                self.interrupt("disconnect")
            self.why = "disconnect"

    def client_gone(self) -> bool:
        r, _, _ = select.select([self.conn], [], [], 0)
        if not r:
            return False
        try:
            return self.conn.recv(1, socket.MSG_PEEK) == b""
        except OSError:
            return True

    def run(self, code: str) -> None:
        kc = self.ctx.kc
        # stop_on_error=False: after a failed (or interrupted) execution ipykernel would
        # otherwise abort requests arriving in the next moments, the next caller's too.
        msg_id = kc.execute(code, store_history=True, allow_stdin=False, stop_on_error=False)
        while True:
            try:
                msg = kc.get_iopub_msg(timeout=POLL)
            except queue.Empty:
                if not self.ctx.alive():
                    self.ctx.dead = True
                    self.send(dead_kernel_error())
                    self.send({"type": "done", "execution_count": self.count or 0})
                    return
                self.check_limits()
                continue
            if msg.get("parent_header", {}).get("msg_id") != msg_id:
                continue
            if self.relay(msg):
                break
            self.check_limits()
        reply = drain_reply(self.ctx, msg_id, 5)
        if reply is not None and isinstance(reply.get("execution_count"), int):
            self.count = reply["execution_count"]
        if reply is not None and reply.get("status") == "aborted" and not self.errored:
            self.errored = True
            self.send(
                error_line("ExecutionAborted", "the kernel aborted the execution without running it")
            )
        if self.why == "timeout" and not self.errored:
            self.send(timeout_error())
        self.send({"type": "done", "execution_count": self.count or 0})

    def check_limits(self) -> None:
        now = time.monotonic()
        if self.interrupted_at is None:
            if self.deadline is not None and now >= self.deadline:
                self.interrupt("timeout")
            elif self.client_gone():
                self.interrupt("disconnect")
        elif now - self.interrupted_at > INTERRUPT_GRACE:
            # SIGINT did not stop it (a C loop ignoring signals): restart the kernel.
            # The answer still ends with `done`, as every execution's does: a stream
            # without one is a broken server to the daemon.
            try:
                self.ctx.restart()
                what = "the context's kernel was restarted and its state is lost"
            except Exception as e:  # the kernel is gone either way
                self.ctx.dead = True
                what = f"the context's kernel could not be restarted ({e}): restart the context"
            self.send(
                error_line(
                    "TimeoutError",
                    f"the execution did not stop when interrupted: {what}",
                )
            )
            self.send({"type": "done", "execution_count": self.count or 0})
            raise Stop()

    def interrupt(self, why: str) -> None:
        self.why = why
        self.interrupted_at = time.monotonic()
        self.ctx.km.interrupt_kernel()

    def relay(self, msg: dict) -> bool:
        kind = msg["msg_type"]
        content = msg["content"]
        if kind == "stream":
            name = "stderr" if content.get("name") == "stderr" else "stdout"
            self.send({"type": name, "text": str(content.get("text", ""))})
        elif kind in ("execute_result", "display_data"):
            data = {k: v for k, v in content.get("data", {}).items() if k in MIME_TYPES}
            if data:
                self.send(
                    {"type": "result", "main": kind == "execute_result", "data": data}
                )
        elif kind == "error":
            self.errored = True
            name = str(content.get("ename", "Error"))
            value = str(content.get("evalue", ""))
            if self.why == "timeout" and name == "KeyboardInterrupt":
                err = timeout_error()
            else:
                err = {
                    "type": "error",
                    "name": name,
                    "value": value,
                    "traceback": [str(t) for t in content.get("traceback", [])],
                }
            self.send(err)
        elif kind == "execute_input":
            count = content.get("execution_count")
            if isinstance(count, int):
                self.count = count
        elif kind == "status" and content.get("execution_state") == "idle":
            return True
        return False


class Stop(Exception):
    """The execution ended early (already reported)."""


def timeout_error() -> dict:
    return error_line("TimeoutError", "the execution was interrupted: it ran past its timeout")


def default_cwd() -> str:
    for d in ("/home/user", "/root"):
        if os.path.isdir(d):
            return d
    return "/"


def serve_connection(server: Server, conn: socket.socket) -> None:
    wlock = threading.Lock()

    def send(obj: dict) -> None:
        line = (json.dumps(obj, separators=(",", ":")) + "\n").encode()
        with wlock:
            conn.sendall(line)

    try:
        buf = b""
        while b"\n" not in buf:
            chunk = conn.recv(65536)
            if not chunk:
                break
            buf += chunk
            if len(buf) > MAX_REQUEST_BYTES:
                raise Failure("bad_request", "request line too long")
        try:
            req = json.loads(buf.split(b"\n", 1)[0])
            if not isinstance(req, dict):
                raise ValueError("not an object")
        except ValueError as e:
            raise Failure("bad_request", f"the request is not a JSON object: {e}")
        op = req.get("op")
        if op == "execute":
            server.execute(conn, send, req)
        elif op == "list":
            with server.lock:
                ctxs = [c.describe() for c in server.contexts.values()]
            if not any(c["id"] == DEFAULT_CONTEXT for c in ctxs):
                ctxs.insert(0, server.context(DEFAULT_CONTEXT).describe())
            send({"type": "contexts", "contexts": ctxs})
        elif op == "create":
            cwd = req.get("cwd")
            if cwd is not None and not isinstance(cwd, str):
                raise Failure("bad_request", "cwd must be a string")
            send(dict(server.create(cwd).describe(), type="context"))
        elif op in ("restart", "delete"):
            ident = req.get("context")
            if not isinstance(ident, str):
                raise Failure("bad_request", "context must be a string")
            (server.restart if op == "restart" else server.delete)(ident)
            send({"type": "ok"})
        else:
            raise Failure("bad_request", f"unknown op {op!r}")
    except Failure as f:
        try:
            send({"type": "failure", "code": f.code, "message": f.message})
        except OSError:
            pass
    except (Stop, OSError):
        pass
    except Exception as e:  # report, keep serving others
        try:
            send({"type": "failure", "code": "internal", "message": repr(e)})
        except OSError:
            pass
    finally:
        conn.close()


def serve() -> None:
    os.makedirs(SOCKET_DIR, mode=0o700, exist_ok=True)
    try:
        os.unlink(SOCKET_PATH)
    except FileNotFoundError:
        pass
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(SOCKET_PATH + ".tmp")
    os.chmod(SOCKET_PATH + ".tmp", 0o600)
    listener.listen(64)
    # Appears only once it accepts, so the relay's wait ends on a working socket.
    os.rename(SOCKET_PATH + ".tmp", SOCKET_PATH)
    server = Server()
    while True:
        conn, _ = listener.accept()
        threading.Thread(
            target=serve_connection, args=(server, conn), daemon=True
        ).start()


if __name__ == "__main__":
    if sys.argv[1:] != ["serve"]:
        sys.exit("usage: python3 -m zygote_codeint serve")
    serve()
