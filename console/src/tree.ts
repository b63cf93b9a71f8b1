// The branch tree view: every sandbox of a lineage as a node of an SVG graph (its own
// memory and disk, how many snapshots and branch points were taken of it), laid out by
// ./layout. Clicking a node selects it; the panel opens it, keeps it (deleting its
// siblings), promotes it (also replacing its parent), branches or deletes it, or diffs
// its files against its parent or any other node (./diff, drawn below the graph).
// The router refreshes it when an event concerns one of its sandboxes (or a new one).
import type { Api, SandboxTree, TreeNode } from "./api";
import { DiffView } from "./diff";
import { bytes, clear, guarded, h, status, svg } from "./dom";
import type { LiveEvent } from "./events";
import { layoutTree, NODE_H, NODE_W } from "./layout";

const PAD = 16;

export class TreeView {
  private tree: SandboxTree | null = null;
  private selected: string;
  private readonly graph = h("div", { class: "graph", "data-testid": "tree" });
  private readonly panel = h("aside", { class: "panel" });
  private readonly title = h("h2", {});
  private readonly diff: DiffView;
  /** The other side picked for a diff, per node, kept across redraws. */
  private readonly diffOther = new Map<string, string>();

  constructor(
    private readonly api: Api,
    root: HTMLElement,
    private readonly id: string,
  ) {
    this.selected = id;
    this.diff = new DiffView(api);
    clear(root);
    root.append(this.title, h("div", { class: "split" }, this.graph, this.panel), this.diff.root);
  }

  async refresh(): Promise<void> {
    this.tree = await this.api.tree(this.id);
    this.draw();
  }

  /**
   * Whether `e` may change the graph: an event of one of its sandboxes, or of one it
   * does not know yet that is not going away (a new child of a branch, perhaps).
   */
  concerns(e: LiveEvent): boolean {
    if (this.node(e.sandbox)) return true;
    return e.message !== "sandbox deleted" && !e.message.startsWith("command ");
  }

  private node(id: string): TreeNode | undefined {
    return this.tree?.sandboxes.find((n) => n.id === id);
  }

  private draw(): void {
    const tree = this.tree;
    if (!tree) return;
    this.title.textContent = `branch tree of ${tree.root} · ${tree.sandboxes.length} sandboxes`;
    const layout = layoutTree(tree.sandboxes);
    const snapshots = new Map<string, number>();
    for (const s of tree.snapshots) snapshots.set(s.sourceSandbox, (snapshots.get(s.sourceSandbox) ?? 0) + 1);
    const pos = new Map(layout.nodes.map((p) => [p.id, p]));
    const edges = layout.edges.map(([from, to]) => {
      const a = pos.get(from)!;
      const b = pos.get(to)!;
      const x1 = a.x + NODE_W + PAD;
      const y1 = a.y + NODE_H / 2 + PAD;
      const x2 = b.x + PAD;
      const y2 = b.y + NODE_H / 2 + PAD;
      const mid = (x1 + x2) / 2;
      return svg("path", { class: "edge", d: `M${x1},${y1} C${mid},${y1} ${mid},${y2} ${x2},${y2}` });
    });
    const nodes = tree.sandboxes.map((n) => {
      const p = pos.get(n.id)!;
      const points = snapshots.get(n.id) ?? 0;
      const g = svg(
        "g",
        {
          class: `node ${n.state}${n.id === this.selected ? " selected" : ""}${n.id === this.id ? " current" : ""}`,
          transform: `translate(${p.x + PAD},${p.y + PAD})`,
          "data-node": n.id,
          tabindex: 0,
          role: "button",
        },
        svg("rect", { width: NODE_W, height: NODE_H, rx: 6 }),
        svg("text", { x: 8, y: 17, class: "name" }, clip(n.name ? `${n.name} ${n.id}` : n.id, 24)),
        svg(
          "text",
          { x: 8, y: 34, class: "sub" },
          `${n.state} · ${bytes(n.uniqueMemoryBytes)} · ${bytes(n.diskBytes)}${points ? ` · ${points} snap` : ""}`,
        ),
        svg("title", {}, `${n.id}: own memory ${bytes(n.uniqueMemoryBytes)}, own disk ${bytes(n.diskBytes)}`),
      );
      g.addEventListener("click", () => this.select(n.id));
      g.addEventListener("dblclick", () => (location.hash = `#/sandbox/${n.id}`));
      g.addEventListener("keydown", (e) => {
        if ((e as KeyboardEvent).key === "Enter") this.select(n.id);
      });
      return g;
    });
    const graph = svg(
      "svg",
      { width: layout.width + 2 * PAD, height: layout.height + 2 * PAD, class: "tree" },
      ...edges,
      ...nodes,
    );
    this.graph.replaceChildren(graph);
    this.drawPanel();
  }

