/** The sandbox API: `Sandbox`, `sb.commands`, `sb.files`. */
import { BranchCollector, type ProgressCallback, branchStreamed } from "./branch.js";
import { type WatchHandle, type WatchOptions, watchDir } from "./watch.js";
import { Client, type ClientOptions, type Command, type ListOptions, type RunOptions, seg } from "./client.js";
import { type BackgroundRunOptions, type CommandHandle, ProcessCommands } from "./commands.js";
import {
  BranchIncompleteError,
  MergeConflictError,
  SandboxBusy,
  SandboxNotFound,
  SandboxNotRunning,
  ZygoteError,
} from "./errors.js";
import {
  type BranchResult,
  type CommandResult,
  type EgressEntry,
  type EventsOptions,
  type ExposedPort,
  type FileEntry,
  type KeepResult,
  type MergeReport,
  type MetricSample,
  type SandboxDiff,
  type SandboxEvent,
  type SandboxInfo,
  type SandboxTree,
  type Snapshot,
  type TtlAction,
  type WriteResult,
  branchFromJson,
  diffFromJson,
  egressFromJson,
  eventFromJson,
  exposedPortFromJson,
  fileEntryFromJson,
  keepFromJson,
  mergeFromJson,
  metricFromJson,
  sandboxFromJson,
  snapshotFromJson,
  treeFromJson,
} from "./models.js";
import { Pty } from "./pty.js";
import {
  type CodeContext,
  type Execution,
  type RunCodeOptions,
  createCodeContext,
  listCodeContexts,
  removeCodeContext,
  restartCodeContext,
  runCode,
} from "./code.js";

export const DEFAULT_IMAGE = "minimal";

/** Either an existing client, or options to make one. */
export interface Connection extends ClientOptions {
  client?: Client;
}

export interface CreateOptions extends Connection {
  /**
   * A built image's name (default `minimal`) or an OCI image reference
   * (`python:3.12-slim`, `registry.example:5000/team/app:1.4`), pulled on first
   * use ({@link Client.pullImage} pulls ahead, with progress and credentials);
   * its `Env`, `WorkingDir` and `User` are the defaults of every command.
   */
  image?: string;
  memoryMib?: number;
  vcpus?: number;
  /** Label, also the guest hostname: a-z, 0-9 and '-'. */
  name?: string;
  /** cgroup limits: `memory_mib`, `cpu_percent`, `pids`. */
  limits?: { memory_mib?: number; cpu_percent?: number; pids?: number };
  /**
   * The daemon deletes the sandbox this many seconds after it is running,
   * even if this process dies first (see {@link Sandbox.setTtl}); with
   * `ttlAction: "pause"` it pauses it instead (see {@link Sandbox.pause}).
   */
  ttlSecs?: number;
  /** What the TTL running out does: `delete` (the daemon's default) or `pause`. */
  ttlAction?: TtlAction;
  /**
   * Named volumes to mount: `{ "/guest/path": "volume name or id" }` (see
   * {@link Client.createVolume}). This sandbox writes them (one sandbox at a
   * time); its branch children see a copy-on-write view.
   */
  volumes?: Record<string, string | { name: string }>;
  /**
   * Commands and file calls on the sandbox while it is paused resume it first
   * (otherwise they throw {@link SandboxPaused}).
   */
  autoResume?: boolean;
  /**
   * `egress` (the daemon's default: outbound traffic through NAT) or `none`
   * (no traffic at all). Branch children inherit the policy.
   */
  network?: NetworkMode;
  /**
   * The only destinations outbound traffic may reach: IPv4 CIDRs such as
   * `10.77.0.0/24`, single addresses, or domain names (`pypi.org`, `*.github.com`,
   * optionally `:port`) (sent as `allow_out`; an empty array
   * allows none).
   */
  allowOut?: readonly string[];
  /** Destinations always refused, even if `allowOut` has them (sent as `deny_out`). */
  denyOut?: readonly string[];
  /** Environment variables every command gets (a command's own `env` wins). */
  envs?: Readonly<Record<string, string>>;
  /**
   * Like `envs`, but the daemon never shows their values; one given as
   * `{ value, inherit: false }` is not passed to branch children. Neither is
   * written into the guest.
   */
  secrets?: Readonly<Record<string, string | SecretSpec>>;
  /**
   * Your own labels (`{ team: "search" }`; at most 63 keys of 1-128 characters
   * of `A-Za-z0-9._-/`, values up to 1024 bytes; keys starting `zygote.` are
   * reserved): shown in {@link Sandbox.info}, kept by branch children (which
   * add `zygote.parent`) and usable to filter {@link Sandbox.list}. Invalid
   * ones throw {@link InvalidArgument}.
   */
  metadata?: Readonly<Record<string, string>>;
}

