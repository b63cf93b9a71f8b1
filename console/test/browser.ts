// The console in a real browser (Debian's chromium, headless, driven by playwright-core)
// against a live zygoted (scripts/console-test.sh starts one on loopback with the qemu
// runtime). Steps: a wrong token and a wrong or reused login code see nothing; the
// one-time URL of `zygote ui` logs in; create a sandbox; `echo $((6*7))` in its terminal
// prints 42; branch it into 3 and see 4 nodes; delete a child and see 3; a diff from the
// tree (./views); live updates from the event stream and its token in a header only
// (./live); a process's output followed live, files (upload, download), metrics, the
// egress record and events; keep + promote a child; then 1000 sandboxes and a 256-child
// tree from fixture data (./scale). Screenshots of each view go to $ARTIFACTS.
//
//   ZYGOTE_URL, ZYGOTE_TOKEN  the daemon          ZYGOTE_BIN  the zygote CLI
//   CHROMIUM                  the browser         ARTIFACTS   where screenshots go
import { execFileSync } from "node:child_process";
import { mkdirSync, readFileSync } from "node:fs";
import { chromium, type Browser, type BrowserContext, type Page } from "playwright-core";
import { api, ARTIFACTS, BASE, browserArgs, check, env, newPage, problems, run, shot, SLOW, step, TOKEN } from "./harness";
import { diskColumn, liveEvents, liveList, liveTree, recordRequests, streamCarriesTokenInHeader } from "./live";
import { scaleChecks } from "./scale";
import { diffFromTree, egressTab, processLogs } from "./views";

async function wrongCredentialsSeeNothing(browser: Browser): Promise<void> {
  step("a wrong token sees nothing");
  const { context, page } = await newPage(browser);
  await page.goto(`${BASE}/ui/`);
  await page.getByTestId("login").waitFor();
  await page.fill("input[name=token]", "0".repeat(64));
  await page.click("button[type=submit]");
  await page.getByText("The daemon refused this token.").waitFor();
  check((await page.getByTestId("list").count()) === 0, "no list behind a wrong token");
  const status = await page.evaluate(async () => (await fetch("/v1/sandboxes", { headers: { Authorization: "Bearer nope" } })).status);
  check(status === 401, `the API answers a wrong token 401 (got ${status})`);
  await shot(page, "login-refused");

  step("a wrong login code sees nothing");
  await page.goto(`${BASE}/ui/#login=${"ab".repeat(32)}`);
  await page.getByText("used already or has expired").waitFor();
  check(!page.url().includes("login="), "the code is out of the address bar");
  check((await page.getByTestId("list").count()) === 0, "no list behind a wrong code");
  await context.close();
}

/** `zygote ui --no-open`: the one-time URL. */
function loginUrl(): string {
  const out = execFileSync(env("ZYGOTE_BIN"), ["ui", "--no-open", "--url", BASE], {
    env: { ...process.env, ZYGOTE_TOKEN: TOKEN },
    encoding: "utf8",
  });
  const url = out.trim().split("\n").pop() ?? "";
  check(url.startsWith(`${BASE}/ui/#login=`), `zygote ui printed a login URL (${out})`);
  return url;
}

async function loginOnce(browser: Browser): Promise<{ context: BrowserContext; page: Page; requests: ReturnType<typeof recordRequests> }> {
  step("log in through the one-time URL of `zygote ui`");
  const url = loginUrl();
  const { context, page } = await newPage(browser);
  const requests = recordRequests(page);
  await page.goto(url);
  await page.getByTestId("list").waitFor();
  check(!page.url().includes("login="), "the code is out of the address bar");

  step("the same URL does not work twice");
  const other = await newPage(browser);
  await other.page.goto(url);
  await other.page.getByText("used already or has expired").waitFor();
  check((await other.page.getByTestId("list").count()) === 0, "no list behind a used code");
  await other.context.close();
  return { context, page, requests };
}

