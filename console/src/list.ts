// The sandboxes view: every sandbox with its state, image, labels, memory (used / given),
// disk (its own writable layer on the host), age and TTL; a filter (labels `key=value` or
// `key`, or any text); create; bulk delete. Rows are virtualized (only those in view
// exist in the DOM), so 1000 sandboxes cost ~40 rows.
import { ApiError, diskBytes, latestMetrics, type Api, type SandboxInfo as Sandbox } from "./api";
import { bytes, clear, duration, guarded, h, nowSecs, status } from "./dom";

const ROW_H = 32;
/** Rows drawn above and below the visible ones, so fast scrolling shows no gaps. */
const OVERSCAN = 8;
/** Deletes in flight at once during a bulk delete. */
const DELETE_PARALLEL = 8;

export function origin(s: Sandbox): string {
  const o = s.origin as { image?: { name?: string }; snapshot?: { id?: string }; branch?: { parent?: string } };
  if (o.image) return o.image.name ?? "?";
  if (o.snapshot) return `snapshot ${o.snapshot.id ?? "?"}`;
  if (o.branch) return `branch of ${o.branch.parent ?? "?"}`;
  return "?";
}

function labels(s: Sandbox): string {
  return Object.entries(s.metadata)
    .map(([k, v]) => `${k}=${v}`)
    .join(" ");
}

/** Memory the guest uses (its newest metrics sample) / memory it was given. */
function memory(s: Sandbox): { text: string; title: string } {
  const m = latestMetrics(s);
  const given = `${s.memoryMib} MiB`;
  if (!m) return { text: `– / ${given}`, title: `${given} given, ${s.vcpus} vCPU; no metrics sample yet` };
  return {
    text: `${bytes(m.memUsed)} / ${given}`,
    title: `${bytes(m.memUsed)} used (${bytes(m.memCache)} cache) of ${given} given; ${s.vcpus} vCPU, ${Math.round(m.cpuUsedPct)}% CPU (${m.timestamp})`,
  };
}

/** The host bytes of its own writable disk layer, and the guest's view of its disk. */
function disk(s: Sandbox): { text: string; title: string } {
  const own = diskBytes(s);
  const m = latestMetrics(s);
  const guest = m ? `; the guest sees ${bytes(m.diskUsed)} used of ${bytes(m.diskTotal)}` : "";
  return { text: own === null ? "–" : bytes(own), title: `own disk layer on the host: ${own === null ? "unknown" : bytes(own)}${guest}` };
}

function ttl(s: Sandbox): string {
  if (s.expiresAt !== null) return `in ${duration(s.expiresAt - nowSecs())}`;
  if (s.ttlSecs !== null) return s.pausedAt !== null ? "paused" : `${duration(s.ttlSecs)}`;
  return "–";
}

/** Whether `s` matches every term of `filter` (labels `k=v` or `k`, else any text). */
export function matches(s: Sandbox, filter: string): boolean {
  for (const term of filter.trim().split(/\s+/).filter(Boolean)) {
    const eq = term.indexOf("=");
    if (eq > 0) {
      if (s.metadata[term.slice(0, eq)] !== term.slice(eq + 1)) return false;
    } else if (!(term in s.metadata)) {
      const text = `${s.id} ${s.name ?? ""} ${s.state} ${origin(s)}`;
      if (!text.includes(term)) return false;
    }
  }
  return true;
}

export class ListView {
  private all: Sandbox[] = [];
  private shown: Sandbox[] = [];
  private selected = new Set<string>();
  private filter = "";
  private readonly viewport = h("div", { class: "viewport", "data-testid": "list" });
  private readonly spacer = h("div", { class: "spacer" });
  private readonly rows = h("div", { class: "rows" });
  private readonly count = h("span", { class: "muted" });
  private readonly deleteButton = h("button", { type: "button", class: "danger" }, "delete selected");
  private readonly selectAll = h("input", { type: "checkbox", title: "select every sandbox shown" });

