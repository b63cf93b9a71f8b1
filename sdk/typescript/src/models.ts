/** Data returned by the SDK: the daemon's JSON in camelCase. */

type Json = Record<string, unknown>;

export interface SandboxInfo {
  id: string;
  /**
   * `creating`, `running`, `paused` (paused to disk with `pause()`; also for a
   * moment while a branch or snapshot stops the VM), `pausing`, `resuming`,
   * `error`, `dead` or `deleting`.
   */
  state: string;
  runtime: string;
  hostname: string;
  name: string | null;
  memoryMib: number;
  vcpus: number;
  createdAt: number;
  pid: number | null;
  /** `{image: {...}}`, `{snapshot: {id}}` or `{branch: {parent, branch_point}}`. */
  origin: Json;
  dependsOn: string[];
  exitReason: string | null;
  /** Time-to-live in seconds once running; null: kept until killed. */
  ttlSecs: number | null;
  /** Unix seconds when the daemon deletes the sandbox (null: never). */
  expiresAt: number | null;
  /** Its network policy and address (null from daemons without networking). */
  network: NetworkInfo | null;
  /** The guest's `/etc/zygote/forked.d` hooks at its last start/branch/restore, in order. */
  forkHooks: ForkHook[];
  /** Environment variables every command gets (`envs` at create, per-child `env`). */
  envs: Record<string, string>;
  /** Names of its secrets (values are never shown). */
  secrets: string[];
  /**
   * Its labels: `metadata` given at create; a branch child has its parent's
   * plus `zygote.parent` (the parent's id). Empty from daemons without metadata.
   */
  metadata: Record<string, string>;
  /** Commands and file calls resume it when it is paused. */
  autoResume: boolean;
  /** Bytes its own writable disk layer holds on the host (null without a VM). */
  diskBytes: number | null;
  /** Its newest metrics sample (taken every few seconds while it runs), null before one. */
  metrics: MetricSample | null;
  /** What its TTL running out does: `delete` or `pause`. */
  ttlAction: TtlAction;
  /** Unix seconds when it was paused, while it is paused. */
  pausedAt: number | null;
  /** While paused with a TTL: the seconds it will have once resumed. */
  ttlLeftSecs: number | null;
  /** The daemon's object as sent (fields this SDK does not model included). */
  raw: Json;
}

/** What a sandbox's TTL running out does. */
export type TtlAction = "delete" | "pause";

/** How one `forked.d` hook ended (hooks run before a child is reported ready). */
export interface ForkHook {
  name: string;
  /** null when it was killed (timeout, signal) or could not start. */
  exitCode: number | null;
  error: string | null;
  stderrTail: string;
}

/** A sandbox's network: its policy and its address. Branch children inherit the policy. */
export interface NetworkInfo {
  /** `egress` (outbound traffic through NAT) or `none` (no traffic at all). */
  mode: string;
  /** When not empty, the only IPv4 CIDRs and domain names outbound traffic may reach. */
  allowOut: string[];
  /** IPv4 CIDRs and domain names always refused (applied before `allowOut`). */
  denyOut: string[];
  /** The guest's IPv4 address (null: the sandbox has no isolated network). */
  address: string | null;
  /**
   * The sandbox has a network namespace of its own with the policy enforced
   * (false: the daemon runs without the isolated network; see `client.info()`).
   */
  isolated: boolean;
}

/**
 * A guest port reachable through the daemon's proxy (see `sb.exposePort`).
 * Unless `public`, requests to it need the API token (`Authorization: Bearer <token>`).
 */
export interface ExposedPort {
  /** The port inside the guest. */
  port: number;
  /** Reachable without the API token. */
  public: boolean;
  /** `http://<port>-<sandbox id>.localhost:<proxy port>`: the port at the root of its own host name. */
  url: string;
  /** `http://127.0.0.1:<proxy port>/sandboxes/<id>/ports/<port>/`: the same under a path. */
  pathUrl: string;
  /** `url` without its scheme: `<port>-<sandbox id>.localhost:<proxy port>`. */
  host: string;
}