  private select(id: string): void {
    this.selected = id;
    this.draw();
  }

  private drawPanel(): void {
    const n = this.node(this.selected) ?? this.node(this.id);
    if (!n) {
      this.panel.replaceChildren(h("p", { class: "muted" }, "select a node"));
      return;
    }
    const act = (label: string, what: () => Promise<void>, cls = "") =>
      h("button", { type: "button", class: cls, onclick: () => void guarded(label, what) }, label);
    const count = h("input", { type: "number", min: 1, max: 256, value: 3, "aria-label": "children", name: "count" });
    const others = (this.tree?.sandboxes ?? []).filter((o) => o.id !== n.id);
    const other = h(
      "select",
      { name: "against", "aria-label": "diff against" },
      ...others.map((o) => h("option", { value: o.id }, o.id === n.parent ? `${o.id} (parent)` : o.name ? `${o.name} ${o.id}` : o.id)),
    );
    other.value = this.diffOther.get(n.id) ?? n.parent ?? others[0]?.id ?? "";
    other.addEventListener("change", () => this.diffOther.set(n.id, other.value));
    this.panel.replaceChildren(
      h("h3", {}, n.name ?? n.id),
      h(
        "dl",
        {},
        h("dt", {}, "id"),
        h("dd", {}, n.id),
        h("dt", {}, "state"),
        h("dd", {}, n.state),
        h("dt", {}, "parent"),
        h("dd", {}, n.parent ?? "–"),
        h("dt", {}, "own memory"),
        h("dd", {}, bytes(n.uniqueMemoryBytes)),
        h("dt", {}, "own disk"),
        h("dd", {}, bytes(n.diskBytes)),
        h("dt", {}, "children"),
        h("dd", {}, String(n.children.length)),
      ),
      h("p", {}, h("a", { href: `#/sandbox/${n.id}`, class: "button" }, "open")),
      h(
        "p",
        {},
        count,
        act("branch", async () => {
          status(`branching ${n.id}…`);
          const r = await this.api.branch(n.id, Number(count.value));
          status(`branched ${n.id}: ${r.children.length} children`);
          await this.refresh();
        }),
      ),
      n.parent ? h("p", {}, act("diff against parent", () => this.diff.show(n.id, n.parent!))) : "",
      others.length
        ? h(
            "p",
            { class: "diff-pick" },
            other,
            act("diff", () => this.diff.show(n.id, other.value)),
          )
        : "",
      n.parent
        ? h(
            "p",
            {},
            act("keep", () => this.keep(n, false)),
            act("keep + promote", () => this.keep(n, true)),
          )
        : "",
      h(
        "p",
        {},
        act(
          "delete",
          async () => {
            if (!confirm(`Delete ${n.id}?`)) return;
            await this.api.remove(n.id);
            status(`deleted ${n.id}`);
            if (n.id === this.id) location.hash = n.parent ? `#/tree/${n.parent}` : "#/";
            else await this.refresh();
          },
          "danger",
        ),
      ),
    );
  }

  private async keep(n: TreeNode, promote: boolean): Promise<void> {
    const what = promote ? "keep it, delete its siblings and replace its parent" : "keep it and delete its siblings";
    if (!confirm(`${n.id}: ${what}?`)) return;
    const r = await this.api.keep(n.id, promote);
    status(`kept ${r.kept}; deleted ${r.deleted.length}`);
    // The tree being shown may be one of those deleted: follow the kept node.
    location.hash = `#/tree/${r.kept}`;
  }
}

function clip(s: string, n: number): string {
  return s.length > n ? `${s.slice(0, n - 1)}…` : s;
}
