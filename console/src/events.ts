// The daemon-wide event stream (`GET /v1/events`, Server-Sent Events). EventSource cannot
// send an Authorization header, and the token must not go in a URL, so the stream is read
// with fetch and a ReadableStream reader and parsed here (SseParser: the WHATWG
// event-stream format, fed arbitrary chunks). EventStream keeps one connection open,
// reconnects with backoff (sending Last-Event-ID) and says when views must reload fully:
// after a reconnect, and on a `lagged` message (events were lost).

/** One dispatched message of an event stream. */
export interface SseMessage {
  /** `event:` field, "message" when absent. */
  event: string;
  /** The `data:` lines joined by "\n". */
  data: string;
  /** The last `id:` seen on this stream (it carries over to later messages). */
  id: string;
}

/**
 * An incremental parser of `text/event-stream`: `push` any piece of the decoded text
 * (lines may be split anywhere, CRLF across two pieces included) and get the messages it
 * completed. Comments (`: keep-alive`) are skipped; `retry:` is read into `retryMs`.
 */
export class SseParser {
  private buffer = "";
  /** The previous piece ended in "\r": a "\n" starting the next one belongs to it. */
  private afterCr = false;
  private data: string[] = [];
  private event = "";
  private lastId = "";
  retryMs: number | null = null;

  push(chunk: string): SseMessage[] {
    const out: SseMessage[] = [];
    let text = chunk;
    if (this.afterCr && text.startsWith("\n")) text = text.slice(1);
    this.afterCr = false;
    this.buffer += text;
    let start = 0;
    for (;;) {
      const cr = this.buffer.indexOf("\r", start);
      const lf = this.buffer.indexOf("\n", start);
      if (cr < 0 && lf < 0) break;
      const end = cr < 0 ? lf : lf < 0 ? cr : Math.min(cr, lf);
      const line = this.buffer.slice(start, end);
      if (this.buffer[end] === "\r") {
        if (end + 1 === this.buffer.length) {
          this.afterCr = true;
          start = end + 1;
        } else {
          start = this.buffer[end + 1] === "\n" ? end + 2 : end + 1;
        }
      } else {
        start = end + 1;
      }
      const message = this.line(line);
      if (message) out.push(message);
    }
    this.buffer = this.buffer.slice(start);
    return out;
  }

  /** The id to send as Last-Event-ID when reconnecting ("" before any). */
  get lastEventId(): string {
    return this.lastId;
  }

  private line(line: string): SseMessage | null {
    if (line === "") return this.dispatch();
    if (line.startsWith(":")) return null;
    const colon = line.indexOf(":");
    const field = colon < 0 ? line : line.slice(0, colon);
    let value = colon < 0 ? "" : line.slice(colon + 1);
    if (value.startsWith(" ")) value = value.slice(1);
    switch (field) {
      case "data":
        this.data.push(value);
        break;
      case "event":
        this.event = value;
        break;
      case "id":
        if (!value.includes("\0")) this.lastId = value;
        break;
      case "retry":
        if (/^\d+$/.test(value)) this.retryMs = Number(value);
        break;
      default:
        break;
    }
    return null;
  }

  private dispatch(): SseMessage | null {
    const data = this.data;
    const event = this.event;
    this.data = [];
    this.event = "";
    if (data.length === 0) return null;
    return { event: event || "message", data: data.join("\n"), id: this.lastId };
  }
}

/** An event of one sandbox, as the stream carries it. */
export interface LiveEvent {
  /** `<epoch>-<seq>`. */
  id: string;
  sandbox: string;
  tsMs: number;
  level: string;
  message: string;
  fields: Record<string, string>;
}

/** The connection's state, for the indicator in the header. */
export type StreamState = "connecting" | "live" | "reconnecting" | "stopped";

export interface StreamHandlers {
  event(e: LiveEvent): void;
  /** Events may have been missed (a reconnect, or `lagged`): reload everything shown. */
  reload(why: string): void;
  state(s: StreamState, detail: string): void;
  /** The daemon refused the token. */
  unauthorized(): void;
}

/** No byte for this long (keep-alives come every 15 s): the connection is dead. */
const SILENCE_MS = 45_000;
const BACKOFF_FIRST_MS = 500;
const BACKOFF_MAX_MS = 15_000;