/**
 * One sample of a running sandbox's resource use (see `sb.metrics()`). Bytes
 * unless said otherwise; the figures are the guest's own report, bounded by the daemon.
 */
export interface MetricSample {
  /** When it was taken (RFC 3339, UTC). */
  timestamp: string;
  /** The same, in unix seconds. */
  timestampUnix: number;
  cpuCount: number;
  /** Percent of all the guest's CPUs busy since the previous sample (0..100). */
  cpuUsedPct: number;
  memTotal: number;
  memUsed: number;
  memCache: number;
  diskTotal: number;
  diskUsed: number;
}

export interface CommandResult {
  stdout: string;
  stderr: string;
  /** null when the program was ended by a signal. */
  exitCode: number | null;
  signal: number | null;
  timedOut: boolean;
  durationMs: number;
}

export interface FileEntry {
  name: string;
  /** `file`, `dir`, `symlink` or `other`. */
  kind: string;
  size: number;
  mode: number;
  mtime: number;
}

export interface WriteResult {
  path: string;
  size: number;
}

export interface Snapshot {
  id: string;
  /** `full`, `diff`, `live` or `branch` (made by a branch). */
  kind: string;
  name: string | null;
  runtime: string;
  sourceSandbox: string;
  memoryMib: number;
  vcpus: number;
  createdAt: number;
  sizeBytes: number;
  dependsOn: string[];
  dependents: string[];
  /** How long taking it stopped the sandbox's vCPUs, in ms (null: not measured). */
  pauseMs: number | null;
  /**
   * For a snapshot imported from a pack (pulled from a registry or uploaded):
   * where it came from. Null for one taken here.
   */
  pack: PackOrigin | null;
  raw: Json;
}

/**
 * A named volume: an ext4 filesystem that outlives sandboxes. Mount it at
 * create (`Sandbox.create({ volumes: { "/data": "my-vol" } })`); that sandbox
 * writes it, its branch children see a copy-on-write view.
 */
export interface Volume {
  id: string;
  name: string;
  sizeMib: number;
  createdAt: number;
  /** The sandbox it is mounted in (the only one that writes it), if any. */
  attachedTo: string | null;
  raw: Json;
}

export function volumeFromJson(d: Json): Volume {
  return {
    id: str(d.id),
    name: str(d.name),
    sizeMib: num(d.size_mib),
    createdAt: num(d.created_at),
    attachedTo: optStr(d.attached_to),
    raw: d,
  };
}

/** Where a snapshot imported from a pack came from ({@link Snapshot.pack}). */
export interface PackOrigin {
  /** `oci://REFERENCE` for a pull ({@link Client.pullSnapshot}), `file` for an upload ({@link Client.importSnapshot}). */
  source: string;
  /** The pack's manifest digest. */
  digest: string;
  /** The snapshot's id on the daemon that exported it. */
  snapshot: string;
}

/**
 * An image sandboxes boot from: built from a recipe (`minimal`) or converted
 * from an OCI image (pulled from a registry, or imported).
 */
export interface Image {
  /**
   * A recipe's name, or for an OCI image its normalized reference
   * (`docker.io/library/python:3.12-slim`): what `Sandbox.create({ image })` takes.
   */
  name: string;
  /** Hash of the root filesystem image file. */
  sha256: string;
  /** Apparent size of its (sparse) ext4 file. */
  sizeBytes: number;
  /** Bytes it takes on the host. */
  diskBytes: number;
  description: string;
  /** Unix seconds when it was built or converted. */
  builtAt: number;
  /** For an OCI image: where it came from (the reference, or the archive imported). */
  source: string | null;
  /** For an OCI image: its manifest digest (`sha256:...`). */
  digest: string | null;
  raw: Json;
}

