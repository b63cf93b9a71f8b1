/**
 * The TypeScript SDK against a real zygoted (ZYGOTE_URL / ZYGOTE_TOKEN;
 * scripts/sdk-test.sh starts one). One sandbox is shared by the checks
 * (boots are the expensive part); branches and restores add a few more.
 * Everything created is killed, and snapshots deleted, at the end.
 */
import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";

import {
  Client,
  CommandFailed,
  CommandTimeout,
  FileNotFound,
  InvalidArgument,
  MergeConflictError,
  Sandbox,
  SandboxNotFound,
  type MetricSample,
  type Snapshot,
  SnapshotNotFound,
  SpawnFailed,
  Unauthorized,
} from "../dist/index.js";

const URL = process.env.ZYGOTE_URL;
const TOKEN = process.env.ZYGOTE_TOKEN;
const MISSING = "sb-000000000000";
/** The shared sandbox's labels; the value has characters a query string gives meaning to. */
const METADATA = { suite: "ts-live", "run/id": "a=b&c d+e" };
const skip = !URL || !TOKEN ? "no live zygoted (set ZYGOTE_URL and ZYGOTE_TOKEN, or run scripts/sdk-test.sh)" : false;
if (skip && process.env.ZYGOTE_LIVE_REQUIRED) throw new Error("ZYGOTE_LIVE_REQUIRED is set but ZYGOTE_URL/ZYGOTE_TOKEN are not");

