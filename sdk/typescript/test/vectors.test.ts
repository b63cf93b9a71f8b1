/**
 * The shared test vectors (sdk/test-vectors.json) against the TypeScript
 * SDK, talking to a scripted fake daemon.
 */
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { after, before, describe, test } from "node:test";

import * as zygote from "../dist/index.js";
import { Client, Sandbox } from "../dist/index.js";
import { FakeDaemon, type ScriptedResponse } from "./fake-daemon.js";

interface Exchange {
  request: {
    method: string;
    path: string;
    query?: Record<string, string>;
    json?: unknown;
    body_text?: string;
    body_base64?: string;
  };
  response: ScriptedResponse;
}

interface Case {
  name: string;
  op: string;
  args: Record<string, any>;
  sandbox?: string;
  token?: string;
  exchanges: Exchange[];
  expect: {
    result?: unknown;
    error?: { type: string; code: string; status?: number; result?: unknown };
    stdout_chunks?: string[];
    stderr_chunks?: string[];
  };
}

const VECTORS = JSON.parse(readFileSync(new URL("../../test-vectors.json", import.meta.url), "utf8")) as {
  token: string;
  ops: Record<string, string>;
  cases: Case[];
};

/** SDK results in the vectors' snake_case (dropping the raw daemon object). */
function snake(value: unknown): unknown {
  if (Array.isArray(value)) return value.map(snake);
  if (value && typeof value === "object") {
    return Object.fromEntries(
      Object.entries(value)
        .filter(([k]) => k !== "raw")
        .map(([k, v]) => [k.replace(/[A-Z]/g, (c) => `_${c.toLowerCase()}`), snake(v)]),
    );
  }
  return value;
}

/** Every field the vector lists must be present and equal; lists match element-wise. */
function assertSubset(expected: unknown, actual: unknown, where = "result"): void {
  if (Array.isArray(expected)) {
    assert.ok(Array.isArray(actual) && actual.length === expected.length, `${where}: ${JSON.stringify(actual)}`);
    expected.forEach((e, i) => assertSubset(e, (actual as unknown[])[i], `${where}[${i}]`));
  } else if (expected && typeof expected === "object") {
    assert.ok(actual && typeof actual === "object", `${where}: expected an object, got ${JSON.stringify(actual)}`);
    for (const [k, v] of Object.entries(expected)) {
      assert.ok(k in (actual as object), `${where}: missing ${k} in ${JSON.stringify(actual)}`);
      assertSubset(v, (actual as Record<string, unknown>)[k], `${where}.${k}`);
    }
  } else {
    assert.deepEqual(actual, expected, where);
  }
}

async function callOp(c: Case, client: Client, chunks: { stdout: string[]; stderr: string[] }): Promise<unknown> {
  const a = c.args;
  const sb = c.sandbox ? new Sandbox(c.sandbox, client) : undefined;
  switch (c.op) {
    case "create":
      return {
        id: (
          await Sandbox.create({
            client,
            image: a.image,
            memoryMib: a.memory_mib,
            name: a.name,
            limits: a.limits,
            ttlSecs: a.ttl_secs,
            network: a.network,
            allowOut: a.allow_out,
            denyOut: a.deny_out,
            metadata: a.metadata,
            autoResume: a.auto_resume,
            ttlAction: a.ttl_action,
          })
        ).id,
      };
    case "connect":
      return { id: (await Sandbox.connect(a.id, { client })).id };
    case "list":
      return { ids: (await Sandbox.list({ client, metadata: a.metadata })).map((s) => s.id) };
    case "restore":
      return { id: (await Sandbox.restore(a.snapshot, { client })).id };
    case "delete_snapshot":
      await client.deleteSnapshot(a.snapshot);
      return {};
  }
  assert.ok(sb, `op ${c.op} needs a sandbox`);
  switch (c.op) {
    case "info":
      return sb.info();
    case "run":
      return sb.commands.run(a.cmd, {
        timeoutMs: a.timeout * 1000,
        env: a.env,
        cwd: a.cwd,
        stdin: a.stdin,
        check: a.check,
        onStdout: (t) => void chunks.stdout.push(t),
        onStderr: (t) => void chunks.stderr.push(t),
      });
    case "write":
      return sb.files.write(a.path, a.data, { mode: a.mode });
    case "read":
      return { text: await sb.files.read(a.path) };
    case "list_files":
      return { entries: await sb.files.list(a.path) };
    case "branch":
      return {
        ids: (await sb.branch({ n: a.n, ttlSecs: a.ttl_secs, allowPartial: a.allow_partial })).map((s) => s.id),
      };
    case "branch_detailed":
      return sb.branchDetailed({ n: a.n, ttlSecs: a.ttl_secs });
    case "branch_progress": {
      const progress: Record<string, unknown>[] = [];
      const kids = await sb.branch({
        n: a.n,
        allowPartial: a.allow_partial,
        onProgress: (p) => {
          // The handle is checked here; the vectors list the rest.
          if (p.ok) assert.ok(p.sandbox instanceof Sandbox && p.sandbox.id === p.sandboxId, p.sandboxId);
          else assert.equal(p.sandbox, null);
          const { sandbox: _handle, ...fields } = p;
          progress.push(fields);
        },
      });
      return { ids: kids.map((s) => s.id), progress };
    }
    case "set_ttl":
      return sb.setTtl(a.ttl_secs, { ttlAction: a.ttl_action });
    case "pause":
      return sb.pause();
    case "resume":
      return sb.resume();
    case "expose_port":
      return sb.exposePort(a.port, { public: a.public });
    case "ports":
      return { ports: await sb.ports() };
    case "unexpose_port":
      await sb.unexposePort(a.port);
      return {};
    case "get_host":
      return { host: await sb.getHost(a.port) };
    case "snapshot":
      return sb.snapshot({ mode: a.mode, name: a.name });
    case "rollback":
      return sb.rollback(a.snapshot);
    case "kill":
      return { killed: await sb.kill() };
  }
  throw new Error(`unknown op ${c.op}`);
}

