// The processes tab: a sandbox's background processes, and the output of the one
// selected, followed live by long-polling `GET .../processes/{pid}/output` (`offset` +
// `wait_ms`): each answer is appended as it comes, until the process has ended and its
// output is read, or the tab closes (the AbortController ends the request in flight).
// The output is the guest's: it is only ever set as text, and the view keeps its last
// MAX_LOG_CHARS characters.
import { ApiError, type Api, type ProcessInfo } from "./api";
import { bytes, guarded, h } from "./dom";

/** How long one output request may wait for something new (the daemon allows 30 s). */
const WAIT_MS = 10_000;
/** The log view keeps this much of the newest output (the guest keeps 1 MiB per process). */
export const MAX_LOG_CHARS = 2 * 1024 * 1024;
const RETRY_MS = 2000;

function describe(p: ProcessInfo): string {
  if (p.state !== "exited") return p.state;
  if (p.timedOut) return "exited (timed out)";
  if (p.signal !== null) return `exited (signal ${p.signal})`;
  return `exited (${p.exitCode ?? "?"})`;
}

export class ProcessesTab {
  readonly root = h("div", { class: "processes" });
  private readonly table = h("div");
  private readonly logState = h("p", { class: "muted", "data-testid": "process-log-state" });
  private readonly log = h("pre", { class: "output", "data-testid": "process-log" });
  private readonly text = document.createTextNode("");
  private following: { pid: number; abort: AbortController } | null = null;
  private trimmed = false;

  constructor(
    private readonly api: Api,
    private readonly id: string,
  ) {
    this.log.append(this.text);
    this.root.append(this.table, this.logState, this.log);
    this.logState.textContent = "select a process to follow its output";
  }

  /** Redraws the table only: the log being followed is left alone. */
  async refresh(): Promise<void> {
    const list = await this.api.processes(this.id);
    const rows = list.map((p) =>
      h(
        "tr",
        { "data-pid": p.pid, class: this.following?.pid === p.pid ? "selected" : "" },
        h("td", {}, String(p.pid)),
        h("td", {}, p.argv.join(" ")),
        h("td", {}, describe(p)),
        h("td", {}, bytes(p.outputBytes)),
        h("td", {}, h("button", { type: "button", onclick: () => this.follow(p.pid) }, "follow")),
      ),
    );
    const note = list.length ? null : h("p", { class: "muted" }, "no background processes (exec -d / background: true)");
    this.table.replaceChildren(
      h(
        "table",
        {},
        h("thead", {}, h("tr", {}, ...["pid", "argv", "state", "output", ""].map((t) => h("th", {}, t)))),
        h("tbody", {}, ...rows),
      ),
      note ?? "",
    );
  }

  /** Follows `pid`'s output from its start, ending the previous follow. */
  follow(pid: number): void {
    this.stop();
    const abort = new AbortController();
    this.following = { pid, abort };
    this.text.data = "";
    this.trimmed = false;
    for (const tr of this.table.querySelectorAll("tr[data-pid]")) {
      tr.classList.toggle("selected", tr.getAttribute("data-pid") === String(pid));
    }
    void guarded(`output of ${pid}`, () => this.read(pid, abort.signal));
  }

  private async read(pid: number, signal: AbortSignal): Promise<void> {
    let offset = 0;
    this.logState.textContent = `process ${pid}: reading…`;
    while (!signal.aborted) {
      let out;
      try {
        out = await this.api.output(this.id, pid, offset, WAIT_MS, signal);
      } catch (e) {
        if (signal.aborted) return;
        if (e instanceof ApiError && e.status === 404) {
          this.logState.textContent = `process ${pid}: gone (${e.message})`;
          return;
        }
        this.logState.textContent = `process ${pid}: ${e instanceof Error ? e.message : String(e)}; trying again`;
        await sleep(RETRY_MS, signal);
        continue;
      }
      if (signal.aborted) return;
      if (out.offset > offset) this.append(`\n[… ${bytes(out.offset - offset)} the guest no longer kept …]\n`);
      this.append(out.stdout + out.stderr);
      const nothingNew = out.nextOffset === offset;
      offset = out.nextOffset;
      const p = out.process;
      const size = `${bytes(offset)} read${this.trimmed ? `, the view keeps the last ${bytes(MAX_LOG_CHARS)}` : ""}`;
      if (p.state === "exited" && offset >= p.outputBytes) {
        this.logState.textContent = `process ${pid}: ${describe(p)} · ${size} · all output read`;
        this.logState.dataset.ended = "true";
        // Its row still says running until the next refresh: now.
        await this.refresh();
        return;
      }
      this.logState.textContent = `process ${pid}: ${describe(p)} · ${size} · following`;
      delete this.logState.dataset.ended;
      // The daemon waited WAIT_MS for nothing (or does not wait): no busy loop.
      if (nothingNew) await sleep(250, signal);
    }
  }

  private append(s: string): void {
    if (!s) return;
    const atBottom = this.log.scrollTop + this.log.clientHeight >= this.log.scrollHeight - 8;
    this.text.appendData(s);
    const excess = this.text.length - MAX_LOG_CHARS;
    if (excess > 0) {
      this.text.deleteData(0, excess);
      this.trimmed = true;
    }
    if (atBottom) this.log.scrollTop = this.log.scrollHeight;
  }

  private stop(): void {
    this.following?.abort.abort();
    this.following = null;
  }

  dispose(): void {
    this.stop();
  }
}

function sleep(ms: number, signal: AbortSignal): Promise<void> {
  return new Promise((resolve) => {
    const t = setTimeout(resolve, ms);
    signal.addEventListener("abort", () => (clearTimeout(t), resolve()), { once: true });
  });
}
