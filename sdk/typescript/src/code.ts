/**
 * The code interpreter (image `code-interpreter`): `POST /v1/sandboxes/{id}/code` runs
 * Python in a context's Jupyter kernel and streams NDJSON events (stdout/stderr chunks,
 * results as mime bundles, then an error and/or `done`); {@link runCode} turns them into
 * callbacks and an {@link Execution}. Contexts are independent kernels.
 */
import { type Client, seg } from "./client.js";
import { ServerError, errorFor } from "./errors.js";

/** A value: the cell's last expression (`isMainResult`) or something displayed. */
export class Result {
  constructor(
    /** Mime type -> value (base64 for images; PNG and JPEG checked by the daemon). */
    readonly data: Record<string, unknown>,
    readonly isMainResult: boolean,
  ) {}
  get text(): string | undefined {
    return this.data["text/plain"] as string | undefined;
  }
  get html(): string | undefined {
    return this.data["text/html"] as string | undefined;
  }
  get png(): string | undefined {
    return this.data["image/png"] as string | undefined;
  }
  formats(): string[] {
    return Object.keys(this.data).sort();
  }
}

/** What the code raised, `TimeoutError` (past its timeout) or `KernelDied`. */
export interface ExecutionError {
  name: string;
  value: string;
  traceback: string[];
}

export class Execution {
  results: Result[] = [];
  logs: { stdout: string[]; stderr: string[] } = { stdout: [], stderr: [] };
  error?: ExecutionError;
  executionCount?: number;
  /** `text/plain` of the main result. */
  get text(): string | undefined {
    return this.results.find((r) => r.isMainResult)?.text;
  }
}

export interface CodeContext {
  id: string;
  language: string;
  cwd: string;
}

type Maybe<T> = (arg: T) => unknown;

export interface RunCodeOptions {
  /** Context id or object (`default` when absent). */
  context?: string | CodeContext;
  /** Interrupts the execution after this long (default 300 s); the state stays. */
  timeoutMs?: number;
  /** Environment variables for this execution only: set in the kernel before the code
   * runs, and as they were again after (also when it raised or timed out). */
  envs?: Record<string, string>;
  onStdout?: Maybe<string>;
  onStderr?: Maybe<string>;
  onResult?: Maybe<Result>;
  onError?: Maybe<ExecutionError>;
}

const ctxId = (c: string | CodeContext): string => (typeof c === "string" ? c : c.id);
const contexts = (id: string): string => `/v1/sandboxes/${seg(id)}/code/contexts`;

export async function runCode(client: Client, id: string, code: string, opts: RunCodeOptions = {}): Promise<Execution> {
  const body: Record<string, unknown> = { code, language: "python" };
  if (opts.context !== undefined) body.context = ctxId(opts.context);
  if (opts.timeoutMs !== undefined) body.timeout_ms = opts.timeoutMs;
  if (opts.envs !== undefined && Object.keys(opts.envs).length > 0) body.envs = { ...opts.envs };
  const ex = new Execution();
  let done = false;
  let failure: Error | undefined;
  // The daemon interrupts at the timeout; the first call of a context also starts its kernel.
  const httpTimeout = (opts.timeoutMs ?? 300_000) + 360_000;
  await client.streamLines("POST", `/v1/sandboxes/${seg(id)}/code`, { json: body }, httpTimeout, async (line) => {
    if (!line.trim()) return;
    let ev: Record<string, unknown>;
    try {
      ev = JSON.parse(line) as Record<string, unknown>;
    } catch {
      throw new ServerError(`bad code event ${line.slice(0, 200)}`, { code: "bad_response" });
    }
    switch (ev.type) {
      case "stdout":
      case "stderr": {
        const text = String(ev.text ?? "");
        ex.logs[ev.type].push(text);
        await (ev.type === "stdout" ? opts.onStdout : opts.onStderr)?.(text);
        break;
      }
      case "result": {
        const r = new Result((ev.data ?? {}) as Record<string, unknown>, Boolean(ev.main));
        ex.results.push(r);
        await opts.onResult?.(r);
        break;
      }
      case "error": {
        ex.error = {
          name: String(ev.name ?? ""),
          value: String(ev.value ?? ""),
          traceback: Array.isArray(ev.traceback) ? ev.traceback.map(String) : [],
        };
        await opts.onError?.(ex.error);
        break;
      }
      case "done":
        ex.executionCount = Number(ev.execution_count ?? 0);
        done = true;
        break;
      case "failure":
        failure = errorFor(String(ev.code ?? "error"), String(ev.message ?? ""));
        break;
    }
    return true;
  });
  if (failure) throw failure;
  if (!done) throw new ServerError("the code stream ended without a done event", { code: "stream_ended" });
  return ex;
}

export async function createCodeContext(client: Client, id: string, cwd?: string): Promise<CodeContext> {
  const body: Record<string, unknown> = { language: "python" };
  if (cwd !== undefined) body.cwd = cwd;
  return client.json<CodeContext>("POST", contexts(id), { json: body });
}

export async function listCodeContexts(client: Client, id: string): Promise<CodeContext[]> {
  return (await client.json<{ contexts: CodeContext[] }>("GET", contexts(id))).contexts;
}

export async function restartCodeContext(client: Client, id: string, ctx: string | CodeContext): Promise<void> {
  await client.request("POST", `${contexts(id)}/${seg(ctxId(ctx))}/restart`);
}

export async function removeCodeContext(client: Client, id: string, ctx: string | CodeContext): Promise<void> {
  await client.request("DELETE", `${contexts(id)}/${seg(ctxId(ctx))}`);
}
