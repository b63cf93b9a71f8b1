// A diff between two sandboxes' files (`GET /v1/sandboxes/{id}/diff?against=OTHER
// &path=/root&content=true`), opened from the tree: what was added, removed and modified
// from OTHER to the sandbox, with the daemon's unified text diffs, and on demand the
// content of an added file. Paths and contents come from guests: they are set as text
// only, and what is drawn is bounded (rows per list, characters of diff text).
import type { Api, SandboxDiff } from "./api";
import { bytes, guarded, h, status } from "./dom";

/** Rows drawn per list (added, removed, modified); the rest are counted. */
const MAX_ROWS = 2000;
/** Characters of unified diff drawn in all; the rest are named, not drawn. */
const MAX_DIFF_CHARS = 4 * 1024 * 1024;
/** An added file's content is shown on demand up to this size. */
const MAX_SHOWN_FILE = 256 * 1024;

function mode(m: number): string {
  return (m & 0o7777).toString(8).padStart(4, "0");
}

/** A unified diff as lines classed by their first character (text nodes only). */
function unifiedView(text: string): HTMLElement {
  const pre = h("pre", { class: "diff" });
  for (const line of text.split("\n")) {
    const cls = line.startsWith("@@")
      ? "hunk"
      : line.startsWith("+++") || line.startsWith("---")
        ? "meta"
        : line.startsWith("+")
          ? "add"
          : line.startsWith("-")
            ? "del"
            : "ctx";
    pre.append(h("span", { class: cls }, `${line}\n`));
  }
  return pre;
}

function more(n: number, what: string): HTMLElement | null {
  return n > 0 ? h("p", { class: "muted" }, `… and ${n} more ${what} not drawn`) : null;
}

export class DiffView {
  readonly root = h("section", { class: "diff-view", "data-testid": "diff" });
  /** The comparison shown, so a newer one replaces it and an older answer is dropped. */
  private seq = 0;

  constructor(private readonly api: Api) {}

  /** Shows how `id`'s files under `path` differ from `against`'s. */
  async show(id: string, against: string, path = "/root"): Promise<void> {
    const seq = ++this.seq;
    this.root.replaceChildren(h("h3", {}, `comparing ${id} with ${against} under ${path}…`));
    status(`comparing ${id} with ${against}…`);
    let d: SandboxDiff;
    try {
      d = await this.api.diff(id, against, path);
    } catch (e) {
      if (seq === this.seq) this.root.replaceChildren(h("p", { class: "error" }, `diff: ${e instanceof Error ? e.message : String(e)}`));
      throw e;
    }
    if (seq !== this.seq) return;
    status(`compared ${id} with ${against}`);
    this.draw(d);
  }

  close(): void {
    this.seq++;
    this.root.replaceChildren();
  }

  private draw(d: SandboxDiff): void {
    const close = h("button", { type: "button", onclick: () => this.close() }, "close");
    const summary = `${d.added.length} added · ${d.removed.length} removed · ${d.modified.length} modified`;
    const parts: (HTMLElement | null)[] = [
      h("div", { class: "toolbar" }, h("h3", {}, `${d.sandbox} against ${d.against}, under ${d.path}`), h("span", { class: "grow" }), close),
      h("p", { "data-testid": "diff-summary" }, summary, h("span", { class: "muted" }, ` (from ${d.against} to ${d.sandbox})`)),
    ];
    if (d.added.length + d.removed.length + d.modified.length === 0) {
      parts.push(h("p", { class: "muted" }, "No difference: the files under this directory are the same."));
    }
    if (d.added.length) {
      const rows = d.added.slice(0, MAX_ROWS).map((e) => {
        const content = h("td", {});
        const show =
          e.kind === "file" && e.size <= MAX_SHOWN_FILE
            ? h("button", { type: "button", onclick: () => void guarded("show", () => this.showFile(d, e.path, content)) }, "show")
            : null;
        return h(
          "tr",
          { class: "added", "data-path": e.path },
          h("td", {}, `+ ${e.path}`),
          h("td", {}, e.kind),
          h("td", {}, bytes(e.size)),
          h("td", {}, show),
          content,
        );
      });
      parts.push(h("h4", {}, `added in ${d.sandbox}`), h("table", { class: "diff-list" }, h("tbody", {}, ...rows)), more(d.added.length - MAX_ROWS, "added"));
    }
    if (d.removed.length) {
      const rows = d.removed
        .slice(0, MAX_ROWS)
        .map((e) => h("tr", { class: "removed", "data-path": e.path }, h("td", {}, `- ${e.path}`), h("td", {}, e.kind), h("td", {}, bytes(e.size))));
      parts.push(h("h4", {}, `only in ${d.against}`), h("table", { class: "diff-list" }, h("tbody", {}, ...rows)), more(d.removed.length - MAX_ROWS, "removed"));
    }
    if (d.modified.length) {
      parts.push(h("h4", {}, "modified"));
      let budget = MAX_DIFF_CHARS;
      for (const m of d.modified.slice(0, MAX_ROWS)) {
        const changes = [
          m.kind !== m.kindBefore ? `${m.kindBefore} → ${m.kind}` : m.kind,
          m.size !== m.sizeBefore ? `${bytes(m.sizeBefore)} → ${bytes(m.size)}` : bytes(m.size),
          m.mode !== m.modeBefore ? `mode ${mode(m.modeBefore)} → ${mode(m.mode)}` : "",
        ].filter(Boolean);
        let body: HTMLElement;
        if (m.unified === null) {
          body = h("p", { class: "muted" }, "no text diff (binary, larger than 256 KiB, or not a file on both sides)");
        } else if (m.unified.length > budget) {
          body = h("p", { class: "muted" }, `text diff of ${bytes(m.unified.length)} not drawn (the page draws ${bytes(MAX_DIFF_CHARS)} in all)`);
        } else {
          budget -= m.unified.length;
          body = unifiedView(m.unified);
        }
        parts.push(h("details", { open: true, class: "modified", "data-path": m.path }, h("summary", {}, `~ ${m.path} `, h("span", { class: "muted" }, changes.join(" · "))), body));
      }
      parts.push(more(d.modified.length - MAX_ROWS, "modified"));
    }
    this.root.replaceChildren(...parts.filter((p): p is HTMLElement => p !== null));
  }

  /** The content of a file added in `d.sandbox`, as text in the row. */
  private async showFile(d: SandboxDiff, rel: string, cell: HTMLElement): Promise<void> {
    const full = `${d.path.replace(/\/$/, "")}/${rel}`;
    const blob = await this.api.download(d.sandbox, full);
    const data = new Uint8Array(await blob.slice(0, MAX_SHOWN_FILE).arrayBuffer());
    const text = new TextDecoder("utf-8", { fatal: false }).decode(data);
    cell.replaceChildren(h("pre", { class: "file-content" }, text));
  }
}
