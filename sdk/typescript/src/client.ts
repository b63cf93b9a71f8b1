/**
 * The HTTP client: one daemon address and token, requests with the API's
 * errors mapped to typed exceptions, the streamed exec, image pulls and
 * snapshot packs.
 */
import { createReadStream, createWriteStream } from "node:fs";
import { rename, rm, stat } from "node:fs/promises";
import { basename, dirname, join } from "node:path";
import { Readable } from "node:stream";
import { pipeline } from "node:stream/promises";
import type { ReadableStream as WebReadableStream } from "node:stream/web";
import { randomBytes } from "node:crypto";

import { type Config, resolveConfig } from "./config.js";
import {
  CommandFailed,
  CommandTimeout,
  ConnectionFailed,
  RequestTimeout,
  ServerError,
  type ZygoteError,
  errorFor,
} from "./errors.js";
import {
  type CommandResult,
  type Image,
  type PushResult,
  type SandboxInfo,
  type Snapshot,
  type Volume,
  volumeFromJson,
  imageFromJson,
  pushResultFromJson,
  sandboxFromJson,
  snapshotFromJson,
} from "./models.js";
import { type Transfer, TransferCollector, type TransferOptions, registryBody } from "./transfer.js";

export const VERSION = "0.1.0";

/**
 * Creating, branching and snapshotting boot or migrate whole VMs; under
 * QEMU TCG that can take tens of seconds, so the default is generous.
 */
export const DEFAULT_REQUEST_TIMEOUT_MS = 600_000;
/** Commands run for at most this long unless told otherwise. */
export const DEFAULT_COMMAND_TIMEOUT_MS = 60_000;

export interface ClientOptions {
  /** Default `$ZYGOTE_URL`, else http://127.0.0.1:7420. */
  url?: string;
  /** Default `$ZYGOTE_TOKEN`, else the daemon's token file. */
  token?: string;
  /** Per-request timeout (not for streamed commands, which have their own). */
  requestTimeoutMs?: number;
}

/** A shell command line (run with `sh -c`) or an argv array. */
export type Command = string | readonly string[];
/** Gets output text as it arrives; a returned promise is awaited before the next chunk. */
export type OutputCallback = (text: string) => unknown;

export interface RunOptions {
  /** Kill the command after this long; `null` for no limit. Default 60 s. */
  timeoutMs?: number | null;
  onStdout?: OutputCallback;
  onStderr?: OutputCallback;
  env?: Record<string, string>;
  cwd?: string;
  /** Text written to the program's stdin (then closed). */
  stdin?: string;
  /** Throw {@link CommandFailed} when the exit code is not 0. */
  check?: boolean;
  /**
   * Run as `"root"`, a uid (`1000` or `"1000"`, group 0) or `"UID:GID"`
   * (numeric, like `docker exec -u`). By default, and for `env` and `cwd` left
   * out, the sandbox's OCI image decides (its `User`, `Env` and `WorkingDir`);
   * otherwise root in `/`.
   */
  user?: string | number;
}

export interface RequestSpec {
  /** Query parameters: an object, or `[name, value]` pairs when a name repeats. */
  query?: Record<string, string> | readonly (readonly [string, string])[];
  json?: unknown;
  /** A body; a stream is sent as it is read. */
  body?: Uint8Array | string | ReadableStream<Uint8Array>;
  /** The body's type (default `application/octet-stream`). */
  contentType?: string;
  headers?: Record<string, string>;
  /** Aborts the request (and a streamed answer) when it fires. */
  signal?: AbortSignal;
}

/** Options of {@link Client.pullSnapshot}. */
export interface PullSnapshotOptions extends TransferOptions {
  /** Name of the snapshot registered (default: the pushed one's). */
  name?: string;
}

type Json = Record<string, unknown>;

export function argvOf(cmd: Command): string[] {
  if (typeof cmd === "string") return ["sh", "-c", cmd];
  if (cmd.length === 0) throw new TypeError("empty command");
  return [...cmd];
}