describe("live zygoted", { skip }, () => {
  const client = new Client({ url: URL, token: TOKEN });
  const snapshots: Snapshot[] = [];
  let sb: Sandbox;

  before(async () => {
    sb = await Sandbox.create({ image: "minimal", memoryMib: 128, metadata: METADATA, client });
  });

  after(async () => {
    // The sandbox reads its snapshots' disk layers: kill it first.
    if (sb) await sb.kill();
    for (const s of snapshots) await client.deleteSnapshot(s);
  });

  test("create gives a running sandbox", async () => {
    const info = await sb.info();
    assert.deepEqual([info.id, info.state, info.memoryMib], [sb.id, "running", 128]);
    assert.deepEqual(info.metadata, METADATA);
    assert.equal(info.runtime, ((await client.info()).runtime as { name: string }).name);
    assert.ok((await Sandbox.list({ client })).some((s) => s.id === sb.id));
    assert.equal((await Sandbox.connect(sb.id, { client })).id, sb.id);
  });

  test("run returns output and exit code", async () => {
    const r = await sb.commands.run("echo out; echo err >&2; exit 3");
    assert.deepEqual([r.exitCode, r.stdout, r.stderr, r.timedOut], [3, "out\n", "err\n", false]);
    const c = await sb.commands.run(["cat"], { stdin: "piped" });
    assert.equal(c.stdout, "piped");
    assert.equal((await sb.commands.run("echo $X; pwd", { env: { X: "42" }, cwd: "/root" })).stdout, "42\n/root\n");
    await assert.rejects(sb.commands.run("exit 4", { check: true }), (e) => e instanceof CommandFailed && e.result.exitCode === 4);
  });

  test("output is streamed while the command runs", async () => {
    const seen: Array<[number, string]> = [];
    const errs: string[] = [];
    const r = await sb.commands.run("for i in 1 2 3; do echo line$i; sleep 0.4; done; echo done >&2", {
      onStdout: (t) => void seen.push([performance.now(), t]),
      onStderr: (t) => void errs.push(t),
    });
    const end = performance.now();
    assert.equal(seen.map(([, t]) => t).join(""), "line1\nline2\nline3\n");
    assert.equal(r.stdout, "line1\nline2\nline3\n");
    assert.equal(errs.join(""), "done\n");
    const lead = end - seen[0]![0];
    assert.ok(lead >= 600, `first output only ${lead.toFixed(0)} ms before the end: not streamed`);
  });

  test("pty: a shell, its output, a resize, a refused size, the exit code", async () => {
    const chunks: Uint8Array[] = [];
    const seen = () => Buffer.concat(chunks).toString();
    const until = async (needle: string) => {
      const end = Date.now() + 60_000;
      while (!seen().includes(needle)) {
        assert.ok(Date.now() < end, `${needle} not in ${seen()}`);
        await new Promise((r) => setTimeout(r, 50));
      }
    };
    const term = await sb.pty.create({ cols: 80, rows: 24, onData: (d) => chunks.push(d), cmd: ["sh"], env: { PS1: "$ " } });
    term.sendInput("echo pty-$((6*7)); tty; stty size\n");
    await until("pty-42");
    await until("/dev/pts/");
    await until("24 80");
    term.resize(100, 30);
    term.sendInput("stty size\n");
    await until("30 100");
    term.resize(0, 5); // refused: an error message, nothing changes
    term.sendInput("exit 3\n");
    assert.deepEqual(await term.wait(), { exitCode: 3, signal: null });
    assert.deepEqual(
      term.errors.map((e) => e.code),
      ["invalid_argument"],
    );
  });

  test("files: write, read, list", async () => {
    const w = await sb.files.write("/root/ts/notes.txt", "hello from ts\n");
    assert.deepEqual(w, { path: "/root/ts/notes.txt", size: 14 });
    assert.equal(await sb.files.read("/root/ts/notes.txt"), "hello from ts\n");
    const blob = new Uint8Array(1024).map((_, i) => i % 256);
    await sb.files.write("/root/ts/blob.bin", blob);
    assert.deepEqual(await sb.files.readBytes("/root/ts/blob.bin"), blob);
    const entries = await sb.files.list("/root/ts");
    assert.deepEqual(entries.map((e) => e.name).sort(), ["blob.bin", "notes.txt"]);
    assert.equal(entries.find((e) => e.name === "blob.bin")?.size, 1024);
    await sb.files.write("/root/ts/run.sh", "#!/bin/sh\necho ran\n", { mode: 0o755 });
    assert.equal((await sb.commands.run(["/root/ts/run.sh"])).stdout, "ran\n");
    // A device file is refused unless asked for; asked for, it is read.
    await assert.rejects(sb.files.readBytes("/dev/null"));
    assert.equal((await sb.files.readBytes("/dev/null", { special: true })).length, 0);
  });

  test("error cases: timeout, missing file/sandbox, bad program, bad token", async () => {
    const t0 = performance.now();
    await assert.rejects(sb.commands.run("echo before; sleep 30", { timeoutMs: 1500 }), (e) => {
      assert.ok(e instanceof CommandTimeout);
      assert.equal(e.code, "command_timeout");
      assert.equal(e.result.stdout, "before\n");
      return true;
    });
    assert.ok(performance.now() - t0 < 15_000);
    assert.equal((await sb.commands.run("echo alive")).stdout, "alive\n");

    await assert.rejects(sb.files.read("/root/nope"), (e) => e instanceof FileNotFound && e.status === 404);
    await assert.rejects(sb.files.read("relative"), InvalidArgument);
    // Refused before anything boots: a bad key, a reserved one, a bad filter key.
    for (const refused of [{ "no spaces": "x" }, { "zygote.parent": sb.id }] as Record<string, string>[]) {
      await assert.rejects(
        Sandbox.create({ metadata: refused, client }),
        (e) => e instanceof InvalidArgument && e.code === "invalid_argument" && e.status === 400,
      );
    }
    await assert.rejects(client.sandboxes({ metadata: { "no spaces": "x" } }), InvalidArgument);
    await assert.rejects(sb.commands.run(["/no/such/program"]), SpawnFailed);

    const ghost = new Sandbox(MISSING, client);
    await assert.rejects(ghost.commands.run("true"), (e) => e instanceof SandboxNotFound && e.code === "not_found");
    await assert.rejects(ghost.info(), SandboxNotFound);
    await assert.rejects(Sandbox.connect(MISSING, { client }), SandboxNotFound);
    assert.equal(await ghost.kill(), false);

    const bad = new Client({ url: URL, token: "not-the-token" });
    await assert.rejects(Sandbox.list({ client: bad }), (e) => e instanceof Unauthorized && e.status === 401);
    await assert.rejects(new Sandbox(sb.id, bad).commands.run("true"), Unauthorized);
  });

  test("branch into three children that diverge", async () => {
    await sb.files.write("/root/base.txt", "shared base");
    const children = await sb.branch({ n: 3 });
    try {
      assert.equal(new Set(children.map((c) => c.id)).size, 3);
      // Children inherit the metadata, name their parent, and are found by it.
      for (const c of children) assert.deepEqual((await c.info()).metadata, { ...METADATA, "zygote.parent": sb.id });
      const found = await Sandbox.list({ metadata: { "zygote.parent": sb.id }, client });
      assert.deepEqual(found.map((f) => f.id).sort(), children.map((c) => c.id).sort());
      const family = await client.sandboxes({ metadata: { "run/id": METADATA["run/id"], suite: "ts-live" } });
      assert.deepEqual(family.map((f) => f.id).sort(), [sb.id, ...children.map((c) => c.id)].sort());
      assert.deepEqual(await client.sandboxes({ metadata: { "run/id": "a=b" } }), []);
      for (const c of children) {
        assert.equal(await c.files.read("/root/base.txt"), "shared base");
        assert.equal((await c.commands.run("hostname")).stdout.trim(), c.id);
      }
      for (const [i, c] of children.entries()) await c.commands.run(`echo ${i} > /root/counter`, { check: true });
      for (const [i, c] of children.entries()) assert.equal((await c.commands.run("cat /root/counter")).stdout, `${i}\n`);
      await children[0]!.files.write("/root/only-in-0.txt", "child 0");
      assert.equal(await children[0]!.files.read("/root/only-in-0.txt"), "child 0");
      for (const other of [sb, children[1]!, children[2]!]) {
        await assert.rejects(other.files.read("/root/only-in-0.txt"), FileNotFound);
      }
    } finally {
      for (const c of children) await c.kill();
    }
  });

  test("branch with onProgress reports each child as it runs, usable at once", async () => {
    const seen: { id: string; ready: number; total: number; index: number; ms: number; hostname: string }[] = [];
    const children = await sb.branch({
      n: 4,
      onProgress: async (p) => {
        assert.ok(p.sandbox, p.error ?? "");
        if (seen.length === 0) {
          // Its siblings are listed too, each creating or already running.
          const family = await client.sandboxes({ metadata: { "zygote.parent": sb.id } });
          const states = new Map(family.map((f) => [f.id, f.state]));
          assert.equal(states.get(p.sandboxId), "running");
          for (const st of states.values()) assert.ok(st === "creating" || st === "running", st);
        }
        const hostname = (await p.sandbox.commands.run("hostname")).stdout.trim();
        seen.push({ id: p.sandboxId, ready: p.ready, total: p.total, index: p.index, ms: p.ms, hostname });
      },
    });
    try {
      assert.deepEqual(seen.map((p) => p.id).sort(), children.map((c) => c.id).sort());
      assert.deepEqual(seen.map((p) => p.ready), [1, 2, 3, 4]);
      assert.ok(seen.every((p) => p.total === 4 && p.hostname === p.id));
      assert.deepEqual(seen.map((p) => p.index).sort(), [0, 1, 2, 3]);
      assert.deepEqual(seen.map((p) => p.ms), seen.map((p) => p.ms).sort((a, b) => a - b));
    } finally {
      for (const c of children) await c.kill();
    }
  });

  test("merge a child's changes back; a conflict changes nothing", async () => {
    const work = "/root/tsmerge";
    await sb.commands.run(`mkdir -p ${work} && echo v1 > ${work}/calc.txt`, { check: true });
    const [child] = await sb.branch({ mergeable: true });
    try {
      await child!.files.write(`${work}/new.txt`, "from the child\n");
      await child!.files.write(`${work}/calc.txt`, "v2\n");
      await sb.files.write(`${work}/parent.txt`, "the parent's own\n");
      const report = await sb.merge(child!, { paths: [work] });
      assert.deepEqual([report.applied, report.sandbox, report.from, report.conflicts], [true, sb.id, child!.id, []]);
      assert.deepEqual(report.changes.map((c) => [c.path, c.action]).sort(), [
        [`${work}/calc.txt`, "modify"],
        [`${work}/new.txt`, "add"],
      ]);
      assert.equal(await sb.files.read(`${work}/new.txt`), "from the child\n");
      assert.equal(await sb.files.read(`${work}/calc.txt`), "v2\n");
      assert.equal(await sb.files.read(`${work}/parent.txt`), "the parent's own\n");

      await child!.files.write(`${work}/calc.txt`, "child v3\n");
      await child!.files.write(`${work}/later.txt`, "later\n");
      await sb.files.write(`${work}/calc.txt`, "parent v3\n");
      await assert.rejects(sb.merge(child!, { paths: [work] }), (e: unknown) => {
        assert.ok(e instanceof MergeConflictError);
        assert.deepEqual(
          e.conflicts.map((c) => [c.path, c.ours, c.theirs, c.resolution]),
          [[`${work}/calc.txt`, "modified", "modified", null]],
        );
        assert.equal(e.report.applied, false);
        return true;
      });
      assert.equal(await sb.files.read(`${work}/calc.txt`), "parent v3\n");
      await assert.rejects(sb.files.read(`${work}/later.txt`), FileNotFound);
    } finally {
      await child!.kill();
    }
  });

  test("snapshot, restore into a new sandbox, roll back in place", async () => {
    await sb.files.write("/root/version.txt", "v1");
    const snap = await sb.snapshot({ mode: "full" });
    snapshots.push(snap);
    assert.deepEqual([snap.kind, snap.sourceSandbox], ["full", sb.id]);
    await sb.files.write("/root/version.txt", "v2");

    const restored = await Sandbox.restore(snap, { client });
    try {
      assert.notEqual(restored.id, sb.id);
      assert.equal(await restored.files.read("/root/version.txt"), "v1");
      assert.deepEqual((await restored.info()).origin, { snapshot: { id: snap.id } });
    } finally {
      assert.equal(await restored.kill(), true);
    }
    const info = await sb.rollback(snap);
    assert.deepEqual([info.id, info.state], [sb.id, "running"]);
    assert.equal(await sb.files.read("/root/version.txt"), "v1");
    await assert.rejects(Sandbox.restore("snap-000000000000", { client }), SnapshotNotFound);
  });

  test("metrics: sampled while running", async () => {
    const sb = await Sandbox.create({ memoryMib: 128, ttlSecs: 600, client });
    try {
      let samples: MetricSample[] = [];
      // The daemon samples every 5 s by default.
      for (const deadline = Date.now() + 30_000; samples.length === 0 && Date.now() < deadline; ) {
        samples = await sb.metrics();
        if (samples.length === 0) await new Promise((r) => setTimeout(r, 500));
      }
      const last = samples.at(-1);
      assert.ok(last, "no metrics sample within 30 s");
      assert.ok(last.cpuCount >= 1 && last.cpuUsedPct >= 0 && last.cpuUsedPct <= 100);
      assert.ok(last.memUsed > 0 && last.memUsed <= last.memTotal && last.memTotal <= 128 * 1048576);
      assert.ok(last.diskUsed > 0 && last.diskUsed <= last.diskTotal);
      const one = await sb.metrics({ start: last.timestampUnix, end: last.timestampUnix });
      assert.deepEqual(one.at(-1), last);
      assert.deepEqual(await sb.metrics({ end: last.timestampUnix - 3600 }), []);
      await assert.rejects(new Sandbox("sb-000000000000", client).metrics(), SandboxNotFound);
    } finally {
      await sb.kill();
    }
  });

  test("network policy: changed while running", async (t) => {
    const sb = await Sandbox.create({ memoryMib: 128, ttlSecs: 600, client });
    try {
      if (!(await sb.info()).network?.isolated) {
        t.skip("the live daemon runs without the isolated network: lists are refused");
        return;
      }
      const denied = await sb.setNetwork({ denyOut: ["192.0.2.0/24"] });
      assert.deepEqual(denied.network?.denyOut, ["192.0.2.0/24"]);
      assert.equal((await sb.setNetwork({ network: "none" })).network?.mode, "none");
      const cleared = (await sb.setNetwork()).network;
      assert.deepEqual([cleared?.mode, cleared?.allowOut, cleared?.denyOut], ["egress", [], []]);
      await assert.rejects(sb.setNetwork({ denyOut: ["10.0.0.1/8"] }), InvalidArgument);
    } finally {
      await sb.kill();
    }
  });

  test("event log: commands and lifecycle", async () => {
    const sb = await Sandbox.create({ memoryMib: 128, ttlSecs: 600, client });
    try {
      await sb.commands.run("true");
      await sb.commands.run("exit 4");
      const got = await sb.events();
      assert.deepEqual(
        got.slice(0, 5).map((e) => e.message),
        ["sandbox started", "command started", "command ended", "command started", "command ended"],
      );
      assert.deepEqual([got[4]?.level, got[4]?.fields.exit_code], ["warn", "4"]);
      const newest = await sb.events({ newestFirst: true, limit: 1 });
      assert.deepEqual(newest.map((e) => e.message), ["command ended"]);
      assert.deepEqual((await sb.events({ level: "warn" })).map((e) => e.message), ["command ended"]);
    } finally {
      await sb.kill();
    }
  });

  test("TTL: set, cleared, then expiring", async () => {
    // Its own sandbox: the last step lets the daemon delete it.
    const doomed = await Sandbox.create({ memoryMib: 128, ttlSecs: 600, client });
    try {
      const info = await doomed.info();
      assert.equal(info.ttlSecs, 600);
      assert.ok(info.expiresAt !== null && info.expiresAt >= info.createdAt + 600, JSON.stringify(info));
      const cleared = await doomed.setTtl(null);
      assert.deepEqual([cleared.ttlSecs, cleared.expiresAt], [null, null]);
      await assert.rejects(doomed.setTtl(0), InvalidArgument);
      const deadline = (await doomed.setTtl(1)).expiresAt;
      assert.ok(deadline !== null && deadline >= Math.floor(Date.now() / 1000) + 1);
      // Until the record is gone: "not running" comes first (state `deleting`).
      const exists = async (): Promise<boolean> => {
        try {
          await doomed.info();
          return true;
        } catch (e) {
          if (e instanceof SandboxNotFound) return false;
          throw e;
        }
      };
      const t0 = performance.now();
      while ((await exists()) && performance.now() - t0 < 15_000) {
        await new Promise((r) => setTimeout(r, 200));
      }
      await assert.rejects(doomed.info(), SandboxNotFound);
      assert.ok(Date.now() / 1000 >= deadline, "deleted before its deadline");
    } finally {
      await doomed.kill();
    }
  });

  test("kill", async () => {
    const victim = await Sandbox.create({ memoryMib: 128, client });
    assert.equal(await victim.kill(), true);
    assert.equal(await victim.kill(), false);
    await assert.rejects(victim.info(), SandboxNotFound);
    await assert.rejects(victim.commands.run("true"), SandboxNotFound);
    assert.ok(!(await client.sandboxes()).some((s) => s.id === victim.id));
  });
});
