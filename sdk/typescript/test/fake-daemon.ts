/**
 * A scripted stand-in for zygoted: answers requests with a test-vector
 * case's responses in order and records what it was sent.
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
}

export interface Recorded {
  method: string;
  path: string;
  query: Record<string, string>;
  headers: IncomingMessage["headers"];
  body: Buffer;
}

export class FakeDaemon {
  responses: ScriptedResponse[] = [];
  requests: Recorded[] = [];
  private server: Server | undefined;

  get url(): string {
    const addr = this.server?.address() as AddressInfo;
    return `http://127.0.0.1:${addr.port}`;
  }

  /** Script the next exchanges (and forget earlier requests). */
  load(responses: ScriptedResponse[]): void {
    this.responses = [...responses];
    this.requests = [];
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
    });
    const r = this.responses[this.requests.length - 1];
    if (!r) {
      res.writeHead(599, { "content-type": "application/json" });
      res.end(JSON.stringify({ error: { code: "fake_exhausted", message: "unexpected request" } }));
      return;
    }
    if (r.ndjson) {
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
    this.server?.closeAllConnections();
    await new Promise<void>((resolve) => (this.server ? this.server.close(() => resolve()) : resolve()));
  }
}
