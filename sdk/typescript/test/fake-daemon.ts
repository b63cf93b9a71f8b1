/**
 * A scripted stand-in for zygoted: answers requests with a test-vector
 * case's responses in order and records what it was sent. With a
 * {@link FakeFiles} attached, creating, listing, getting and deleting
 * sandboxes, file reads and writes, branches and merges are answered from its
 * state instead, the way zygoted does (metadata included).
 */
import { createServer, type IncomingMessage, type Server, type ServerResponse } from "node:http";
import type { AddressInfo } from "node:net";

export interface ScriptedResponse {
  status: number;
  json?: unknown;
  ndjson?: unknown[];
  body_text?: string;
  body_base64?: string;
  content_type?: string;
  /** A body written in these chunks; with `cut`, broken off before its end (as zygoted does). */
  chunks?: Buffer[];
  cut?: boolean;
}

export interface Recorded {
  method: string;
  path: string;
  query: Record<string, string>;
  headers: IncomingMessage["headers"];
  body: Buffer;
  /** The query string as sent (`query` keeps one value per name). */
  rawQuery: string;
}

type Files = Map<string, string>;
type Answer = { status: number; json?: unknown; bytes?: Buffer };

const failure = (status: number, code: string, message: string): Answer => ({
  status,
  json: { error: { code, message } },
});

// zygoted's metadata rules (crates/daemon/src/model/metadata.rs).
const MAX_METADATA_KEYS = 64;
const METADATA_KEY = /^[A-Za-z0-9._/-]{1,128}$/;
const MAX_METADATA_VALUE_LEN = 1024;
const PARENT_KEY = "zygote.parent";

/** Why zygoted refuses `m` as a create's metadata (undefined: it takes it). */
export function metadataError(m: unknown): string | undefined {
  if (!m || typeof m !== "object" || Array.isArray(m)) return "metadata must be an object of strings";
  const entries = Object.entries(m);
  if (entries.length > MAX_METADATA_KEYS - 1) {
    return `metadata has ${entries.length} keys; at most ${MAX_METADATA_KEYS - 1}`;
  }
  for (const [k, v] of entries) {
    if (!METADATA_KEY.test(k)) return `metadata key ${JSON.stringify(k)} must be 1-128 characters of A-Z a-z 0-9 . _ - /`;
    if (k.startsWith("zygote.")) return `metadata key ${JSON.stringify(k)}: keys starting with "zygote." are zygote's own`;
    if (typeof v !== "string" || Buffer.byteLength(v) > MAX_METADATA_VALUE_LEN || v.includes("\0")) {
      return `metadata value of ${JSON.stringify(k)} must be at most ${MAX_METADATA_VALUE_LEN} bytes, without NUL`;
    }
  }
  return undefined;
}

/** The list's `metadata=key=value` filters, or zygoted's 400 answer. */
export function parseFilters(params: URLSearchParams): [string, string][] | Answer {
  const filters: [string, string][] = [];
  for (const [name, value] of params) {
    if (name !== "metadata") {
      return failure(400, "invalid_argument", `unknown query parameter ${JSON.stringify(name)} (filter with metadata=key=value)`);
    }
    const eq = value.indexOf("=");
    if (eq < 0) return failure(400, "invalid_argument", `metadata filter ${JSON.stringify(value)}: want key=value`);
    const key = value.slice(0, eq);
    if (!METADATA_KEY.test(key)) {
      return failure(400, "invalid_argument", `metadata key ${JSON.stringify(key)} must be 1-128 characters of A-Z a-z 0-9 . _ - /`);
    }
    filters.push([key, value.slice(eq + 1)]);
  }
  return filters;
}

/**
 * Sandboxes holding regular files (absolute path -> text), branched and merged
 * like zygoted does it: a branch copies the parent's files into each child and,
 * when `mergeable` (or `keepsPoints`, as on the qemu runtime), keeps them as the
 * branch point's state; a merge compares, under each merged directory, that
 * state with both sandboxes' files (three-way) and answers a MergeReport.
 * Directories, modes and links are not modelled.
 *
 * Sandboxes carry metadata like zygoted's: validated at create (400
 * `invalid_argument`), inherited by branch children with `zygote.parent`
 * added, shown in every sandbox view and used to filter the list.
 *
 * Pause and resume too: a paused sandbox's file calls get 409
 * `sandbox_paused` (one created with `auto_resume` is resumed instead), pausing
 * a paused one or resuming a running one 409 `wrong_state`.
 */