async function createAndType(page: Page): Promise<string> {
  step("create a sandbox from the list");
  const before = new Set(((await api("GET", "/v1/sandboxes")) as { sandboxes: { id: string }[] }).sandboxes.map((s) => s.id));
  await page.click("text=new sandbox");
  const row = page.locator(".row[data-id]", { has: page.locator(".state.running") });
  await row.first().waitFor({ timeout: SLOW });
  const id = (await row.first().getAttribute("data-id"))!;
  check(!before.has(id), "the running sandbox is the new one");
  await page.getByText(`created ${id}`).waitFor({ timeout: SLOW });
  await shot(page, "list");

  step(`open ${id}: echo $((6*7)) in its terminal`);
  await page.click(`.row[data-id="${id}"] a[href="#/sandbox/${id}"]`);
  await page.getByText("connected: the guest's login shell").waitFor({ timeout: 60_000 });
  const rows = page.locator(".xterm-rows");
  // The prompt first, so the keys go to a shell that reads them.
  await page.waitForFunction(() => (document.querySelector(".xterm-rows")?.textContent ?? "").trim().length > 0, null, { timeout: 60_000 });
  await page.click(".terminal");
  await page.keyboard.type("echo $((6*7))");
  await page.keyboard.press("Enter");
  await page.waitForFunction(
    () => [...document.querySelectorAll(".xterm-rows > div")].some((r) => r.textContent?.trim() === "42"),
    null,
    { timeout: 60_000 },
  );
  check((await rows.innerText()).includes("echo $((6*7))"), "the command was echoed");
  await shot(page, "terminal");
  return id;
}

/** Branches `id` into 3 from its page, then deletes one child from the tree: the other two. */
async function branchAndDelete(page: Page, id: string): Promise<string[]> {
  // A file the children inherit, for the diff (./views).
  await run(id, "mkdir -p /root/difftest && echo base-line > /root/difftest/shared.txt && sync");
  step(`branch ${id} into 3 from its page`);
  await page.fill(".info input[name=count]", "3");
  await page.click(".info button:text('branch')");
  await page.waitForURL(`**/ui/#/tree/${id}`, { timeout: SLOW });
  const nodes = page.locator("[data-node]");
  await page.waitForFunction(() => document.querySelectorAll("[data-node]").length === 4, null, { timeout: SLOW });
  check((await nodes.count()) === 4, "4 nodes");
  await shot(page, "tree");
  // The README's picture: the graph and its panel only.
  await page.screenshot({ path: `${ARTIFACTS}/tree-readme.png`, clip: { x: 0, y: 40, width: 1400, height: 330 } });

  step("delete a child from the tree");
  const child = (await page.locator(`[data-node]:not([data-node="${id}"])`).first().getAttribute("data-node"))!;
  await page.click(`[data-node="${child}"]`);
  await page.click(".panel button:text('delete')");
  await page.waitForFunction(() => document.querySelectorAll("[data-node]").length === 3, null, { timeout: 60_000 });
  check((await page.locator(`[data-node="${child}"]`).count()) === 0, "the child is gone from the tree");
  await shot(page, "tree-after-delete");
  const tree = (await api("GET", `/v1/sandboxes/${id}/tree`)) as { sandboxes: { id: string }[] };
  return tree.sandboxes.map((s) => s.id).filter((c) => c !== id);
}

