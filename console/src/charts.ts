// Line charts of a sandbox's metric samples (CPU, memory, disk over time) as SVG.
import type { MetricSample } from "./api";
import { bytes, h, svg } from "./dom";

const W = 420;
const H = 120;

function chart(title: string, samples: MetricSample[], value: (s: MetricSample) => number, max: number, label: (v: number) => string): HTMLElement {
  const t0 = samples[0]?.timestampUnix ?? 0;
  const t1 = samples[samples.length - 1]?.timestampUnix ?? 1;
  const span = Math.max(1, t1 - t0);
  const top = Math.max(max, 1e-9);
  const points = samples
    .map((s) => `${(((s.timestampUnix - t0) / span) * W).toFixed(1)},${(H - (value(s) / top) * H).toFixed(1)}`)
    .join(" ");
  const last = samples.length ? label(value(samples[samples.length - 1])) : "–";
  return h(
    "figure",
    { class: "chart" },
    h("figcaption", {}, `${title}: ${last} (of ${label(max)})`),
    svg(
      "svg",
      { viewBox: `0 0 ${W} ${H}`, width: W, height: H, preserveAspectRatio: "none" },
      svg("rect", { width: W, height: H, class: "frame" }),
      // One sample is a point, not yet a line.
      samples.length > 1
        ? svg("polyline", { points, class: "line" })
        : svg("circle", { cx: W / 2, cy: H - (value(samples[0]) / top) * H, r: 3, class: "dot" }),
    ),
  );
}

export function metricCharts(samples: MetricSample[]): HTMLElement {
  if (samples.length === 0) {
    return h("p", { class: "muted" }, "no samples yet (the daemon takes one every 5 s while the sandbox runs)");
  }
  const last = samples[samples.length - 1];
  return h(
    "div",
    { class: "charts", "data-testid": "metrics" },
    chart("CPU", samples, (s) => s.cpuUsedPct, 100, (v) => `${v.toFixed(1)}%`),
    chart("memory used", samples, (s) => s.memUsed, last.memTotal, bytes),
    chart("disk used", samples, (s) => s.diskUsed, last.diskTotal, bytes),
    h("p", { class: "muted" }, `${samples.length} samples`),
  );
}
