/**
 * Watching a guest directory against a real zygoted and a real guest (ZYGOTE_URL /
 * ZYGOTE_TOKEN; scripts/sdk-test.sh starts one): changes as they happen with
 * relative names, recursion into a new directory, a missing directory, stop().
 */
import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";

import { Client, FileNotFound, Sandbox, type WatchEvent } from "../dist/index.js";

const URL = process.env.ZYGOTE_URL;
const TOKEN = process.env.ZYGOTE_TOKEN;
const skip = !URL || !TOKEN ? "no live zygoted (set ZYGOTE_URL and ZYGOTE_TOKEN, or run scripts/sdk-test.sh)" : false;
if (skip && process.env.ZYGOTE_LIVE_REQUIRED) throw new Error("ZYGOTE_LIVE_REQUIRED is set but ZYGOTE_URL/ZYGOTE_TOKEN are not");

describe("live zygoted: watching a directory", { skip }, () => {
  const client = new Client({ url: URL, token: TOKEN });
  let sb: Sandbox;

  before(async () => {
    sb = await Sandbox.create({ image: "minimal", memoryMib: 128, client });
  });

  after(async () => {
    if (sb) await sb.kill();
  });

  test("changes arrive as they happen, recursively, until stop()", async () => {
    await sb.commands.run("mkdir -p /w");
    const seen: WatchEvent[] = [];
    const h = await sb.files.watch("/w", { recursive: true, onEvent: (e) => void seen.push(e) });
    await sb.files.write("/w/a.txt", "1");
    await sb.commands.run("mkdir /w/new && echo x > /w/new/f && rm /w/a.txt");
    const want = ["a.txt create", "new create", "new/f create", "a.txt remove"];
    const deadline = Date.now() + 30_000;
    const has = () => want.every((w) => seen.some((e) => `${e.name} ${e.kind}` === w));
    while (!has() && Date.now() < deadline) await new Promise((r) => setTimeout(r, 100));
    assert.ok(has(), JSON.stringify(seen));
    await h.stop();
    const after = seen.length;
    await sb.files.write("/w/late.txt", "1");
    await new Promise((r) => setTimeout(r, 500));
    assert.equal(seen.length, after, "no events after stop()");
  });

  test("a missing directory is FileNotFound", async () => {
    await assert.rejects(sb.files.watch("/no/such/dir", { onEvent: () => undefined }), FileNotFound);
  });
});