/** A secret as {@link CreateOptions.secrets} takes it. */
export interface SecretSpec {
  value: string;
  /** Whether branch children get it too (default true). */
  inherit?: boolean;
  /**
   * Binds the secret to these hosts (`api.openai.com`, `*.example.com`,
   * optionally `:port`; 443 by default): commands see only a placeholder, and
   * the daemon's egress proxy puts the value into the headers of HTTPS requests
   * to those hosts alone, so it never enters the guest.
   */
  hosts?: readonly string[];
}

/** What network a sandbox gets: see {@link CreateOptions.network}. */
export type NetworkMode = "egress" | "none";

export interface RestoreOptions extends Connection {
  name?: string;
  ttlSecs?: number;
}

export interface BranchOptions {
  /** Number of children (default 1). */
  n?: number;
  /** Children's time-to-live; by default the parent's (counted from their start). */
  ttlSecs?: number;
  /**
   * One object per child (exactly `n`), added over the parent's `envs` for
   * that child: tokens, seeds, task ids.
   */
  env?: readonly Readonly<Record<string, string>>[];
  /**
   * {@link Sandbox.branch} resolves to the children that came up even when
   * some did not, instead of throwing {@link BranchIncompleteError}.
   */
  allowPartial?: boolean;
  /**
   * Keep the branch point's state so the children can later be merged into the
   * parent or into each other ({@link Sandbox.merge}). The qemu runtime always
   * keeps it, the kvm runtime only when asked (it costs a memory file of the
   * parent, written after the children run).
   */
  mergeable?: boolean;
  /**
   * Called for each child as soon as it runs or fails (in the order they
   * finish; awaited), with a handle on it: large fan-outs (up to 256
   * children) can be followed, and a child used while its siblings still come
   * up. Uses the daemon's streaming form; the result is the same.
   */
  onProgress?: ProgressCallback<Sandbox>;
}

/** What a merge does with a path both sides changed: see {@link MergeOptions.onConflict}. */
export type OnConflict = "fail" | "theirs" | "ours";

export interface MergeOptions {
  /** Directories merged (absolute; default `["/root"]`). */
  paths?: readonly string[];
  /**
   * Where both sandboxes changed a path differently: `fail` (the default)
   * changes nothing and throws {@link MergeConflictError}; `theirs` takes the
   * other sandbox's version, `ours` keeps this one's.
   */
  onConflict?: OnConflict;
  /** Report what would be done (conflicts included) and change nothing; never throws for conflicts. */
  dryRun?: boolean;
}

export type SnapshotMode = "full" | "diff" | "live";

type Json = Record<string, unknown>;

function clientOf(c: Connection): Client {
  if (c.client) {
    if (c.url !== undefined || c.token !== undefined) throw new TypeError("give either client or url/token, not both");
    return c.client;
  }
  return new Client(c);
}

const snapshotId = (s: Snapshot | string): string => (typeof s === "string" ? s : s.id);

/** An expose refused because the port is exposed already: a 409 not about the sandbox's state. */
const alreadyExposed = (e: unknown): boolean =>
  e instanceof ZygoteError && e.status === 409 && !(e instanceof SandboxBusy || e instanceof SandboxNotRunning);

