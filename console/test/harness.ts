// What the browser suites share: the daemon's address and token, steps and checks, pages
// that record what goes wrong, screenshots, the REST API called directly (not through
// the page).
//
// CONSOLE_DIST=DIR (development only): the page's assets are served from DIR instead of
// the daemon's embedded copy (the daemon's answer, headers and CSP included, with the
// body replaced), so a console change can be tried without rebuilding zygoted.
import { readFileSync } from "node:fs";
import type { Browser, BrowserContext, Page } from "playwright-core";

export const env = (k: string): string => {
  const v = process.env[k];
  if (!v) throw new Error(`${k} is not set`);
  return v;
};
export const BASE = env("ZYGOTE_URL").replace(/\/$/, "");
export const TOKEN = env("ZYGOTE_TOKEN");
export const ARTIFACTS = env("ARTIFACTS");
/** Generous: under QEMU TCG a boot or a branch takes tens of seconds. */
export const SLOW = 240_000;

const t0 = Date.now();
export function step(what: string): void {
  console.log(`== [${Math.round((Date.now() - t0) / 1000)}s] ${what}`);
}

export function check(ok: boolean, what: string): void {
  if (!ok) throw new Error(`check failed: ${what}`);
}

/** A check that cannot run here: says why, and the suite goes on. */
export function skip(what: string, why: string): void {
  console.log(`   SKIPPED ${what}: ${why}`);
}

/**
 * Chromium's flags. With CONSOLE_DIST, a page chromium got from an intercepted answer
 * counts as from no known address, and its local network access checks would then block
 * its WebSocket to the loopback daemon: they are off for that development mode only.
 */
export function browserArgs(): string[] {
  const args = ["--no-sandbox"];
  if (process.env.CONSOLE_DIST) args.push("--disable-features=LocalNetworkAccessChecks");
  return args;
}

/** Everything the page reports as wrong: script errors, CSP refusals, failed loads. */
export const problems: string[] = [];

export async function newPage(browser: Browser): Promise<{ context: BrowserContext; page: Page }> {
  const context = await browser.newContext({ viewport: { width: 1400, height: 900 }, acceptDownloads: true });
  const dist = process.env.CONSOLE_DIST;
  if (dist) {
    await context.route(/\/ui\/(index\.html|app\.js|app\.css)?$/, async (route) => {
      const name = new URL(route.request().url()).pathname.replace(/^\/ui\/?/, "") || "index.html";
      const resp = await route.fetch();
      await route.fulfill({ response: resp, body: readFileSync(`${dist}/${name}`) });
    });
  }
  const page = await context.newPage();
  page.on("pageerror", (e) => problems.push(`page error: ${e.message}`));
  page.on("console", (m) => {
    // The browser logs every 4xx answer as an error (401s in the wrong-token steps, a 404
    // when a view polls a sandbox just deleted); the page handles those itself. What is
    // left is the page's own: script errors, CSP refusals.
    if (m.type() === "error" && !m.text().startsWith("Failed to load resource")) problems.push(`console: ${m.text()}`);
  });
  page.on("dialog", (d) => void d.accept());
  return { context, page };
}

export async function shot(page: Page, name: string): Promise<void> {
  await page.screenshot({ path: `${ARTIFACTS}/${name}.png` });
}

export async function api(method: string, path: string, body?: unknown): Promise<unknown> {
  const resp = await fetch(BASE + path, {
    method,
    headers: { Authorization: `Bearer ${TOKEN}`, "Content-Type": "application/json" },
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  if (!resp.ok) throw new Error(`${method} ${path}: ${resp.status} ${await resp.text()}`);
  const text = await resp.text();
  return text ? JSON.parse(text) : null;
}

/** A command run to its end in the sandbox's guest; its stdout. */
export async function run(id: string, script: string): Promise<string> {
  const r = (await api("POST", `/v1/sandboxes/${id}/exec`, { argv: ["sh", "-c", script] })) as { stdout?: string; exit_code?: number };
  check(r.exit_code === 0, `\`${script}\` exited 0 (${JSON.stringify(r)})`);
  return r.stdout ?? "";
}

export async function sandboxIds(): Promise<string[]> {
  return ((await api("GET", "/v1/sandboxes")) as { sandboxes: { id: string }[] }).sandboxes.map((s) => s.id);
}

/** Waits until `f` is true, polling; false after `ms`. */
export async function until(f: () => Promise<boolean>, ms: number, everyMs = 50): Promise<boolean> {
  const end = Date.now() + ms;
  for (;;) {
    if (await f()) return true;
    if (Date.now() > end) return false;
    await new Promise((r) => setTimeout(r, everyMs));
  }
}
