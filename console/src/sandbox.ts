// One sandbox: its details and tabs for a live terminal, its processes (with the output
// of one followed live), a file browser (download, upload), metric charts, its egress
// record and its event log (new events appended as the daemon's stream brings them). The
// router refreshes it when an event concerns this sandbox, and every few seconds for the
// numbers that change without events (metrics, the egress record).
import { ApiError, type Api, type FileEntry, type SandboxInfo as Sandbox } from "./api";
import { metricCharts } from "./charts";
import { bytes, clear, duration, guarded, h, nowSecs, status } from "./dom";
import { egressTable } from "./egress";
import type { LiveEvent } from "./events";
import { origin } from "./list";
import { ProcessesTab } from "./processes";
import { TerminalView } from "./terminal";

const TABS = ["terminal", "processes", "files", "metrics", "egress", "events"] as const;
type Tab = (typeof TABS)[number];

/** Why a view is refreshed: the slow poll, an event about it, or everything (a reconnect). */
export type RefreshReason = "poll" | "event" | "reload";

/** Rows the events tab keeps (the oldest go first). */
const MAX_EVENT_ROWS = 1000;

interface EventRow {
  tsMs: number;
  level: string;
  message: string;
  fields: Record<string, string>;
}

export class SandboxView {
  private tab: Tab = "terminal";
  private terminal: TerminalView | null = null;
  private processTab: ProcessesTab | null = null;
  private eventRows: HTMLTableSectionElement | null = null;
  private dir = "/root";
  private readonly info = h("div", { class: "info" });
  private readonly tabs = h("nav", { class: "tabs" });
  private readonly body = h("section", { class: "tab" });

  constructor(
    private readonly api: Api,
    root: HTMLElement,
    private readonly id: string,
    tab: string | undefined,
  ) {
    if (tab && (TABS as readonly string[]).includes(tab)) this.tab = tab as Tab;
    clear(root);
    root.append(this.info, this.tabs, this.body);
    this.drawTabs();
    void this.open();
  }

  private drawTabs(): void {
    this.tabs.replaceChildren(
      ...TABS.map((t) =>
        h("a", { href: `#/sandbox/${this.id}/${t}`, class: t === this.tab ? "active" : "", "data-tab": t }, t),
      ),
    );
  }

  /**
   * The details, and the data of tabs that show a snapshot of something: the processes
   * at each refresh; metrics and the egress record at the poll; the event log, which
   * events are appended to, only when some may have been missed.
   */
  async refresh(reason: RefreshReason = "poll"): Promise<void> {
    let s: Sandbox;
    try {
      s = await this.api.sandbox(this.id);
    } catch (e) {
      if (e instanceof ApiError && e.status === 404) {
        this.info.replaceChildren(h("h2", {}, this.id), h("p", { class: "error", "data-testid": "gone" }, "This sandbox no longer exists."));
        return;
      }
      throw e;
    }
    this.drawInfo(s);
    const again =
      this.tab === "processes" ||
      ((this.tab === "metrics" || this.tab === "egress") && reason !== "event") ||
      (this.tab === "events" && reason !== "event");
    if (again) await this.load();
  }

  /** Whether `e` is about this sandbox; the events tab shows it at once. */
  concerns(e: LiveEvent): boolean {
    if (e.sandbox !== this.id) return false;
    if (this.tab === "events" && this.eventRows) {
      this.eventRows.prepend(this.eventRow(e));
      while (this.eventRows.rows.length > MAX_EVENT_ROWS) this.eventRows.lastElementChild?.remove();
    }
    return true;
  }

  private drawInfo(s: Sandbox): void {
    const labels = Object.entries(s.metadata).map(([k, v]) => h("code", {}, `${k}=${v}`));
    const count = h("input", { type: "number", min: 1, max: 256, value: 3, "aria-label": "children", name: "count" });
    const branch = h("button", { type: "button" }, "branch");
    branch.addEventListener("click", () =>
      guarded("branch", async () => {
        status(`branching ${s.id}…`);
        const r = await this.api.branch(s.id, Number(count.value));
        status(`branched ${s.id}: ${r.children.length} children`);
        location.hash = `#/tree/${s.id}`;
      }),
    );
    const del = h("button", { type: "button", class: "danger" }, "delete");
    del.addEventListener("click", () =>
      guarded("delete", async () => {
        if (!confirm(`Delete ${s.id}?`)) return;
        await this.api.remove(s.id);
        location.hash = "#/";
      }),
    );
    this.info.replaceChildren(
      h("h2", {}, s.name ? `${s.name} (${s.id})` : s.id),
      h(
        "p",
        {},
        h("span", { class: `state ${s.state}`, "data-testid": "state" }, s.state),
        ` · ${origin(s)} · ${s.memoryMib} MiB · ${s.vcpus} vCPU · ${s.runtime} · up ${duration(nowSecs() - s.createdAt)}`,
        s.expiresAt !== null ? ` · expires in ${duration(s.expiresAt - nowSecs())}` : "",
        s.exitReason ? ` · ${s.exitReason}` : "",
        " ",
        ...labels,
      ),
      h("div", { class: "toolbar" }, h("a", { href: `#/tree/${s.id}`, class: "button" }, "branch tree"), count, branch, del),
    );
  }

