/** Unit tests beyond the shared vectors: configuration, transport errors,
 * disposal, async callbacks. No VM involved. */
import assert from "node:assert/strict";
import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { createServer } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { after, before, describe, test } from "node:test";

import {
  BranchIncompleteError,
  Client,
  ConflictError,
  ConnectionFailed,
  DEFAULT_URL,
  FileNotFound,
  InvalidArgument,
  MergeConflictError,
  SandboxNotRunning,
  SandboxPaused,
  ServerError,
  Sandbox,
  SandboxNotFound,
  type SandboxTree,
  WrongState,
  ZygoteError,
  errorFor,
  resolveConfig,
} from "../dist/index.js";
import { FakeDaemon, FakeFiles } from "./fake-daemon.js";

const SANDBOX = { id: "sb-aaaaaaaaaaaa", state: "running" };

describe("configuration", () => {
  let dir: string;
  before(() => {
    dir = mkdtempSync(join(tmpdir(), "zygote-ts-"));
  });
  after(() => rmSync(dir, { recursive: true, force: true }));

  test("arguments, then env, then the daemon's token file", () => {
    const state = join(dir, "state");
    mkdirSync(state);
    writeFileSync(join(state, "token"), "from-file\n");
    const env: Record<string, string> = { ZYGOTE_STATE_DIR: state };
    assert.deepEqual(resolveConfig({ env }), { url: DEFAULT_URL, token: "from-file" });
    env.ZYGOTE_URL = "http://10.0.0.1:9";
    env.ZYGOTE_TOKEN = "from-env";
    assert.deepEqual(resolveConfig({ env }), { url: "http://10.0.0.1:9", token: "from-env" });
    assert.deepEqual(resolveConfig({ env, url: "http://127.0.0.1:1/", token: "arg" }), {
      url: "http://127.0.0.1:1",
      token: "arg",
    });
  });

  test("state directory rules match the daemon's", () => {
    mkdirSync(join(dir, "xdg/zygote"), { recursive: true });
    writeFileSync(join(dir, "xdg/zygote/token"), "xdg-token");
    assert.equal(resolveConfig({ env: { XDG_STATE_HOME: join(dir, "xdg") } }).token, "xdg-token");
    mkdirSync(join(dir, "home/.local/state/zygote"), { recursive: true });
    writeFileSync(join(dir, "home/.local/state/zygote/token"), "home-token");
    assert.equal(resolveConfig({ env: { HOME: join(dir, "home") } }).token, "home-token");
    assert.equal(resolveConfig({ env: { HOME: join(dir, "nobody") } }).token, undefined);
  });

  test("bad and Unix URLs are refused with an explanation", () => {
    assert.throws(() => resolveConfig({ url: "ftp://x", env: {} }), /bad zygoted URL/);
    assert.throws(() => resolveConfig({ url: "unix:///run/z.sock", env: {} }), /Unix sockets/);
  });
});

describe("errors", () => {
  test("codes map to classes that keep code and status", () => {
    const e = errorFor("sandbox_not_running", "sandbox sb-1 is dead, not running", 409);
    assert.ok(e instanceof SandboxNotRunning && e instanceof ZygoteError && e instanceof Error);
    assert.deepEqual([e.name, e.code, e.status], ["SandboxNotRunning", "sandbox_not_running", 409]);
    const unknown = errorFor("brand_new_code", "something", 418);
    assert.equal(unknown.constructor, ZygoteError);
    assert.equal(unknown.code, "brand_new_code");
  });

  test("an unreachable daemon is ConnectionFailed", async () => {
    const port = await new Promise<number>((resolve) => {
      const srv = createServer();
      srv.listen(0, "127.0.0.1", () => {
        const p = (srv.address() as { port: number }).port;
        srv.close(() => resolve(p));
      });
    });
    const client = new Client({ url: `http://127.0.0.1:${port}`, token: "t" });
    await assert.rejects(Sandbox.create({ client }), (e: unknown) => {
      assert.ok(e instanceof ConnectionFailed);
      assert.equal(e.code, "connection_failed");
      assert.match(e.message, /is it running/);
      return true;
    });
  });
});

