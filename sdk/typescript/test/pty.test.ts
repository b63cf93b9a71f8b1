/** `sandbox.pty` against a fake pty endpoint (a `ws` server speaking the
 * daemon's protocol): query, token, subprotocol, output, input, resize,
 * refused control messages, exit, HTTP errors before the upgrade, kill. */
import assert from "node:assert/strict";
import { type IncomingMessage, createServer } from "node:http";
import type { AddressInfo } from "node:net";
import type { Duplex } from "node:stream";
import { after, before, describe, test } from "node:test";

import { WebSocketServer, type WebSocket } from "ws";

import { Client, InvalidArgument, Sandbox, SandboxNotFound, Unauthorized, ptyQuery } from "../dist/index.js";

const TOKEN = "t0k";

function refuse(socket: Duplex, status: number, code: string, message: string): void {
  const body = JSON.stringify({ error: { code, message } });
  socket.end(
    `HTTP/1.1 ${status} Error\r\nContent-Type: application/json\r\nContent-Length: ${Buffer.byteLength(body)}\r\nConnection: close\r\n\r\n${body}`,
  );
}

/** Echoes input, reports sizes, exits on "exit N". */
function terminal(ws: WebSocket, req: IncomingMessage): void {
  assert.equal(ws.protocol, "zygote.pty.v1");
  const q = new URL(req.url ?? "", "http://x").searchParams;
  ws.send(Buffer.from(`cmd=${q.getAll("cmd").join(",")} env=${q.getAll("env").join(",")} size=${q.get("cols")}x${q.get("rows")}\r\n`));
  ws.on("message", (data: Buffer, isBinary: boolean) => {
    if (!isBinary) {
      const m = JSON.parse(data.toString()) as { cols: number; rows: number };
      if (m.cols < 1 || m.rows < 1) ws.send(JSON.stringify({ type: "error", code: "invalid_argument", message: "bad size" }));
      else ws.send(Buffer.from(`resized ${m.cols}x${m.rows}\r\n`));
      return;
    }
    ws.send(data);
    const text = data.toString();
    if (text.startsWith("exit ")) {
      ws.send(JSON.stringify({ type: "exit", exit_code: Number(text.slice(5)), signal: null }));
      ws.close(1000, "exited");
    }
  });
}

describe("pty", () => {
  const server = createServer();
  const wss = new WebSocketServer({ noServer: true, handleProtocols: (p) => (p.has("zygote.pty.v1") ? "zygote.pty.v1" : false) });
  let url = "";
  before(async () => {
    server.on("upgrade", (req, socket, head) => {
      if (req.headers.authorization !== `Bearer ${TOKEN}`) return refuse(socket, 401, "unauthorized", "missing or wrong bearer token");
      if (!req.url?.startsWith("/v1/sandboxes/sb-1/")) return refuse(socket, 404, "not_found", 'sandbox "sb-x" not found');
      if (new URL(req.url, "http://x").searchParams.get("cols") === "0") return refuse(socket, 400, "invalid_argument", "cols must be in 1..=1000");
      wss.handleUpgrade(req, socket, head, (ws) => terminal(ws, req));
    });
    await new Promise<void>((r) => server.listen(0, "127.0.0.1", r));
    url = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
  });
  after(() => {
    wss.close();
    server.close();
  });

  const sandbox = (id = "sb-1", token = TOKEN) => new Sandbox(id, new Client({ url, token }));
  const until = async (chunks: Uint8Array[], needle: string) => {
    for (let i = 0; i < 500; i++) {
      if (Buffer.concat(chunks).toString().includes(needle)) return;
      await new Promise((r) => setTimeout(r, 10));
    }
    assert.fail(`${needle} not in ${Buffer.concat(chunks).toString()}`);
  };

  test("the query repeats cmd and env", () => {
    const q = new URLSearchParams(ptyQuery({ cols: 80, rows: 24, cmd: ["sh", "-c", "a&b"], env: { K: "v=1" }, cwd: "/tmp" }));
    assert.deepEqual(q.getAll("cmd"), ["sh", "-c", "a&b"]);
    assert.deepEqual(q.getAll("env"), ["K=v=1"]);
    assert.equal(q.get("cwd"), "/tmp");
    assert.equal(ptyQuery({ cols: 1, rows: 2 }), "cols=1&rows=2");
  });

  test("a session round trip", async () => {
    const chunks: Uint8Array[] = [];
    const term = await sandbox().pty.create({ cols: 100, rows: 30, onData: (d) => chunks.push(d), cmd: ["sh"], env: { A: "1" } });
    await until(chunks, "cmd=sh env=A=1 size=100x30");
    term.sendInput("echo hi\n");
    await until(chunks, "echo hi\n");
    term.resize(120, 40);
    await until(chunks, "resized 120x40");
    term.resize(0, 40);
    term.sendInput(new TextEncoder().encode("exit 3"));
    assert.deepEqual(await term.wait(), { exitCode: 3, signal: null });
    assert.deepEqual(
      term.errors.map((e) => e.code),
      ["invalid_argument"],
    );
  });

  test("errors before the upgrade", async () => {
    const noop = () => {};
    await assert.rejects(sandbox("sb-1", "wrong").pty.create({ cols: 80, rows: 24, onData: noop }), Unauthorized);
    await assert.rejects(sandbox("sb-x").pty.create({ cols: 80, rows: 24, onData: noop }), SandboxNotFound);
    await assert.rejects(sandbox().pty.create({ cols: 0, rows: 24, onData: noop }), InvalidArgument);
  });

  test("kill closes the terminal", async () => {
    const chunks: Uint8Array[] = [];
    const term = await sandbox().pty.create({ cols: 80, rows: 24, onData: (d) => chunks.push(d) });
    await until(chunks, "size=80x24");
    term.kill();
    await assert.rejects(term.wait(), /closed before its program ended/);
  });
});
