// The daemon's REST API as the console uses it: the token goes in `Authorization` (and,
// for the pty WebSocket, as the `zygote.bearer.` subprotocol), never in a URL.

// The daemon's JSON is mapped by the TypeScript SDK's models (one mapping for both).
import {
  diffFromJson,
  egressFromJson,
  eventFromJson,
  fileEntryFromJson,
  keepFromJson,
  metricFromJson,
  processFromJson,
  processOutputFromJson,
  sandboxFromJson,
  treeFromJson,
  type EgressEntry,
  type FileEntry,
  type KeepResult,
  type MetricSample,
  type ProcessInfo,
  type ProcessOutput,
  type SandboxDiff,
  type SandboxEvent,
  type SandboxInfo,
  type SandboxTree,
  type TreeNode,
} from "../../sdk/typescript/src/models";

export type {
  EgressEntry,
  FileEntry,
  MetricSample,
  ProcessInfo,
  ProcessOutput,
  SandboxDiff,
  SandboxEvent,
  SandboxInfo,
  SandboxTree,
  TreeNode,
};

type Json = Record<string, unknown>;

/** An answer other than 2xx, with the API's error code when it sent one. */
export class ApiError extends Error {
  constructor(
    readonly status: number,
    readonly code: string,
    message: string,
  ) {
    super(message);
  }
}

const TOKEN_KEY = "zygote.token";

/** The token of this tab's session (sessionStorage: this tab only, gone when it closes). */
export function savedToken(): string | null {
  return sessionStorage.getItem(TOKEN_KEY);
}

export function saveToken(token: string | null): void {
  if (token === null) sessionStorage.removeItem(TOKEN_KEY);
  else sessionStorage.setItem(TOKEN_KEY, token);
}

export class Api {
  /** Called when the daemon refuses the token (401): the console logs out. */
  onUnauthorized: () => void = () => {};

  constructor(readonly token: string) {}

  async request(method: string, path: string, body?: BodyInit, type?: string, signal?: AbortSignal): Promise<Response> {
    const headers: Record<string, string> = { Authorization: `Bearer ${this.token}` };
    if (type) headers["Content-Type"] = type;
    const resp = await fetch(path, { method, headers, body, cache: "no-store", signal });
    if (resp.ok) return resp;
    let code = "";
    let message = `${method} ${path}: HTTP ${resp.status}`;
    try {
      const err = (await resp.json()) as { error?: { code?: string; message?: string } };
      code = err.error?.code ?? "";
      if (err.error?.message) message = err.error.message;
    } catch {
      // not JSON: the status says enough
    }
    if (resp.status === 401) this.onUnauthorized();
    throw new ApiError(resp.status, code, message);
  }

  async json<T>(method: string, path: string, body?: unknown): Promise<T> {
    const resp = await this.request(
      method,
      path,
      body === undefined ? undefined : JSON.stringify(body),
      body === undefined ? undefined : "application/json",
    );
    const text = await resp.text();
    return (text ? JSON.parse(text) : null) as T;
  }

  get<T>(path: string): Promise<T> {
    return this.json<T>("GET", path);
  }

  async sandboxes(): Promise<SandboxInfo[]> {
    return (await this.get<{ sandboxes: Json[] }>("/v1/sandboxes")).sandboxes.map(sandboxFromJson);
  }

  async sandbox(id: string): Promise<SandboxInfo> {
    return sandboxFromJson(await this.get(`/v1/sandboxes/${enc(id)}`));
  }

  async tree(id: string): Promise<SandboxTree> {
    return treeFromJson(await this.get(`/v1/sandboxes/${enc(id)}/tree`));
  }

  /** One sandbox from `image`; the daemon answers once it runs (a SandboxList of one). */
  async create(image: string): Promise<SandboxInfo> {
    const list = await this.json<{ sandboxes: Json[] }>("POST", "/v1/sandboxes", { image });
    return sandboxFromJson(list.sandboxes[0]);
  }

  async branch(id: string, count: number): Promise<{ children: string[] }> {
    return this.json("POST", `/v1/sandboxes/${enc(id)}/branch`, { count });
  }

  async keep(id: string, promote: boolean): Promise<KeepResult> {
    return keepFromJson(await this.json("POST", `/v1/sandboxes/${enc(id)}/keep`, { promote }));
  }

  async remove(id: string): Promise<void> {
    await this.request("DELETE", `/v1/sandboxes/${enc(id)}`);
  }

