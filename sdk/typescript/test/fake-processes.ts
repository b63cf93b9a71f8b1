/**
 * Background processes the way zygoted serves them (crates/daemon/src/api/processes.rs),
 * for the fake daemon: `POST .../exec {"background": true}` answers 202 with the
 * process; the process routes list it, read its output from an offset (JSON, with a
 * long-poll `wait_ms`, or `follow=true` NDJSON written as it is printed), write its
 * stdin and signal it, with the daemon's error codes.
 *
 * The guest's programs are modelled by name (argv[0], or the command of `sh -c`), as
 * in the Python SDK's tests/fake_processes.py:
 * - `cat`: copies stdin to stdout; exits 0 at end of file.
 * - `talk`: prints `start`; answers each stdin line `L` with `got L`; at end of file
 *   prints `bye` to stderr and exits 3.
 * - `sleep`: prints and reads nothing (stdin past a 64 KiB pipe is `guest_busy`); runs
 *   until a signal.
 * - `echo WORDS`: prints them and exits 0.
 * Anything else fails to start (`guest_spawn_failed`). A signal other than
 * SIGCONT/SIGSTOP ends a program; a `timeout_ms` past kills it (SIGKILL, `timed_out`).
 */
import type { ServerResponse } from "node:http";

const SIGNALS: Record<string, number> = { KILL: 9, TERM: 15, INT: 2, HUP: 1, QUIT: 3, USR1: 10, USR2: 12, STOP: 19, CONT: 18 };
const PIPE_BYTES = 65536;

/** The daemon's SignalRequest::number (undefined: refused). */
export function signalNumber(spec: unknown): number | undefined {
  if (typeof spec === "number") return Number.isInteger(spec) && spec >= 1 && spec <= 64 ? spec : undefined;
  if (typeof spec === "string") {
    const bare = spec.toUpperCase().replace(/^SIG/, "");
    return SIGNALS[bare === "INTERRUPT" ? "INT" : bare];
  }
  return undefined;
}

class FakeProcess {
  chunks: { offset: number; stream: string; data: Buffer }[] = [];
  total = 0;
  state = "running";
  exitCode: number | null = null;
  signal: number | null = null;
  timedOut = false;
  durationMs: number | null = null;
  stdinOpen = true;
  unread = Buffer.alloc(0);
  readonly started = Date.now();
  /** Called on every change (output, end). */
  listeners = new Set<() => void>();

  constructor(
    readonly pid: number,
    readonly argv: string[],
    readonly program: string,
    readonly args: string[],
  ) {}

  view(): Record<string, unknown> {
    return {
      pid: this.pid,
      argv: this.argv,
      state: this.state,
      exit_code: this.exitCode,
      signal: this.signal,
      timed_out: this.timedOut,
      duration_ms: this.durationMs,
      started_at_ms: this.started,
      output_bytes: this.total,
      stdin_open: this.stdinOpen,
    };
  }

  changed(): void {
    for (const l of [...this.listeners]) l();
  }

  print(stream: string, data: Buffer): void {
    if (data.length === 0) return;
    this.chunks.push({ offset: this.total, stream, data });
    this.total += data.length;
  }

  read(offset: number): { start: number; chunks: { stream: string; data: Buffer }[] } {
    const start = Math.max(offset, this.chunks[0]?.offset ?? this.total);
    const chunks = this.chunks
      .filter((c) => c.offset + c.data.length > start)
      .map((c) => ({ stream: c.stream, data: c.data.subarray(Math.max(0, start - c.offset)) }));
    return { start, chunks };
  }

  end(how: { code?: number; signal?: number; timedOut?: boolean }): void {
    this.state = "exited";
    this.exitCode = how.code ?? null;
    this.signal = how.signal ?? null;
    this.timedOut = how.timedOut ?? false;
    this.durationMs = Date.now() - this.started;
    this.stdinOpen = false;
  }

  stdin(data: Buffer, eof: boolean): void {
    this.unread = Buffer.concat([this.unread, data]);
    if (this.program === "cat") {
      this.print("stdout", this.unread);
      this.unread = Buffer.alloc(0);
    } else if (this.program === "talk") {
      let nl: number;
      while ((nl = this.unread.indexOf("\n")) >= 0) {
        this.print("stdout", Buffer.concat([Buffer.from("got "), this.unread.subarray(0, nl + 1)]));
        this.unread = this.unread.subarray(nl + 1);
      }
    }
    if (eof) {
      this.stdinOpen = false;
      if (this.program === "cat") this.end({ code: 0 });
      if (this.program === "talk") {
        this.print("stderr", Buffer.from("bye\n"));
        this.end({ code: 3 });
      }
    }
  }
}

