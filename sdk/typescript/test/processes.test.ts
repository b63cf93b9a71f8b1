/** Background processes (`commands.run(cmd, { background: true })`, the handle,
 * `commands.list/connect/kill/signal/sendStdin`) against the fake daemon's model of
 * the process routes (fake-processes.ts). No VM involved. */
import assert from "node:assert/strict";
import { after, before, beforeEach, describe, test } from "node:test";

import {
  Client,
  CommandFailed,
  CommandHandle,
  CommandTimeout,
  ConflictError,
  FileNotFound,
  InvalidArgument,
  ProcessExited,
  ProcessNotFound,
  RequestTimeout,
  Sandbox,
  ServerError,
  SpawnFailed,
  errorFor,
} from "../dist/index.js";
import { FakeDaemon } from "./fake-daemon.js";
import { FakeProcesses } from "./fake-processes.js";

const SID = "sb-aaaaaaaaaaaa";

describe("background processes", () => {
  const fake = new FakeDaemon();
  let procs: FakeProcesses;
  let sb: Sandbox;
  before(() => fake.start());
  after(() => fake.stop());
  beforeEach(() => {
    procs = new FakeProcesses();
    fake.processes = procs;
    fake.load([]);
    sb = new Sandbox(SID, new Client({ url: fake.url, token: "t" }));
  });

  test("run with background sends exec with background and resolves to a handle", async () => {
    const h = await sb.commands.run("talk", { background: true, stdin: "first\n", env: { A: "1" }, cwd: "/tmp", timeoutMs: 30_000 });
    assert.ok(h instanceof CommandHandle);
    const sent = fake.requests[0]!;
    assert.equal(`${sent.method} ${sent.path}`, `POST /v1/sandboxes/${SID}/exec`);
    assert.deepEqual(JSON.parse(sent.body.toString()), {
      argv: ["sh", "-c", "talk"],
      env: { A: "1" },
      cwd: "/tmp",
      stdin: "first\n",
      timeout_ms: 30000,
      background: true,
    });
    const info = await h.info();
    assert.deepEqual([info.pid, info.state, info.stdinOpen, info.argv], [h.pid, "running", true, ["sh", "-c", "talk"]]);
    assert.equal(await h.kill(), true);
  });

  test("stdin as text and bytes, then wait follows to the exit with callbacks", async () => {
    const out: string[] = [];
    const err: string[] = [];
    const h = await sb.commands.run("talk", {
      background: true,
      onStdout: (t) => void out.push(t),
      onStderr: async (t) => void err.push(t),
    });
    await h.sendStdin("hello\n");
    await h.sendStdin(new TextEncoder().encode("world\n"), { eof: true });
    const r = await h.wait();
    assert.deepEqual(
      [r.stdout, r.stderr, r.exitCode, r.signal, r.timedOut],
      ["start\ngot hello\ngot world\n", "bye\n", 3, null, false],
    );
    assert.equal(out.join(""), r.stdout);
    assert.deepEqual(err, ["bye\n"]);
    assert.deepEqual([h.stdout, h.stderr, h.exitCode, h.offset], [r.stdout, r.stderr, 3, r.stdout.length + 4]);
    assert.deepEqual(await h.wait(), r);
    await assert.rejects(h.sendStdin("late"), (e) => e instanceof ProcessExited && e.status === 409);
    assert.equal(await h.kill(), false);
    assert.equal(await sb.commands.kill(h.pid), false);
  });

  test("check makes wait throw CommandFailed; its own timeout CommandTimeout", async () => {
    const h = await sb.commands.run("talk", { background: true, check: true });
    await h.closeStdin();
    await assert.rejects(h.wait(), (e) => e instanceof CommandFailed && e.result.exitCode === 3);
    const t = await sb.commands.run("sleep 1000", { background: true, timeoutMs: 200 });
    await assert.rejects(t.wait(), (e) => e instanceof CommandTimeout && e.result.timedOut && e.result.signal === 9);
    assert.equal(t.exitCode, null);
  });

  test("kill and signals by name; a bad name is InvalidArgument", async () => {
    const h = await sb.commands.run(["sleep", "1000"], { background: true });
    await assert.rejects(h.signal("NOPE"), InvalidArgument);
    await sb.commands.signal(h.pid, "interrupt");
    assert.equal((await h.wait()).signal, 2);
    const k = await sb.commands.run("sleep 1000", { background: true });
    assert.equal(await k.kill(), true);
    const r = await k.wait();
    assert.deepEqual([r.exitCode, r.signal], [null, 9]);
  });

  test("a wait timeout leaves it running and a later wait goes on", async () => {
    const seen: string[] = [];
    const h = await sb.commands.run("cat", { background: true, onStdout: (t) => void seen.push(t) });
    await h.sendStdin("one\n");
    await assert.rejects(h.wait({ timeoutMs: 300 }), (e) => e instanceof RequestTimeout && e.code === "wait_timeout");
    assert.equal((await h.info()).state, "running");
    assert.equal(h.stdout, "one\n");
    setTimeout(() => void h.sendStdin("two\n", { eof: true }), 100);
    const r = await h.wait({ timeoutMs: 10_000 });
    assert.deepEqual([r.stdout, r.exitCode, seen], ["one\ntwo\n", 0, ["one\n", "two\n"]]);
  });

  test("a follow that ended in an error throws it and a later wait goes on", async () => {
    const out: string[] = [];
    const h = await sb.commands.run("talk", { background: true, onStdout: (t) => void out.push(t) });
    procs.followErrors.push({ code: "agent_unreachable", message: "lost the agent" });
    await assert.rejects(h.wait(), (e) => e instanceof ServerError && e.code === "agent_unreachable");
    assert.equal(h.stdout, "start\n");
    await h.sendStdin("x\n", { eof: true });
    const r = await h.wait();
    assert.deepEqual([r.stdout, r.exitCode, out], ["start\ngot x\n", 3, ["start\n", "got x\n"]]);
    assert.deepEqual(fake.requests.at(-1)!.query, { follow: "true", offset: "6" });
  });

  test("a character split across writes is decoded whole", async () => {
    const seen: string[] = [];
    const h = await sb.commands.run("cat", { background: true, onStdout: (t) => void seen.push(t) });
    const bytes = new TextEncoder().encode("é\n");
    await h.sendStdin(bytes.subarray(0, 1));
    await h.sendStdin(bytes.subarray(1), { eof: true });
    assert.equal((await h.wait()).stdout, "é\n");
    assert.equal(seen.join(""), "é\n");
  });

  test("poll reads what is new and wait goes on from there", async () => {
    const out: string[] = [];
    const h = await sb.commands.run("talk", { background: true, onStdout: (t) => void out.push(t) });
    const info = await h.poll();
    assert.deepEqual([h.stdout, h.offset, info.state, info.outputBytes], ["start\n", 6, "running", 6]);
    setTimeout(() => void h.sendStdin("x\n"), 50);
    await h.poll(5000);
    assert.equal(h.stdout, "start\ngot x\n");
    await h.closeStdin();
    assert.equal((await h.wait()).stdout, "start\ngot x\n");
    assert.deepEqual(out, ["start\n", "got x\n"]);
    await assert.rejects(h.poll(31_000), RangeError);
  });

  test("list, connect from another client, unknown pids", async () => {
    const first = await sb.commands.run("talk", { background: true });
    const second = await sb.commands.run("echo done", { background: true });
    const listed = await sb.commands.list();
    assert.deepEqual(listed.map((p) => [p.pid, p.state, p.exitCode]), [
      [first.pid, "running", null],
      [second.pid, "exited", 0],
    ]);
    const other = new Sandbox(SID, new Client({ url: fake.url, token: "t" }));
    const seen: string[] = [];
    const again = await other.commands.connect(first.pid, { onStdout: (t) => void seen.push(t) });
    await first.sendStdin("hi\n", { eof: true });
    const r = await again.wait();
    assert.equal(r.stdout, "start\ngot hi\n");
    assert.equal(seen.join(""), r.stdout);

    await assert.rejects(sb.commands.connect(999999), (e) => e instanceof ProcessNotFound && e.code === "not_found");
    await assert.rejects(
      sb.commands.sendStdin(999999, "x"),
      (e) => e instanceof ProcessNotFound && !(e instanceof FileNotFound) && e.code === "guest_not_found",
    );
    assert.equal(await sb.commands.kill(999999), false);
    await assert.rejects(sb.commands.run(["/no/such"], { background: true }), SpawnFailed);
  });

  test("stdin a program does not read ends in guest_busy", async () => {
    const h = await sb.commands.run("sleep 1000", { background: true });
    await assert.rejects(h.sendStdin(new Uint8Array(70000)), (e) => e instanceof ConflictError && e.code === "guest_busy");
    assert.equal(await h.kill(), true);
  });

  test("a branch child's copy is connected and killed apart from the parent's", async () => {
    const h = await sb.commands.run("talk", { background: true });
    procs.branch(SID, "sb-child0000001");
    const child = new Sandbox("sb-child0000001", sb.client);
    const inChild = await child.commands.connect(h.pid);
    assert.equal(await inChild.kill(), true);
    assert.equal((await inChild.wait()).signal, 9);
    assert.equal((await h.info()).state, "running");
    await h.closeStdin();
    assert.equal((await h.wait()).exitCode, 3);
  });

  test("error codes of the process routes", () => {
    assert.ok(errorFor("process_exited", "process 5 has exited", 409) instanceof ProcessExited);
    assert.ok(errorFor("process_exited", "x", 409) instanceof ConflictError);
    assert.ok(errorFor("not_found", 'process "5" not found', 404) instanceof ProcessNotFound);
    assert.equal(errorFor("guest_busy", "did not read", 409).constructor, ConflictError);
  });
});