async function otherViews(page: Page, id: string): Promise<void> {
  step("processes: a running process's output so far");
  await api("POST", `/v1/sandboxes/${id}/exec`, { argv: ["sh", "-c", "echo console-bg-output; sleep 600"], background: true });
  await page.goto(`${BASE}/ui/#/sandbox/${id}/processes`);
  const bg = page.locator("tr[data-pid]", { hasText: "echo console-bg-output" });
  await bg.waitFor({ timeout: 30_000 });
  await bg.locator("button:text('follow')").click();
  await page.locator("pre.output", { hasText: "console-bg-output" }).waitFor();
  await processLogs(page, id);

  step("files: upload, list, download");
  await page.click("a[data-tab=files]");
  await page.getByTestId("dir").waitFor();
  const content = `uploaded by the console test ${Date.now()}\n`;
  await page.setInputFiles("input[name=upload]", { name: "console-upload.txt", mimeType: "text/plain", buffer: Buffer.from(content) });
  const row = page.locator('tr[data-file="console-upload.txt"]');
  await row.waitFor({ timeout: 30_000 });
  const [download] = await Promise.all([page.waitForEvent("download"), row.locator("button:text('download')").click()]);
  const got = readFileSync((await download.path())!, "utf8");
  check(got === content, `the download is what was uploaded (${JSON.stringify(got)})`);
  await shot(page, "files");

  step("metrics: charts once a sample is taken");
  await page.click("a[data-tab=metrics]");
  await page.getByTestId("metrics").waitFor({ timeout: 30_000 });
  await shot(page, "metrics");

  await egressTab(page, id);

  step("events: the log shows the branch");
  await page.click("a[data-tab=events]");
  await page.getByTestId("events").getByText("branch", { exact: false }).first().waitFor({ timeout: 30_000 });
  await shot(page, "events");
}

async function keepAndPromote(page: Page, id: string): Promise<void> {
  step("keep + promote a child from the tree: it replaces the parent, its sibling goes");
  await page.goto(`${BASE}/ui/#/tree/${id}`);
  await page.waitForFunction(() => document.querySelectorAll("[data-node]").length === 3, null, { timeout: 30_000 });
  const child = (await page.locator(`[data-node]:not([data-node="${id}"])`).first().getAttribute("data-node"))!;
  await page.click(`[data-node="${child}"]`);
  await page.click(".panel button:text('keep + promote')");
  await page.waitForURL(`**/ui/#/tree/${child}`, { timeout: 60_000 });
  await page.waitForFunction(() => document.querySelectorAll("[data-node]").length === 1, null, { timeout: 60_000 });
  check((await page.locator(`[data-node="${child}"]`).count()) === 1, "the kept child is the whole tree");
  const list = (await api("GET", "/v1/sandboxes")) as { sandboxes: { id: string }[] };
  check(!list.sandboxes.some((s) => s.id === id), "the parent is gone");
  await shot(page, "tree-after-promote");
}

/** Deletes every sandbox of the (private) daemon: the suite leaves no VM behind. */
async function removeAll(): Promise<void> {
  const list = (await api("GET", "/v1/sandboxes")) as { sandboxes: { id: string }[] };
  for (const s of list.sandboxes) {
    // A child may go with its parent: 404s are fine.
    await fetch(`${BASE}/v1/sandboxes/${s.id}`, { method: "DELETE", headers: { Authorization: `Bearer ${TOKEN}` } });
  }
}

let failurePage: Page | null = null;

async function main(): Promise<void> {
  mkdirSync(ARTIFACTS, { recursive: true });
  const browser = await chromium.launch({ executablePath: env("CHROMIUM"), args: browserArgs() });
  try {
    await wrongCredentialsSeeNothing(browser);
    const { context, page, requests } = await loginOnce(browser);
    // A failure's picture: the page as it was.
    failurePage = page;
    const id = await createAndType(page);
    const children = await branchAndDelete(page, id);
    await diffFromTree(page, id, children);
    await liveTree(page, id);
    await otherViews(page, id);
    await liveEvents(page, id);
    await keepAndPromote(page, id);
    await diskColumn(page);
    await liveList(page);
    await streamCarriesTokenInHeader(requests);
    await context.close();
    step("1000 sandboxes and a 256-child tree (fixture data)");
    const fixture = await newPage(browser);
    await scaleChecks(fixture.page, BASE, TOKEN, ARTIFACTS, step, check);
    await fixture.context.close();
  } catch (e) {
    await failurePage?.screenshot({ path: `${ARTIFACTS}/failure.png` }).catch(() => {});
    if (problems.length) console.error(`the pages reported:\n${problems.join("\n")}`);
    throw e;
  } finally {
    await browser.close();
    await removeAll();
  }
  check(problems.length === 0, `the pages reported no errors:\n${problems.join("\n")}`);
  step("all console checks passed");
}

main().catch((e) => {
  console.error(e instanceof Error ? e.stack ?? e.message : e);
  process.exit(1);
});