export class FakeFiles {
  readonly sandboxes = new Map<string, Files>();
  readonly metadata = new Map<string, Record<string, string>>();
  /** child -> [parent, branch point]; branch point -> the files it kept (null: not kept). */
  private readonly origin = new Map<string, [string, string]>();
  private readonly points = new Map<string, Files | null>();
  readonly paused = new Set<string>();
  /** sandbox -> `auto_resume` and `ttl_action` as given at create. */
  private readonly lifecycle = new Map<string, { auto_resume?: boolean; ttl_action?: string }>();
  private ids = 0;

  constructor(
    sandboxes: Record<string, Record<string, string>> = {},
    readonly keepsPoints = false,
  ) {
    for (const [id, files] of Object.entries(sandboxes)) this.sandboxes.set(id, new Map(Object.entries(files)));
  }

  private nextId(prefix: string): string {
    return `${prefix}-${(++this.ids).toString(16).padStart(12, "0")}`;
  }

  /** A sandbox as zygoted shows it (the fields this model keeps). */
  view(sid: string): Record<string, unknown> {
    const paused = this.paused.has(sid);
    const life = this.lifecycle.get(sid) ?? {};
    return {
      id: sid,
      state: paused ? "paused" : "running",
      name: null,
      metadata: { ...this.metadata.get(sid) },
      pid: paused ? null : 4242,
      paused_at: paused ? 1700000000 : null,
      auto_resume: life.auto_resume === true,
      ttl_action: life.ttl_action ?? "delete",
    };
  }

  /** The answer to a request this model handles, else undefined. */
  answer(
    method: string,
    path: string,
    query: Record<string, string>,
    body: Buffer,
    params: URLSearchParams = new URLSearchParams(),
  ): Answer | undefined {
    if (path === "/v1/sandboxes") {
      return method === "POST" ? this.create(JSON.parse(body.toString("utf8")) as Record<string, unknown>) : this.list(params);
    }
    const one = /^\/v1\/sandboxes\/([^/]+)$/.exec(path);
    if (one && this.sandboxes.has(one[1]!) && (method === "GET" || method === "DELETE")) {
      const sid = one[1]!;
      if (method === "GET") return { status: 200, json: this.view(sid) };
      this.sandboxes.delete(sid);
      this.metadata.delete(sid);
      return { status: 204 };
    }
    const m = /^\/v1\/sandboxes\/([^/]+)\/(files|branch|merge|pause|resume)$/.exec(path);
    const files = m ? this.sandboxes.get(m[1]!) : undefined;
    if (!m || !files) return undefined;
    const [, sid, route] = m as unknown as [string, string, string];
    if (route === "pause" || route === "resume") return this.pauseOrResume(sid, route);
    if (this.paused.has(sid)) {
      if (route !== "files" || this.lifecycle.get(sid)?.auto_resume !== true) {
        return failure(409, "sandbox_paused", `sandbox ${sid} is paused: resume it first`);
      }
      this.paused.delete(sid);
    }
    const file = query.path ?? "";
    if (route === "files" && method === "GET") {
      const text = files.get(file);
      return text === undefined
        ? failure(404, "guest_not_found", `${file}: no such file`)
        : { status: 200, bytes: Buffer.from(text) };
    }
    if (route === "files" && method === "PUT") {
      files.set(file, body.toString("utf8"));
      return { status: 200, json: { path: file, size: body.length } };
    }
    const req = JSON.parse(body.toString("utf8")) as Record<string, unknown>;
    if (route === "branch") {
      const point = this.nextId("snap");
      this.points.set(point, this.keepsPoints || req.mergeable === true ? new Map(files) : null);
      const children = Array.from({ length: (req.count as number | undefined) ?? 1 }, () => this.nextId("sb"));
      for (const child of children) {
        this.sandboxes.set(child, new Map(files));
        this.metadata.set(child, { ...this.metadata.get(sid), [PARENT_KEY]: sid });
        this.origin.set(child, [sid, point]);
      }
      return { status: 201, json: { parent: sid, branch_point: point, children, failed: [], duration_ms: 1 } };
    }
    return this.merge(sid, req);
  }