  private async open(): Promise<void> {
    clear(this.body);
    if (this.tab === "terminal") {
      this.terminal = new TerminalView(this.api, this.id);
      this.terminal.mount(this.body);
    } else {
      await guarded(this.tab, () => this.load());
    }
  }

  private async load(): Promise<void> {
    switch (this.tab) {
      case "processes":
        if (!this.processTab) {
          this.processTab = new ProcessesTab(this.api, this.id);
          this.body.replaceChildren(this.processTab.root);
        }
        return this.processTab.refresh();
      case "files":
        return this.files();
      case "metrics":
        this.body.replaceChildren(metricCharts(await this.api.metrics(this.id)));
        return;
      case "egress":
        this.body.replaceChildren(egressTable(await this.api.egress(this.id)));
        return;
      case "events":
        return this.events();
      default:
        return;
    }
  }

  private async files(): Promise<void> {
    let entries: FileEntry[];
    try {
      entries = await this.api.list(this.id, this.dir);
    } catch (e) {
      if (e instanceof ApiError && e.status === 404 && this.dir !== "/") {
        this.dir = "/";
        return this.files();
      }
      throw e;
    }
    entries.sort((a, b) => Number(b.kind === "dir") - Number(a.kind === "dir") || a.name.localeCompare(b.name));
    const path = (name: string) => (this.dir === "/" ? `/${name}` : `${this.dir}/${name}`);
    const go = (dir: string) => {
      this.dir = dir;
      void guarded("files", () => this.files());
    };
    const parent = this.dir === "/" ? null : this.dir.replace(/\/[^/]*$/, "") || "/";
    const rows = entries.map((e) =>
      h(
        "tr",
        { "data-file": e.name },
        h(
          "td",
          {},
          e.kind === "dir"
            ? h("a", { href: "#", onclick: (ev: Event) => (ev.preventDefault(), go(path(e.name))) }, `${e.name}/`)
            : e.name,
        ),
        h("td", {}, e.kind),
        h("td", {}, e.kind === "dir" ? "" : bytes(e.size)),
        h("td", {}, new Date(e.mtime * 1000).toISOString().replace("T", " ").slice(0, 19)),
        h(
          "td",
          {},
          e.kind === "file"
            ? h("button", { type: "button", onclick: () => void guarded("download", () => this.download(path(e.name), e.name)) }, "download")
            : "",
        ),
      ),
    );
    const input = h("input", { type: "file", "aria-label": "upload", name: "upload" });
    input.addEventListener("change", () =>
      guarded("upload", async () => {
        const f = input.files?.[0];
        if (!f) return;
        await this.api.upload(this.id, path(f.name), f);
        status(`uploaded ${path(f.name)} (${bytes(f.size)})`);
        await this.files();
      }),
    );
    this.body.replaceChildren(
      h(
        "div",
        { class: "toolbar" },
        h("code", { "data-testid": "dir" }, this.dir),
        parent ? h("button", { type: "button", onclick: () => go(parent) }, "up") : null,
        h("span", { class: "grow" }),
        h("label", {}, "upload here: ", input),
      ),
      h("table", {}, h("tbody", {}, ...rows)),
    );
  }

  private async download(path: string, name: string): Promise<void> {
    const blob = await this.api.download(this.id, path);
    // The token is in a header, so the browser cannot fetch the file by a link itself:
    // the bytes go through an object URL.
    const url = URL.createObjectURL(blob);
    const a = h("a", { href: url, download: name });
    document.body.append(a);
    a.click();
    a.remove();
    setTimeout(() => URL.revokeObjectURL(url), 10_000);
  }

  /** The log, newest first; the stream's events are put on top as they come. */
  private async events(): Promise<void> {
    const list = await this.api.events(this.id);
    this.eventRows = h("tbody", {}, ...list.map((e) => this.eventRow(e)));
    this.body.replaceChildren(h("table", { "data-testid": "events" }, this.eventRows));
  }

  private eventRow(e: EventRow): HTMLTableRowElement {
    return h(
      "tr",
      { class: `level-${e.level}` },
      h("td", {}, new Date(e.tsMs).toLocaleTimeString()),
      h("td", {}, e.level),
      h("td", {}, e.message),
      h("td", { class: "fields" }, JSON.stringify(e.fields)),
    );
  }

  dispose(): void {
    this.terminal?.dispose();
    this.processTab?.dispose();
  }
}