/** `sb.commands`: programs in the sandbox (background ones too: `list`, `connect`, `kill`, `signal`, `sendStdin`). */
export class Commands extends ProcessCommands {
  constructor(sb: Sandbox) {
    super(sb);
  }

  /**
   * Runs `cmd` (a shell command line, or an argv array) and waits for it;
   * output is streamed to `onStdout`/`onStderr` as it is printed. Past
   * `timeoutMs` the program is killed and {@link CommandTimeout} thrown
   * (with the output so far in `.result`). A non-zero exit is returned,
   * not thrown, unless `check: true`.
   *
   * With `background: true` it resolves once the program runs, to a
   * {@link CommandHandle} (`pid`, `wait()`, `kill()`, `sendStdin()`...).
   */
  run(cmd: Command, opts: BackgroundRunOptions): Promise<CommandHandle>;
  run(cmd: Command, opts?: RunOptions & { background?: false }): Promise<CommandResult>;
  run(cmd: Command, opts: RunOptions & { background?: boolean } = {}): Promise<CommandResult | CommandHandle> {
    if (opts.background) return this.start(cmd, opts);
    return this.sb.client.exec(this.sb.id, cmd, opts);
  }
}

export class Files {
  constructor(private readonly sb: Sandbox) {}

  private path(suffix = ""): string {
    return `/v1/sandboxes/${seg(this.sb.id)}/files${suffix}`;
  }

  /**
   * The file as UTF-8 text; throws {@link FileNotFound}. A device, FIFO or socket is
   * refused unless `special: true` (then read up to the daemon's 64 MiB limit).
   */
  async read(path: string, opts: { special?: boolean } = {}): Promise<string> {
    return new TextDecoder().decode(await this.readBytes(path, opts));
  }

  async readBytes(path: string, opts: { special?: boolean } = {}): Promise<Uint8Array> {
    const query: Record<string, string> = { path };
    if (opts.special) query.special = "true";
    const resp = await this.sb.client.request("GET", this.path(), { query });
    return new Uint8Array(await resp.arrayBuffer());
  }

  /** Atomically replaces `path` (parents are created); `mode` e.g. `0o755`. */
  async write(path: string, data: string | Uint8Array, opts: { mode?: number } = {}): Promise<WriteResult> {
    const query: Record<string, string> = { path };
    if (opts.mode !== undefined) query.mode = opts.mode.toString(8);
    const d = await this.sb.client.json<{ path: string; size: number }>("PUT", this.path(), { query, body: data });
    return { path: d.path, size: d.size };
  }

  /** Entries of a directory. */
  async list(path = "/"): Promise<FileEntry[]> {
    const d = await this.sb.client.json<{ entries: Json[] }>("GET", this.path("/list"), { query: { path } });
    return d.entries.map(fileEntryFromJson);
  }

  /**
   * Watches the directory `path`: `onEvent` gets each change as it happens
   * (`recursive`: in every directory below it too). Resolves once the watch is in
   * place; `stop()` the handle to end it. Throws {@link FileNotFound} for a missing
   * directory.
   */
  async watch(path: string, opts: WatchOptions): Promise<WatchHandle> {
    return watchDir(this.sb.client, this.sb.id, path, opts);
  }
}

/**
 * A handle on one sandbox (a microVM). Make one with {@link Sandbox.create},
 * {@link Sandbox.restore}, {@link Sandbox.connect} or {@link Sandbox.branch};
 * `new Sandbox(id, client)` wraps a known id without a request. With
 * `await using sb = await Sandbox.create()` it is killed at scope exit.
 */
export class Sandbox {
  readonly commands: Commands;
  readonly files: Files;
  readonly pty: Pty;

  constructor(
    readonly id: string,
    readonly client: Client = new Client(),
  ) {
    this.commands = new Commands(this);
    this.files = new Files(this);
    this.pty = new Pty(this);
  }