/** A snapshot pushed to a registry ({@link Client.pushSnapshot}). */
export interface PushResult {
  /** Where it is: what {@link Client.pullSnapshot} (or `Sandbox.restore`) takes on another host. */
  reference: string;
  /** The pack's manifest digest; `REPOSITORY@DIGEST` names this very pack. */
  digest: string;
  /** Bytes of all its blobs (a second push of the same snapshot uploads none). */
  size: number;
}

/**
 * One progress line of an image pull or a snapshot push or pull, as the
 * `onProgress` callbacks get it. `type` says which fields are set:
 * - `progress`: `line`, a step in words;
 * - `resolved` (image pulls): `reference` resolved to the manifest `digest`
 *   with `layers` layers of `bytes` compressed bytes;
 * - `layer` (image pulls) and `blob` (snapshot packs): number `index`
 *   (`digest`) has `done` of `total` bytes; `state` is `cached` (already
 *   there: nothing is sent), `resuming`, `downloading` (also for uploads) or `done`.
 *
 * Lines of kinds newer than this SDK come with only `type` (and `raw`).
 */
export interface TransferProgress {
  type: string;
  line: string | null;
  reference: string | null;
  digest: string | null;
  layers: number | null;
  bytes: number | null;
  index: number | null;
  done: number | null;
  total: number | null;
  state: string | null;
  raw: Json;
}

/** A requested child of a branch that did not come up (the daemon left nothing of it). */
export interface BranchFailure {
  /** Its position among the requested children (0-based). */
  index: number;
  /** Why it failed. */
  error: string;
}

export interface BranchResult {
  parent: string;
  /** Id of the (implicit) snapshot the children share. */
  branchPoint: string;
  /** The children that run. */
  children: string[];
  /** Requested children that did not come up (empty when all did, and from older daemons). */
  failed: BranchFailure[];
  durationMs: number;
  /** How long the parent's vCPUs were stopped, in ms (null: not measured). */
  pauseMs: number | null;
}

/** One sandbox of a {@link SandboxTree}. */
export interface TreeNode {
  id: string;
  name: string | null;
  state: string;
  /** The sandbox it was branched from, or whose snapshot it was started from (null: a root, or its parent is gone). */
  parent: string | null;
  /** The branch point (a branch child) or snapshot (a restore) it started from. */
  startedFrom: string | null;
  /** Its children's ids, oldest first. */
  children: string[];
  /**
   * Memory of its VM process not shared with any other process: what deleting
   * it gives back to the host (null: it has no running VM).
   */
  uniqueMemoryBytes: number | null;
  /**
   * Bytes on disk of its own writable disk layer (null: the runtime keeps the
   * disk in the VM's memory, or the sandbox has none).
   */
  diskBytes: number | null;
}

/** A snapshot or branch point taken of a sandbox of a {@link SandboxTree}. */
export interface TreeSnapshot {
  id: string;
  /** `full`, `diff`, `live` or `branch` (a branch point). */
  kind: string;
  sourceSandbox: string;
  sizeBytes: number;
}

/**
 * A sandbox's lineage (`sb.tree()`): its topmost existing ancestor and every
 * descendant, and the snapshots and branch points taken of them.
 */
export interface SandboxTree {
  /** The topmost ancestor that still exists. */
  root: string;
  /** Every sandbox of the tree, parents before their children. */
  sandboxes: TreeNode[];
  snapshots: TreeSnapshot[];
}

/** The level of a {@link SandboxEvent}, least important first. */
export type EventLevel = "debug" | "info" | "warn" | "error";

/**
 * One entry of a sandbox's event log (`sb.events()`): what the daemon did to it
 * or in it (started, branched, paused, a command and how it ended, a snapshot, a
 * network or timeout change, its VM stopping).
 */
export interface SandboxEvent {
  /** When, in unix milliseconds. */
  tsMs: number;
  level: EventLevel;
  message: string;
  /** Details: ids, the command line, its exit code, ... */
  fields: Record<string, string>;
}

/**
 * One entry of a sandbox's egress record (`sb.egress()`): a connection its guest
 * made through the daemon's egress proxy (rules by name).
 */
