/**
 * Watching a guest directory: `sb.files.watch(path, { onEvent, recursive })` reads
 * `GET /v1/sandboxes/{id}/files/watch`, an NDJSON stream. The promise resolves once
 * the daemon's `started` line has arrived, so every change made afterwards is
 * reported; `stop()` aborts the request, which ends the watch in the guest.
 */
import { type Client, seg } from "./client.js";
import { ServerError, errorFor } from "./errors.js";

/**
 * One change: `name` relative to the watched directory (`""` for itself); `kind`
 * `create`, `write`, `remove`, `rename`, `chmod`, or `overflow` (events were lost).
 */
export interface WatchEvent {
  name: string;
  kind: string;
}

export interface WatchOptions {
  /** Called for each change, in order (awaited before the next). */
  onEvent: (event: WatchEvent) => unknown;
  /** Also every directory below it, including ones created while it is watched. */
  recursive?: boolean;
}

/** A running watch. */
export class WatchHandle {
  /** Settles when the watch ends: stopped, the directory removed, or an error (rejects). */
  readonly done: Promise<void>;

  constructor(
    private readonly abort: AbortController,
    done: Promise<void>,
  ) {
    this.done = done;
  }

  /** Ends the watch. */
  async stop(): Promise<void> {
    this.abort.abort();
    await this.done.catch(() => undefined);
  }
}

export async function watchDir(client: Client, sandboxId: string, path: string, opts: WatchOptions): Promise<WatchHandle> {
  const abort = new AbortController();
  let started!: () => void;
  const ready = new Promise<void>((resolve) => {
    started = resolve;
  });
  const query: Record<string, string> = { path };
  if (opts.recursive) query.recursive = "true";
  const route = `/v1/sandboxes/${seg(sandboxId)}/files/watch`;
  const stream = client.streamLines("GET", route, { query, signal: abort.signal }, null, async (line) => {
    if (!line) return true;
    const ev = JSON.parse(line) as { type?: string; name?: string; kind?: string; code?: string; message?: string };
    switch (ev.type) {
      case "started":
        started();
        break;
      case "event":
        await opts.onEvent({ name: String(ev.name ?? ""), kind: String(ev.kind ?? "") });
        break;
      case "end":
        return false;
      case "error":
        throw errorFor(String(ev.code ?? "error"), String(ev.message ?? ""));
    }
    return true;
  });
  // Stopping is a clean end, not an error.
  const done = stream.catch((e: unknown) => {
    if (abort.signal.aborted) return;
    throw e;
  });
  const opened = await Promise.race([ready.then(() => true), done.then(() => false)]);
  if (!opened) throw new ServerError("the watch stream ended before it started", { code: "bad_response" });
  return new WatchHandle(abort, done);
}