  /** Boots a sandbox from an image; resolves once its agent answers. */
  static async create(opts: CreateOptions = {}): Promise<Sandbox> {
    const client = clientOf(opts);
    const body: Json = { image: opts.image ?? DEFAULT_IMAGE };
    if (opts.memoryMib !== undefined) body.mem_mib = opts.memoryMib;
    if (opts.vcpus !== undefined) body.vcpus = opts.vcpus;
    if (opts.name !== undefined) body.name = opts.name;
    if (opts.limits !== undefined) body.limits = opts.limits;
    if (opts.ttlSecs !== undefined) body.ttl_secs = opts.ttlSecs;
    if (opts.ttlAction !== undefined) body.ttl_action = checkTtlAction(opts.ttlAction);
    if (opts.autoResume !== undefined) body.auto_resume = opts.autoResume;
    Object.assign(body, policyBody(opts));
    if (opts.envs !== undefined) body.envs = { ...opts.envs };
    if (opts.secrets !== undefined) {
      body.secrets = Object.fromEntries(
        Object.entries(opts.secrets).map(([k, v]) => [k, typeof v === "string" ? { value: v } : { ...v }]),
      );
    }
    if (opts.metadata !== undefined) body.metadata = { ...opts.metadata };
    if (opts.volumes !== undefined && Object.keys(opts.volumes).length > 0) {
      body.volumes = Object.entries(opts.volumes).map(([path, v]) => ({
        name: typeof v === "string" ? v : v.name,
        path,
      }));
    }
    return Sandbox.fromCreate(client, body);
  }

  /**
   * A new sandbox started from a snapshot (its memory, processes and files):
   * a snapshot, its id, or the reference of a snapshot pack in a registry
   * (`registry.example:5000/team/warm:v1`, pulled on first use; see
   * {@link Client.pullSnapshot}). To roll an existing sandbox back instead,
   * use {@link rollback}.
   */
  static async restore(snapshot: Snapshot | string, opts: RestoreOptions = {}): Promise<Sandbox> {
    const body: Json = { snapshot: snapshotId(snapshot) };
    if (opts.name !== undefined) body.name = opts.name;
    if (opts.ttlSecs !== undefined) body.ttl_secs = opts.ttlSecs;
    return Sandbox.fromCreate(clientOf(opts), body);
  }

  private static async fromCreate(client: Client, body: Json): Promise<Sandbox> {
    const d = await client.json<{ sandboxes: Json[] }>("POST", "/v1/sandboxes", { json: body });
    const first = d.sandboxes[0];
    if (!first) throw new TypeError("zygoted created no sandbox");
    return new Sandbox(sandboxFromJson(first).id, client);
  }

  /** A handle on an existing sandbox; throws {@link SandboxNotFound}. */
  static async connect(id: string, opts: Connection = {}): Promise<Sandbox> {
    const client = clientOf(opts);
    await client.json("GET", `/v1/sandboxes/${seg(id)}`);
    return new Sandbox(id, client);
  }

  /**
   * Handles on the daemon's sandboxes; with `metadata`, only those whose
   * metadata has every one of those pairs, e.g.
   * `Sandbox.list({ metadata: { "zygote.parent": sb.id } })` for a sandbox's branch children.
   */
  static async list(opts: Connection & ListOptions = {}): Promise<Sandbox[]> {
    const client = clientOf(opts);
    return (await client.sandboxes({ metadata: opts.metadata })).map((s) => new Sandbox(s.id, client));
  }

  /** Current state from the daemon. */
  async info(): Promise<SandboxInfo> {
    return sandboxFromJson(await this.client.json("GET", `/v1/sandboxes/${seg(this.id)}`));
  }

  async isRunning(): Promise<boolean> {
    try {
      return (await this.info()).state === "running";
    } catch (e) {
      if (e instanceof SandboxNotFound) return false;
      throw e;
    }
  }