export interface EgressEntry {
  /** The sandbox that made it (a branch child is a sandbox of its own). */
  sandbox: string;
  /** `refused`, `open`, `closed`, `cut` (by a policy change) or `failed`. */
  event: string;
  /** The host it named (TLS SNI or HTTP Host), if any. */
  host: string | null;
  address: string;
  port: number;
  /** `tls`, `http` or empty. */
  protocol: string;
  /** Plain HTTP only: the first request's method and path. */
  method: string | null;
  path: string | null;
  reason: string;
  bytesOut: number;
  bytesIn: number;
  startedMs: number;
  endedMs: number | null;
  /** Names of the secrets bound to hosts whose values went out on it. */
  secrets: string[];
}

/** Filters of `sb.events()`. */
export interface EventsOptions {
  /** Only events at or after this time (unix milliseconds). */
  sinceMs?: number;
  /** Only events at or before this time (unix milliseconds). */
  untilMs?: number;
  /** At most this many (1..1000, default 100), the first in the order asked for. */
  limit?: number;
  /** Newest first instead of oldest first. */
  newestFirst?: boolean;
  /** Only events at this level or above. */
  level?: EventLevel;
  /** Only events whose message contains this. */
  search?: string;
}

/** What `sb.keep()` did. */
export interface KeepResult {
  /** The sandbox kept. */
  kept: string;
  /** Its siblings and their descendants (and, with `promote`, its parent), deleted. */
  deleted: string[];
  /** The name it took from its parent (`promote`; null otherwise, or when the parent had none). */
  name: string | null;
}

const str = (v: unknown, dflt = ""): string => (typeof v === "string" ? v : dflt);
const num = (v: unknown): number => (typeof v === "number" ? v : 0);
const optNum = (v: unknown): number | null => (typeof v === "number" ? v : null);
const optStr = (v: unknown): string | null => (typeof v === "string" ? v : null);
const strs = (v: unknown): string[] => (Array.isArray(v) ? v.map(String) : []);
const strMap = (v: unknown): Record<string, string> =>
  v && typeof v === "object" && !Array.isArray(v)
    ? Object.fromEntries(Object.entries(v as Json).map(([k, x]) => [k, String(x)]))
    : {};

export function sandboxFromJson(d: Json): SandboxInfo {
  return {
    id: str(d.id),
    state: str(d.state),
    runtime: str(d.runtime),
    hostname: str(d.hostname),
    name: optStr(d.name),
    memoryMib: num(d.mem_mib),
    vcpus: num(d.vcpus),
    createdAt: num(d.created_at),
    pid: optNum(d.pid),
    origin: (d.origin as Json | undefined) ?? {},
    dependsOn: strs(d.depends_on),
    exitReason: optStr(d.exit_reason),
    ttlSecs: optNum(d.ttl_secs),
    expiresAt: optNum(d.expires_at),
    network: d.network && typeof d.network === "object" ? networkFromJson(d.network as Json) : null,
    envs:
      d.envs && typeof d.envs === "object"
        ? Object.fromEntries(Object.entries(d.envs as Json).map(([k, v]) => [k, String(v)]))
        : {},
    secrets: strs(d.secrets),
    metadata: strMap(d.metadata),
    autoResume: d.auto_resume === true,
    diskBytes: optNum(d.disk_bytes),
    metrics: d.metrics && typeof d.metrics === "object" ? metricFromJson(d.metrics as Json) : null,
    ttlAction: d.ttl_action === "pause" ? "pause" : "delete",
    pausedAt: optNum(d.paused_at),
    ttlLeftSecs: optNum(d.ttl_left_secs),
    forkHooks: Array.isArray(d.fork_hooks)
      ? (d.fork_hooks as Json[]).map((h) => ({
          name: str(h.name),
          exitCode: optNum(h.exit_code),
          error: optStr(h.error),
          stderrTail: str(h.stderr_tail),
        }))
      : [],
    raw: d,
  };
}

