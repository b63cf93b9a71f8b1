/**
 * OCI images and snapshot packs against a real zygoted and a real registry on
 * 127.0.0.1 (live-registry.ts), as the Python SDK's tests/test_live_oci.py: a
 * busybox image made with umoci and pushed with skopeo is pulled (with
 * progress, and on first use by a create), booted and exec'd in as its config
 * says (and as other users); a snapshot is exported to a file and imported
 * back, pushed (a second push sends nothing) and pulled back, and sandboxes
 * started from the imported and the pulled snapshot find its files.
 *
 * Skips, saying why, without docker-registry, skopeo, umoci or a static
 * busybox (and the pack part on a daemon whose runtime has no packs: kvm, for
 * now). Everything made is removed at the end.
 */
import assert from "node:assert/strict";
import { rmSync, statSync } from "node:fs";
import { join } from "node:path";
import { after, before, describe, test } from "node:test";

import { Client, ImageNotFound, InvalidArgument, Sandbox, type Snapshot, type TransferProgress } from "../dist/index.js";
import { APP_FILE, GREETING, LocalRegistry, buildLayout, tempDir, unavailable } from "./live-registry.js";

const URL = process.env.ZYGOTE_URL;
const TOKEN = process.env.ZYGOTE_TOKEN;
const STATE = "written before the snapshot\n";
const noDaemon = !URL || !TOKEN ? "no live zygoted (set ZYGOTE_URL and ZYGOTE_TOKEN, or run scripts/sdk-test.sh)" : undefined;
const missing = noDaemon ? undefined : unavailable();
const skip = noDaemon ?? (missing ? `the OCI live tests need a local registry: ${missing}` : false);

describe("live zygoted: OCI images and snapshot packs", { skip }, () => {
  const client = new Client({ url: URL, token: TOKEN });
  const sandboxes: Sandbox[] = [];
  const snapshots: Snapshot[] = [];
  let registry: LocalRegistry | undefined;
  let tmp: string;
  let digest: string;
  let sb: Sandbox;
  const ref = (repo: string) => `${registry!.host}/${repo}`;

  before(async () => {
    tmp = tempDir("zygote-sdk-oci-");
    registry = await LocalRegistry.start();
    const layout = buildLayout(tmp);
    digest = registry.push(layout, "v1", "sdk/app:1");
    // The same image under a second name, for a create to pull on first use.
    assert.equal(registry.push(layout, "v1", "sdk/app:2"), digest);
  });

  after(async () => {
    // Sandboxes read their snapshots' disk layers: they go first; then the
    // snapshots, newest first (a later one may build on an earlier one).
    for (const s of sandboxes) await s.kill();
    for (const s of snapshots.reverse()) await client.deleteSnapshot(s);
    await registry?.stop();
    if (tmp) rmSync(tmp, { recursive: true, force: true });
  });

  test("pullImage reports progress; the image is listed", async () => {
    const seen: TransferProgress[] = [];
    const image = await client.pullImage(ref("sdk/app:1"), { onProgress: (p) => void seen.push(p) });
    assert.deepEqual([image.source, image.digest], [ref("sdk/app:1"), digest]);
    assert.equal(seen[0]?.type, "resolved");
    assert.deepEqual([seen[0]?.digest, seen[0]?.layers], [digest, 1]);
    const layers = seen.filter((e) => e.type === "layer");
    const last = layers.at(-1)!;
    assert.ok(last.total && last.done === last.total, JSON.stringify(last));
    const listed = await client.images();
    assert.equal(listed.find((i) => i.name === image.name)?.digest, digest);
    assert.equal(listed.find((i) => i.name === "minimal")?.source, null);
    await assert.rejects(client.pullImage(ref("sdk/app:nope")), ImageNotFound);
  });

  test("a sandbox created from a reference runs commands as the image says, or as told", async () => {
    sb = await Sandbox.create({ image: ref("sdk/app:2"), memoryMib: 128, client });
    sandboxes.push(sb);
    const r = await sb.commands.run("id -u; id -g; pwd; echo $GREETING");
    assert.equal(r.stdout, `1000\n1000\n/app\n${GREETING}\n`);
    assert.equal((await sb.commands.run("id -u; pwd", { user: "root", cwd: "/" })).stdout, "0\n/\n");
    assert.equal((await sb.commands.run(["id", "-u"], { user: 4242 })).stdout, "4242\n");
    await assert.rejects(sb.commands.run("id", { user: "app" }), InvalidArgument);
    const h = await sb.commands.run("id -u", { background: true, user: "0" });
    assert.equal((await h.wait()).stdout, "0\n");
    assert.equal(await sb.files.read("/app/hello.txt"), APP_FILE);
  });

  test("a snapshot goes out to a file and a registry and comes back", async (t) => {
    const runtime = ((await client.info()).runtime as { name: string }).name;
    if (runtime !== "qemu") {
      t.skip(`snapshot packs are the qemu runtime's; this daemon runs ${runtime}`);
      return;
    }
    assert.ok(sb, "needs the sandbox of the previous test");
    await sb.files.write("/app/state.txt", STATE);
    const snap = await sb.snapshot({ name: "sdk-oci-ts" });
    snapshots.push(snap);
    assert.equal(snap.pack, null);

    const pack = join(tmp, "snapshot.tar");
    const size = await client.exportSnapshot(snap, pack);
    assert.ok(size > 0 && size === statSync(pack).size);
    const imported = await client.importSnapshot(pack, { name: "sdk-oci-ts-imported" });
    snapshots.push(imported);
    assert.deepEqual([imported.name, imported.pack?.source, imported.pack?.snapshot], ["sdk-oci-ts-imported", "file", snap.id]);

    const warm = ref("sdk/warm:v1");
    const pushing: TransferProgress[] = [];
    const pushed = await client.pushSnapshot(snap, warm, { onProgress: (p) => void pushing.push(p) });
    assert.equal(pushed.reference, warm);
    assert.match(pushed.digest, /^sha256:/);
    assert.ok(pushed.size > 0 && pushing.some((e) => e.type === "blob"));
    const again: TransferProgress[] = [];
    assert.equal((await client.pushSnapshot(snap.id, warm, { onProgress: (p) => void again.push(p) })).digest, pushed.digest);
    assert.deepEqual(new Set(again.filter((e) => e.type === "blob").map((e) => e.state)), new Set(["cached"]));

    const pulled = await client.pullSnapshot(warm, { name: "sdk-oci-ts-pulled" });
    snapshots.push(pulled);
    assert.deepEqual(pulled.pack, { source: `oci://${warm}`, digest: pushed.digest, snapshot: snap.id });

    for (const source of [imported, pulled]) {
      const restored = await Sandbox.restore(source, { client });
      sandboxes.push(restored);
      assert.equal(await restored.files.read("/app/state.txt"), STATE);
      assert.equal((await restored.commands.run("id -u; pwd")).stdout, "1000\n/app\n");
    }
    await assert.rejects(client.pullSnapshot(ref("sdk/warm:nope")), ImageNotFound);
  });
});