/** The body of `POST .../exec` (and `.../exec/stream`) for `cmd` and `opts`. */
export function execBody(cmd: Command, opts: RunOptions): Json {
  const timeoutMs = opts.timeoutMs === undefined ? DEFAULT_COMMAND_TIMEOUT_MS : opts.timeoutMs;
  const body: Json = { argv: argvOf(cmd) };
  if (opts.env && Object.keys(opts.env).length > 0) body.env = opts.env;
  if (opts.cwd !== undefined) body.cwd = opts.cwd;
  if (opts.user !== undefined) {
    if (typeof opts.user !== "string" && typeof opts.user !== "number") {
      throw new TypeError(`user is "root", a uid or "UID:GID", not ${JSON.stringify(opts.user)}`);
    }
    body.user = String(opts.user);
  }
  if (opts.stdin !== undefined) body.stdin = opts.stdin;
  if (timeoutMs !== null) {
    if (!(timeoutMs > 0)) throw new RangeError("timeoutMs must be positive (or null for no limit)");
    body.timeout_ms = Math.max(1, Math.ceil(timeoutMs));
  }
  return body;
}

async function errorFromResponse(resp: Response): Promise<ZygoteError> {
  const text = await resp.text();
  try {
    const err = (JSON.parse(text) as { error?: { code?: unknown; message?: unknown } }).error;
    if (err && typeof err.code === "string") {
      return errorFor(err.code, String(err.message ?? ""), resp.status);
    }
  } catch {
    // Not the API's error format (e.g. a proxy's page): keep the status.
  }
  return errorFor(`http_${resp.status}`, text.trim().slice(0, 500) || resp.statusText, resp.status);
}

export class Client {
  readonly config: Config;
  /** Bound of one request (and of a streamed branch as a whole). */
  readonly requestTimeoutMs: number;

  constructor(options: ClientOptions = {}) {
    this.config = resolveConfig(options);
    this.requestTimeoutMs = options.requestTimeoutMs ?? DEFAULT_REQUEST_TIMEOUT_MS;
  }

  private headers(extra: Record<string, string> = {}): Record<string, string> {
    const h: Record<string, string> = { "user-agent": `zygote-typescript/${VERSION}`, ...extra };
    if (this.config.token) h.authorization = `Bearer ${this.config.token}`;
    return h;
  }

  private async fetch(method: string, path: string, spec: RequestSpec, timeoutMs: number | null): Promise<Response> {
    const url = new URL(this.config.url + path);
    const query = spec.query ?? {};
    for (const [k, v] of Array.isArray(query) ? query : Object.entries(query)) url.searchParams.append(k, v);
    let body: RequestSpec["body"];
    const extra: Record<string, string> = {};
    if (spec.json !== undefined) {
      body = JSON.stringify(spec.json);
      extra["content-type"] = "application/json";
    } else if (spec.body !== undefined) {
      body = spec.body;
      extra["content-type"] = spec.contentType ?? "application/octet-stream";
    }
    Object.assign(extra, spec.headers);
    const init: RequestInit & { duplex?: "half" } = {
      method,
      headers: this.headers(extra),
      body,
      signal: anySignal(spec.signal, timeoutMs === null ? undefined : AbortSignal.timeout(timeoutMs)),
    };
    // A streamed body goes out while the answer may already come back.
    if (body instanceof ReadableStream) init.duplex = "half";
    try {
      return await fetch(url, init);
    } catch (e) {
      throw this.transportError(e);
    }
  }

  private transportError(e: unknown): ZygoteError {
    if (e instanceof Error && (e.name === "TimeoutError" || e.name === "AbortError")) {
      return new RequestTimeout(`zygoted at ${this.config.url} did not answer in time`, { cause: e });
    }
    const cause = e instanceof Error && e.cause instanceof Error ? `: ${e.cause.message}` : "";
    return new ConnectionFailed(
      `cannot reach zygoted at ${this.config.url}${cause} (is it running? \`zygote serve\`)`,
      { cause: e },
    );
  }

  /** Sends one request; throws the typed error for an error answer. */
  async request(method: string, path: string, spec: RequestSpec = {}): Promise<Response> {
    const resp = await this.fetch(method, path, spec, this.requestTimeoutMs);
    if (!resp.ok) throw await errorFromResponse(resp);
    return resp;
  }

  async json<T = Json>(method: string, path: string, spec: RequestSpec = {}): Promise<T> {
    const resp = await this.request(method, path, spec);
    try {
      return (await resp.json()) as T;
    } catch (e) {
      throw new ServerError(`unexpected answer from zygoted: ${String(e)}`, { code: "bad_response" });
    }
  }