export function networkFromJson(d: Json): NetworkInfo {
  return {
    mode: str(d.mode),
    allowOut: strs(d.allow_out),
    denyOut: strs(d.deny_out),
    address: optStr(d.address),
    isolated: d.isolated === true,
  };
}

export function exposedPortFromJson(d: Json): ExposedPort {
  const url = str(d.url);
  return {
    port: num(d.port),
    public: d.public === true,
    url,
    pathUrl: str(d.path_url),
    // The authority as written (new URL() would drop a default port).
    host: url.replace(/^[a-z][a-z0-9+.-]*:\/\//i, "").replace(/[/?#].*$/, ""),
  };
}

export function metricFromJson(d: Json): MetricSample {
  return {
    timestamp: str(d.timestamp),
    timestampUnix: num(d.timestamp_unix),
    cpuCount: num(d.cpu_count),
    cpuUsedPct: num(d.cpu_used_pct),
    memTotal: num(d.mem_total),
    memUsed: num(d.mem_used),
    memCache: num(d.mem_cache),
    diskTotal: num(d.disk_total),
    diskUsed: num(d.disk_used),
  };
}

export function snapshotFromJson(d: Json): Snapshot {
  return {
    id: str(d.id),
    kind: str(d.kind),
    name: optStr(d.name),
    runtime: str(d.runtime),
    sourceSandbox: str(d.source_sandbox),
    memoryMib: num(d.mem_mib),
    vcpus: num(d.vcpus),
    createdAt: num(d.created_at),
    sizeBytes: num(d.size_bytes),
    dependsOn: strs(d.depends_on),
    dependents: strs(d.dependents),
    pauseMs: optNum(d.pause_ms),
    pack: isObject(d.pack) ? packOriginFromJson(d.pack) : null,
    raw: d,
  };
}

const isObject = (v: unknown): v is Json => v !== null && typeof v === "object" && !Array.isArray(v);

export function packOriginFromJson(d: Json): PackOrigin {
  return { source: str(d.source), digest: str(d.digest), snapshot: str(d.snapshot) };
}

export function imageFromJson(d: Json): Image {
  return {
    name: str(d.name),
    sha256: str(d.sha256),
    sizeBytes: num(d.size_bytes),
    diskBytes: num(d.disk_bytes),
    description: str(d.description),
    builtAt: num(d.built_at),
    source: optStr(d.source),
    digest: optStr(d.digest),
    raw: d,
  };
}

export function pushResultFromJson(d: Json): PushResult {
  return { reference: str(d.reference), digest: str(d.digest), size: num(d.size) };
}

export function transferProgressFromJson(d: Json): TransferProgress {
  return {
    type: str(d.type),
    line: optStr(d.line),
    reference: optStr(d.reference),
    digest: optStr(d.digest),
    layers: optNum(d.layers),
    bytes: optNum(d.bytes),
    index: optNum(d.index),
    done: optNum(d.done),
    total: optNum(d.total),
    state: optStr(d.state),
    raw: d,
  };
}

export function fileEntryFromJson(d: Json): FileEntry {
  return { name: str(d.name), kind: str(d.kind), size: num(d.size), mode: num(d.mode), mtime: num(d.mtime) };
}

export function branchFromJson(d: Json): BranchResult {
  const failed = Array.isArray(d.failed) ? (d.failed as Json[]) : [];
  return {
    parent: str(d.parent),
    branchPoint: str(d.branch_point),
    children: strs(d.children),
    failed: failed.map((f) => ({ index: num(f.index), error: str(f.error) })),
    durationMs: num(d.duration_ms),
    pauseMs: optNum(d.pause_ms),
  };
}

export function eventFromJson(d: Json): SandboxEvent {
  return { tsMs: num(d.ts_ms), level: str(d.level, "info") as EventLevel, message: str(d.message), fields: strMap(d.fields) };
}

export function egressFromJson(d: Json): EgressEntry {
  return {
    sandbox: str(d.sandbox),
    event: str(d.event),
    host: optStr(d.host),
    address: str(d.address),
    port: num(d.port),
    protocol: str(d.protocol),
    method: optStr(d.method),
    path: optStr(d.path),
    reason: str(d.reason),
    bytesOut: num(d.bytes_out),
    bytesIn: num(d.bytes_in),
    startedMs: num(d.started_ms),
    endedMs: optNum(d.ended_ms),
    secrets: strs(d.secrets),
  };
}

export function treeFromJson(d: Json): SandboxTree {
  const nodes = Array.isArray(d.sandboxes) ? (d.sandboxes as Json[]) : [];
  const snaps = Array.isArray(d.snapshots) ? (d.snapshots as Json[]) : [];
  return {
    root: str(d.root),
    sandboxes: nodes.map((n) => ({
      id: str(n.id),
      name: optStr(n.name),
      state: str(n.state),
      parent: optStr(n.parent),
      startedFrom: optStr(n.started_from),
      children: strs(n.children),
      uniqueMemoryBytes: optNum(n.unique_memory_bytes),
      diskBytes: optNum(n.disk_bytes),
    })),
    snapshots: snaps.map((s) => ({
      id: str(s.id),
      kind: str(s.kind),
      sourceSandbox: str(s.source_sandbox),
      sizeBytes: num(s.size_bytes),
    })),
  };
}

export function keepFromJson(d: Json): KeepResult {
  return { kept: str(d.kept), deleted: strs(d.deleted), name: optStr(d.name) };
}

/** An entry only on one side of {@link Sandbox.diff}. */
export interface DiffEntry {
  /** Relative to the compared directory. */
  path: string;
  /** `file`, `dir`, `symlink` or `other`. */
  kind: string;
  size: number;
  mode: number;
}

/** An entry on both sides that differs (content, type, mode or link target). */
export interface DiffChange {
  path: string;
  kindBefore: string;
  kind: string;
  sizeBefore: number;
  size: number;
  modeBefore: number;
  mode: number;
  /** With `content: true`, for text files up to 256 KiB: the unified diff. */
  unified: string | null;
}

/** How one sandbox's files under `path` differ from another's. */
export interface SandboxDiff {
  sandbox: string;
  against: string;
  path: string;
  /** Only in `sandbox`. */
  added: DiffEntry[];
  /** Only in `against`. */
  removed: DiffEntry[];
  modified: DiffChange[];
}

const diffEntry = (e: Json): DiffEntry => ({
  path: str(e.path),
  kind: str(e.kind),
  size: num(e.size),
  mode: num(e.mode),
});

export function diffFromJson(d: Json): SandboxDiff {
  const list = (v: unknown): Json[] => (Array.isArray(v) ? (v as Json[]) : []);
  return {
    sandbox: str(d.sandbox),
    against: str(d.against),
    path: str(d.path),
    added: list(d.added).map(diffEntry),
    removed: list(d.removed).map(diffEntry),
    modified: list(d.modified).map((m) => ({
      path: str(m.path),
      kindBefore: str(m.kind_before),
      kind: str(m.kind),
      sizeBefore: num(m.size_before),
      size: num(m.size),
      modeBefore: num(m.mode_before),
      mode: num(m.mode),
      unified: optStr(m.unified),
    })),
  };
}

/** One change {@link Sandbox.merge} made (or, not applied, would make). */
export interface MergeChange {
  /** Absolute path in the guest merged into. */
  path: string;
  /** `add`, `modify`, `remove` or `mode` (permissions only). */
  action: string;
  /** The kind it has afterwards (`file`, `dir`, `symlink`); for `remove`, the kind removed. */
  kind: string;
  /** Bytes copied for it (files). */
  size: number;
}

/** A path both sandboxes changed differently since their common branch point. */
export interface MergeConflict {
  path: string;
  /**
   * What the sandbox merged into did to it: `added`, `modified`, `removed`, or
   * `changed below` (a directory the other side removed or replaced has changes of ours inside).
   */
  ours: string;
  /** What the sandbox merged from did to it. */
  theirs: string;
  /** `theirs` or `ours` when `onConflict` settled it; null when it stopped the merge. */
  resolution: string | null;
}

/** What `parent.merge(child)` did: `child`'s changes under `paths` since the two parted, made in `parent`. */
export interface MergeReport {
  /** The sandbox merged into. */
  sandbox: string;
  /** The sandbox merged from. */
  from: string;
  /** The snapshot (branch point) holding the state both descend from. */
  base: string;
  /** The directories merged. */
  paths: string[];
  /**
   * Whether the changes were made: false with `dryRun`, when a conflict stopped
   * the merge (then nothing was changed), or when there was nothing to change.
   */
  applied: boolean;
  changes: MergeChange[];
  conflicts: MergeConflict[];
  /** Entries of the other sandbox that cannot be merged (FIFOs, sockets, devices), left alone. */
  skipped: string[];
  bytesCopied: number;
  durationMs: number;
}

export function mergeFromJson(d: Json): MergeReport {
  const list = (v: unknown): Json[] => (Array.isArray(v) ? (v as Json[]) : []);
  return {
    sandbox: str(d.sandbox),
    from: str(d.from),
    base: str(d.base),
    paths: strs(d.paths),
    applied: d.applied === true,
    changes: list(d.changes).map((c) => ({
      path: str(c.path),
      action: str(c.action),
      kind: str(c.kind),
      size: num(c.size),
    })),
    conflicts: list(d.conflicts).map((c) => ({
      path: str(c.path),
      ours: str(c.ours),
      theirs: str(c.theirs),
      resolution: optStr(c.resolution),
    })),
    skipped: strs(d.skipped),
    bytesCopied: num(d.bytes_copied),
    durationMs: num(d.duration_ms),
  };
}

/** A background process (`commands.run(cmd, { background: true })`) as the daemon shows it. */
export interface ProcessInfo {
  /** Its pid in the guest (also its process group): what the process calls take. */
  pid: number;
  argv: string[];
  /** `running` or `exited` (ended, and all its output collected). */
  state: string;
  /** Its exit status once it exited normally. */
  exitCode: number | null;
  /** The signal that ended it, if one did. */
  signal: number | null;
  /** Killed because its `timeoutMs` expired. */
  timedOut: boolean;
  /** How long it ran, once it has ended. */
  durationMs: number | null;
  /** When it started, by the guest's clock (unix milliseconds). */
  startedAtMs: number;
  /** Bytes printed so far, stdout and stderr together. */
  outputBytes: number;
  /** Its stdin still takes data. */
  stdinOpen: boolean;
}

/** What a background process printed from an offset (decoded by the daemon), and the process as of then. */
export interface ProcessOutput {
  stdout: string;
  stderr: string;
  /** Where this output starts: the offset asked, or later if older output was dropped. */
  offset: number;
  /** The offset to read from next (stdout and stderr bytes counted together). */
  nextOffset: number;
  droppedBytes: number;
  process: ProcessInfo;
}

export function processFromJson(d: Json): ProcessInfo {
  return {
    pid: num(d.pid),
    argv: strs(d.argv),
    state: str(d.state),
    exitCode: optNum(d.exit_code),
    signal: optNum(d.signal),
    timedOut: d.timed_out === true,
    durationMs: optNum(d.duration_ms),
    startedAtMs: num(d.started_at_ms),
    outputBytes: num(d.output_bytes),
    stdinOpen: d.stdin_open === true,
  };
}

export function processOutputFromJson(d: Json): ProcessOutput {
  return {
    stdout: str(d.stdout),
    stderr: str(d.stderr),
    offset: num(d.offset),
    nextOffset: num(d.next_offset),
    droppedBytes: num(d.dropped_bytes),
    process: processFromJson(d.process as Json),
  };
}