const send = (res: ServerResponse, status: number, json?: unknown): void => {
  if (json === undefined) {
    res.writeHead(status);
    res.end();
  } else {
    res.writeHead(status, { "content-type": "application/json" });
    res.end(JSON.stringify(json));
  }
};

const failure = (res: ServerResponse, status: number, code: string, message: string): void =>
  send(res, status, { error: { code, message } });

export class FakeProcesses {
  /** sandbox id -> pid -> process (any sandbox id is taken as running). */
  readonly sandboxes = new Map<string, Map<number, FakeProcess>>();
  private nextPid = 100;
  /** The next follows end with this error line after the output so far (the agent lost mid-follow). */
  readonly followErrors: { code: string; message: string }[] = [];
  private readonly timers = new Set<NodeJS.Timeout>();

  /** A branch child runs its own copy of each of the parent's processes (same pids). */
  branch(parent: string, child: string): void {
    const copies = new Map<number, FakeProcess>();
    for (const [pid, p] of this.sandboxes.get(parent) ?? []) {
      const c = Object.assign(new FakeProcess(p.pid, p.argv, p.program, p.args), p, { listeners: new Set() });
      c.chunks = [...p.chunks];
      copies.set(pid, c);
    }
    this.sandboxes.set(child, copies);
  }

  stop(): void {
    for (const t of this.timers) clearTimeout(t);
  }

  /** Answers a request this model handles (true), else false. */
  answer(method: string, path: string, query: URLSearchParams, body: Buffer, res: ServerResponse): boolean {
    const m = /^\/v1\/sandboxes\/([^/]+)\/(exec|processes)(?:\/([^/]+))?(?:\/(output|stdin|signal))?$/.exec(path);
    if (!m) return false;
    const [, sid, route, pidText, what] = m;
    let procs = this.sandboxes.get(sid!);
    if (!procs) this.sandboxes.set(sid!, (procs = new Map()));
    if (route === "exec") {
      const req = JSON.parse(body.toString()) as Record<string, unknown>;
      if (pidText !== undefined || req.background !== true) return false;
      this.spawn(procs, req, res);
      return true;
    }
    if (pidText === undefined) {
      send(res, 200, { processes: [...procs.values()].sort((a, b) => a.pid - b.pid).map((p) => p.view()) });
      return true;
    }
    if (!/^[0-9]+$/.test(pidText) || Number(pidText) === 0) {
      failure(res, 400, "invalid_argument", `pid must be a positive integer, got ${JSON.stringify(pidText)}`);
      return true;
    }
    const p = procs.get(Number(pidText));
    if (what === undefined) {
      if (p) send(res, 200, p.view());
      else failure(res, 404, "not_found", `process "${pidText}" not found`);
      return true;
    }
    if (!p) {
      failure(res, 404, "guest_not_found", `no process ${pidText}`);
      return true;
    }
    if (what === "output") this.output(p, query, res);
    else if (what === "stdin") this.stdin(p, JSON.parse(body.toString()) as Record<string, unknown>, res);
    else this.signal(p, (JSON.parse(body.toString()) as Record<string, unknown>).signal, res);
    return true;
  }

  private spawn(procs: Map<number, FakeProcess>, req: Record<string, unknown>, res: ServerResponse): void {
    const argv = req.argv as string[];
    const words = argv[0] === "sh" && argv[1] === "-c" && argv[2] !== undefined ? argv[2].split(/\s+/) : argv;
    const program = words[0] ?? "";
    if (!["cat", "talk", "sleep", "echo"].includes(program)) {
      failure(res, 422, "guest_spawn_failed", `spawn ${argv[0]}: No such file or directory`);
      return;
    }
    const p = new FakeProcess(++this.nextPid, argv, program, words.slice(1));
    procs.set(p.pid, p);
    if (program === "talk") p.print("stdout", Buffer.from("start\n"));
    if (program === "echo") {
      p.print("stdout", Buffer.from(p.args.join(" ") + "\n"));
      p.end({ code: 0 });
    } else if (typeof req.stdin === "string" && req.stdin) {
      p.stdin(Buffer.from(req.stdin), false);
    }
    if (typeof req.timeout_ms === "number" && p.state === "running") {
      const t = setTimeout(() => {
        this.timers.delete(t);
        if (p.state !== "running") return;
        p.end({ signal: 9, timedOut: true });
        p.changed();
      }, req.timeout_ms);
      t.unref(); // a program left running must not keep the test process alive
      this.timers.add(t);
    }
    send(res, 202, p.view());
  }