  /**
   * Runs a command through `POST /v1/sandboxes/{id}/exec/stream`, calling
   * `onStdout`/`onStderr` as output arrives.
   */
  async exec(sandboxId: string, cmd: Command, opts: RunOptions = {}): Promise<CommandResult> {
    const timeoutMs = opts.timeoutMs === undefined ? DEFAULT_COMMAND_TIMEOUT_MS : opts.timeoutMs;
    const body = execBody(cmd, opts);
    // The daemon enforces the command's timeout; the HTTP wait only needs
    // to outlast it (and must not cut off a long silent command).
    const httpTimeout = timeoutMs === null ? null : timeoutMs + 30_000;
    const collector = new ExecCollector(opts);
    await this.streamLines("POST", `/v1/sandboxes/${seg(sandboxId)}/exec/stream`, { json: body }, httpTimeout, (line) =>
      collector.feed(line),
    );
    return collector.result(typeof cmd === "string" ? cmd : cmd.join(" "), opts.check ?? false);
  }

  /**
   * Sends a request answered with NDJSON and passes each line to `onLine`
   * (awaited before the next) until the stream ends or `onLine` asks to stop
   * by returning `false`. `timeoutMs` bounds the whole exchange (`null`: none).
   */
  async streamLines(
    method: string,
    path: string,
    spec: RequestSpec,
    timeoutMs: number | null,
    onLine: (line: string) => Promise<unknown>,
  ): Promise<void> {
    const resp = await this.fetch(method, path, spec, timeoutMs);
    if (!resp.ok) throw await errorFromResponse(resp);
    if (!resp.body) throw new ServerError("stream without a body", { code: "bad_response" });
    const lines = new TextDecoder();
    const reader = resp.body.getReader();
    let pending = "";
    try {
      for (;;) {
        let chunk: Awaited<ReturnType<typeof reader.read>>;
        try {
          chunk = await reader.read();
        } catch (e) {
          throw this.transportError(e);
        }
        if (chunk.done) break;
        pending += lines.decode(chunk.value, { stream: true });
        let nl: number;
        while ((nl = pending.indexOf("\n")) >= 0) {
          const line = pending.slice(0, nl);
          pending = pending.slice(nl + 1);
          if ((await onLine(line)) === false) {
            await reader.cancel().catch(() => undefined);
            return;
          }
        }
      }
    } catch (e) {
      // A callback threw or the connection broke: hang up, which makes the
      // daemon kill an exec'd program instead of letting it run unobserved.
      await reader.cancel().catch(() => undefined);
      throw e;
    }
    await onLine(pending + lines.decode());
  }

  /**
   * An image pull or a snapshot push or pull (NDJSON): `onProgress` gets each
   * progress line (awaited); resolves to what the final line carries.
   */
  async transfer<T>(t: Transfer<T>, opts: TransferOptions = {}): Promise<T> {
    const collector = new TransferCollector(t);
    await this.streamLines("POST", t.path, { json: t.body }, opts.timeoutMs ?? null, async (line) => {
      const p = collector.feed(line);
      if (p !== null && opts.onProgress) await opts.onProgress(p);
    });
    return collector.result();
  }

  /**
   * The images sandboxes can boot: built ones (`minimal`) and OCI images
   * pulled or imported (with `source` and `digest`).
   */
  async images(): Promise<Image[]> {
    const d = await this.json<{ images: Json[] }>("GET", "/v1/images");
    return d.images.map(imageFromJson);
  }

  /**
   * Pulls an OCI image (`alpine:3.20`, `registry.example:5000/team/app:1.4`,
   * `app@sha256:...`) into the daemon and converts it; resolves to the image,
   * whose `name` `Sandbox.create({ image })` takes (so does the reference: a
   * create pulls on first use). `username`/`password` are for this pull only
   * (else the daemon's docker config). `onProgress` gets each
   * {@link TransferProgress} (`resolved`, `layer`, `progress`).
   *
   * Throws {@link ImageNotFound}, {@link RegistryUnauthorized},
   * {@link UnsupportedPlatform}, {@link BadImage}, {@link ImageTooLarge} or
   * {@link RegistryError}.
   */
  async pullImage(reference: string, opts: TransferOptions = {}): Promise<Image> {
    return this.transfer(
      {
        path: "/v1/images",
        body: registryBody(reference, opts),
        what: `pull of ${reference}`,
        final: "done",
        parse: (ev) => imageFromJson(ev.image as Json),
      },
      opts,
    );
  }

