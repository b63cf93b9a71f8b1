/**
 * OCI images and snapshot packs the way zygoted serves them
 * (crates/daemon/src/api/images.rs, api/packs.rs), for the fake daemon, with a
 * registry modelled in memory, as the Python SDK's tests/fake_oci.py does:
 *
 * - `POST /v1/images` pulls an image of the registry: NDJSON `resolved`, one
 *   `layer` line per layer and state (`downloading`/`done`, or `cached` for a
 *   layer in the blob store already), `progress`, then `done` with the image, or
 *   an `error` line (`image_not_found`, `registry_unauthorized`,
 *   `unsupported_platform`, `bad_image`). A reference zygoted cannot parse, or a
 *   username without a password, is a 400 before any stream. `GET /v1/images`
 *   lists `minimal` and what was pulled (`source`, `digest`).
 * - `POST /v1/sandboxes` naming a reference as `image` (or a pack's as `snapshot`)
 *   pulls it first (404 `image_not_found` when the registry has none), then leaves
 *   the create to the other models.
 * - Snapshots: `POST /v1/snapshots`, `GET` (list, one), `DELETE`; `GET .../export`
 *   answers a tar (an OCI layout whose one blob is the pack's config), chunked,
 *   broken off half-way for a snapshot in `cutExports`; `POST
 *   /v1/snapshots/import?name=` reads it back (201, `pack.source` `file`; 422
 *   `bad_image` for anything else); `POST .../push` and `POST /v1/snapshots/pull`
 *   stream `progress` and `blob` lines (`cached` for blobs the other side has),
 *   then `pushed` or `done`, or `error`.
 *
 * The registry wants `auth` (user, password) for everything when it is set.
 */
import { createHash } from "node:crypto";

import type { ScriptedResponse } from "./fake-daemon.js";

type Json = Record<string, unknown>;

const REFERENCE = /^[a-z0-9]([a-z0-9._:/@-]*[a-z0-9])?$/;

export const digestOf = (data: Buffer | string): string => `sha256:${createHash("sha256").update(data).digest("hex")}`;

const failure = (status: number, code: string, message: string): ScriptedResponse => ({
  status,
  json: { error: { code, message } },
});
const streamError = (code: string, message: string): Json => ({ type: "error", code, message });

/** An image the registry serves: its layers' sizes; `arch` and `broken` for the refusals. */
export interface RegistryImage {
  layers: number[];
  arch?: string;
  broken?: boolean;
}

export const manifestOf = (ref: string, img: RegistryImage): string => digestOf(`manifest ${ref} ${img.layers.join(",")}`);
const layerOf = (ref: string, i: number): string => digestOf(`layer ${ref} ${i}`);

interface RegistryPack {
  digest: string;
  snapshot: Json;
  blobs: [string, number][];
}

/** A tar member: a regular file (`data`), a directory (`dir`) or a symbolic link (`link`). */
export interface TarEntry {
  name: string;
  data?: Buffer;
  mode?: number;
  dir?: boolean;
  link?: string;
}

/** A USTAR archive of `entries`, root-owned (what the export answers; the live tests' layers). */
export function tar(entries: (TarEntry | [string, Buffer])[]): Buffer {
  const parts: Buffer[] = [];
  for (const entry of entries) {
    const e: TarEntry = Array.isArray(entry) ? { name: entry[0], data: entry[1] } : entry;
    const data = e.data ?? Buffer.alloc(0);
    const h = Buffer.alloc(512);
    const field = (value: string, at: number, len: number) => h.write(value, at, len, "ascii");
    const octal = (n: number, len: number) => `${n.toString(8).padStart(len - 1, "0")}\0`;
    field(e.name, 0, 100);
    field(octal(e.mode ?? (e.dir ? 0o755 : e.link ? 0o777 : 0o644), 8), 100, 8);
    field(octal(0, 8), 108, 8);
    field(octal(0, 8), 116, 8);
    field(octal(data.length, 12), 124, 12);
    field(octal(1700000000, 12), 136, 12);
    field("        ", 148, 8);
    field(e.dir ? "5" : e.link ? "2" : "0", 156, 1);
    if (e.link) field(e.link, 157, 100);
    field("ustar\0", 257, 6);
    field("00", 263, 2);
    let sum = 0;
    for (const b of h) sum += b;
    field(`${sum.toString(8).padStart(6, "0")}\0 `, 148, 8);
    parts.push(h, data, Buffer.alloc((512 - (data.length % 512)) % 512));
  }
  parts.push(Buffer.alloc(1024));
  return Buffer.concat(parts);
}

