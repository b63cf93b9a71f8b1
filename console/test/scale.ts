// The console at scale, from fixture data (the API answers are intercepted in the
// browser; the assets and the token check are the live daemon's): a list of 1000
// sandboxes (virtualized rows, a label filter, a bulk delete of 100) and a tree of a
// root with 256 children.
import type { Page, Route } from "playwright-core";

const N = 1000;
const CHILDREN = 256;

function sandbox(i: number): Record<string, unknown> {
  const now = Math.floor(Date.now() / 1000);
  return {
    id: `fx-${i}`,
    name: null,
    state: i % 7 === 0 ? "paused" : "running",
    runtime: "qemu",
    origin: { image: { name: "minimal", sha256: "0" } },
    metadata: { team: `t${i % 10}` },
    mem_mib: 256,
    vcpus: 1,
    created_at: now - i * 60,
    ttl_secs: i % 3 === 0 ? 3600 : null,
    expires_at: i % 3 === 0 ? now + 3600 : null,
    disk_bytes: i % 5 === 0 ? null : (i + 1) * 4096,
    metrics:
      i % 5 === 0
        ? null
        : { timestamp: new Date().toISOString(), timestamp_unix: now, cpu_count: 1, cpu_used_pct: i % 100, mem_total: 256 << 20, mem_used: (20 + (i % 200)) << 20, mem_cache: 4 << 20, disk_total: 1 << 30, disk_used: 100 << 20 },
  };
}

function tree(): Record<string, unknown> {
  const node = (id: string, parent: string | null, children: string[]) => ({
    id,
    name: null,
    state: "running",
    parent,
    started_from: parent ? "bp-1" : null,
    children,
    unique_memory_bytes: 50 << 20,
    disk_bytes: 1 << 20,
  });
  const kids = Array.from({ length: CHILDREN }, (_, i) => `fx-child-${i}`);
  return {
    root: "fx-root",
    sandboxes: [node("fx-root", null, kids), ...kids.map((k) => node(k, "fx-root", []))],
    snapshots: [{ id: "bp-1", kind: "branch", source_sandbox: "fx-root", size_bytes: 1 << 20 }],
  };
}

const json = (route: Route, body: unknown) =>
  route.fulfill({ status: 200, contentType: "application/json", body: JSON.stringify(body) });

export async function scaleChecks(
  page: Page,
  base: string,
  token: string,
  artifacts: string,
  step: (what: string) => void,
  check: (ok: boolean, what: string) => void,
): Promise<void> {
  const list = { sandboxes: Array.from({ length: N }, (_, i) => sandbox(i)) };
  const deleted = new Set<string>();
  await page.route(`${base}/v1/sandboxes`, (route) => json(route, list));
  await page.route(`${base}/v1/sandboxes/fx-root/tree`, (route) => json(route, tree()));
  await page.route(/\/v1\/sandboxes\/fx-\d+$/, (route) => {
    if (route.request().method() !== "DELETE") return route.fallback();
    deleted.add(route.request().url().split("/").pop()!);
    return route.fulfill({ status: 204 });
  });
  // Logged in as a tab that already has the token (the login steps are tested live).
  await page.addInitScript((t) => sessionStorage.setItem("zygote.token", t), token);

  let t = Date.now();
  await page.goto(`${base}/ui/#/`);
  await page.getByText(`${N} of ${N}`).waitFor({ timeout: 10_000 });
  const listMs = Date.now() - t;
  const rows = await page.locator(".rows > .row").count();
  check(rows > 0 && rows < 100, `only the rows in view are in the DOM (${rows} of ${N})`);
  await page.locator(".viewport").evaluate((v) => (v.scrollTop = v.scrollHeight));
  await page.locator('.row[data-id="fx-999"]').waitFor({ timeout: 5_000 });
  step(`list: ${N} sandboxes shown in ${listMs} ms, ${rows} rows in the DOM; the last one reached by scrolling`);
  await page.locator(".viewport").evaluate((v) => (v.scrollTop = 0));

  await page.fill("input[name=filter]", "team=t3");
  await page.getByText(`${N / 10} of ${N}`).waitFor();
  await page.click(".row.head input[type=checkbox]");
  await page.getByText(`delete selected (${N / 10})`).waitFor();
  await page.screenshot({ path: `${artifacts}/scale-list.png` });
  await page.click("text=delete selected");
  await page.getByText(`deleted ${N / 10}`).waitFor({ timeout: 30_000 });
  const expected = list.sandboxes.filter((s) => (s.metadata as { team: string }).team === "t3").map((s) => s.id as string);
  check(deleted.size === expected.length && expected.every((id) => deleted.has(id)), `the bulk delete asked for exactly the ${expected.length} filtered (${deleted.size})`);
  step(`list: the filter team=t3 shows ${N / 10}; their bulk delete sent ${deleted.size} DELETEs`);

  t = Date.now();
  await page.goto(`${base}/ui/#/tree/fx-root`);
  await page.waitForFunction((n) => document.querySelectorAll("[data-node]").length === n, CHILDREN + 1, { timeout: 10_000 });
  const treeMs = Date.now() - t;
  const last = page.locator(`[data-node="fx-child-${CHILDREN - 1}"]`);
  await last.scrollIntoViewIfNeeded();
  await last.click();
  await page.locator(".panel h3", { hasText: `fx-child-${CHILDREN - 1}` }).waitFor();
  await page.screenshot({ path: `${artifacts}/scale-tree.png` });
  step(`tree: ${CHILDREN + 1} nodes drawn in ${treeMs} ms; the last child selected after scrolling to it`);
  check(listMs < 5_000 && treeMs < 5_000, `the list (${listMs} ms) and the tree (${treeMs} ms) render within 5 s`);
}