  /**
   * Pushes a snapshot to a registry as one OCI artifact (its base image, disk
   * and memory state); blobs the registry has are not sent again. `onProgress`
   * gets `blob` and `progress` lines. The pack holds the guest's memory: push
   * it only where you would keep the sandbox.
   */
  async pushSnapshot(snapshot: Snapshot | string, reference: string, opts: TransferOptions = {}): Promise<PushResult> {
    const id = snapshotIdOf(snapshot);
    return this.transfer(
      {
        path: `/v1/snapshots/${seg(id)}/push`,
        body: registryBody(reference, opts),
        what: `push of ${id} to ${reference}`,
        final: "pushed",
        parse: pushResultFromJson,
      },
      opts,
    );
  }

  /**
   * Pulls a snapshot pack (pushed by {@link pushSnapshot}, here or on another
   * host) and registers it as a new snapshot (`name`: default the pushed
   * one's); `Sandbox.restore` starts sandboxes from it, and its `pack` says
   * where it came from. `Sandbox.restore(reference)` pulls on first use too.
   */
  async pullSnapshot(reference: string, opts: PullSnapshotOptions = {}): Promise<Snapshot> {
    const body = registryBody(reference, opts);
    if (opts.name !== undefined) body.name = opts.name;
    return this.transfer(
      {
        path: "/v1/snapshots/pull",
        body,
        what: `pull of ${reference}`,
        final: "done",
        parse: (ev) => snapshotFromJson(ev.snapshot as Json),
      },
      opts,
    );
  }

  /**
   * Writes a snapshot's pack (a tar) to the file `path`, streamed as the daemon
   * sends it; resolves to its size in bytes. The file appears only once it is
   * complete. It holds the guest's memory: keep it as you would the sandbox.
   * `timeoutMs` bounds the whole download (default: none).
   */
  async exportSnapshot(snapshot: Snapshot | string, path: string, opts: { timeoutMs?: number | null } = {}): Promise<number> {
    const id = snapshotIdOf(snapshot);
    const resp = await this.fetch("GET", `/v1/snapshots/${seg(id)}/export`, {}, opts.timeoutMs ?? null);
    if (!resp.ok) throw await errorFromResponse(resp);
    if (!resp.body) throw new ServerError("the export answered without a body", { code: "bad_response" });
    const part = join(dirname(path), `.${basename(path)}.${randomBytes(4).toString("hex")}.part`);
    let written = 0;
    const body = Readable.fromWeb(resp.body as WebReadableStream<Uint8Array>);
    body.on("data", (chunk: Uint8Array) => {
      written += chunk.length;
    });
    const file = createWriteStream(part, { flags: "wx" });
    // Which side failed first: the daemon ends a body it cannot finish by breaking
    // the connection (a partial pack is never mistaken for a whole one); a write
    // error is the file's. The pipeline then fails the other side with the same error.
    let first: { cut: boolean; error: unknown } | undefined;
    body.on("error", (error) => void (first ??= { cut: true, error }));
    file.on("error", (error) => void (first ??= { cut: false, error }));
    try {
      try {
        await pipeline(body, file);
      } catch (e) {
        if (!first?.cut) throw first?.error ?? e;
        const cut = first.error;
        if (cut instanceof Error && (cut.name === "TimeoutError" || cut.name === "AbortError")) {
          throw this.transportError(cut);
        }
        throw new ServerError(`the export of ${id} was cut short: ${describe(cut)}`, { code: "stream_ended", cause: cut });
      }
      await rename(part, path);
    } finally {
      await rm(part, { force: true });
    }
    return written;
  }