/** The regular files of a USTAR archive; throws on anything else. */
export function untar(data: Buffer): Map<string, Buffer> {
  const files = new Map<string, Buffer>();
  let at = 0;
  while (at + 512 <= data.length) {
    const h = data.subarray(at, at + 512);
    if (h.every((b) => b === 0)) return files;
    if (h.toString("ascii", 257, 262) !== "ustar") throw new Error("not a tar");
    const name = h.toString("ascii", 0, 100).replace(/\0.*$/s, "");
    const size = parseInt(h.toString("ascii", 124, 136).replace(/\0.*$/s, "").trim(), 8);
    if (!Number.isFinite(size) || at + 512 + size > data.length) throw new Error("a truncated tar");
    files.set(name, data.subarray(at + 512, at + 512 + size));
    at += 512 + Math.ceil(size / 512) * 512;
  }
  throw new Error("a tar without its end");
}

export class FakeOci {
  registry: Record<string, RegistryImage>;
  readonly packs = new Map<string, RegistryPack>();
  auth: [string, string] | undefined;
  images: Json[] = [
    {
      name: "minimal",
      sha256: "ab".repeat(32),
      size_bytes: 536870912,
      disk_bytes: 41943040,
      description: "busybox, the agent",
      built_at: 1700000000,
    },
  ];
  readonly snapshots = new Map<string, Json>();
  /** Blobs this daemon has (layers pulled, packs made or pulled): cached the next time. */
  readonly blobs = new Set<string>();
  /** Blobs the registry has (pushed packs), so a second push sends none. */
  readonly registryBlobs = new Set<string>();
  readonly cutExports = new Set<string>();
  private ids = 0xa0;

  constructor(registry: Record<string, RegistryImage> = {}) {
    this.registry = registry;
  }

  answer(method: string, path: string, query: Record<string, string>, body: Buffer): ScriptedResponse | undefined {
    const req = (): Json => JSON.parse(body.toString("utf8")) as Json;
    if (path === "/v1/images") return method === "POST" ? this.pullImage(req()) : this.listImages();
    if (path === "/v1/sandboxes" && method === "POST") return this.beforeCreate(req());
    if (path === "/v1/snapshots") {
      return method === "POST"
        ? { status: 201, json: this.newSnapshot((req().name as string | undefined) ?? null, String(req().sandbox), null) }
        : { status: 200, json: { snapshots: [...this.snapshots.values()] } };
    }
    if (path === "/v1/snapshots/import" && method === "POST") return this.importPack(query, body);
    if (path === "/v1/snapshots/pull" && method === "POST") {
      const r = req();
      return this.refused(r) ?? { status: 200, ndjson: this.pullPackEvents(r) };
    }
    const m = /^\/v1\/snapshots\/([^/]+)(\/export|\/push)?$/.exec(path);
    if (!m) return undefined;
    const snap = this.snapshots.get(m[1]!);
    if (!snap) return failure(404, "not_found", `snapshot "${m[1]}" not found`);
    if (m[2] === undefined) {
      if (method === "DELETE") {
        this.snapshots.delete(m[1]!);
        return { status: 204 };
      }
      return { status: 200, json: snap };
    }
    if (m[2] === "/export") return this.export(snap);
    return this.push(snap, req());
  }

  private listImages(): ScriptedResponse {
    return { status: 200, json: { images: this.images, recipes: ["minimal"] } };
  }

  /** The 400 zygoted answers before any stream (bad reference, half credentials). */
  private refused(req: Json): ScriptedResponse | undefined {
    const ref = req.reference;
    if (typeof ref !== "string" || !REFERENCE.test(ref)) {
      return failure(400, "invalid_argument", `invalid image reference ${JSON.stringify(ref)}`);
    }
    if (("username" in req) !== ("password" in req)) {
      return failure(400, "invalid_argument", "username and password go together: give both or neither");
    }
    return undefined;
  }

