// Browser checks of the live updates (the daemon-wide event stream, GET /v1/events):
// changes made through the REST API, not through the page, show in the open view within
// 2 s although the page's own poll is 10 s; the stream's request carries the token in
// its Authorization header, never in a URL; the list's disk column. Called from
// test/browser.ts; each check skips, saying why, when the daemon has no event stream.
import type { Page, Request } from "playwright-core";
import { api, BASE, check, shot, skip, SLOW, step, TOKEN, until } from "./harness";

/** A change must show within this long of the API's answer. */
const LIVE_MS = 2000;

/** Every request the page makes, with all its headers (recorded from the start). */
export function recordRequests(page: Page): { url: string; headers: Promise<Record<string, string>> }[] {
  const seen: { url: string; headers: Promise<Record<string, string>> }[] = [];
  page.on("request", (r: Request) => seen.push({ url: r.url(), headers: r.allHeaders() }));
  return seen;
}

/** Whether the daemon serves the stream (it answers a plain request with its first message). */
export async function daemonHasEvents(): Promise<boolean> {
  const abort = new AbortController();
  try {
    const resp = await fetch(`${BASE}/v1/events`, { headers: { Authorization: `Bearer ${TOKEN}` }, signal: abort.signal });
    return resp.ok && (resp.headers.get("content-type") ?? "").startsWith("text/event-stream");
  } catch {
    return false;
  } finally {
    abort.abort();
  }
}

async function waitLive(page: Page): Promise<void> {
  await page.locator('[data-testid=live][data-state="live"]').waitFor({ timeout: 30_000 });
}

/** The stream's requests: the token in the Authorization header only, in no URL at all. */
export async function streamCarriesTokenInHeader(requests: ReturnType<typeof recordRequests>): Promise<void> {
  step("the event stream's request: the token in its Authorization header, never in a URL");
  const streams = requests.filter((r) => new URL(r.url).pathname === "/v1/events");
  check(streams.length > 0, "the page opened the event stream");
  for (const r of streams) {
    const headers = await r.headers;
    check(headers.authorization === `Bearer ${TOKEN}`, `the stream's request carries the token (${JSON.stringify(Object.keys(headers))})`);
  }
  const leaked = requests.filter((r) => r.url.includes(TOKEN) || decodeURIComponent(r.url).includes(TOKEN));
  check(leaked.length === 0, `no request URL holds the token (${leaked.length} did)`);
  step(`   ${streams.length} stream request(s) of ${requests.length} checked`);
}

/** Sandboxes created and deleted through the API appear in and leave the open list. */
export async function liveList(page: Page): Promise<void> {
  step("live: a sandbox created and deleted through the API shows in the open list within 2 s");
  if (!(await daemonHasEvents())) return skip("the live list", "the daemon has no GET /v1/events");
  await page.goto(`${BASE}/ui/#/`);
  await page.getByTestId("list").waitFor();
  await waitLive(page);
  const created = (await api("POST", "/v1/sandboxes", { image: "minimal", metadata: { made: "by-the-api" } })) as {
    sandboxes: { id: string }[];
  };
  const id = created.sandboxes[0].id;
  let t = Date.now();
  const running = page.locator(`.row[data-id="${id}"] .state.running`);
  const shown = await until(async () => (await running.count()) === 1, LIVE_MS);
  check(shown, `${id} shows as running within ${LIVE_MS} ms of the API's answer`);
  step(`   created ${id}: shown running after ${Date.now() - t} ms`);
  await shot(page, "list-live");

  await api("DELETE", `/v1/sandboxes/${id}`);
  t = Date.now();
  const gone = await until(async () => (await page.locator(`.row[data-id="${id}"]`).count()) === 0, LIVE_MS);
  check(gone, `${id} leaves the list within ${LIVE_MS} ms of the API's answer`);
  step(`   deleted ${id}: gone after ${Date.now() - t} ms`);
}

/** A branch done through the API adds its children to the open tree. */
export async function liveTree(page: Page, id: string): Promise<void> {
  step(`live: a branch of ${id} done through the API shows in the open tree within 2 s`);
  if (!(await daemonHasEvents())) return skip("the live tree", "the daemon has no GET /v1/events");
  await page.goto(`${BASE}/ui/#/tree/${id}`);
  await page.locator(`[data-node="${id}"]`).waitFor({ timeout: 30_000 });
  await waitLive(page);
  const before = await page.locator("[data-node]").count();
  const r = (await api("POST", `/v1/sandboxes/${id}/branch`, { count: 2 })) as { children: string[] };
  const t = Date.now();
  try {
    const shown = await until(async () => {
      for (const c of r.children) if ((await page.locator(`[data-node="${c}"]`).count()) === 0) return false;
      return true;
    }, LIVE_MS);
    check(shown, `the new children ${r.children.join(", ")} show within ${LIVE_MS} ms (${before} nodes before)`);
    step(`   ${r.children.length} new nodes after ${Date.now() - t} ms`);
    await shot(page, "tree-live");
  } finally {
    for (const c of r.children) await api("DELETE", `/v1/sandboxes/${c}`);
  }
}

/** The events tab puts an event on top as it happens. */
export async function liveEvents(page: Page, id: string): Promise<void> {
  step("live: the events tab shows a new event within 2 s");
  if (!(await daemonHasEvents())) return skip("the live event log", "the daemon has no GET /v1/events");
  await page.goto(`${BASE}/ui/#/sandbox/${id}/events`);
  await page.getByTestId("events").waitFor({ timeout: 30_000 });
  await waitLive(page);
  const marker = `live-event-${Date.now()}`;
  await api("POST", `/v1/sandboxes/${id}/exec`, { argv: ["sh", "-c", `echo ${marker}`] });
  const t = Date.now();
  const shown = await until(async () => (await page.getByTestId("events").getByText(marker).count()) > 0, LIVE_MS);
  check(shown, `an event naming ${marker} shows within ${LIVE_MS} ms`);
  step(`   shown after ${Date.now() - t} ms`);
  await shot(page, "events-live");
}

/** The list's disk column for a running sandbox, once the daemon gives `disk_bytes`. */
export async function diskColumn(page: Page): Promise<void> {
  step("list: the disk column of a running sandbox");
  const list = (await api("GET", "/v1/sandboxes")) as { sandboxes: { id: string; state: string; disk_bytes?: number | null }[] };
  const running = list.sandboxes.find((s) => s.state === "running");
  if (!running) return skip("the disk column", "no running sandbox");
  if (!("disk_bytes" in running)) return skip("the disk column", "the daemon's sandboxes have no disk_bytes field yet");
  await page.goto(`${BASE}/ui/#/`);
  const cell = page.locator(`.row[data-id="${running.id}"] .disk`);
  await cell.waitFor({ timeout: SLOW });
  const ok = await until(async () => /\d/.test(await cell.innerText()), 15_000, 200);
  check(ok, `the disk column of ${running.id} shows a size (${await cell.innerText()}; the API says ${running.disk_bytes})`);
  const memory = await page.locator(`.row[data-id="${running.id}"] .memory`).innerText();
  step(`   ${running.id}: disk ${await cell.innerText()}, memory ${memory}`);
  await shot(page, "list-disk");
}
