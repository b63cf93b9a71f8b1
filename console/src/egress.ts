// The egress tab: the sandbox's egress record (`GET /v1/sandboxes/{id}/egress`), the
// connections its guest made through the daemon's egress proxy, as a table, newest first.
// Host names and paths come from the guest: text only.
import type { EgressEntry } from "./api";
import { bytes, h } from "./dom";

function when(ms: number): string {
  return new Date(ms).toISOString().replace("T", " ").slice(0, 19);
}

function lasted(e: EgressEntry): string {
  if (e.endedMs === null) return e.event === "open" ? "open" : "";
  const s = (e.endedMs - e.startedMs) / 1000;
  return s < 10 ? `${s.toFixed(1)} s` : `${Math.round(s)} s`;
}

export function egressTable(entries: EgressEntry[]): HTMLElement {
  if (entries.length === 0) {
    return h(
      "p",
      { class: "muted", "data-testid": "egress-empty" },
      "No egress record: this sandbox's guest made no connection through the daemon's egress proxy " +
        "(only TCP to the ports its network rules by name cover goes through it).",
    );
  }
  const rows = [...entries].reverse().map((e) =>
    h(
      "tr",
      { class: `egress-${e.event}` },
      h("td", {}, when(e.startedMs)),
      h("td", {}, e.event),
      h("td", {}, e.host ?? ""),
      h("td", {}, `${e.address}:${e.port}`),
      h("td", {}, e.protocol),
      h("td", { class: "fields" }, e.method ? `${e.method} ${e.path ?? ""}` : ""),
      h("td", {}, e.reason),
      h("td", {}, `${bytes(e.bytesOut)} / ${bytes(e.bytesIn)}`),
      h("td", {}, lasted(e)),
      h("td", {}, e.secrets.join(", ")),
    ),
  );
  const head = ["started", "event", "host", "address", "protocol", "request", "reason", "out / in", "lasted", "secrets"];
  return h(
    "div",
    {},
    h("p", { class: "muted" }, `${entries.length} connection${entries.length === 1 ? "" : "s"}, newest first`),
    h(
      "table",
      { "data-testid": "egress" },
      h("thead", {}, h("tr", {}, ...head.map((t) => h("th", {}, t)))),
      h("tbody", {}, ...rows),
    ),
  );
}