  private unauthorized(req: Json): Json | undefined {
    if (!this.auth || (req.username === this.auth[0] && req.password === this.auth[1])) return undefined;
    return streamError("registry_unauthorized", "the registry refused the credentials");
  }

  private pullImage(req: Json): ScriptedResponse {
    return this.refused(req) ?? { status: 200, ndjson: this.pullEvents(String(req.reference), req) };
  }

  private pullEvents(ref: string, req: Json): Json[] {
    const denied = this.unauthorized(req);
    if (denied) return [denied];
    const img = this.registry[ref];
    if (!img) return [streamError("image_not_found", `${ref}: manifest unknown`)];
    if ((img.arch ?? "amd64") !== "amd64") {
      return [streamError("unsupported_platform", `${ref} has no linux/amd64 image (it has linux/${img.arch})`)];
    }
    const manifest = manifestOf(ref, img);
    const total = img.layers.reduce((a, b) => a + b, 0);
    const events: Json[] = [{ type: "resolved", reference: ref, digest: manifest, layers: img.layers.length, bytes: total }];
    for (const [i, size] of img.layers.entries()) {
      const digest = layerOf(ref, i);
      if (this.blobs.has(digest)) {
        events.push({ type: "layer", index: i, digest, done: size, total: size, state: "cached" });
        continue;
      }
      events.push({ type: "layer", index: i, digest, done: 0, total: size, state: "downloading" });
      if (img.broken) return [...events, streamError("bad_image", `layer ${digest}: the bytes do not match the digest`)];
      events.push({ type: "layer", index: i, digest, done: size, total: size, state: "done" });
      this.blobs.add(digest);
    }
    events.push({ type: "progress", line: "converting to ext4" });
    const image = {
      name: ref,
      sha256: createHash("sha256").update(manifest).digest("hex"),
      size_bytes: 1 << 30,
      disk_bytes: total,
      description: `OCI image ${ref}`,
      built_at: 1700000100,
      source: ref,
      digest: manifest,
    };
    this.images = [...this.images.filter((i) => i.name !== ref), image];
    events.push({ type: "done", image });
    return events;
  }

  /** Pulls what a create names by reference (then the create goes on). */
  private beforeCreate(req: Json): ScriptedResponse | undefined {
    let events: Json[];
    if (typeof req.image === "string" && !this.images.some((i) => i.name === req.image)) {
      events = this.pullEvents(req.image, {});
    } else if (typeof req.snapshot === "string" && !this.snapshots.has(req.snapshot) && this.packs.has(req.snapshot)) {
      events = this.pullPackEvents({ reference: req.snapshot });
    } else {
      return undefined;
    }
    const last = events[events.length - 1]!;
    if (last.type !== "error") return undefined;
    const status = ({ image_not_found: 404, registry_unauthorized: 403, registry_error: 502 } as Record<string, number>)[
      String(last.code)
    ];
    return failure(status ?? 422, String(last.code), String(last.message));
  }

  private newSnapshot(name: string | null, sourceSandbox: string, pack: Json | null): Json {
    const id = `snap-${(this.ids++).toString(16).padStart(12, "0")}`;
    const snap: Json = {
      id,
      name,
      kind: "full",
      runtime: "qemu",
      source_sandbox: sourceSandbox,
      depends_on: [],
      dependents: [],
      mem_mib: 128,
      vcpus: 1,
      created_at: 1700000200,
      size_bytes: 4096,
      implicit: false,
      pause_ms: 3.5,
    };
    if (pack) snap.pack = pack;
    this.snapshots.set(id, snap);
    return snap;
  }

  private blobsOf(snap: Json): [string, number][] {
    return [
      [digestOf("image minimal"), 3000],
      [digestOf(`disk ${snap.id}`), 2000],
      [digestOf(`state ${snap.id}`), 1000],
    ];
  }

