/**
 * Interactive terminals: `sandbox.pty.create({cols, rows, onData})`.
 *
 * The daemon's `GET /v1/sandboxes/{id}/pty` is a WebSocket: binary messages
 * carry the terminal's bytes both ways, text messages JSON control (`resize`
 * from us; `error` and, when the program ends, `exit` from the daemon).
 * Closing the socket (`kill()`) makes the daemon kill the program.
 */
import WebSocket from "ws";

import type { Config } from "./config.js";
import { ConnectionFailed, ZygoteError, errorFor } from "./errors.js";

/** The WebSocket subprotocol the daemon selects. */
export const PTY_PROTOCOL = "zygote.pty.v1";

/** How the terminal's program ended: exactly one of the two is set. */
export interface PtyExit {
  exitCode: number | null;
  signal: number | null;
}

export interface PtyCreateOptions {
  /** Terminal size, each 1..1000. */
  cols: number;
  rows: number;
  /** Terminal output, as it arrives. */
  onData: (data: Uint8Array) => void;
  /** Program and arguments; default the guest user's login shell. */
  cmd?: readonly string[];
  env?: Readonly<Record<string, string>>;
  cwd?: string;
}

/** The route's query string (`cmd` and `env` repeat). */
export function ptyQuery(opts: Omit<PtyCreateOptions, "onData">): string {
  const q = new URLSearchParams();
  q.append("cols", String(opts.cols));
  q.append("rows", String(opts.rows));
  for (const c of opts.cmd ?? []) q.append("cmd", c);
  for (const [k, v] of Object.entries(opts.env ?? {})) q.append("env", `${k}=${v}`);
  if (opts.cwd !== undefined) q.append("cwd", opts.cwd);
  return q.toString();
}

/** A daemon text message: the exit, or a refused control message / failure. */
export function parseControl(text: string): PtyExit | ZygoteError {
  const msg = JSON.parse(text) as { type?: string; exit_code?: number | null; signal?: number | null; code?: string; message?: string };
  if (msg.type === "exit") return { exitCode: msg.exit_code ?? null, signal: msg.signal ?? null };
  return errorFor(msg.code ?? "error", msg.message ?? text);
}

/** A running terminal. */
export class PtyHandle {
  /** Control messages the daemon refused (the session went on). */
  readonly errors: ZygoteError[] = [];
  private exit: PtyExit | undefined;
  private readonly closed: Promise<void>;

  constructor(
    private readonly ws: WebSocket,
    onData: (data: Uint8Array) => void,
  ) {
    ws.on("message", (data: WebSocket.RawData, isBinary: boolean) => {
      const bytes = Buffer.isBuffer(data) ? data : Array.isArray(data) ? Buffer.concat(data) : Buffer.from(data);
      if (isBinary) return onData(new Uint8Array(bytes));
      const got = parseControl(bytes.toString("utf8"));
      if (got instanceof ZygoteError) this.errors.push(got);
      else this.exit = got;
    });
    this.closed = new Promise((resolve) => ws.once("close", () => resolve()));
  }

  /** Keystrokes (raw bytes; a string is sent as UTF-8). */
  sendInput(data: Uint8Array | string): void {
    this.ws.send(typeof data === "string" ? Buffer.from(data, "utf8") : data, { binary: true });
  }

  /** A new terminal size; a bad one lands in `errors`, nothing changes. */
  resize(cols: number, rows: number): void {
    this.ws.send(JSON.stringify({ type: "resize", cols, rows }));
  }

  /** Resolves when the program ends; rejects if the terminal closed without an exit. */
  async wait(): Promise<PtyExit> {
    await this.closed;
    if (this.exit) return this.exit;
    throw this.errors.at(-1) ?? new ZygoteError("the terminal closed before its program ended", { code: "closed" });
  }

  /** Closes the terminal: the daemon kills the program (and its session). */
  kill(): void {
    this.ws.close();
  }
}

/** Opens the pty WebSocket; errors before the upgrade reject with the API's error. */
export function openPty(config: Config, sandboxId: string, opts: PtyCreateOptions): Promise<PtyHandle> {
  const url = `${config.url.replace(/^http/, "ws")}/v1/sandboxes/${encodeURIComponent(sandboxId)}/pty?${ptyQuery(opts)}`;
  const headers: Record<string, string> = config.token ? { authorization: `Bearer ${config.token}` } : {};
  const ws = new WebSocket(url, [PTY_PROTOCOL], { headers, maxPayload: 1 << 24 });
  // Attached at once: output may follow the upgrade in the same packet.
  return new Promise((resolve, reject) => {
    const handle = new PtyHandle(ws, opts.onData);
    ws.once("open", () => resolve(handle));
    ws.once("unexpected-response", (_req, res) => {
      const chunks: Buffer[] = [];
      res.on("data", (c: Buffer) => chunks.push(c));
      res.on("end", () => {
        const status = res.statusCode ?? 0;
        try {
          const body = JSON.parse(Buffer.concat(chunks).toString("utf8")) as { error: { code: string; message: string } };
          reject(errorFor(body.error.code, body.error.message, status));
        } catch {
          reject(errorFor("error", `HTTP ${status} instead of a WebSocket`, status));
        }
        ws.terminate();
      });
    });
    ws.once("error", (e: Error) => reject(new ConnectionFailed(`cannot open a terminal at ${config.url}: ${e.message}`, { cause: e })));
  });
}

/** `sandbox.pty`: interactive terminals in the sandbox. */
export class Pty {
  constructor(private readonly sb: { readonly id: string; readonly client: { readonly config: Config } }) {}

  /** Starts `cmd` (default the guest user's login shell) on a terminal of `cols` x `rows`. */
  create(opts: PtyCreateOptions): Promise<PtyHandle> {
    return openPty(this.sb.client.config, this.sb.id, opts);
  }
}