  private pauseOrResume(sid: string, op: "pause" | "resume"): Answer {
    const paused = this.paused.has(sid);
    if ((op === "pause") === paused) {
      const state = paused ? "paused" : "running";
      return failure(409, "wrong_state", `sandbox ${sid} is ${state}: ${op} needs it ${paused ? "running" : "paused"}`);
    }
    if (op === "pause") this.paused.add(sid);
    else this.paused.delete(sid);
    return { status: 200, json: this.view(sid) };
  }

  private create(req: Record<string, unknown>): Answer {
    const meta = req.metadata ?? {};
    const why = metadataError(meta);
    if (why !== undefined) return failure(400, "invalid_argument", why);
    const made = Array.from({ length: (req.n as number | undefined) ?? 1 }, () => {
      const sid = this.nextId("sb");
      this.sandboxes.set(sid, new Map());
      this.metadata.set(sid, { ...(meta as Record<string, string>) });
      this.lifecycle.set(sid, {
        auto_resume: req.auto_resume as boolean | undefined,
        ttl_action: req.ttl_action as string | undefined,
      });
      return this.view(sid);
    });
    return { status: 201, json: { sandboxes: made } };
  }

  private list(params: URLSearchParams): Answer {
    const filters = parseFilters(params);
    if (!Array.isArray(filters)) return filters;
    const matching = [...this.sandboxes.keys()].filter((sid) =>
      filters.every(([k, v]) => this.metadata.get(sid)?.[k] === v),
    );
    return { status: 200, json: { sandboxes: matching.map((sid) => this.view(sid)) } };
  }

  /** Parent and child, or two children of one branch point: the simple trees. */
  private commonPoint(a: string, b: string): string | undefined {
    for (const [x, y] of [
      [a, b],
      [b, a],
    ] as const) {
      const o = this.origin.get(y);
      if (o && o[0] === x) return o[1];
    }
    const [oa, ob] = [this.origin.get(a), this.origin.get(b)];
    return oa && ob && oa[1] === ob[1] ? oa[1] : undefined;
  }

  private merge(sid: string, req: Record<string, unknown>): Answer {
    const src = String(req.from);
    const onConflict = (req.on_conflict as string | undefined) ?? "fail";
    const theirs = this.sandboxes.get(src);
    if (!theirs) return failure(404, "not_found", `sandbox "${src}" not found`);
    const point = this.commonPoint(sid, src);
    if (point === undefined) return failure(409, "conflict", `${sid} and ${src} are not of one tree`);
    const base = this.points.get(point);
    if (!base) return failure(409, "conflict", `the common state of ${sid} and ${src} (${point}) was not saved`);
    const dirs = ((req.paths as string[] | undefined) ?? ["/root"]).map((p) => p.replace(/\/+$/, "")).sort();
    const ours = this.sandboxes.get(sid)!;
    const changes: { path: string; action: string; kind: string; size: number }[] = [];
    const conflicts: Record<string, string>[] = [];
    const take = new Map<string, string | undefined>();
    const did = (before?: string, after?: string) =>
      before === undefined ? "added" : after === undefined ? "removed" : "modified";
    for (const path of [...new Set([...base.keys(), ...theirs.keys()])].sort()) {
      if (!dirs.some((d) => path.startsWith(`${d}/`))) continue;
      const [b, o, t] = [base.get(path), ours.get(path), theirs.get(path)];
      if (t === b || t === o) continue; // theirs did not change it, or both made the same change
      if (o !== b) {
        conflicts.push({
          path,
          ours: did(b, o),
          theirs: did(b, t),
          ...(onConflict === "fail" ? {} : { resolution: onConflict }),
        });
        if (onConflict !== "theirs") continue;
      }
      take.set(path, t);
      const action = t === undefined ? "remove" : b === undefined ? "add" : "modify";
      changes.push({ path, action, kind: "file", size: t?.length ?? 0 });
    }
    const applied = !(onConflict === "fail" && conflicts.length > 0) && req.dry_run !== true && take.size > 0;
    if (applied) {
      for (const [path, text] of take) {
        if (text === undefined) ours.delete(path);
        else ours.set(path, text);
      }
    }
    const report = {
      sandbox: sid,
      from: src,
      base: point,
      paths: dirs,
      applied,
      changes,
      conflicts,
      skipped: [],
      bytes_copied: applied ? changes.reduce((n, c) => n + c.size, 0) : 0,
      duration_ms: 1,
    };
    return { status: 200, json: report };
  }
}