  /**
   * Forks this sandbox's live state (memory, processes, files) into `n`
   * copy-on-write children that then diverge independently; this sandbox
   * keeps running. When only some children came up it throws
   * {@link BranchIncompleteError} (carrying the running ones and the causes),
   * unless `allowPartial`; when none did, the daemon's error.
   */
  async branch(opts: BranchOptions = {}): Promise<Sandbox[]> {
    const res = await this.branchDetailed(opts);
    const children = res.children.map((id) => new Sandbox(id, this.client));
    if (res.failed.length > 0 && !opts.allowPartial) {
      const causes = res.failed.map((f) => `child ${f.index} failed: ${f.error}`).join("; ");
      throw new BranchIncompleteError(
        `only ${children.length} of ${opts.n ?? 1} children of ${res.parent} came up; ${causes}`,
        res.parent,
        children,
        res.failed,
      );
    }
    return children;
  }

  /**
   * As {@link branch}, with the branch point, timing and the children that
   * did not come up (`failed`); it does not throw for those.
   */
  async branchDetailed(opts: BranchOptions = {}): Promise<BranchResult> {
    const count = opts.n ?? 1;
    const body: Json = { count };
    if (opts.ttlSecs !== undefined) body.ttl_secs = opts.ttlSecs;
    if (opts.mergeable) body.mergeable = true;
    if (opts.env !== undefined) {
      if (opts.env.length !== count) {
        throw new TypeError(`env takes one object per child: an array of ${count}`);
      }
      body.env = opts.env.map((e) => ({ ...e }));
    }
    if (opts.onProgress) {
      const collector = new BranchCollector(count, (id) => new Sandbox(id, this.client));
      return branchStreamed(this.client, this.id, body, collector, opts.onProgress);
    }
    const d = await this.client.json("POST", `/v1/sandboxes/${seg(this.id)}/branch`, { json: body });
    return branchFromJson(d);
  }

  /**
   * The daemon deletes this sandbox `ttlSecs` from now (replacing any
   * earlier deadline); `null` keeps it until killed. `ttlAction` changes what
   * the deadline does (`delete` or `pause`). While the sandbox is paused its
   * TTL does not run: it starts whole at resume.
   */
  async setTtl(ttlSecs: number | null, opts: { ttlAction?: TtlAction } = {}): Promise<SandboxInfo> {
    // null is meaningful (no TTL), so the field is always sent.
    const body: Json = { ttl_secs: ttlSecs };
    if (opts.ttlAction !== undefined) body.ttl_action = checkTtlAction(opts.ttlAction);
    const d = await this.client.json("PUT", `/v1/sandboxes/${seg(this.id)}/ttl`, { json: body });
    return sandboxFromJson(d);
  }

  /**
   * Replaces this sandbox's network policy while it runs or is paused (the
   * fields as at create; what is left out is the create default). In force for
   * new connections when this resolves; branch children made later inherit it.
   */
  async setNetwork(policy: NetworkPolicyOptions = {}): Promise<SandboxInfo> {
    const d = await this.client.json("PUT", `/v1/sandboxes/${seg(this.id)}/network`, {
      json: policyBody(policy),
    });
    return sandboxFromJson(d);
  }

  /**
   * Pauses the sandbox to disk: its memory and devices are saved, its VM
   * process ends (its memory returns to the host); it keeps its id, files,
   * network and lineage, and its TTL stops. Commands and file calls throw
   * {@link SandboxPaused} until {@link resume} (or resume it themselves if it
   * was created with `autoResume: true`).
   */
  async pause(): Promise<SandboxInfo> {
    return sandboxFromJson(await this.client.json("POST", `/v1/sandboxes/${seg(this.id)}/pause`));
  }

  /** Brings a paused sandbox back where it was: the same processes, files and network. */
  async resume(): Promise<SandboxInfo> {
    return sandboxFromJson(await this.client.json("POST", `/v1/sandboxes/${seg(this.id)}/resume`));
  }