export function liveEventFromJson(d: Record<string, unknown>): LiveEvent {
  const fields: Record<string, string> = {};
  if (d.fields && typeof d.fields === "object") {
    for (const [k, v] of Object.entries(d.fields as Record<string, unknown>)) fields[k] = String(v);
  }
  return {
    id: String(d.id ?? ""),
    sandbox: String(d.sandbox ?? ""),
    tsMs: Number(d.ts_ms ?? 0),
    level: String(d.level ?? "info"),
    message: String(d.message ?? ""),
    fields,
  };
}

/**
 * The daemon-wide stream, kept open until `stop`: reads `/v1/events` with the token in
 * the Authorization header, reconnects after an error with a doubling delay (0.5 s up to
 * 15 s; back to 0.5 s once a connection is live) and Last-Event-ID.
 */
export class EventStream {
  private abort: AbortController | null = null;
  private stopped = false;
  private lastId = "";
  private connectedOnce = false;
  private backoffMs = BACKOFF_FIRST_MS;
  private retryTimer: ReturnType<typeof setTimeout> | undefined;

  constructor(
    private readonly token: string,
    private readonly handlers: StreamHandlers,
    private readonly url = "/v1/events",
  ) {}

  start(): void {
    this.stopped = false;
    void this.run();
  }

  stop(): void {
    this.stopped = true;
    clearTimeout(this.retryTimer);
    this.abort?.abort();
    this.handlers.state("stopped", "");
  }

  private async run(): Promise<void> {
    while (!this.stopped) {
      this.handlers.state(this.connectedOnce ? "reconnecting" : "connecting", "");
      let why: string;
      try {
        why = await this.connect();
      } catch (e) {
        why = e instanceof Error ? e.message : String(e);
      }
      if (this.stopped) return;
      this.handlers.state("reconnecting", `${why}; again in ${(this.backoffMs / 1000).toFixed(1)} s`);
      await new Promise<void>((resolve) => {
        this.retryTimer = setTimeout(resolve, this.backoffMs);
      });
      this.backoffMs = Math.min(this.backoffMs * 2, BACKOFF_MAX_MS);
    }
  }

  /** One connection, until it ends; returns why it ended. */
  private async connect(): Promise<string> {
    const abort = new AbortController();
    this.abort = abort;
    const headers: Record<string, string> = { Authorization: `Bearer ${this.token}`, Accept: "text/event-stream" };
    if (this.lastId) headers["Last-Event-ID"] = this.lastId;
    let silence: ReturnType<typeof setTimeout> | undefined;
    let silent = false;
    const arm = () => {
      clearTimeout(silence);
      silence = setTimeout(() => {
        silent = true;
        abort.abort();
      }, SILENCE_MS);
    };
    arm();
    try {
      const resp = await fetch(this.url, { headers, cache: "no-store", signal: abort.signal });
      if (resp.status === 401) {
        this.stopped = true;
        this.handlers.state("stopped", "the daemon refused the token");
        this.handlers.unauthorized();
        return "unauthorized";
      }
      if (!resp.ok || !resp.body) return `HTTP ${resp.status}`;
      const parser = new SseParser();
      const decoder = new TextDecoder();
      const reader = resp.body.getReader();
      for (;;) {
        const { done, value } = await reader.read();
        if (done) return "the daemon closed the stream";
        arm();
        for (const m of parser.push(decoder.decode(value, { stream: true }))) this.message(m);
      }
    } catch (e) {
      if (silent) return `nothing heard for ${SILENCE_MS / 1000} s`;
      throw e;
    } finally {
      clearTimeout(silence);
      abort.abort();
    }
  }

  private message(m: SseMessage): void {
    if (m.id) this.lastId = m.id;
    let data: Record<string, unknown>;
    try {
      data = JSON.parse(m.data) as Record<string, unknown>;
    } catch {
      return;
    }
    switch (m.event) {
      case "ready": {
        const again = this.connectedOnce;
        this.connectedOnce = true;
        this.backoffMs = BACKOFF_FIRST_MS;
        this.handlers.state("live", "");
        if (again) this.handlers.reload("reconnected");
        break;
      }
      case "lagged":
        this.handlers.reload(`missed ${String(data.missed ?? "some")} events`);
        break;
      case "sandbox":
        this.handlers.event(liveEventFromJson(data));
        break;
      default:
        break;
    }
  }
}
