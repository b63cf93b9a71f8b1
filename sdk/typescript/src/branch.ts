/**
 * Streamed branches: `branch({ n, onProgress })` asks the daemon for
 * `"stream": true`, which answers at once with NDJSON lines (the branch point,
 * one line per child as it comes up or fails, then the summary).
 * {@link BranchCollector} turns them into {@link BranchProgress} reports and,
 * at the end, the same {@link BranchResult} the plain request answers.
 */
import { type Client, seg } from "./client.js";
import { ServerError, errorFor } from "./errors.js";
import { type BranchResult, branchFromJson } from "./models.js";

type Json = Record<string, unknown>;

/**
 * One child of a streamed branch, reported as soon as it runs (or failed).
 * `sandbox` is a handle on it, usable at once while its siblings still come
 * up (null when it failed: nothing of it is left).
 */
export interface BranchProgress<S> {
  /** Its position among the requested children (0-based). */
  index: number;
  sandboxId: string;
  sandbox: S | null;
  /** Whether it runs. */
  ok: boolean;
  /** Why it did not come up (null: it runs). */
  error: string | null;
  /** Milliseconds from the daemon taking the request to this child's report. */
  ms: number;
  /** Children running so far, this one included. */
  ready: number;
  /** Children that failed so far, this one included. */
  failed: number;
  /** Children requested. */
  total: number;
  branchPoint: string;
}

export type ProgressCallback<S> = (progress: BranchProgress<S>) => void | Promise<void>;

/** Feeds on the stream's lines; `make` turns a child's id into a handle. */
export class BranchCollector<S> {
  private point = "";
  private ready = 0;
  private failed = 0;
  private done: BranchResult | null = null;
  private error: { code: string; message: string } | null = null;

  constructor(
    private total: number,
    private readonly make: (id: string) => S,
  ) {}

  /** The report for a child's line (null for the other lines). */
  feed(line: string): BranchProgress<S> | null {
    if (!line.trim()) return null;
    let ev: Json;
    try {
      ev = JSON.parse(line) as Json;
    } catch {
      throw new ServerError(`unexpected line in the branch stream: ${line.slice(0, 200)}`, { code: "bad_response" });
    }
    switch (ev.type) {
      case "point": {
        this.point = String(ev.branch_point);
        const ids = Array.isArray(ev.children) ? ev.children.length : 0;
        if (ids > 0) this.total = ids;
        return null;
      }
      case "child":
        this.ready += 1;
        return this.progress(ev, this.make(String(ev.id)), null);
      case "child_failed":
        this.failed += 1;
        return this.progress(ev, null, String(ev.error ?? ""));
      case "done":
        this.done = branchFromJson(ev);
        return null;
      case "error":
        this.error = { code: String(ev.code ?? "error"), message: String(ev.message ?? "") };
        return null;
      default:
        // A newer daemon's kind of line.
        return null;
    }
  }

  private progress(ev: Json, sandbox: S | null, error: string | null): BranchProgress<S> {
    return {
      index: Number(ev.index),
      sandboxId: String(ev.id),
      sandbox,
      ok: error === null,
      error,
      ms: Number(ev.ms ?? 0),
      ready: this.ready,
      failed: this.failed,
      total: this.total,
      branchPoint: this.point,
    };
  }

  /** The summary line, or the error the stream ended with. */
  result(): BranchResult {
    if (this.error) throw errorFor(this.error.code, this.error.message);
    if (!this.done) throw new ServerError("the branch stream ended without a summary", { code: "bad_response" });
    return this.done;
  }
}

/**
 * `POST .../branch` with `"stream": true`: `onProgress` gets each child as it
 * comes up (awaited before the next line), the summary is returned.
 */
export async function branchStreamed<S>(
  client: Client,
  sandboxId: string,
  body: Json,
  collector: BranchCollector<S>,
  onProgress: ProgressCallback<S>,
): Promise<BranchResult> {
  const path = `/v1/sandboxes/${seg(sandboxId)}/branch`;
  // The same bound as the plain request's: the whole branch.
  await client.streamLines("POST", path, { json: { ...body, stream: true } }, client.requestTimeoutMs, async (line) => {
    const p = collector.feed(line);
    if (p !== null) await onProgress(p);
  });
  return collector.result();
}