  /**
   * The lineage: topmost existing ancestor and every descendant, with each
   * one's unique memory (what deleting it gives back) and disk layer bytes,
   * plus snapshots/branch points.
   */
  /**
   * What happened to this sandbox and in it, oldest first (`newestFirst` turns
   * that round): started, branched, paused, resumed, commands started and how
   * they ended, snapshots, network and timeout changes, its VM stopping. A
   * branch child's log starts at the branch.
   */
  async events(opts: EventsOptions = {}): Promise<SandboxEvent[]> {
    const levels = ["debug", "info", "warn", "error"];
    if (opts.level !== undefined && !levels.includes(opts.level)) {
      throw new TypeError(`level must be one of ${levels.join(", ")}, not ${JSON.stringify(opts.level)}`);
    }
    const query: Record<string, string> = {};
    if (opts.sinceMs !== undefined) query.since_ms = String(Math.trunc(opts.sinceMs));
    if (opts.untilMs !== undefined) query.until_ms = String(Math.trunc(opts.untilMs));
    if (opts.limit !== undefined) query.limit = String(Math.trunc(opts.limit));
    if (opts.newestFirst) query.order = "desc";
    if (opts.level !== undefined) query.level = opts.level;
    if (opts.search !== undefined) query.search = opts.search;
    const d = await this.client.json("GET", `/v1/sandboxes/${seg(this.id)}/events`, { query });
    const events = Array.isArray(d.events) ? (d.events as Json[]) : [];
    return events.map(eventFromJson);
  }

  /**
   * This sandbox's egress record, oldest first: the connections its guest made
   * through the daemon's egress proxy (TCP to the ports rules by name cover), with
   * host, address, port, method and path (plain HTTP), allowed or refused and why,
   * bytes each way; the last `limit` (1..10000, default 1000).
   */
  async egress(opts: { limit?: number } = {}): Promise<EgressEntry[]> {
    const query: Record<string, string> = {};
    if (opts.limit !== undefined) query.limit = String(Math.trunc(opts.limit));
    const d = await this.client.json("GET", `/v1/sandboxes/${seg(this.id)}/egress`, { query });
    const entries = Array.isArray(d.entries) ? (d.entries as Json[]) : [];
    return entries.map(egressFromJson);
  }

  async tree(): Promise<SandboxTree> {
    return treeFromJson(await this.client.json("GET", `/v1/sandboxes/${seg(this.id)}/tree`));
  }

  /**
   * How this sandbox's files under `path` (default `/root`) differ from
   * `other`'s (a sibling, the parent, any sandbox): `added` (only here),
   * `removed` (only there) and `modified`; with `content: true` each modified
   * text file up to 256 KiB carries its unified diff.
   */
  async diff(
    other: Sandbox | string,
    opts: { path?: string; content?: boolean } = {},
  ): Promise<SandboxDiff> {
    const query: Record<string, string> = {
      against: typeof other === "string" ? other : other.id,
      content: opts.content ? "true" : "false",
    };
    if (opts.path !== undefined) query.path = opts.path;
    return diffFromJson(await this.client.json("GET", `/v1/sandboxes/${seg(this.id)}/diff`, { query }));
  }

  /**
   * Keep this branch child: delete its siblings (other children of its branch
   * point) and their descendants; with `promote: true` also delete the parent
   * and take its name. Throws {@link ConflictError} when this sandbox is not a
   * branch child, has no siblings left (without `promote`), or has no parent
   * left to promote over.
   */
  async keep(opts: { promote?: boolean } = {}): Promise<KeepResult> {
    const d = await this.client.json("POST", `/v1/sandboxes/${seg(this.id)}/keep`, {
      json: { promote: opts.promote ?? false },
    });
    return keepFromJson(d);
  }

