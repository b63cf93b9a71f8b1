/**
 * OCI images, exec users and snapshot packs against the fake daemon's model of
 * them (fake-oci.ts): pulls with progress and credentials, creates that pull on
 * first use, export to a file and import from one (streamed), push and pull
 * through the modelled registry, and each error the daemon can answer.
 */
import assert from "node:assert/strict";
import { mkdtempSync, readdirSync, readFileSync, rmSync, statSync, writeFileSync } from "node:fs";
import { randomBytes } from "node:crypto";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterEach, beforeEach, describe, test } from "node:test";

import {
  BadImage,
  Client,
  ImageNotFound,
  InvalidArgument,
  NotFoundError,
  RegistryError,
  RegistryUnauthorized,
  Sandbox,
  ServerError,
  SnapshotNotFound,
  type TransferProgress,
  UnsupportedPlatform,
} from "../dist/index.js";
import { FakeDaemon, FakeFiles } from "./fake-daemon.js";
import { FakeOci, manifestOf } from "./fake-oci.js";
import { FakeProcesses } from "./fake-processes.js";

const APP = "127.0.0.1:5000/team/app:1";
const WARM = "127.0.0.1:5000/team/warm:v1";

describe("OCI images and snapshot packs (fake daemon)", () => {
  let fake: FakeDaemon;
  let oci: FakeOci;
  let client: Client;
  let dir: string;

  beforeEach(async () => {
    oci = new FakeOci({
      [APP]: { layers: [700, 300] },
      "127.0.0.1:5000/arm/only:1": { layers: [10], arch: "arm64" },
      "127.0.0.1:5000/team/broken:1": { layers: [10], broken: true },
    });
    fake = await new FakeDaemon().start();
    fake.files = new FakeFiles();
    fake.oci = oci;
    client = new Client({ url: fake.url, token: "t" });
    dir = mkdtempSync(join(tmpdir(), "zygote-ts-oci-"));
  });
  afterEach(async () => {
    await fake.stop();
    rmSync(dir, { recursive: true, force: true });
  });

  const body = (i = -1) => JSON.parse(fake.requests.at(i)!.body.toString("utf8")) as Record<string, unknown>;

  test("pullImage reports progress and resolves to the image; a second pull finds the layers", async () => {
    const seen: TransferProgress[] = [];
    const image = await client.pullImage(APP, { onProgress: (p) => void seen.push(p) });
    assert.equal(image.name, APP);
    assert.equal(image.source, APP);
    assert.equal(image.digest, manifestOf(APP, oci.registry[APP]!));
    assert.deepEqual(
      seen.map((e) => e.type),
      ["resolved", "layer", "layer", "layer", "layer", "progress"],
    );
    const r = seen[0]!;
    assert.deepEqual([r.reference, r.digest, r.layers, r.bytes], [APP, image.digest, 2, 1000]);
    assert.deepEqual(
      seen.slice(1, 3).map((e) => [e.index, e.done, e.total, e.state]),
      [
        [0, 0, 700, "downloading"],
        [0, 700, 700, "done"],
      ],
    );
    assert.equal(seen.at(-1)!.line, "converting to ext4");
    assert.deepEqual(body(), { reference: APP });

    const listed = new Map((await client.images()).map((i) => [i.name, i]));
    assert.deepEqual([...listed.keys()].sort(), [APP, "minimal"].sort());
    assert.deepEqual([listed.get("minimal")!.source, listed.get("minimal")!.digest], [null, null]);
    assert.deepEqual([listed.get(APP)!.source, listed.get(APP)!.digest], [APP, image.digest]);

    const again: TransferProgress[] = [];
    await client.pullImage(APP, { onProgress: async (p) => void again.push(p) });
    assert.deepEqual(
      again.filter((e) => e.type === "layer").map((e) => e.state),
      ["cached", "cached"],
    );
  });

  test("pull errors are their classes", async () => {
    for (const [ref, cls, code] of [
      ["127.0.0.1:5000/team/missing:1", ImageNotFound, "image_not_found"],
      ["127.0.0.1:5000/arm/only:1", UnsupportedPlatform, "unsupported_platform"],
      ["127.0.0.1:5000/team/broken:1", BadImage, "bad_image"],
    ] as const) {
      await assert.rejects(client.pullImage(ref), (e: unknown) => {
        assert.ok(e instanceof cls, `${ref}: ${String(e)}`);
        assert.equal(e.code, code);
        assert.equal(e.status, undefined);
        return true;
      });
    }
    assert.ok(new ImageNotFound("x") instanceof NotFoundError);
    assert.ok(new RegistryError("x") instanceof ServerError);
    await assert.rejects(client.pullImage("Not A Reference"), (e: unknown) => e instanceof InvalidArgument && e.status === 400);
  });

  test("credentials go with the pull; one without the other is refused before any request", async () => {
    oci.auth = ["ci", "pw"];
    await assert.rejects(client.pullImage(APP), RegistryUnauthorized);
    await assert.rejects(client.pullImage(APP, { username: "ci", password: "wrong" }), RegistryUnauthorized);
    assert.equal((await client.pullImage(APP, { username: "ci", password: "pw" })).name, APP);
    assert.deepEqual(body(), { reference: APP, username: "ci", password: "pw" });
    const sent = fake.requests.length;
    await assert.rejects(client.pullImage(APP, { username: "ci" }), /go together/);
    assert.equal(fake.requests.length, sent);
  });

  test("a stream without its result, with an unknown line, or ending in an error", async () => {
    fake.oci = undefined;
    fake.load([
      { status: 200, ndjson: [{ type: "resolved", reference: APP, digest: "sha256:1", layers: 1, bytes: 1 }] },
      { status: 200, ndjson: [{ type: "newer_kind", x: 1 }, { type: "done", image: { name: APP } }] },
      { status: 200, ndjson: [{ type: "error", code: "registry_error", message: "502 from the registry" }] },
    ]);
    await assert.rejects(client.pullImage(APP), (e: unknown) => e instanceof ServerError && e.code === "stream_ended");
    const seen: TransferProgress[] = [];
    assert.equal((await client.pullImage(APP, { onProgress: (p) => void seen.push(p) })).name, APP);
    assert.deepEqual(
      seen.map((p) => [p.type, p.raw]),
      [["newer_kind", { type: "newer_kind", x: 1 }]],
    );
    await assert.rejects(client.pullImage(APP), (e: unknown) => e instanceof RegistryError && e.code === "registry_error");
  });

  test("a create from a reference pulls it first", async () => {
    const sb = await Sandbox.create({ image: APP, client });
    assert.equal((await sb.info()).state, "running");
    assert.ok((await client.images()).some((i) => i.name === APP));
    await assert.rejects(
      Sandbox.create({ image: "127.0.0.1:5000/team/missing:1", client }),
      (e: unknown) => e instanceof ImageNotFound && e.status === 404,
    );
  });

  test("run sends the user, also in the background", async () => {
    const exit = { type: "exit", exit_code: 0, signal: null, timed_out: false, duration_ms: 1 };
    fake.load([
      { status: 200, ndjson: [exit] },
      { status: 200, ndjson: [exit] },
      { status: 200, ndjson: [exit] },
    ]);
    const sb = new Sandbox("sb-aaaaaaaaaaaa", client);
    await sb.commands.run("id -u", { user: "1000:1000" });
    await sb.commands.run(["id"], { user: 1000 });
    await sb.commands.run("id");
    await assert.rejects(sb.commands.run("id", { user: true as unknown as string }), TypeError);
    assert.deepEqual(
      fake.requests.map((r) => (JSON.parse(r.body.toString()) as { user?: string }).user),
      ["1000:1000", "1000", undefined],
    );
    fake.processes = new FakeProcesses();
    const h = await sb.commands.run("echo hi", { background: true, user: "root" });
    assert.equal((await h.wait()).stdout, "hi\n");
    const started = fake.requests.find((r) => r.path.endsWith("/exec"))!;
    assert.equal((JSON.parse(started.body.toString()) as { user: string }).user, "root");
  });

  test("export streams to a file; import streams it back", async () => {
    const sb = await Sandbox.create({ client });
    const snap = await sb.snapshot({ name: "warm" });
    assert.equal(snap.pack, null);
    const dest = join(dir, "warm.tar");
    const size = await client.exportSnapshot(snap, dest);
    const data = readFileSync(dest);
    assert.equal(size, data.length);
    assert.deepEqual(data, oci.tarOf(oci.snapshots.get(snap.id)!));
    assert.equal(fake.requests.at(-1)!.path, `/v1/snapshots/${snap.id}/export`);
    assert.deepEqual(readdirSync(dir), ["warm.tar"]);

    const imported = await client.importSnapshot(dest, { name: "warm-copy" });
    const req = fake.requests.at(-1)!;
    assert.deepEqual([req.method, req.path, req.query], ["POST", "/v1/snapshots/import", { name: "warm-copy" }]);
    assert.deepEqual(req.body, data);
    assert.equal(req.headers["content-type"], "application/x-tar");
    assert.equal(req.headers["content-length"], String(data.length));
    assert.notEqual(imported.id, snap.id);
    assert.equal(imported.name, "warm-copy");
    assert.equal(imported.pack?.source, "file");
    assert.equal(imported.pack?.snapshot, snap.id);
    assert.match(imported.pack?.digest ?? "", /^sha256:/);
    assert.deepEqual((await client.getSnapshot(imported.id)).pack, imported.pack);
    assert.equal((await client.importSnapshot(dest)).name, "warm");
  });

  test("a large import is sent whole, with its length", async () => {
    const junk = join(dir, "junk.tar");
    writeFileSync(junk, randomBytes(3 * (1 << 20) + 12345));
    await assert.rejects(client.importSnapshot(junk), (e: unknown) => e instanceof BadImage && e.status === 422);
    assert.deepEqual(fake.requests.at(-1)!.body, readFileSync(junk));
    assert.equal(fake.requests.at(-1)!.headers["content-length"], String(statSync(junk).size));
  });

  test("a failed export leaves no file; a missing file is not sent", async () => {
    const dest = join(dir, "x.tar");
    await assert.rejects(client.exportSnapshot("snap-000000000000", dest), SnapshotNotFound);
    const snap = await (await Sandbox.create({ client })).snapshot();
    oci.cutExports.add(snap.id);
    await assert.rejects(client.exportSnapshot(snap, dest), (e: unknown) => e instanceof ServerError && e.code === "stream_ended");
    assert.deepEqual(readdirSync(dir), []);
    // A file that cannot be written is the file system's error, not a cut stream.
    oci.cutExports.delete(snap.id);
    await assert.rejects(client.exportSnapshot(snap, join(dir, "no/such/dir.tar")), (e: unknown) => {
      assert.equal((e as NodeJS.ErrnoException).code, "ENOENT");
      return true;
    });
    const sent = fake.requests.length;
    await assert.rejects(client.importSnapshot(join(dir, "missing.tar")), /ENOENT/);
    assert.equal(fake.requests.length, sent);
  });

  test("push and pull a snapshot through the registry; restore from its reference", async () => {
    const snap = await (await Sandbox.create({ client })).snapshot({ name: "warm" });
    const seen: TransferProgress[] = [];
    const pushed = await client.pushSnapshot(snap, WARM, { onProgress: (p) => void seen.push(p) });
    assert.deepEqual([pushed.reference, pushed.size], [WARM, 6000]);
    assert.match(pushed.digest, /^sha256:/);
    assert.equal(fake.requests.at(-1)!.path, `/v1/snapshots/${snap.id}/push`);
    assert.deepEqual(body(), { reference: WARM });
    assert.equal(seen[0]!.line, "packing");
    assert.deepEqual(
      seen.filter((e) => e.type === "blob").map((e) => [e.index, e.state]),
      [
        [0, "downloading"],
        [0, "done"],
        [1, "downloading"],
        [1, "done"],
        [2, "downloading"],
        [2, "done"],
      ],
    );
    const again: TransferProgress[] = [];
    await client.pushSnapshot(snap.id, WARM, { onProgress: (p) => void again.push(p) });
    assert.deepEqual(new Set(again.filter((e) => e.type === "blob").map((e) => e.state)), new Set(["cached"]));

    const got: TransferProgress[] = [];
    const pulled = await client.pullSnapshot(WARM, { name: "warm-pulled", onProgress: (p) => void got.push(p) });
    assert.deepEqual(body(), { reference: WARM, name: "warm-pulled" });
    assert.equal(pulled.name, "warm-pulled");
    assert.deepEqual(pulled.pack, { source: `oci://${WARM}`, digest: pushed.digest, snapshot: snap.id });
    assert.deepEqual(
      got.map((e) => e.type),
      ["progress", "blob", "blob", "blob"],
    );
    assert.ok((await client.snapshots()).some((s) => s.id === pulled.id));

    const before = oci.snapshots.size;
    const restored = await Sandbox.restore(WARM, { client });
    assert.equal((await restored.info()).state, "running");
    assert.equal(oci.snapshots.size, before + 1);
  });

  test("pack errors", async () => {
    await assert.rejects(
      client.pushSnapshot("snap-000000000000", WARM),
      (e: unknown) => e instanceof SnapshotNotFound && e.status === 404,
    );
    await assert.rejects(client.pullSnapshot(WARM), ImageNotFound);
    const snap = await (await Sandbox.create({ client })).snapshot();
    await assert.rejects(client.pushSnapshot(snap, "Bad Ref"), InvalidArgument);
    oci.auth = ["ci", "pw"];
    await assert.rejects(client.pushSnapshot(snap, WARM), RegistryUnauthorized);
    await client.pushSnapshot(snap, WARM, { username: "ci", password: "pw" });
    await assert.rejects(client.pullSnapshot(WARM), RegistryUnauthorized);
    assert.notEqual((await client.pullSnapshot(WARM, { username: "ci", password: "pw" })).pack, null);
    await assert.rejects(client.pullSnapshot(WARM, { password: "pw" }), TypeError);
  });
});