  /** The pack as export writes it: an OCI layout with the config as its one blob. */
  tarOf(snap: Json): Buffer {
    const config = Buffer.from(JSON.stringify({ format: 1, snapshot: { id: snap.id, name: snap.name } }));
    const index = Buffer.from(
      JSON.stringify({ schemaVersion: 2, manifests: [{ artifactType: "application/vnd.zygote.snapshot.v1", digest: digestOf(config) }] }),
    );
    return tar([
      ["oci-layout", Buffer.from('{"imageLayoutVersion":"1.0.0"}')],
      ["index.json", index],
      [`blobs/sha256/${digestOf(config).slice(7)}`, config],
    ]);
  }

  private export(snap: Json): ScriptedResponse {
    const data = this.tarOf(snap);
    if (this.cutExports.has(String(snap.id))) {
      return { status: 200, content_type: "application/x-tar", chunks: [data.subarray(0, data.length / 2)], cut: true };
    }
    const chunks: Buffer[] = [];
    for (let i = 0; i < data.length; i += 1000) chunks.push(data.subarray(i, i + 1000));
    return { status: 200, content_type: "application/x-tar", chunks };
  }

  private importPack(query: Record<string, string>, body: Buffer): ScriptedResponse {
    let digest: string;
    let orig: Json;
    try {
      const files = untar(body);
      digest = String((JSON.parse(files.get("index.json")!.toString()) as { manifests: Json[] }).manifests[0]!.digest);
      const blob = files.get(`blobs/sha256/${digest.slice(7)}`);
      if (!blob) throw new Error(`no blob ${digest}`);
      if (digestOf(blob) !== digest) return failure(422, "bad_image", `blob ${digest}: the bytes do not match the digest`);
      orig = (JSON.parse(blob.toString()) as { snapshot: Json }).snapshot;
    } catch (e) {
      return failure(422, "bad_image", `not a snapshot pack: ${(e as Error).message}`);
    }
    const pack = { source: "file", digest, snapshot: orig.id };
    return { status: 201, json: this.newSnapshot(query.name ?? (orig.name as string | null), String(orig.id), pack) };
  }

  private push(snap: Json, req: Json): ScriptedResponse {
    const refused = this.refused(req);
    if (refused) return refused;
    const denied = this.unauthorized(req);
    if (denied) return { status: 200, ndjson: [{ type: "progress", line: "packing" }, denied] };
    const ref = String(req.reference);
    const blobs = this.blobsOf(snap);
    const events: Json[] = [{ type: "progress", line: "packing" }];
    for (const [i, [digest, size]] of blobs.entries()) {
      this.blobs.add(digest);
      if (this.registryBlobs.has(digest)) {
        events.push({ type: "blob", index: i, digest, done: size, total: size, state: "cached" });
        continue;
      }
      events.push({ type: "blob", index: i, digest, done: 0, total: size, state: "downloading" });
      events.push({ type: "blob", index: i, digest, done: size, total: size, state: "done" });
      this.registryBlobs.add(digest);
    }
    const manifest = digestOf(`pack ${snap.id}`);
    this.packs.set(ref, { digest: manifest, snapshot: { ...snap }, blobs });
    events.push({ type: "pushed", reference: ref, digest: manifest, size: blobs.reduce((n, [, s]) => n + s, 0) });
    return { status: 200, ndjson: events };
  }

  private pullPackEvents(req: Json): Json[] {
    const ref = String(req.reference);
    const denied = this.unauthorized(req);
    if (denied) return [denied];
    const pack = this.packs.get(ref);
    if (!pack) return [streamError("image_not_found", `${ref}: manifest unknown`)];
    const events: Json[] = [{ type: "progress", line: `resolved to ${pack.digest}` }];
    for (const [i, [digest, size]] of pack.blobs.entries()) {
      events.push({ type: "blob", index: i, digest, done: size, total: size, state: this.blobs.has(digest) ? "cached" : "done" });
      this.blobs.add(digest);
    }
    const orig = pack.snapshot;
    const origin = { source: `oci://${ref}`, digest: pack.digest, snapshot: orig.id };
    const snap = this.newSnapshot((req.name as string | undefined) ?? (orig.name as string | null), String(orig.source_sandbox), origin);
    events.push({ type: "done", snapshot: snap });
    return events;
  }
}