  /**
   * Brings the changes `other` made to its files under `paths` (directories,
   * default `["/root"]`) since the two parted into this sandbox, three-way:
   * `other` is a child (of a `mergeable` branch), a sibling or any sandbox of
   * the same tree. What this sandbox changed itself is kept.
   *
   * Where both changed a path differently, `onConflict` decides: `fail` (the
   * default) changes nothing and throws {@link MergeConflictError}, whose
   * `report` and `conflicts` say what conflicts; `theirs` takes `other`'s
   * version, `ours` keeps this one's. `dryRun: true` resolves to what would be
   * done, conflicts included. Throws {@link ConflictError} when the two are not
   * of one tree or their common state was not kept (kvm: branch with `mergeable`).
   */
  async merge(other: Sandbox | string, opts: MergeOptions = {}): Promise<MergeReport> {
    const dryRun = opts.dryRun ?? false;
    const body: Json = {
      from: typeof other === "string" ? other : other.id,
      on_conflict: opts.onConflict ?? "fail",
      dry_run: dryRun,
    };
    if (opts.paths !== undefined) body.paths = [...opts.paths];
    const d = await this.client.json("POST", `/v1/sandboxes/${seg(this.id)}/merge`, { json: body });
    const report = mergeFromJson(d);
    // The daemon answers a merge stopped by conflicts with 200 and `applied: false`, as it
    // does a dry run or nothing to merge: the unsettled conflicts tell it apart.
    const stuck = report.conflicts.filter((c) => c.resolution === null);
    if (dryRun || stuck.length === 0) return report;
    const shown = stuck
      .slice(0, 10)
      .map((c) => `${c.path} (ours ${c.ours}, theirs ${c.theirs})`)
      .join(", ");
    const more = stuck.length > 10 ? ` and ${stuck.length - 10} more` : "";
    throw new MergeConflictError(
      `merging ${report.from} into ${report.sandbox} stopped on ${stuck.length} conflict(s), ` +
        `nothing was changed: ${shown}${more}`,
      report,
    );
  }

  /** Saves this sandbox's state; `mode` must be a kind the runtime supports. */
  async snapshot(opts: { mode?: SnapshotMode; name?: string } = {}): Promise<Snapshot> {
    const body: Json = { sandbox: this.id, kind: opts.mode ?? "full" };
    if (opts.name !== undefined) body.name = opts.name;
    return snapshotFromJson(await this.client.json("POST", "/v1/snapshots", { json: body }));
  }

  /** Restores this sandbox in place to `snapshot`; its id stays the same. */
  async rollback(snapshot: Snapshot | string): Promise<SandboxInfo> {
    const d = await this.client.json("POST", `/v1/sandboxes/${seg(this.id)}/restore`, {
      json: { snapshot: snapshotId(snapshot) },
    });
    return sandboxFromJson(d);
  }

  /**
   * Makes guest port `port` reachable through the daemon's proxy, at `url`
   * (`http://<port>-<id>.localhost:<proxy port>`) and `pathUrl`. Unless
   * `public`, the proxy wants the API token (`Authorization: Bearer <token>`,
   * the one this client uses). A port already exposed throws
   * {@link ConflictError}; one outside 1-65535 {@link InvalidArgument}.
   */
  async exposePort(port: number, opts: { public?: boolean } = {}): Promise<ExposedPort> {
    const d = await this.client.json("POST", this.portsPath(), {
      json: { port, public: opts.public ?? false },
    });
    return exposedPortFromJson(d);
  }

  /** The ports exposed so far. */
  async ports(): Promise<ExposedPort[]> {
    const d = await this.client.json<{ ports: Json[] }>("GET", this.portsPath());
    return d.ports.map(exposedPortFromJson);
  }

  /** Stops exposing `port`; throws {@link NotFoundError} if it was not exposed. */
  async unexposePort(port: number): Promise<void> {
    await this.client.request("DELETE", this.portsPath(`/${seg(String(port))}`));
  }

  /**
   * The host (no scheme) at which the daemon's proxy serves guest port `port`:
   * `<port>-<id>.localhost:<proxy port>`, as in `` `http://${await sb.getHost(8080)}` ``
   * (E2B's `getHost`).
   *
   * A port not exposed yet is exposed first, not public: requests to it then
   * need the API token. For a port reachable without the token, call
   * `exposePort(port, { public: true })` before.
   */
  async getHost(port: number): Promise<string> {
    let found = (await this.ports()).find((p) => p.port === port);
    if (!found) {
      try {
        found = await this.exposePort(port);
      } catch (e) {
        // Exposed by someone else since the listing: use that.
        if (alreadyExposed(e)) found = (await this.ports()).find((p) => p.port === port);
        if (!found) throw e;
      }
    }
    return found.host;
  }

