/**
 * Background processes: `sb.commands.run(cmd, { background: true })`.
 *
 * The daemon starts the program and answers at once (202, the process); it
 * runs on in the guest with its stdin open and its output kept there (the
 * last 1 MiB). A {@link CommandHandle} follows it by pid: its output from an
 * offset (`GET .../processes/{pid}/output`, JSON, or NDJSON with
 * `follow=true`), stdin and signals. The guest keeps the processes, so
 * another handle ({@link ProcessCommands.connect}, or in a branch child, where
 * each runs on as the child's own copy under the same pid) picks one up later.
 */
import {
  Client,
  type Command,
  ExecCollector,
  type OutputCallback,
  type RunOptions,
  execBody,
  seg,
} from "./client.js";
import { CommandFailed, CommandTimeout, FileNotFound, ProcessExited, ProcessNotFound, RequestTimeout } from "./errors.js";
import {
  type CommandResult,
  type ProcessInfo,
  type ProcessOutput,
  processFromJson,
  processOutputFromJson,
} from "./models.js";

/** A signal by name (`"SIGTERM"`, `"TERM"`, `"interrupt"`...) or number. */
export type Signal = string | number;

/** `run` options with `background: true`: it resolves to a {@link CommandHandle} once the program runs. */
export interface BackgroundRunOptions extends RunOptions {
  /**
   * Start the program and return a handle at once. `timeoutMs` still bounds
   * its whole run (default 60 s; `null` for a server); its stdin stays open
   * (`stdin` is written first); `check` applies to {@link CommandHandle.wait}.
   */
  background: true;
}

export interface ConnectOptions {
  onStdout?: OutputCallback;
  onStderr?: OutputCallback;
  /** {@link CommandHandle.wait} throws {@link CommandFailed} when the exit code is not 0. */
  check?: boolean;
}

export interface WaitOptions {
  /**
   * Stop waiting after this long and throw {@link RequestTimeout} (code
   * `wait_timeout`); the program runs on. Default: until it ends.
   */
  timeoutMs?: number | null;
}

interface SandboxRef {
  readonly id: string;
  readonly client: Client;
}

/** The longest wait for new output in one read (the daemon's `wait_ms` limit). */
export const MAX_OUTPUT_WAIT_MS = 30_000;

const processPath = (sid: string, pid: number, what = ""): string =>
  `/v1/sandboxes/${seg(sid)}/processes/${pid}${what}`;

/** The guest's "no such process" (`guest_not_found`, otherwise a missing file) as {@link ProcessNotFound}. */
async function pidErrors<T>(p: Promise<T>): Promise<T> {
  try {
    return await p;
  } catch (e) {
    if (e instanceof FileNotFound) throw new ProcessNotFound(e.message, { code: e.code, status: e.status, cause: e });
    throw e;
  }
}

async function getProcess(client: Client, sid: string, pid: number): Promise<ProcessInfo> {
  return processFromJson(await client.json("GET", processPath(sid, pid)));
}

async function sendStdin(
  client: Client,
  sid: string,
  pid: number,
  data: string | Uint8Array,
  eof: boolean,
): Promise<void> {
  const json: Record<string, unknown> =
    typeof data === "string" ? { data } : { data_base64: Buffer.from(data).toString("base64") };
  if (eof) json.eof = true;
  await pidErrors(client.request("POST", processPath(sid, pid, "/stdin"), { json }));
}

async function signal(client: Client, sid: string, pid: number, sig: Signal): Promise<void> {
  if (typeof sig !== "string" && typeof sig !== "number") {
    throw new TypeError(`a signal is a name such as "SIGTERM" or a number, not ${String(sig)}`);
  }
  await pidErrors(client.request("POST", processPath(sid, pid, "/signal"), { json: { signal: sig } }));
}

/** SIGKILL; false when the process had already ended (or is unknown). */
async function kill(client: Client, sid: string, pid: number): Promise<boolean> {
  try {
    await signal(client, sid, pid, "SIGKILL");
    return true;
  } catch (e) {
    if (e instanceof ProcessExited || e instanceof ProcessNotFound) return false;
    throw e;
  }
}

/**
 * A background process. The program runs on whether or not the handle is
 * used; {@link wait} reads its output (passing it to the callbacks) until it ends.
 */
export class CommandHandle {
  readonly pid: number;
  readonly argv: string[];
  private readonly collector: ExecCollector;
  /** The offset of the output the collector has not counted (poll's jumps). */
  private base: number;
  private last: ProcessInfo;

  constructor(
    private readonly client: Client,
    readonly sandboxId: string,
    info: ProcessInfo,
    private readonly opts: ConnectOptions = {},
    offset = 0,
  ) {
    this.pid = info.pid;
    this.argv = info.argv;
    this.last = info;
    this.collector = new ExecCollector(opts);
    this.base = offset;
  }

  /** The stdout read so far (by {@link wait} or {@link poll}). */
  get stdout(): string {
    return this.collector.text.stdout.join("");
  }

  get stderr(): string {
    return this.collector.text.stderr.join("");
  }

  /** Where the next read starts (stdout and stderr bytes counted together). */
  get offset(): number {
    return this.base + this.collector.outputBytes;
  }

  /** The exit code once it is known to have ended (null while running, or when a signal ended it). */
  get exitCode(): number | null {
    return this.last.exitCode;
  }

