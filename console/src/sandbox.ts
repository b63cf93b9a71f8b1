// One sandbox: its details and tabs for a live terminal, its processes (with their
// output), a file browser (download, upload), metric charts and its event log. The
// details and the open tab's data are refreshed by the router's poll.
import { ApiError, type Api, type FileEntry, type SandboxInfo as Sandbox } from "./api";
import { metricCharts } from "./charts";
import { bytes, clear, duration, guarded, h, nowSecs, status } from "./dom";
import { origin } from "./list";
import { TerminalView } from "./terminal";

const TABS = ["terminal", "processes", "files", "metrics", "events"] as const;
type Tab = (typeof TABS)[number];

export class SandboxView {
  private tab: Tab = "terminal";
  private terminal: TerminalView | null = null;
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

  /** The poll: the details, and the data of tabs that show a snapshot of something. */
  async refresh(): Promise<void> {
    const s = await this.api.sandbox(this.id);
    this.drawInfo(s);
    if (this.tab === "processes" || this.tab === "metrics" || this.tab === "events") await this.load();
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
        return this.processes();
      case "files":
        return this.files();
      case "metrics":
        this.body.replaceChildren(metricCharts(await this.api.metrics(this.id)));
        return;
      case "events":
        return this.events();
      default:
        return;
    }
  }

  private async processes(): Promise<void> {
    const list = await this.api.processes(this.id);
    // The output being read stays across polls, which redraw only the table.
    const output = this.body.querySelector<HTMLPreElement>("pre.output") ?? h("pre", { class: "output" });
    const rows = list.map((p) =>
      h(
        "tr",
        {},
        h("td", {}, String(p.pid)),
        h("td", {}, p.argv.join(" ")),
        h("td", {}, p.state + (p.exitCode !== null ? ` (${p.exitCode})` : "")),
        h("td", {}, bytes(p.outputBytes)),
        h(
          "td",
          {},
          h(
            "button",
            {
              type: "button",
              onclick: () =>
                void guarded("output", async () => {
                  const o = await this.api.output(this.id, p.pid);
                  output.textContent = o.stdout + o.stderr;
                }),
            },
            "output",
          ),
        ),
      ),
    );
    const table = h(
      "table",
      {},
      h("thead", {}, h("tr", {}, ...["pid", "argv", "state", "output", ""].map((t) => h("th", {}, t)))),
      h("tbody", {}, ...rows),
    );
    const note = list.length ? null : h("p", { class: "muted" }, "no background processes (exec -d / background: true)");
    this.body.replaceChildren(table, note ?? "", output);
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

  private async events(): Promise<void> {
    const list = await this.api.events(this.id);
    const rows = list.map((e) =>
      h(
        "tr",
        { class: `level-${e.level}` },
        h("td", {}, new Date(e.tsMs).toLocaleTimeString()),
        h("td", {}, e.level),
        h("td", {}, e.message),
        h("td", { class: "fields" }, JSON.stringify(e.fields)),
      ),
    );
    this.body.replaceChildren(h("table", { "data-testid": "events" }, h("tbody", {}, ...rows)));
  }

  dispose(): void {
    this.terminal?.dispose();
  }
}