  private portsPath(suffix = ""): string {
    return `/v1/sandboxes/${seg(this.id)}/ports${suffix}`;
  }

  /**
   * The samples the daemon took of this sandbox between `start` and `end`
   * (inclusive; Dates or unix seconds; both optional), oldest first: one every
   * few seconds while it runs (none while paused), the newest 720 kept in the
   * daemon's memory (lost when it restarts).
   */
  async metrics(range: MetricsRange = {}): Promise<MetricSample[]> {
    const query: Record<string, string> = {};
    for (const key of ["start", "end"] as const) {
      const t = range[key];
      if (t !== undefined) query[key] = String(unixSeconds(key, t));
    }
    if (query.start !== undefined && query.end !== undefined && Number(query.start) > Number(query.end)) {
      throw new RangeError(`start (${query.start}) must not be after end (${query.end})`);
    }
    const d = await this.client.json<{ metrics: Json[] }>("GET", `/v1/sandboxes/${seg(this.id)}/metrics`, { query });
    return d.metrics.map(metricFromJson);
  }

  /**
   * Runs Python in the sandbox's code interpreter (image `code-interpreter`): variables,
   * imports and figures stay between calls and are carried into branch children.
   */
  async runCode(code: string, opts: RunCodeOptions = {}): Promise<Execution> {
    return runCode(this.client, this.id, code, opts);
  }

  /** A new context: a kernel of its own. */
  async createCodeContext(cwd?: string): Promise<CodeContext> {
    return createCodeContext(this.client, this.id, cwd);
  }

  async listCodeContexts(): Promise<CodeContext[]> {
    return listCodeContexts(this.client, this.id);
  }

  /** A fresh kernel for the context (its state is lost; also after `KernelDied`). */
  async restartCodeContext(ctx: string | CodeContext = "default"): Promise<void> {
    return restartCodeContext(this.client, this.id, ctx);
  }

  async removeCodeContext(ctx: string | CodeContext): Promise<void> {
    return removeCodeContext(this.client, this.id, ctx);
  }

  /** The guest's serial console output. */
  async logs(): Promise<string> {
    return (await this.client.request("GET", `/v1/sandboxes/${seg(this.id)}/logs`)).text();
  }

  /** Stops the VM and removes the sandbox; false if it was already gone. */
  async kill(): Promise<boolean> {
    try {
      await this.client.request("DELETE", `/v1/sandboxes/${seg(this.id)}`);
      return true;
    } catch (e) {
      if (e instanceof SandboxNotFound) return false;
      throw e;
    }
  }

  async [Symbol.asyncDispose](): Promise<void> {
    await this.kill();
  }
}

/** `action` if the daemon knows it (the type allows only those; plain JS may not). */
function checkTtlAction(action: TtlAction): TtlAction {
  if (action !== "delete" && action !== "pause") {
    throw new TypeError(`ttlAction must be "delete" or "pause", not ${JSON.stringify(action)}`);
  }
  return action;
}

/** A network policy: `network`, `allowOut` and `denyOut` of {@link CreateOptions}. */
export type NetworkPolicyOptions = Pick<CreateOptions, "network" | "allowOut" | "denyOut">;

/** The policy fields of a request body: only those given. */
function policyBody(p: NetworkPolicyOptions): Json {
  const body: Json = {};
  if (p.network !== undefined) body.network = p.network;
  if (p.allowOut !== undefined) body.allow_out = [...p.allowOut];
  if (p.denyOut !== undefined) body.deny_out = [...p.denyOut];
  return body;
}

/** The time bounds of {@link Sandbox.metrics}: Dates or unix seconds. */
export interface MetricsRange {
  start?: Date | number;
  end?: Date | number;
}

function unixSeconds(what: string, t: Date | number): number {
  const secs = t instanceof Date ? Math.floor(t.getTime() / 1000) : t;
  if (typeof secs !== "number" || !Number.isFinite(secs) || secs < 0) {
    throw new RangeError(`${what} must be unix seconds (>= 0) or a Date, got ${String(t)}`);
  }
  return Math.floor(secs);
}