  constructor(
    private readonly api: Api,
    readonly root: HTMLElement,
  ) {
    const filter = h("input", {
      type: "search",
      placeholder: "filter: team=search  key  text",
      "aria-label": "filter",
      name: "filter",
    });
    filter.addEventListener("input", () => {
      this.filter = filter.value;
      this.refilter();
    });
    const image = h("input", { value: "minimal", "aria-label": "image", name: "image", size: 14 });
    const create = h("button", { type: "button" }, "new sandbox");
    create.addEventListener("click", () =>
      guarded("create", async () => {
        create.disabled = true;
        status(`creating a sandbox from ${image.value}…`);
        try {
          const s = await this.api.create(image.value.trim() || "minimal");
          status(`created ${s.id}`);
          await this.refresh();
        } finally {
          create.disabled = false;
        }
      }),
    );
    this.deleteButton.addEventListener("click", () => void this.deleteSelected());
    this.selectAll.addEventListener("change", () => {
      for (const s of this.shown) {
        if (this.selectAll.checked) this.selected.add(s.id);
        else this.selected.delete(s.id);
      }
      this.draw();
    });
    this.viewport.addEventListener("scroll", () => this.draw(), { passive: true });
    this.viewport.append(this.spacer);
    this.spacer.append(this.rows);
    const header = h(
      "div",
      { class: "row head" },
      h("span", {}, this.selectAll),
      ...["id / name", "state", "image", "labels", "memory used / given", "disk", "age", "TTL", ""].map((t) => h("span", {}, t)),
    );
    clear(root);
    root.append(
      h("div", { class: "toolbar" }, filter, this.count, h("span", { class: "grow" }), image, create, this.deleteButton),
      header,
      this.viewport,
    );
  }

  async refresh(): Promise<void> {
    this.update(await this.api.sandboxes());
  }

  /** Any event may change a row (its state, a new sandbox, one gone). */
  concerns(): boolean {
    return true;
  }

  /** New data. */
  update(all: Sandbox[]): void {
    this.all = all;
    const ids = new Set(all.map((s) => s.id));
    for (const id of this.selected) if (!ids.has(id)) this.selected.delete(id);
    this.refilter();
  }

  private refilter(): void {
    this.shown = this.all.filter((s) => matches(s, this.filter));
    this.count.textContent = `${this.shown.length} of ${this.all.length}`;
    this.spacer.style.height = `${this.shown.length * ROW_H}px`;
    this.draw();
  }

  /** Builds the rows in view (and a few around them). */
  private draw(): void {
    const top = this.viewport.scrollTop;
    const height = this.viewport.clientHeight || 600;
    const first = Math.max(0, Math.floor(top / ROW_H) - OVERSCAN);
    const last = Math.min(this.shown.length, Math.ceil((top + height) / ROW_H) + OVERSCAN);
    this.rows.style.transform = `translateY(${first * ROW_H}px)`;
    const now = nowSecs();
    const rows = this.shown.slice(first, last).map((s) => this.row(s, now));
    this.rows.replaceChildren(...rows);
    const n = this.selected.size;
    this.deleteButton.textContent = `delete selected (${n})`;
    this.deleteButton.disabled = n === 0;
    this.selectAll.checked = this.shown.length > 0 && this.shown.every((s) => this.selected.has(s.id));
  }

  private row(s: Sandbox, now: number): HTMLElement {
    const check = h("input", { type: "checkbox", "aria-label": `select ${s.id}` });
    check.checked = this.selected.has(s.id);
    check.addEventListener("change", () => {
      if (check.checked) this.selected.add(s.id);
      else this.selected.delete(s.id);
      this.draw();
    });
    const mem = memory(s);
    const dsk = disk(s);
    return h(
      "div",
      { class: "row", "data-id": s.id },
      h("span", {}, check),
      h("span", {}, h("a", { href: `#/sandbox/${s.id}` }, s.name ? `${s.name} (${s.id})` : s.id)),
      h("span", { class: `state ${s.state}` }, s.state),
      h("span", {}, origin(s)),
      h("span", { class: "labels", title: labels(s) }, labels(s)),
      h("span", { class: "memory", title: mem.title }, mem.text),
      h("span", { class: "disk", title: dsk.title }, dsk.text),
      h("span", {}, duration(now - s.createdAt)),
      h("span", {}, ttl(s)),
      h("span", {}, h("a", { href: `#/tree/${s.id}` }, "tree")),
    );
  }

  private async deleteSelected(): Promise<void> {
    const ids = [...this.selected];
    if (ids.length === 0 || !confirm(`Delete ${ids.length} sandbox(es)? Their VMs are killed.`)) return;
    let done = 0;
    const failed: string[] = [];
    const work = [...ids];
    const worker = async () => {
      for (let id = work.pop(); id !== undefined; id = work.pop()) {
        try {
          await this.api.remove(id);
          this.selected.delete(id);
        } catch (e) {
          // A child deleted with its parent is already gone: not a failure.
          if (!(e instanceof ApiError && e.status === 404)) failed.push(id);
        }
        done++;
        status(`deleting: ${done}/${ids.length}`);
      }
    };
    await Promise.all(Array.from({ length: DELETE_PARALLEL }, worker));
    status(failed.length ? `could not delete ${failed.join(", ")}` : `deleted ${ids.length}`, failed.length > 0);
    this.draw();
    await guarded("refresh", () => this.refresh());
  }
}