  /**
   * Follows the output until the program ends and resolves to how, like a
   * foreground `run` ({@link CommandTimeout} when its own timeout killed it;
   * {@link CommandFailed} on a non-zero exit when started with `check: true`).
   * `timeoutMs` bounds this wait only (the program runs on; wait again to go on).
   */
  async wait(opts: WaitOptions = {}): Promise<CommandResult> {
    const timeoutMs = opts.timeoutMs ?? null;
    if (timeoutMs !== null && !(timeoutMs > 0)) throw new RangeError("timeoutMs must be positive (or null)");
    if (!this.collector.done) {
      this.collector.forgetError();
      const query = { follow: "true", offset: String(this.offset) };
      try {
        await pidErrors(
          this.client.streamLines("GET", processPath(this.sandboxId, this.pid, "/output"), { query }, timeoutMs, async (line) => {
            await this.collector.feed(line);
            return !this.collector.done;
          }),
        );
      } catch (e) {
        if (timeoutMs !== null && e instanceof RequestTimeout) {
          throw new RequestTimeout(`process ${this.pid} is still running after ${timeoutMs} ms`, {
            code: "wait_timeout",
            cause: e,
          });
        }
        throw e;
      }
    }
    const what = this.argv.join(" ") || String(this.pid);
    try {
      return this.ended(this.collector.result(what, this.opts.check ?? false));
    } catch (e) {
      if (e instanceof CommandTimeout || e instanceof CommandFailed) this.ended(e.result);
      throw e;
    }
  }

  private ended(r: CommandResult): CommandResult {
    this.last = { ...this.last, state: "exited", exitCode: r.exitCode, signal: r.signal, timedOut: r.timedOut, durationMs: r.durationMs };
    return r;
  }

  /**
   * Reads what it printed since the last read (waiting up to `waitMs`, at
   * most 30 s, when nothing is new), passes it to the callbacks, and
   * resolves to the process as of then.
   */
  async poll(waitMs = 0): Promise<ProcessInfo> {
    if (!(waitMs >= 0 && waitMs <= MAX_OUTPUT_WAIT_MS)) throw new RangeError(`waitMs is 0..${MAX_OUTPUT_WAIT_MS}`);
    const query: Record<string, string> = { offset: String(this.offset) };
    if (waitMs > 0) query.wait_ms = String(Math.round(waitMs));
    const got: ProcessOutput = processOutputFromJson(
      await pidErrors(this.client.json("GET", processPath(this.sandboxId, this.pid, "/output"), { query })),
    );
    this.base = got.nextOffset - this.collector.outputBytes;
    await this.collector.emit("stdout", got.stdout);
    await this.collector.emit("stderr", got.stderr);
    this.last = got.process;
    return got.process;
  }

  /** The process as the daemon shows it now. */
  async info(): Promise<ProcessInfo> {
    this.last = await getProcess(this.client, this.sandboxId, this.pid);
    return this.last;
  }

  /** Writes to its stdin (text, or exact bytes); `eof: true` closes it afterwards. */
  sendStdin(data: string | Uint8Array, opts: { eof?: boolean } = {}): Promise<void> {
    return sendStdin(this.client, this.sandboxId, this.pid, data, opts.eof ?? false);
  }

  /** Closes its stdin: the program reads end of file. */
  closeStdin(): Promise<void> {
    return sendStdin(this.client, this.sandboxId, this.pid, "", true);
  }

  /** Sends `sig` (`"SIGTERM"`, `"INT"`, `9`...) to its process group. */
  signal(sig: Signal): Promise<void> {
    return signal(this.client, this.sandboxId, this.pid, sig);
  }

  /** SIGKILL; false when it had already ended (or is unknown). */
  kill(): Promise<boolean> {
    return kill(this.client, this.sandboxId, this.pid);
  }
}

/** The background-process half of `sb.commands`. */
export class ProcessCommands {
  constructor(protected readonly sb: SandboxRef) {}

  protected async start(cmd: Command, opts: RunOptions): Promise<CommandHandle> {
    const json = { ...execBody(cmd, opts), background: true };
    const info = processFromJson(await this.sb.client.json("POST", `/v1/sandboxes/${seg(this.sb.id)}/exec`, { json }));
    return new CommandHandle(this.sb.client, this.sb.id, info, opts);
  }

  /** The background processes, oldest first (running and ended; the guest keeps the 256 most recent). */
  async list(): Promise<ProcessInfo[]> {
    const d = await this.sb.client.json<{ processes: Record<string, unknown>[] }>(
      "GET",
      `/v1/sandboxes/${seg(this.sb.id)}/processes`,
    );
    return d.processes.map(processFromJson);
  }

  /**
   * A handle on the background process `pid` (started earlier, by another
   * handle, or in the parent of this branch child); its `wait()` reads the
   * output from the start (what the guest still keeps). Throws {@link ProcessNotFound}.
   */
  async connect(pid: number, opts: ConnectOptions = {}): Promise<CommandHandle> {
    return new CommandHandle(this.sb.client, this.sb.id, await getProcess(this.sb.client, this.sb.id, pid), opts);
  }

  /** SIGKILL to `pid`; false when it had already ended (or is unknown). */
  kill(pid: number): Promise<boolean> {
    return kill(this.sb.client, this.sb.id, pid);
  }

  signal(pid: number, sig: Signal): Promise<void> {
    return signal(this.sb.client, this.sb.id, pid, sig);
  }

  /** Writes to `pid`'s stdin; `eof: true` closes it afterwards. */
  sendStdin(pid: number, data: string | Uint8Array, opts: { eof?: boolean } = {}): Promise<void> {
    return sendStdin(this.sb.client, this.sb.id, pid, data, opts.eof ?? false);
  }
}