  private output(p: FakeProcess, query: URLSearchParams, res: ServerResponse): void {
    const offset = Number(query.get("offset") ?? "0");
    if (query.get("follow") === "true") {
      if (query.has("wait_ms")) {
        failure(res, 400, "invalid_argument", "wait_ms does not apply with follow=true");
        return;
      }
      this.follow(p, offset, res);
      return;
    }
    const waitMs = Number(query.get("wait_ms") ?? "0");
    if (!(waitMs >= 0 && waitMs <= 30000)) {
      failure(res, 400, "invalid_argument", `wait_ms must be in 0..=30000, got ${waitMs}`);
      return;
    }
    const answer = (): void => {
      const { start, chunks } = p.read(offset);
      const text = (s: string): string =>
        Buffer.concat(chunks.filter((c) => c.stream === s).map((c) => c.data)).toString("utf8");
      send(res, 200, {
        stdout: text("stdout"),
        stderr: text("stderr"),
        offset: start,
        next_offset: p.total,
        dropped_bytes: Math.max(0, start - offset),
        process: p.view(),
      });
    };
    if (p.total > offset || p.state !== "running" || waitMs === 0) {
      answer();
      return;
    }
    const done = (): void => {
      clearTimeout(timer);
      p.listeners.delete(done);
      answer();
    };
    const timer = setTimeout(done, waitMs);
    p.listeners.add(done);
  }

  private follow(p: FakeProcess, offset: number, res: ServerResponse): void {
    res.writeHead(200, { "content-type": "application/x-ndjson" });
    let pos = offset;
    const failure = this.followErrors.shift();
    const pump = (): void => {
      const { chunks } = p.read(pos);
      pos = p.total;
      for (const c of chunks) {
        res.write(JSON.stringify({ type: "output", stream: c.stream, data: c.data.toString("base64") }) + "\n");
      }
      if (failure) {
        p.listeners.delete(pump);
        res.end(JSON.stringify({ type: "error", ...failure }) + "\n");
      } else if (p.state === "exited") {
        p.listeners.delete(pump);
        res.end(
          JSON.stringify({
            type: "exit",
            exit_code: p.exitCode,
            signal: p.signal,
            timed_out: p.timedOut,
            duration_ms: p.durationMs,
          }) + "\n",
        );
      }
    };
    p.listeners.add(pump);
    res.on("close", () => p.listeners.delete(pump));
    pump();
  }

  private stdin(p: FakeProcess, req: Record<string, unknown>, res: ServerResponse): void {
    if (req.data !== undefined && req.data_base64 !== undefined) {
      failure(res, 400, "invalid_argument", "give data or data_base64, not both");
      return;
    }
    const data =
      typeof req.data === "string" ? Buffer.from(req.data) : Buffer.from(String(req.data_base64 ?? ""), "base64");
    if (data.length === 0 && req.eof !== true) {
      failure(res, 400, "invalid_argument", "nothing to do: no data and no eof");
    } else if (p.state === "exited") {
      failure(res, 409, "process_exited", `process ${p.pid} has exited`);
    } else if (!p.stdinOpen) {
      failure(res, 400, "guest_bad_request", `process ${p.pid} closed its stdin`);
    } else if (p.program === "sleep" && p.unread.length + data.length > PIPE_BYTES) {
      failure(res, 409, "guest_busy", `process ${p.pid} did not read its stdin within 10 s`);
    } else {
      p.stdin(data, req.eof === true);
      p.changed();
      send(res, 204);
    }
  }

  private signal(p: FakeProcess, spec: unknown, res: ServerResponse): void {
    const sig = signalNumber(spec);
    if (sig === undefined) {
      failure(res, 400, "invalid_argument", `unknown signal ${JSON.stringify(spec)}`);
    } else if (p.state === "exited") {
      failure(res, 409, "process_exited", `process ${p.pid} has exited`);
    } else {
      if (sig !== SIGNALS.CONT && sig !== SIGNALS.STOP) p.end({ signal: sig });
      p.changed();
      send(res, 204);
    }
  }
}