function checkRequests(c: Case, fake: FakeDaemon): void {
  const want = c.exchanges.map((x) => x.request);
  const got = fake.requests;
  assert.equal(got.length, want.length, `made ${got.map((r) => `${r.method} ${r.path}`).join(", ")}`);
  const token = c.token ?? VECTORS.token;
  want.forEach((w, i) => {
    const r = got[i]!;
    assert.deepEqual([r.method, r.path], [w.method, w.path], `request ${i}`);
    assert.equal(r.headers.authorization, `Bearer ${token}`, `request ${i} auth`);
    assert.deepEqual(r.query, w.query ?? {}, `request ${i} query`);
    if (w.json !== undefined) assert.deepEqual(JSON.parse(r.body.toString("utf8")), w.json, `request ${i} body`);
    else if (w.body_text !== undefined) assert.equal(r.body.toString("utf8"), w.body_text, `request ${i} body`);
    else if (w.body_base64 !== undefined) assert.equal(r.body.toString("base64"), w.body_base64, `request ${i} body`);
    else assert.equal(r.body.length, 0, `request ${i} has an unexpected body`);
  });
}

function checkOutcome(c: Case, outcome: unknown, chunks: { stdout: string[]; stderr: string[] }): void {
  const { error, result } = c.expect;
  if (error) {
    assert.ok(outcome instanceof zygote.ZygoteError, `expected ${error.type}, got ${JSON.stringify(outcome)}`);
    const cls = (zygote as unknown as Record<string, new (...a: never[]) => unknown>)[error.type];
    assert.ok(cls, `no error class ${error.type} in the SDK`);
    assert.ok(outcome instanceof cls, `expected ${error.type}, got ${outcome.name}: ${outcome.message}`);
    assert.equal(outcome.name, error.type);
    assert.equal(outcome.code, error.code);
    if (error.status !== undefined) assert.equal(outcome.status, error.status);
    if (error.result !== undefined) assertSubset(error.result, snake((outcome as zygote.CommandTimeout).result));
    return;
  }
  assert.ok(!(outcome instanceof Error), `unexpected error ${String(outcome)}`);
  assertSubset(result, snake(outcome));
  if (c.expect.stdout_chunks) assert.deepEqual(chunks.stdout, c.expect.stdout_chunks);
  if (c.expect.stderr_chunks) assert.deepEqual(chunks.stderr, c.expect.stderr_chunks);
}

describe("shared test vectors", () => {
  const fake = new FakeDaemon();
  before(() => fake.start());
  after(() => fake.stop());

  for (const c of VECTORS.cases) {
    test(c.name, async () => {
      fake.load(c.exchanges.map((x) => x.response));
      const client = new Client({ url: fake.url, token: c.token ?? VECTORS.token });
      const chunks = { stdout: [] as string[], stderr: [] as string[] };
      let outcome: unknown;
      try {
        outcome = await callOp(c, client, chunks);
      } catch (e) {
        if (!(e instanceof zygote.ZygoteError)) throw e;
        outcome = e;
      }
      checkRequests(c, fake);
      checkOutcome(c, outcome, chunks);
    });
  }

  test("every op in the vectors is exercised", () => {
    assert.deepEqual(new Set(VECTORS.cases.map((c) => c.op)), new Set(Object.keys(VECTORS.ops)));
  });
});