  async processes(id: string): Promise<ProcessInfo[]> {
    const list = await this.get<{ processes: Json[] }>(`/v1/sandboxes/${enc(id)}/processes`);
    return list.processes.map(processFromJson);
  }

  /** Output from `offset`; with `waitMs`, the daemon holds the answer until there is some. */
  async output(id: string, pid: number, offset = 0, waitMs = 0, signal?: AbortSignal): Promise<ProcessOutput> {
    const q = new URLSearchParams({ offset: String(offset), wait_ms: String(waitMs) });
    const resp = await this.request("GET", `/v1/sandboxes/${enc(id)}/processes/${pid}/output?${q}`, undefined, undefined, signal);
    return processOutputFromJson((await resp.json()) as Json);
  }

  /** How `id`'s files under `path` differ from `against`'s, with unified text diffs. */
  async diff(id: string, against: string, path = "/root"): Promise<SandboxDiff> {
    const q = new URLSearchParams({ against, path, content: "true" });
    return diffFromJson(await this.get(`/v1/sandboxes/${enc(id)}/diff?${q}`));
  }

  async egress(id: string): Promise<EgressEntry[]> {
    const list = await this.get<{ entries: Json[] }>(`/v1/sandboxes/${enc(id)}/egress`);
    return list.entries.map(egressFromJson);
  }

  async list(id: string, path: string): Promise<FileEntry[]> {
    const q = new URLSearchParams({ path });
    const dir = await this.get<{ entries: Json[] }>(`/v1/sandboxes/${enc(id)}/files/list?${q}`);
    return dir.entries.map(fileEntryFromJson);
  }

  async download(id: string, path: string): Promise<Blob> {
    const q = new URLSearchParams({ path });
    return (await this.request("GET", `/v1/sandboxes/${enc(id)}/files?${q}`)).blob();
  }

  async upload(id: string, path: string, data: Blob): Promise<void> {
    const q = new URLSearchParams({ path });
    await this.request("PUT", `/v1/sandboxes/${enc(id)}/files?${q}`, data, "application/octet-stream");
  }

  async metrics(id: string): Promise<MetricSample[]> {
    const list = await this.get<{ metrics: Json[] }>(`/v1/sandboxes/${enc(id)}/metrics`);
    return list.metrics.map(metricFromJson);
  }

  async events(id: string, limit = 200): Promise<SandboxEvent[]> {
    const q = new URLSearchParams({ order: "desc", limit: String(limit) });
    const list = await this.get<{ events: Json[] }>(`/v1/sandboxes/${enc(id)}/events?${q}`);
    return list.events.map(eventFromJson);
  }

  /** The pty WebSocket: the token rides as a subprotocol (browsers cannot set headers). */
  pty(id: string, cols: number, rows: number): WebSocket {
    const scheme = location.protocol === "https:" ? "wss:" : "ws:";
    const q = new URLSearchParams({ cols: String(cols), rows: String(rows) });
    const url = `${scheme}//${location.host}/v1/sandboxes/${enc(id)}/pty?${q}`;
    const ws = new WebSocket(url, ["zygote.pty.v1", `zygote.bearer.${this.token}`]);
    ws.binaryType = "arraybuffer";
    return ws;
  }
}

/**
 * Host bytes of the sandbox's own writable disk layer (`disk_bytes`), null when the
 * daemon does not know or does not say. Read from the raw JSON: the SDK's mapper keeps it
 * only there.
 */
export function diskBytes(s: SandboxInfo): number | null {
  const v = s.raw.disk_bytes;
  return typeof v === "number" ? v : null;
}

/** The sandbox's newest metrics sample (`metrics` in the list), if the daemon gave one. */
export function latestMetrics(s: SandboxInfo): MetricSample | null {
  const v = s.raw.metrics;
  return v && typeof v === "object" ? metricFromJson(v as Json) : null;
}

function enc(s: string): string {
  return encodeURIComponent(s);
}

/** Exchanges a one-time login code (from `zygote ui`) for the token; null if refused. */
export async function redeemCode(code: string): Promise<string | null> {
  const resp = await fetch("/ui/login", {
    method: "POST",
    headers: { "Content-Type": "application/json" },
    body: JSON.stringify({ code }),
    cache: "no-store",
  });
  if (!resp.ok) return null;
  return ((await resp.json()) as { token: string }).token;
}

/** Whether the daemon takes `token` (a cheap authenticated call). */
export async function tokenWorks(token: string): Promise<boolean> {
  const resp = await fetch("/v1/info", {
    headers: { Authorization: `Bearer ${token}` },
    cache: "no-store",
  });
  return resp.ok;
}
