/** runCode and code contexts (issue 37) against the scripted fake daemon: the request
 * sent, events to callbacks and an Execution, errors. No VM involved. */
import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";

import { Client, NotFoundError, Result, Sandbox, ServerError, Unsupported } from "../dist/index.js";
import { FakeDaemon } from "./fake-daemon.js";

const SID = "sb-aaaaaaaaaaaa";
const EVENTS = [
  { type: "stdout", text: "hi\n" },
  { type: "result", main: false, data: { "image/png": "iVBORw0KGgo=", "text/plain": "<Figure>" } },
  { type: "result", main: true, data: { "text/plain": "42" } },
  { type: "done", execution_count: 3 },
];

describe("runCode", () => {
  const fake = new FakeDaemon();
  before(() => fake.start());
  after(() => fake.stop());

  test("sends the request and gathers the execution", async () => {
    fake.load([{ status: 200, ndjson: EVENTS }]);
    const sb = new Sandbox(SID, new Client({ url: fake.url, token: "t" }));
    const out: string[] = [];
    const results: Result[] = [];
    const ex = await sb.runCode("print('hi')\n42", {
      context: "c1",
      timeoutMs: 5000,
      envs: { ZYG_A: "1" },
      onStdout: (t) => out.push(t),
      onResult: (r) => results.push(r),
    });
    assert.equal(fake.requests[0]!.path, `/v1/sandboxes/${SID}/code`);
    assert.deepEqual(JSON.parse(fake.requests[0]!.body.toString("utf8")), {
      code: "print('hi')\n42",
      language: "python",
      context: "c1",
      timeout_ms: 5000,
      envs: { ZYG_A: "1" },
    });
    assert.deepEqual(out, ["hi\n"]);
    assert.equal(results.length, 2);
    assert.equal(results[0]!.png, "iVBORw0KGgo=");
    assert.equal(ex.text, "42");
    assert.equal(ex.executionCount, 3);
    assert.equal(ex.error, undefined);
  });

  test("errors, broken streams and refusals", async () => {
    fake.load([
      {
        status: 200,
        ndjson: [
          { type: "error", name: "ZeroDivisionError", value: "division by zero", traceback: ["t"] },
          { type: "done", execution_count: 1 },
        ],
      },
      { status: 200, ndjson: [{ type: "stdout", text: "x" }] },
      { status: 404, json: { error: { code: "code_context_not_found", message: "no code context" } } },
      { status: 422, json: { error: { code: "no_code_interpreter", message: "no interpreter" } } },
    ]);
    const sb = new Sandbox(SID, new Client({ url: fake.url, token: "t" }));
    const ex = await sb.runCode("1/0", { envs: {} });
    assert.equal(JSON.parse(fake.requests.at(-1)!.body.toString("utf8")).envs, undefined, "empty envs are not sent");
    assert.equal(ex.error?.name, "ZeroDivisionError");
    await assert.rejects(sb.runCode("print('x')"), ServerError);
    await assert.rejects(sb.runCode("1", { context: "gone" }), NotFoundError);
    await assert.rejects(sb.runCode("1"), Unsupported);
  });

  test("contexts", async () => {
    const ctx = { id: "abc", language: "python", cwd: "/home/user" };
    fake.load([{ status: 201, json: ctx }, { status: 200, json: { contexts: [ctx] } }, { status: 204 }, { status: 204 }]);
    const sb = new Sandbox(SID, new Client({ url: fake.url, token: "t" }));
    assert.deepEqual(await sb.createCodeContext("/home/user"), ctx);
    assert.deepEqual(await sb.listCodeContexts(), [ctx]);
    await sb.restartCodeContext(ctx);
    await sb.removeCodeContext("abc");
    const base = `/v1/sandboxes/${SID}/code/contexts`;
    assert.deepEqual(
      fake.requests.map((r) => [r.method, r.path]),
      [
        ["POST", base],
        ["GET", base],
        ["POST", `${base}/abc/restart`],
        ["DELETE", `${base}/abc`],
      ],
    );
  });
});