  /**
   * Uploads a pack file (made by {@link exportSnapshot}), streamed from disk,
   * and registers it as a new snapshot (`name`: default the exported one's).
   * A damaged pack throws {@link BadImage} with nothing registered.
   * `timeoutMs` bounds the whole upload and import (default: none).
   */
  async importSnapshot(path: string, opts: { name?: string; timeoutMs?: number | null } = {}): Promise<Snapshot> {
    // A missing file is the caller's error, before any request.
    const { size } = await stat(path);
    const stream = Readable.toWeb(createReadStream(path, { highWaterMark: 1 << 20 })) as ReadableStream<Uint8Array>;
    const resp = await this.fetch(
      "POST",
      "/v1/snapshots/import",
      {
        query: opts.name === undefined ? {} : { name: opts.name },
        body: stream,
        contentType: "application/x-tar",
        headers: { "content-length": String(size) },
      },
      opts.timeoutMs ?? null,
    );
    if (!resp.ok) throw await errorFromResponse(resp);
    try {
      return snapshotFromJson((await resp.json()) as Json);
    } catch (e) {
      throw new ServerError(`unexpected answer from zygoted: ${String(e)}`, { code: "bad_response" });
    }
  }

  /** `GET /v1/info`: runtime in use, snapshot kinds, cgroup support. */
  info(): Promise<Json> {
    return this.json("GET", "/v1/info");
  }

  /**
   * Every sandbox; with `metadata`, only those whose metadata has all of
   * those key/value pairs (e.g. `{ "zygote.parent": id }`: a sandbox's branch children).
   */
  async sandboxes(opts: ListOptions = {}): Promise<SandboxInfo[]> {
    const d = await this.json<{ sandboxes: Json[] }>("GET", "/v1/sandboxes", {
      query: metadataFilters(opts.metadata),
    });
    return d.sandboxes.map(sandboxFromJson);
  }

  async snapshots(): Promise<Snapshot[]> {
    const d = await this.json<{ snapshots: Json[] }>("GET", "/v1/snapshots");
    return d.snapshots.map(snapshotFromJson);
  }

  async getSnapshot(id: string): Promise<Snapshot> {
    return snapshotFromJson(await this.json("GET", `/v1/snapshots/${seg(id)}`));
  }

  async deleteSnapshot(snapshot: Snapshot | string): Promise<void> {
    await this.request("DELETE", `/v1/snapshots/${seg(snapshotIdOf(snapshot))}`);
  }

  /** A new empty volume (ext4, sparse on the host; 1024 MiB unless given). */
  async createVolume(name: string, opts: { sizeMib?: number } = {}): Promise<Volume> {
    const body: Json = { name };
    if (opts.sizeMib !== undefined) body.size_mib = opts.sizeMib;
    return volumeFromJson(await this.json("POST", "/v1/volumes", body));
  }

  async volumes(): Promise<Volume[]> {
    const d = await this.json<{ volumes: Json[] }>("GET", "/v1/volumes");
    return d.volumes.map(volumeFromJson);
  }

  /** A volume by name or id. */
  async getVolume(volume: string): Promise<Volume> {
    return volumeFromJson(await this.json("GET", `/v1/volumes/${seg(volume)}`));
  }

  /** Deletes a volume and its data; refused (a conflict) while a sandbox has it. */
  async deleteVolume(volume: Volume | string): Promise<void> {
    await this.request("DELETE", `/v1/volumes/${seg(typeof volume === "string" ? volume : volume.id)}`);
  }
}

const snapshotIdOf = (s: Snapshot | string): string => (typeof s === "string" ? s : s.id);

/** An error and its causes in one line (undici's "terminated" says little alone). */
function describe(e: unknown): string {
  const parts: string[] = [];
  for (let x: unknown = e; x instanceof Error && parts.length < 4; x = x.cause) parts.push(x.message);
  return parts.join(": ") || String(e);
}

export interface ListOptions {
  /** Only sandboxes whose metadata has every one of these key/value pairs. */
  metadata?: Readonly<Record<string, string>>;
}

/**
 * `{k: v, ...}` as the list's query: one `metadata=k=v` per pair (the daemon
 * ANDs them), each URL-encoded (a value may hold `=`, `&` or spaces). The
 * daemon splits a filter at its first `=`, so a key holding one (never a
 * valid key) is refused here rather than silently read as another filter.
 */