export class FakeDaemon {
  responses: ScriptedResponse[] = [];
  requests: Recorded[] = [];
  files: FakeFiles | undefined;
  /** Background processes (fake-processes.ts): it writes its answers itself. */
  processes: { answer(method: string, path: string, query: URLSearchParams, body: Buffer, res: ServerResponse): boolean; stop(): void } | undefined;
  /** Images, snapshots and packs (fake-oci.ts): an answer, or undefined to let the others answer. */
  oci:
    | { answer(method: string, path: string, query: Record<string, string>, body: Buffer): ScriptedResponse | undefined }
    | undefined;
  private scripted = 0;
  private server: Server | undefined;

  get url(): string {
    const addr = this.server?.address() as AddressInfo;
    return `http://127.0.0.1:${addr.port}`;
  }

  /** Script the next exchanges (and forget earlier requests). */
  load(responses: ScriptedResponse[]): void {
    this.responses = [...responses];
    this.requests = [];
    this.scripted = 0;
  }

  async start(): Promise<this> {
    this.server = createServer((req, res) => {
      const chunks: Buffer[] = [];
      req.on("data", (c: Buffer) => chunks.push(c));
      req.on("end", () => this.handle(req, Buffer.concat(chunks), res));
    });
    await new Promise<void>((resolve) => this.server!.listen(0, "127.0.0.1", resolve));
    return this;
  }

  private handle(req: IncomingMessage, body: Buffer, res: ServerResponse): void {
    const url = new URL(req.url ?? "/", "http://fake");
    this.requests.push({
      method: req.method ?? "",
      path: url.pathname,
      query: Object.fromEntries(url.searchParams),
      headers: req.headers,
      body,
      rawQuery: url.search.replace(/^\?/, ""),
    });
    if (this.processes?.answer(req.method ?? "", url.pathname, url.searchParams, body, res)) return;
    const oci = this.oci?.answer(req.method ?? "", url.pathname, Object.fromEntries(url.searchParams), body);
    if (oci) {
      this.respond(res, oci);
      return;
    }
    const modelled = this.files?.answer(
      req.method ?? "",
      url.pathname,
      Object.fromEntries(url.searchParams),
      body,
      url.searchParams,
    );
    if (modelled) {
      if (modelled.bytes) {
        res.writeHead(modelled.status, { "content-type": "application/octet-stream" });
        res.end(modelled.bytes);
      } else if (modelled.json === undefined) {
        res.writeHead(modelled.status);
        res.end();
      } else {
        res.writeHead(modelled.status, { "content-type": "application/json" });
        res.end(JSON.stringify(modelled.json));
      }
      return;
    }
    const r = this.responses[this.scripted++];
    if (!r) {
      res.writeHead(599, { "content-type": "application/json" });
      res.end(JSON.stringify({ error: { code: "fake_exhausted", message: "unexpected request" } }));
      return;
    }
    this.respond(res, r);
  }

  private respond(res: ServerResponse, r: ScriptedResponse): void {
    if (r.chunks) {
      res.writeHead(r.status, { "content-type": r.content_type ?? "application/octet-stream" });
      for (const c of r.chunks) res.write(c);
      if (r.cut) {
        // Broken off once what was written is out: the client sees the body end early.
        res.write("", () => setTimeout(() => res.socket?.destroy(), 50));
        return;
      }
      res.end();
    } else if (r.ndjson) {
      // One event per chunk, as the daemon streams them.
      res.writeHead(r.status, { "content-type": "application/x-ndjson" });
      for (const ev of r.ndjson) res.write(JSON.stringify(ev) + "\n");
      res.end();
    } else if (r.json !== undefined) {
      res.writeHead(r.status, { "content-type": "application/json" });
      res.end(JSON.stringify(r.json));
    } else if (r.body_text !== undefined) {
      res.writeHead(r.status, { "content-type": r.content_type ?? "text/plain" });
      res.end(r.body_text);
    } else if (r.body_base64 !== undefined) {
      res.writeHead(r.status, { "content-type": r.content_type ?? "application/octet-stream" });
      res.end(Buffer.from(r.body_base64, "base64"));
    } else {
      res.writeHead(r.status);
      res.end();
    }
  }

  async stop(): Promise<void> {
    this.processes?.stop();
    this.server?.closeAllConnections();
    await new Promise<void>((resolve) => (this.server ? this.server.close(() => resolve()) : resolve()));
  }
}
