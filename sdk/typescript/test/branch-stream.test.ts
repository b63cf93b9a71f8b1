/** branch({ n, onProgress }): the streaming endpoint, against the fake daemon
 * (the shared vectors cover the usual answers; these the edges). */
import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";

import { BranchCollector, type BranchProgress, Client, Sandbox, ServerError } from "../dist/index.js";
import { FakeDaemon } from "./fake-daemon.js";

const PARENT = "sb-aaaaaaaaaaaa";
const KIDS = ["sb-c00000000001", "sb-c00000000002", "sb-c00000000003"];
const POINT = { type: "point", parent: PARENT, branch_point: "snap-b", pause_ms: 3, children: KIDS, ms: 5 };
const DONE = { type: "done", parent: PARENT, branch_point: "snap-b", children: KIDS, failed: [], duration_ms: 90 };
const child = (i: number, ms: number) => ({ type: "child", index: i, id: KIDS[i], ms });
const stream = (...lines: unknown[]) => ({ status: 200, ndjson: lines });

describe("streamed branch", () => {
  let fake: FakeDaemon;
  before(async () => {
    fake = await new FakeDaemon().start();
  });
  after(() => fake.stop());

  test("a child can be used from the callback while its siblings come up", async () => {
    const info = { status: 200, json: { id: KIDS[2], state: "running" } };
    fake.load([stream(POINT, child(2, 40), child(0, 50), child(1, 60), DONE), info]);
    const states: string[] = [];
    const sb = new Sandbox(PARENT, new Client({ url: fake.url, token: "t" }));
    const kids = await sb.branch({
      n: 3,
      onProgress: async (p: BranchProgress<Sandbox>) => {
        if (p.ready === 1) states.push((await p.sandbox!.info()).state);
      },
    });
    assert.deepEqual(kids.map((k) => k.id), KIDS);
    assert.deepEqual(states, ["running"]);
    assert.deepEqual(JSON.parse(fake.requests[0]!.body.toString("utf8")), { count: 3, stream: true });
    assert.deepEqual([fake.requests[1]!.method, fake.requests[1]!.path], ["GET", `/v1/sandboxes/${KIDS[2]}`]);
  });

  test("a callback that throws rejects the call", async () => {
    fake.load([stream(POINT, child(0, 40), child(1, 50), child(2, 60), DONE)]);
    const sb = new Sandbox(PARENT, new Client({ url: fake.url, token: "t" }));
    const boom = new Error("stop");
    await assert.rejects(
      sb.branch({
        n: 3,
        onProgress: () => {
          throw boom;
        },
      }),
      (e) => e === boom,
    );
  });

  test("a stream without a summary is a server error", async () => {
    fake.load([stream(POINT, child(0, 40))]);
    const sb = new Sandbox(PARENT, new Client({ url: fake.url, token: "t" }));
    await assert.rejects(sb.branchDetailed({ n: 3, onProgress: () => undefined }), (e: unknown) => {
      assert.ok(e instanceof ServerError);
      assert.equal(e.code, "bad_response");
      return true;
    });
  });

  test("the collector skips unknown lines and refuses garbage", () => {
    const col = new BranchCollector<string>(3, (id) => id.toUpperCase());
    assert.equal(col.feed(JSON.stringify(POINT)), null);
    assert.equal(col.feed(JSON.stringify({ type: "newer_kind" })), null);
    assert.equal(col.feed(""), null);
    const p = col.feed(JSON.stringify(child(1, 70)));
    assert.deepEqual([p?.index, p?.sandbox, p?.ready, p?.total, p?.ok], [1, KIDS[1]!.toUpperCase(), 1, 3, true]);
    assert.throws(() => col.feed("not json"), ServerError);
    col.feed(JSON.stringify(DONE));
    assert.deepEqual(col.result().children, KIDS);
  });
});