export function metadataFilters(metadata: Readonly<Record<string, string>> | undefined): [string, string][] {
  if (metadata === undefined) return [];
  if (metadata === null || typeof metadata !== "object" || Array.isArray(metadata)) {
    throw new TypeError("metadata filters are an object of key to value, e.g. { team: \"search\" }");
  }
  return Object.entries(metadata).map(([k, v]) => {
    if (typeof v !== "string") throw new TypeError(`metadata filter ${JSON.stringify(k)}: values are strings`);
    if (k === "" || k.includes("=")) {
      throw new TypeError(`metadata filter key ${JSON.stringify(k)} must be non-empty and without '='`);
    }
    return ["metadata", `${k}=${v}`];
  });
}

/** One path segment (ids come from callers; keep `/` and `?` out of paths). */
/** The signal that fires when any of `signals` does (none: null). */
function anySignal(...signals: (AbortSignal | undefined)[]): AbortSignal | null {
  const given = signals.filter((s): s is AbortSignal => s !== undefined);
  if (given.length <= 1) return given[0] ?? null;
  return AbortSignal.any(given);
}

export function seg(s: string): string {
  return encodeURIComponent(s);
}

/**
 * Turns the NDJSON exec events into callbacks and a result. Output is
 * decoded per stream with a streaming decoder, so a UTF-8 character split
 * across two chunks stays intact.
 */
export class ExecCollector {
  private readonly decoders = { stdout: new TextDecoder(), stderr: new TextDecoder() };
  readonly text = { stdout: [] as string[], stderr: [] as string[] };
  private end: Json | undefined;
  private error: ZygoteError | undefined;
  /** Output bytes seen, both streams together (a background process's offset). */
  outputBytes = 0;

  constructor(private readonly opts: Pick<RunOptions, "onStdout" | "onStderr">) {}

  /** The exit event was seen: {@link result} is final. */
  get done(): boolean {
    return this.end !== undefined;
  }

  /** Forgets an error event (a background process's output may be followed again). */
  forgetError(): void {
    this.error = undefined;
  }

  async feed(line: string): Promise<void> {
    line = line.trim();
    if (!line) return;
    let ev: Json;
    try {
      ev = JSON.parse(line) as Json;
    } catch {
      throw new ServerError(`bad exec event ${JSON.stringify(line.slice(0, 200))}`, { code: "bad_response" });
    }
    switch (ev.type) {
      case "output": {
        const stream = ev.stream;
        if (stream === "stdout" || stream === "stderr") {
          const bytes = Buffer.from(String(ev.data ?? ""), "base64");
          this.outputBytes += bytes.length;
          await this.emit(stream, this.decoders[stream].decode(bytes, { stream: true }));
        }
        break;
      }
      case "exit":
        this.end = ev;
        // Flush a character a decoder held back at the very end.
        await this.emit("stdout", this.decoders.stdout.decode());
        await this.emit("stderr", this.decoders.stderr.decode());
        break;
      case "error":
        this.error = errorFor(String(ev.code ?? "error"), String(ev.message ?? ""));
        break;
      default:
        // `started` and event types newer than this SDK carry nothing to collect.
        break;
    }
  }

  async emit(stream: "stdout" | "stderr", text: string): Promise<void> {
    if (!text) return;
    this.text[stream].push(text);
    const cb = stream === "stdout" ? this.opts.onStdout : this.opts.onStderr;
    if (cb) await cb(text);
  }

  result(what: string, check: boolean): CommandResult {
    if (this.error) throw this.error;
    if (!this.end) throw new ServerError("the exec stream ended without an exit event", { code: "stream_ended" });
    const e = this.end;
    const res: CommandResult = {
      stdout: this.text.stdout.join(""),
      stderr: this.text.stderr.join(""),
      exitCode: typeof e.exit_code === "number" ? e.exit_code : null,
      signal: typeof e.signal === "number" ? e.signal : null,
      timedOut: e.timed_out === true,
      durationMs: typeof e.duration_ms === "number" ? e.duration_ms : 0,
    };
    if (res.timedOut) throw new CommandTimeout(`command timed out after ${res.durationMs} ms: ${what}`, res);
    if (check && res.exitCode !== 0) {
      const how = res.exitCode === null ? `signal ${res.signal}` : `exit code ${res.exitCode}`;
      throw new CommandFailed(`command failed with ${how}: ${what}`, res);
    }
    return res;
  }
}
