/**
 * Background processes against a real zygoted and a real guest (ZYGOTE_URL /
 * ZYGOTE_TOKEN; scripts/sdk-test.sh starts one): fed through stdin and waited on,
 * killed, listed, connected from a second client, and run on in a branch child as
 * the child's own copy. One sandbox (plus one branch child), killed at the end.
 */
import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";

import {
  Client,
  type CommandHandle,
  CommandTimeout,
  InvalidArgument,
  ProcessExited,
  ProcessNotFound,
  RequestTimeout,
  Sandbox,
} from "../dist/index.js";

const URL = process.env.ZYGOTE_URL;
const TOKEN = process.env.ZYGOTE_TOKEN;
const skip = !URL || !TOKEN ? "no live zygoted (set ZYGOTE_URL and ZYGOTE_TOKEN, or run scripts/sdk-test.sh)" : false;
if (skip && process.env.ZYGOTE_LIVE_REQUIRED) throw new Error("ZYGOTE_LIVE_REQUIRED is set but ZYGOTE_URL/ZYGOTE_TOKEN are not");

const TALK = 'echo start; while read l; do echo "got $l"; done; echo bye >&2; exit 3';
const COUNTER = "i=0; while :; do i=$((i+1)); echo $i; sleep 0.2; done";

/** The counter's last number once it printed more than `above` (polling its output). */
async function lastCount(h: CommandHandle, above: number): Promise<number> {
  const deadline = Date.now() + 60_000;
  for (;;) {
    await h.poll(1000);
    const last = Number(h.stdout.trim().split("\n").pop() ?? "0");
    if (last > above) return last;
    assert.ok(Date.now() < deadline, `${h.pid} stuck at ${last}`);
  }
}

describe("live zygoted: background processes", { skip }, () => {
  const client = new Client({ url: URL, token: TOKEN });
  let sb: Sandbox;

  before(async () => {
    sb = await Sandbox.create({ image: "minimal", memoryMib: 128, client });
  });

  after(async () => {
    if (sb) await sb.kill();
  });

  test("fed through stdin and waited on", async () => {
    const out: string[] = [];
    const h = await sb.commands.run(TALK, { background: true, stdin: "first\n", onStdout: (t) => void out.push(t) });
    assert.equal((await h.info()).state, "running");
    await h.sendStdin("hello\n");
    await h.sendStdin(new TextEncoder().encode("wörld\n"), { eof: true });
    const r = await h.wait({ timeoutMs: 60_000 });
    assert.deepEqual([r.stdout, r.stderr, r.exitCode], ["start\ngot first\ngot hello\ngot wörld\n", "bye\n", 3]);
    assert.equal(out.join(""), r.stdout);
    const info = await h.info();
    assert.deepEqual([info.state, info.exitCode, info.outputBytes], ["exited", 3, h.offset]);
    await assert.rejects(h.sendStdin("late\n"), ProcessExited);
    assert.equal(await h.kill(), false);
  });

  test("kill, list, timeouts and unknown pids", async () => {
    const sleeper = await sb.commands.run("exec sleep 1000", { background: true, timeoutMs: null });
    const listed = (await sb.commands.list()).find((p) => p.pid === sleeper.pid);
    assert.equal(listed?.state, "running");
    await assert.rejects(sleeper.wait({ timeoutMs: 1000 }), (e) => e instanceof RequestTimeout && e.code === "wait_timeout");
    assert.equal(await sleeper.kill(), true);
    const r = await sleeper.wait({ timeoutMs: 60_000 });
    assert.deepEqual([r.exitCode, r.signal], [null, 9]);
    assert.equal(await sb.commands.kill(sleeper.pid), false);

    const timed = await sb.commands.run("exec sleep 1000", { background: true, timeoutMs: 1000 });
    await assert.rejects(timed.wait({ timeoutMs: 60_000 }), (e) => e instanceof CommandTimeout && e.result.timedOut);
    await assert.rejects(sb.commands.connect(999999), ProcessNotFound);
    await assert.rejects(sb.commands.sendStdin(999999, "x"), ProcessNotFound);
    await assert.rejects(sb.commands.signal(timed.pid, "NOPE"), InvalidArgument);
  });

  test("connect from a second Sandbox object", async () => {
    const h = await sb.commands.run('echo ready; read x; echo "x=$x"', { background: true });
    const other = await Sandbox.connect(sb.id, { url: URL, token: TOKEN });
    const seen: string[] = [];
    const again = await other.commands.connect(h.pid, { onStdout: (t) => void seen.push(t) });
    await h.sendStdin("go\n");
    const r = await again.wait({ timeoutMs: 60_000 });
    assert.deepEqual([r.stdout, r.exitCode, seen.join("")], ["ready\nx=go\n", 0, "ready\nx=go\n"]);
  });

  test("a branch child runs its own copy under the same pid", async () => {
    const counter = await sb.commands.run(COUNTER, { background: true, timeoutMs: null });
    const before = await lastCount(counter, 3);
    const [child] = await sb.branch();
    try {
      const inChild = await child!.commands.connect(counter.pid);
      const later = await lastCount(inChild, before);
      assert.equal(await inChild.kill(), true);
      assert.equal((await inChild.wait({ timeoutMs: 60_000 })).signal, 9);
      assert.ok((await lastCount(counter, later)) > later, "the parent's goes on");
    } finally {
      await child!.kill();
    }
    assert.equal(await counter.kill(), true);
  });
});