describe("sandbox handles", () => {
  const fake = new FakeDaemon();
  before(() => fake.start());
  after(() => fake.stop());

  test("bad commands are refused before any request", async () => {
    fake.load([]);
    const sb = new Sandbox("sb-aaaaaaaaaaaa", new Client({ url: fake.url, token: "t" }));
    await assert.rejects(sb.commands.run([]), TypeError);
    await assert.rejects(sb.commands.run("true", { timeoutMs: 0 }), RangeError);
    assert.equal(fake.requests.length, 0);
  });

  test("create sends only the network options given, in the API's names", async () => {
    fake.load([{ status: 201, json: { sandboxes: [SANDBOX] } }, { status: 201, json: { sandboxes: [SANDBOX] } }]);
    const client = new Client({ url: fake.url, token: "t" });
    await Sandbox.create({ client, network: "egress", denyOut: ["169.254.0.0/16"] });
    await Sandbox.create({ client, allowOut: [] });
    assert.deepEqual(
      fake.requests.map((r) => JSON.parse(r.body.toString("utf8"))),
      [
        { image: "minimal", network: "egress", deny_out: ["169.254.0.0/16"] },
        { image: "minimal", allow_out: [] },
      ],
    );
  });

  test("envs, secrets and per-child env are sent as the API takes them", async () => {
    fake.load([{ status: 201, json: { sandboxes: [SANDBOX] } }, branchAnswer([])]);
    const client = new Client({ url: fake.url, token: "t" });
    const sb = await Sandbox.create({
      client,
      envs: { TASK: "root" },
      secrets: { TOKEN: { value: "s3cret", inherit: false }, KEY: "k" },
    });
    await sb.branch({ n: 2, env: [{ SEED: "1" }, { SEED: "2" }] });
    await assert.rejects(sb.branch({ n: 2, env: [{ SEED: "1" }] }), /one object per child/);
    assert.deepEqual(
      fake.requests.map((r) => JSON.parse(r.body.toString("utf8"))),
      [
        {
          image: "minimal",
          envs: { TASK: "root" },
          secrets: { TOKEN: { value: "s3cret", inherit: false }, KEY: { value: "k" } },
        },
        { count: 2, env: [{ SEED: "1" }, { SEED: "2" }] },
      ],
    );
  });

  test("diff sends its query and parses the answer", async () => {
    const answer = {
      sandbox: "sb-b",
      against: "sb-c",
      path: "/srv",
      added: [{ path: "new.txt", kind: "file", size: 3, mode: 420 }],
      removed: [],
      modified: [
        {
          path: "x",
          kind_before: "file",
          kind: "file",
          size_before: 1,
          size: 2,
          mode_before: 420,
          mode: 420,
          unified: "--- a\n+++ b\n",
        },
      ],
    };
    fake.load([{ status: 200, json: answer }]);
    const client = new Client({ url: fake.url, token: "t" });
    const d = await new Sandbox("sb-b", client).diff(new Sandbox("sb-c", client), { path: "/srv", content: true });
    assert.equal(fake.requests[0]!.path, "/v1/sandboxes/sb-b/diff");
    assert.deepEqual(fake.requests[0]!.query, { against: "sb-c", content: "true", path: "/srv" });
    assert.deepEqual(d.added.map((e) => e.path), ["new.txt"]);
    assert.equal(d.modified[0]!.unified, "--- a\n+++ b\n");
    assert.equal(d.modified[0]!.sizeBefore, 1);
  });

  test("an exposed port's host is its URL without the scheme", async () => {
    const port = {
      port: 8080,
      public: false,
      url: "http://8080-sb-aaaaaaaaaaaa.localhost:7421",
      path_url: "http://127.0.0.1:7421/sandboxes/sb-aaaaaaaaaaaa/ports/8080/",
    };
    fake.load([{ status: 200, json: { ports: [port] } }]);
    const sb = new Sandbox(SANDBOX.id, new Client({ url: fake.url, token: "t" }));
    assert.deepEqual(await sb.ports(), [
      {
        port: 8080,
        public: false,
        url: port.url,
        pathUrl: port.path_url,
        host: "8080-sb-aaaaaaaaaaaa.localhost:7421",
      },
    ]);
  });

  test("client and url are exclusive", async () => {
    const client = new Client({ url: fake.url, token: "t" });
    await assert.rejects(Sandbox.create({ client, url: fake.url }), TypeError);
  });

  test("await using kills the sandbox at scope exit", async () => {
    fake.load([{ status: 201, json: { sandboxes: [SANDBOX] } }, { status: 204 }]);
    const client = new Client({ url: fake.url, token: "t" });
    {
      await using sb = await Sandbox.create({ client });
      assert.equal(sb.id, SANDBOX.id);
    }
    assert.deepEqual(
      fake.requests.map((r) => `${r.method} ${r.path}`),
      ["POST /v1/sandboxes", "DELETE /v1/sandboxes/sb-aaaaaaaaaaaa"],
    );
  });

  test("async callbacks are awaited in order", async () => {
    const out = (s: string) => ({ type: "output", stream: "stdout", data: Buffer.from(s).toString("base64") });
    fake.load([
      {
        status: 200,
        ndjson: [{ type: "started", pid: 1 }, out("a"), out("b"), { type: "exit", exit_code: 0, timed_out: false }],
      },
    ]);
    const sb = new Sandbox("sb-aaaaaaaaaaaa", new Client({ url: fake.url, token: "t" }));
    const seen: string[] = [];
    const r = await sb.commands.run("x", {
      onStdout: async (t) => {
        await new Promise((res) => setTimeout(res, 20));
        seen.push(t);
      },
    });
    assert.deepEqual([r.stdout, seen], ["ab", ["a", "b"]]);
  });

  test("a callback's error is the run's error", async () => {
    const out = { type: "output", stream: "stdout", data: Buffer.from("x").toString("base64") };
    fake.load([{ status: 200, ndjson: [{ type: "started", pid: 1 }, out, { type: "exit", exit_code: 0 }] }]);
    const sb = new Sandbox("sb-aaaaaaaaaaaa", new Client({ url: fake.url, token: "t" }));
    const boom = new Error("callback failed");
    await assert.rejects(
      sb.commands.run("x", {
        onStdout: () => {
          throw boom;
        },
      }),
      (e) => e === boom,
    );
  });

  /** A 201 branch answer: children 0 and 2 run; `failed` as given. */
  const branchAnswer = (failed: { index: number; error: string }[]) => ({
    status: 201,
    json: {
      parent: SANDBOX.id,
      branch_point: "snap-bbbbbbbbbbbb",
      children: ["sb-c00000000001", "sb-c00000000003"],
      failed,
      duration_ms: 900,
      pause_ms: 7.5,
    },
  });
  const lostChild = [{ index: 1, error: "the agent did not answer" }];

  test("a branch with a lost child throws BranchIncompleteError with the running ones", async () => {
    fake.load([branchAnswer(lostChild)]);
    const client = new Client({ url: fake.url, token: "t" });
    await assert.rejects(new Sandbox(SANDBOX.id, client).branch({ n: 3 }), (e: unknown) => {
      assert.ok(e instanceof BranchIncompleteError && e instanceof ZygoteError);
      assert.deepEqual([e.name, e.code, e.parent], ["BranchIncompleteError", "branch_incomplete", SANDBOX.id]);
      assert.ok(e.children.every((k) => k instanceof Sandbox && k.client === client));
      assert.deepEqual(e.children.map((k) => k.id), ["sb-c00000000001", "sb-c00000000003"]);
      assert.deepEqual(e.failures, lostChild);
      assert.match(e.message, /2 of 3/);
      assert.match(e.message, /child 1 failed: the agent did not answer/);
      return true;
    });
  });

  test("allowPartial resolves to the running children; branchDetailed does not throw", async () => {
    fake.load([branchAnswer(lostChild), branchAnswer(lostChild)]);
    const sb = new Sandbox(SANDBOX.id, new Client({ url: fake.url, token: "t" }));
    const kids = await sb.branch({ n: 3, allowPartial: true });
    assert.deepEqual(kids.map((k) => k.id), ["sb-c00000000001", "sb-c00000000003"]);
    const res = await sb.branchDetailed({ n: 3 });
    assert.deepEqual([res.failed, res.pauseMs], [lostChild, 7.5]);
    // allowPartial is the SDK's choice: the request is the same.
    assert.deepEqual(JSON.parse(fake.requests[0]!.body.toString("utf8")), { count: 3 });
  });

  test("a branch without failures resolves to the children", async () => {
    fake.load([branchAnswer([])]);
    const sb = new Sandbox(SANDBOX.id, new Client({ url: fake.url, token: "t" }));
    const kids = await sb.branch({ n: 2 });
    assert.deepEqual(kids.map((k) => k.id), ["sb-c00000000001", "sb-c00000000003"]);
  });

  const treeAnswer = {
    root: SANDBOX.id,
    sandboxes: [
      {
        id: SANDBOX.id,
        name: "agent",
        state: "running",
        parent: null,
        started_from: null,
        children: ["sb-c00000000001", "sb-c00000000002"],
        unique_memory_bytes: 52428800,
        disk_bytes: 4096,
      },
      {
        id: "sb-c00000000001",
        name: null,
        state: "running",
        parent: SANDBOX.id,
        started_from: "snap-bbbbbbbbbbbb",
        children: [],
        unique_memory_bytes: 1048576,
        disk_bytes: null,
      },
      {
        id: "sb-c00000000002",
        name: null,
        state: "dead",
        parent: SANDBOX.id,
        started_from: "snap-bbbbbbbbbbbb",
        children: [],
        unique_memory_bytes: null,
        disk_bytes: null,
      },
    ],
    snapshots: [{ id: "snap-bbbbbbbbbbbb", kind: "branch", source_sandbox: SANDBOX.id, size_bytes: 134217728 }],
  };

  test("tree gets the lineage and parses every field, nulls included", async () => {
    fake.load([{ status: 200, json: treeAnswer }]);
    const tree = await new Sandbox("sb-c00000000001", new Client({ url: fake.url, token: "t" })).tree();
    assert.deepEqual(
      fake.requests.map((r) => [r.method, r.path, r.body.length]),
      [["GET", "/v1/sandboxes/sb-c00000000001/tree", 0]],
    );
    const expected: SandboxTree = {
      root: SANDBOX.id,
      sandboxes: [
        {
          id: SANDBOX.id,
          name: "agent",
          state: "running",
          parent: null,
          startedFrom: null,
          children: ["sb-c00000000001", "sb-c00000000002"],
          uniqueMemoryBytes: 52428800,
          diskBytes: 4096,
        },
        {
          id: "sb-c00000000001",
          name: null,
          state: "running",
          parent: SANDBOX.id,
          startedFrom: "snap-bbbbbbbbbbbb",
          children: [],
          uniqueMemoryBytes: 1048576,
          diskBytes: null,
        },
        {
          id: "sb-c00000000002",
          name: null,
          state: "dead",
          parent: SANDBOX.id,
          startedFrom: "snap-bbbbbbbbbbbb",
          children: [],
          uniqueMemoryBytes: null,
          diskBytes: null,
        },
      ],
      snapshots: [{ id: "snap-bbbbbbbbbbbb", kind: "branch", sourceSandbox: SANDBOX.id, sizeBytes: 134217728 }],
    };
    assert.deepEqual(tree, expected);
  });

  test("keep posts promote and parses the result", async () => {
    fake.load([
      { status: 200, json: { kept: "sb-c00000000001", deleted: ["sb-c00000000002"], name: null } },
      { status: 200, json: { kept: "sb-c00000000001", deleted: ["sb-c00000000003", SANDBOX.id], name: "agent" } },
    ]);
    const sb = new Sandbox("sb-c00000000001", new Client({ url: fake.url, token: "t" }));
    assert.deepEqual(await sb.keep(), { kept: "sb-c00000000001", deleted: ["sb-c00000000002"], name: null });
    assert.deepEqual(await sb.keep({ promote: true }), {
      kept: "sb-c00000000001",
      deleted: ["sb-c00000000003", SANDBOX.id],
      name: "agent",
    });
    assert.deepEqual(
      fake.requests.map((r) => [r.method, r.path, JSON.parse(r.body.toString("utf8"))]),
      [
        ["POST", "/v1/sandboxes/sb-c00000000001/keep", { promote: false }],
        ["POST", "/v1/sandboxes/sb-c00000000001/keep", { promote: true }],
      ],
    );
  });

  test("a refused keep is a ConflictError; a missing sandbox's tree SandboxNotFound", async () => {
    const message = "sb-aaaaaaaaaaaa is not a branch child: there are no siblings to drop";
    fake.load([
      { status: 409, json: { error: { code: "conflict", message } } },
      { status: 404, json: { error: { code: "not_found", message: 'sandbox "sb-x" not found' } } },
    ]);
    const client = new Client({ url: fake.url, token: "t" });
    await assert.rejects(new Sandbox(SANDBOX.id, client).keep({ promote: true }), (e: unknown) => {
      assert.ok(e instanceof ConflictError && e.constructor === ConflictError);
      assert.deepEqual([e.code, e.status, e.message], ["conflict", 409, message]);
      return true;
    });
    await assert.rejects(new Sandbox("sb-x", client).tree(), SandboxNotFound);
  });

  const WORK = "/root/work";
  /** The parent holds a small project (and a file outside it) in the fake's file model. */
  const project = (keepsPoints = false): void => {
    fake.load([]);
    fake.files = new FakeFiles(
      { [SANDBOX.id]: { [`${WORK}/calc.sh`]: "a - b", [`${WORK}/README`]: "calc", "/root/notes": "n" } },
      keepsPoints,
    );
  };
  const merges = () =>
    fake.requests.filter((r) => r.path.endsWith("/merge")).map((r) => JSON.parse(r.body.toString("utf8")));

  test("merge brings a child's changes into the parent and keeps the parent's own", async () => {
    project();
    try {
      const parent = new Sandbox(SANDBOX.id, new Client({ url: fake.url, token: "t" }));
      const [child] = await parent.branch({ mergeable: true });
      await child!.files.write(`${WORK}/calc.sh`, "a + b");
      await child!.files.write(`${WORK}/test.sh`, "test");
      await child!.files.write("/root/notes", "outside the merged directory");
      await parent.files.write(`${WORK}/parent.txt`, "the parent's own");

      const preview = await parent.merge(child!, { paths: [WORK], dryRun: true });
      assert.equal(preview.applied, false);
      assert.equal(await parent.files.read(`${WORK}/calc.sh`), "a - b");

      const report = await parent.merge(child!, { paths: [WORK] });
      assert.deepEqual(JSON.parse(fake.requests[0]!.body.toString("utf8")), { count: 1, mergeable: true });
      assert.deepEqual(merges(), [
        { from: child!.id, on_conflict: "fail", dry_run: true, paths: [WORK] },
        { from: child!.id, on_conflict: "fail", dry_run: false, paths: [WORK] },
      ]);
      assert.deepEqual(
        [report.applied, report.sandbox, report.from, report.paths, report.conflicts],
        [true, SANDBOX.id, child!.id, [WORK], []],
      );
      assert.deepEqual(report.changes, [
        { path: `${WORK}/calc.sh`, action: "modify", kind: "file", size: 5 },
        { path: `${WORK}/test.sh`, action: "add", kind: "file", size: 4 },
      ]);
      assert.deepEqual([preview.changes, report.bytesCopied], [report.changes, 9]);
      const after: Record<string, string> = {};
      for (const p of [`${WORK}/calc.sh`, `${WORK}/test.sh`, `${WORK}/parent.txt`, "/root/notes"]) {
        after[p] = await parent.files.read(p);
      }
      assert.deepEqual(after, {
        [`${WORK}/calc.sh`]: "a + b",
        [`${WORK}/test.sh`]: "test",
        [`${WORK}/parent.txt`]: "the parent's own",
        "/root/notes": "n",
      });
    } finally {
      fake.files = undefined;
    }
  });

  test("a merge stopped by conflicts throws MergeConflictError and changes nothing", async () => {
    project(true);
    try {
      const parent = new Sandbox(SANDBOX.id, new Client({ url: fake.url, token: "t" }));
      const [child] = await parent.branch();
      await child!.files.write(`${WORK}/calc.sh`, "a + b");
      await child!.files.write(`${WORK}/test.sh`, "test");
      await parent.files.write(`${WORK}/calc.sh`, "a * b");
      const calc = { path: `${WORK}/calc.sh`, ours: "modified", theirs: "modified" };
      await assert.rejects(parent.merge(child!.id, { paths: [WORK] }), (e: unknown) => {
        assert.ok(e instanceof MergeConflictError && e instanceof ZygoteError && !(e instanceof ConflictError));
        assert.deepEqual([e.name, e.code, e.status], ["MergeConflictError", "merge_conflict", undefined]);
        assert.deepEqual([e.report.applied, e.report.from], [false, child!.id]);
        assert.deepEqual(e.conflicts, [{ ...calc, resolution: null }]);
        assert.match(e.message, /\/root\/work\/calc\.sh \(ours modified, theirs modified\)/);
        assert.match(e.message, /nothing was changed/);
        return true;
      });
      await assert.rejects(parent.files.read(`${WORK}/test.sh`), FileNotFound);
      assert.equal(await parent.files.read(`${WORK}/calc.sh`), "a * b");
      // A dry run reports the conflict without throwing; `theirs` settles it.
      const dry = await parent.merge(child!, { paths: [WORK], dryRun: true });
      assert.deepEqual([dry.applied, dry.conflicts], [false, [{ ...calc, resolution: null }]]);
      const theirs = await parent.merge(child!, { paths: [WORK], onConflict: "theirs" });
      assert.deepEqual([theirs.applied, theirs.conflicts], [true, [{ ...calc, resolution: "theirs" }]]);
      assert.equal(await parent.files.read(`${WORK}/calc.sh`), "a + b");
    } finally {
      fake.files = undefined;
    }
  });

  test("merge refusals are ConflictErrors; siblings merge with ours", async () => {
    project();
    try {
      const parent = new Sandbox(SANDBOX.id, new Client({ url: fake.url, token: "t" }));
      // The kvm runtime: a branch point is kept only when asked.
      const [lone] = await parent.branch();
      await assert.rejects(parent.merge(lone!), (e: unknown) => {
        assert.ok(e instanceof ConflictError && e.constructor === ConflictError);
        assert.equal(e.status, 409);
        assert.match(e.message, /was not saved/);
        return true;
      });
      assert.deepEqual(merges(), [{ from: lone!.id, on_conflict: "fail", dry_run: false }]);

      const [x, y] = await parent.branch({ n: 2, mergeable: true });
      await x!.files.write(`${WORK}/calc.sh`, "a + b");
      await x!.files.write(`${WORK}/test.sh`, "test");
      await y!.files.write(`${WORK}/calc.sh`, "b + a");
      await assert.rejects(y!.merge(x!, { paths: [WORK] }), MergeConflictError);
      const ours = await y!.merge(x!, { paths: [WORK], onConflict: "ours" });
      assert.equal(ours.applied, true);
      assert.deepEqual(
        ours.conflicts.map((c) => [c.path, c.resolution]),
        [[`${WORK}/calc.sh`, "ours"]],
      );
      assert.deepEqual(
        ours.changes.map((c) => c.path),
        [`${WORK}/test.sh`],
      );
      assert.deepEqual(
        [await y!.files.read(`${WORK}/calc.sh`), await y!.files.read(`${WORK}/test.sh`)],
        ["b + a", "test"],
      );
    } finally {
      fake.files = undefined;
    }
  });

  test("volumes are sent at create as {name, path} mounts", async () => {
    fake.load([]);
    fake.files = new FakeFiles();
    try {
      const client = new Client({ url: fake.url, token: "t" });
      await Sandbox.create({ client, volumes: { "/data": "vol-a", "/b": { name: "other" } } });
      assert.deepEqual(JSON.parse(fake.requests[0]!.body.toString("utf8")), {
        image: "minimal",
        volumes: [
          { name: "vol-a", path: "/data" },
          { name: "other", path: "/b" },
        ],
      });
    } finally {
      fake.files = undefined;
    }
  });

  /** A value with the characters a query string gives meaning to. */
  const TRICKY = "a=b&c d+e%f?";
  const listQueries = () =>
    fake.requests.filter((r) => r.method === "GET" && r.path === "/v1/sandboxes").map((r) => r.rawQuery);

  test("metadata is sent at create, inherited by branches and filters the list", async () => {
    fake.load([]);
    fake.files = new FakeFiles();
    try {
      const client = new Client({ url: fake.url, token: "t" });
      const sb = await Sandbox.create({ client, metadata: { team: "search", "run/id": TRICKY } });
      const other = await Sandbox.create({ client, metadata: { team: "infra" } });
      assert.deepEqual(JSON.parse(fake.requests[0]!.body.toString("utf8")), {
        image: "minimal",
        metadata: { team: "search", "run/id": TRICKY },
      });
      assert.deepEqual((await sb.info()).metadata, { team: "search", "run/id": TRICKY });
      const kids = await sb.branch({ n: 2 });
      for (const k of kids) {
        assert.deepEqual((await k.info()).metadata, { team: "search", "run/id": TRICKY, "zygote.parent": sb.id });
      }
      const byParent = await Sandbox.list({ client, metadata: { "zygote.parent": sb.id } });
      assert.deepEqual(byParent.map((s) => s.id).sort(), kids.map((k) => k.id).sort());
      assert.ok(byParent.every((s) => s instanceof Sandbox && s.client === client));
      // Several pairs are ANDed; the value travels intact.
      const both = await client.sandboxes({ metadata: { team: "search", "run/id": TRICKY } });
      assert.deepEqual(both.map((s) => s.id).sort(), [sb.id, ...kids.map((k) => k.id)].sort());
      assert.deepEqual((await client.sandboxes({ metadata: { team: "infra" } })).map((s) => s.id), [other.id]);
      assert.deepEqual(await client.sandboxes({ metadata: { team: "search", "run/id": "a=b" } }), []);
      assert.equal((await client.sandboxes()).length, 4);
      assert.equal((await Sandbox.list({ client, metadata: {} })).length, 4);
      const queries = listQueries();
      // One metadata=key=value parameter per pair, each encoded.
      assert.deepEqual(
        [...new URLSearchParams(queries[1])],
        [
          ["metadata", "team=search"],
          ["metadata", `run/id=${TRICKY}`],
        ],
      );
      assert.ok(!queries[1]!.includes(TRICKY));
      assert.deepEqual(queries.slice(-2), ["", ""]);
    } finally {
      fake.files = undefined;
    }
  });

  test("invalid metadata and filters throw InvalidArgument; a key with '=' is refused locally", async () => {
    fake.load([]);
    fake.files = new FakeFiles();
    try {
      const client = new Client({ url: fake.url, token: "t" });
      const many = Object.fromEntries(Array.from({ length: 64 }, (_, i) => [`k${i}`, "v"]));
      for (const bad of [{ "sp ace": "x" }, { "zygote.parent": "sb-1" }, { k: "v".repeat(1025) }, many]) {
        await assert.rejects(
          Sandbox.create({ client, metadata: bad }),
          (e) => e instanceof InvalidArgument && e.code === "invalid_argument" && e.status === 400,
        );
      }
      await assert.rejects(client.sandboxes({ metadata: { "bad key": "x" } }), InvalidArgument);
      // The daemon's refusals of queries the SDK never sends, modelled by the fake.
      for (const query of [{ metadata: "novalue" }, { state: "running" }] as Record<string, string>[]) {
        await assert.rejects(client.request("GET", "/v1/sandboxes", { query }), InvalidArgument);
      }
      const sent = fake.requests.length;
      await assert.rejects(Sandbox.list({ client, metadata: { "a=b": "c" } }), /without '='/);
      assert.equal(fake.requests.length, sent);
      assert.deepEqual(await client.sandboxes(), []);
    } finally {
      fake.files = undefined;
    }
  });

  test("a sandbox killed is gone from the fake's list; old answers have empty metadata", async () => {
    fake.load([{ status: 200, json: { id: "sb-old", state: "running" } }]);
    const client = new Client({ url: fake.url, token: "t" });
    assert.deepEqual((await new Sandbox("sb-old", client).info()).metadata, {});
    fake.files = new FakeFiles();
    try {
      const sb = await Sandbox.create({ client, metadata: { k: "v" } });
      assert.equal(await sb.kill(), true);
      assert.deepEqual(await client.sandboxes({ metadata: { k: "v" } }), []);
    } finally {
      fake.files = undefined;
    }
  });

  test("pause and resume; a paused sandbox refuses file calls unless created with autoResume", async () => {
    fake.load([]);
    fake.files = new FakeFiles();
    try {
      const client = new Client({ url: fake.url, token: "t" });
      const sb = await Sandbox.create({ client });
      await sb.files.write("/root/f", "kept");
      const paused = await sb.pause();
      assert.deepEqual([paused.state, paused.pid, paused.pausedAt !== null], ["paused", null, true]);
      await assert.rejects(
        sb.files.read("/root/f"),
        (e) => e instanceof SandboxPaused && e instanceof SandboxNotRunning && e.status === 409,
      );
      await assert.rejects(sb.pause(), (e) => e instanceof WrongState && e.code === "wrong_state");
      assert.equal((await sb.resume()).state, "running");
      assert.equal(await sb.files.read("/root/f"), "kept");
      await assert.rejects(sb.resume(), WrongState);

      const auto = await Sandbox.create({ client, autoResume: true, ttlAction: "pause", ttlSecs: 60 });
      assert.deepEqual(JSON.parse(fake.requests.at(-1)!.body.toString("utf8")), {
        image: "minimal",
        ttl_secs: 60,
        ttl_action: "pause",
        auto_resume: true,
      });
      const info = await auto.info();
      assert.deepEqual([info.autoResume, info.ttlAction], [true, "pause"]);
      await auto.files.write("/root/g", "x");
      await auto.pause();
      assert.equal(await auto.files.read("/root/g"), "x");
      assert.equal((await auto.info()).state, "running");
    } finally {
      fake.files = undefined;
    }
  });

  test("setTtl sends ttl_action when given; an unknown action is refused locally", async () => {
    fake.load([
      { status: 200, json: SANDBOX },
      { status: 200, json: SANDBOX },
    ]);
    const sb = new Sandbox("sb-aaaaaaaaaaaa", new Client({ url: fake.url, token: "t" }));
    const info = await sb.setTtl(30, { ttlAction: "pause" });
    await sb.setTtl(null);
    await assert.rejects(sb.setTtl(30, { ttlAction: "stop" as "pause" }), TypeError);
    assert.deepEqual(
      fake.requests.map((r) => JSON.parse(r.body.toString("utf8"))),
      [{ ttl_secs: 30, ttl_action: "pause" }, { ttl_secs: null }],
    );
    // Daemons from before pause/resume: the defaults.
    assert.deepEqual([info.autoResume, info.ttlAction, info.pausedAt, info.ttlLeftSecs], [false, "delete", null, null]);
  });

  test("setNetwork replaces the policy with what is given", async () => {
    fake.load([
      { status: 200, json: SANDBOX },
      { status: 200, json: SANDBOX },
    ]);
    const sb = new Sandbox("sb-aaaaaaaaaaaa", new Client({ url: fake.url, token: "t" }));
    await sb.setNetwork({ denyOut: ["10.0.0.0/8"], allowOut: [] });
    await sb.setNetwork();
    assert.deepEqual(
      fake.requests.map((r) => [r.method, r.path]),
      [
        ["PUT", "/v1/sandboxes/sb-aaaaaaaaaaaa/network"],
        ["PUT", "/v1/sandboxes/sb-aaaaaaaaaaaa/network"],
      ],
    );
    assert.deepEqual(
      fake.requests.map((r) => JSON.parse(r.body.toString("utf8"))),
      [{ allow_out: [], deny_out: ["10.0.0.0/8"] }, {}],
    );
  });

  test("events ask for their filters and parse the log", async () => {
    fake.load([
      {
        status: 200,
        json: {
          events: [
            { ts_ms: 1700000000123, level: "warn", message: "command ended", fields: { exit_code: "3" } },
            { ts_ms: 1700000000456, level: "info", message: "paused" },
          ],
        },
      },
      { status: 200, json: { events: [] } },
    ]);
    const sb = new Sandbox("sb-aaaaaaaaaaaa", new Client({ url: fake.url, token: "t" }));
    const got = await sb.events({ sinceMs: 5, limit: 2, newestFirst: true, level: "warn", search: "command" });
    assert.deepEqual(got, [
      { tsMs: 1700000000123, level: "warn", message: "command ended", fields: { exit_code: "3" } },
      { tsMs: 1700000000456, level: "info", message: "paused", fields: {} },
    ]);
    assert.deepEqual(await sb.events(), []);
    await assert.rejects(sb.events({ level: "fatal" as "warn" }), /level must be one of/);
    assert.deepEqual(
      fake.requests.map((r) => [r.method, r.path, r.rawQuery]),
      [
        ["GET", "/v1/sandboxes/sb-aaaaaaaaaaaa/events", "since_ms=5&limit=2&order=desc&level=warn&search=command"],
        ["GET", "/v1/sandboxes/sb-aaaaaaaaaaaa/events", ""],
      ],
    );
  });

  test("metrics sends the time bounds and reads the samples", async () => {
    const metric = {
      timestamp: "2026-01-01T00:00:05Z",
      timestamp_unix: 1767225605,
      cpu_count: 2,
      cpu_used_pct: 12.5,
      mem_total: 536870912,
      mem_used: 104857600,
      mem_cache: 10485760,
      disk_total: 1073741824,
      disk_used: 314572800,
    };
    fake.load([
      { status: 200, json: { metrics: [metric] } },
      { status: 200, json: { metrics: [] } },
    ]);
    const sb = new Sandbox("sb-aaaaaaaaaaaa", new Client({ url: fake.url, token: "t" }));
    const got = await sb.metrics({ start: 1767225600, end: new Date(Date.UTC(2026, 0, 1, 0, 1)) });
    assert.deepEqual(got, [
      {
        timestamp: "2026-01-01T00:00:05Z",
        timestampUnix: 1767225605,
        cpuCount: 2,
        cpuUsedPct: 12.5,
        memTotal: 536870912,
        memUsed: 104857600,
        memCache: 10485760,
        diskTotal: 1073741824,
        diskUsed: 314572800,
      },
    ]);
    assert.deepEqual(await sb.metrics(), []);
    await assert.rejects(sb.metrics({ start: 10, end: 5 }), /must not be after end/);
    await assert.rejects(sb.metrics({ start: -1 }), RangeError);
    assert.deepEqual(
      fake.requests.map((r) => [r.method, r.path, r.query]),
      [
        ["GET", "/v1/sandboxes/sb-aaaaaaaaaaaa/metrics", { start: "1767225600", end: "1767225660" }],
        ["GET", "/v1/sandboxes/sb-aaaaaaaaaaaa/metrics", {}],
      ],
    );
  });

  test("a stream without an exit event is a ServerError", async () => {
    fake.load([{ status: 200, ndjson: [{ type: "started", pid: 1 }] }]);
    const sb = new Sandbox("sb-aaaaaaaaaaaa", new Client({ url: fake.url, token: "t" }));
    await assert.rejects(sb.commands.run("x"), (e) => e instanceof ServerError && e.code === "stream_ended");
  });
});
