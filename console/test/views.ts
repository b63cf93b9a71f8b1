// Browser checks of the tree's diff, the processes tab's live output and the egress tab,
// against the live daemon (called from test/browser.ts).
import type { Page } from "playwright-core";
import { api, BASE, check, run, shot, step } from "./harness";

/**
 * In one child of `parent`: a line appended to a file the parent has and a new file whose
 * content looks like HTML; the tree's "diff against parent" shows both, the content as
 * text; the other side can be any node.
 */
export async function diffFromTree(page: Page, parent: string, children: string[]): Promise<void> {
  const [child, other] = children;
  step(`diff from the tree: ${child} against its parent ${parent}, then against ${other}`);
  const marker = `changed-in-child-${Date.now()}`;
  await run(child, `echo ${marker} >> /root/difftest/shared.txt && printf 'added file\\n<b id=hostile>not html</b>\\n' > /root/difftest/added.txt`);
  await page.goto(`${BASE}/ui/#/tree/${parent}`);
  await page.locator(`[data-node="${child}"]`).click();
  await page.locator(".panel h3", { hasText: child }).waitFor();
  await page.click(".panel button:text('diff against parent')");
  const summary = page.getByTestId("diff-summary");
  await summary.waitFor({ timeout: 60_000 });
  // Other files of /root may differ too (a shell's history): these two must be there.
  const counts = (text: string) => (/^(\d+) added · (\d+) removed · (\d+) modified/.exec(text) ?? []).slice(1).map(Number);
  const text = (await summary.innerText()).trim();
  const [added, , modified] = counts(text);
  check(added >= 1 && modified >= 1, `the summary counts the added and the modified file (${text})`);
  check((await page.locator('tr.added[data-path="difftest/added.txt"]').count()) === 1, "the added file is listed");
  const unified = page.locator('details.modified[data-path="difftest/shared.txt"] pre.diff');
  const diffText = await unified.innerText();
  check(diffText.includes(`+${marker}`), `the unified diff shows the added line (${diffText})`);
  check(diffText.includes("base-line"), `the unified diff shows the context (${diffText})`);
  check((await unified.locator("span.add", { hasText: marker }).count()) === 1, "the added line is marked as added");

  await page.click('tr.added[data-path="difftest/added.txt"] button:text("show")');
  const content = page.locator('tr.added[data-path="difftest/added.txt"] pre.file-content');
  await content.waitFor({ timeout: 30_000 });
  const shown = await content.innerText();
  check(shown.includes("<b id=hostile>not html</b>"), `the added file's content is shown as text (${shown})`);
  check((await page.locator("#hostile").count()) === 0, "the guest's text made no element");
  await shot(page, "tree-diff");

  // The other side picked in the panel: the sibling has neither change.
  await page.selectOption(".panel select[name=against]", other);
  await page.click(".panel .diff-pick button:text('diff')");
  await page.locator(".diff-view h3", { hasText: `${child} against ${other}` }).waitFor({ timeout: 60_000 });
  const otherText = (await page.getByTestId("diff-summary").innerText()).trim();
  check(counts(otherText)[0] >= 1 && counts(otherText)[2] >= 1, `against the sibling too (${otherText})`);
  check((await page.locator('details.modified[data-path="difftest/shared.txt"] pre.diff').innerText()).includes(`+${marker}`), "with the same line");
}

/**
 * A background process printing a line every 200 ms for ~3 s: the processes tab shows
 * its output growing while it runs (at least two different non-empty observations before
 * the last line), then the last line and its end.
 */
export async function processLogs(page: Page, id: string): Promise<void> {
  step("processes: a process's output followed live");
  // The page loads the list when the tab opens: the process is started first, with a
  // second of silence so the follow starts before its output.
  const script = "sleep 1; i=1; while [ $i -le 15 ]; do echo tick-$i; i=$((i+1)); sleep 0.2; done; echo tick-done";
  const started = (await api("POST", `/v1/sandboxes/${id}/exec`, { argv: ["sh", "-c", script], background: true })) as { pid: number };
  check(typeof started.pid === "number", `the background exec answered a pid (${JSON.stringify(started)})`);
  // Loaded afresh (the tab may be open already: a goto to the same fragment is no load).
  await page.goto(`${BASE}/ui/#/sandbox/${id}/processes`);
  await page.reload();
  const row = page.locator(`tr[data-pid="${started.pid}"]`);
  await row.waitFor({ timeout: 30_000 });
  await row.locator("button:text('follow')").click();
  const log = page.getByTestId("process-log");
  const seen: string[] = [];
  const deadline = Date.now() + 60_000;
  for (;;) {
    const text = await log.innerText();
    if (text.includes("tick-done")) break;
    if (text.trim() && text !== seen[seen.length - 1]) seen.push(text);
    check(Date.now() < deadline, `the last line arrives (seen: ${JSON.stringify(seen.slice(-1))})`);
    await page.waitForTimeout(50);
  }
  const growing = seen.filter((t, i) => i === 0 || (t.length > seen[i - 1].length && t.startsWith(seen[i - 1])));
  check(growing.length >= 2, `the output grew while the process ran (${seen.length} observations: ${JSON.stringify(seen.map((t) => t.length))})`);
  await page.locator('[data-testid=process-log-state][data-ended="true"]').waitFor({ timeout: 30_000 });
  const final = await log.innerText();
  const ticks = final.split("\n").filter((l) => l.startsWith("tick-"));
  check(ticks.length === 16 && ticks[15] === "tick-done", `every line once, in order (${JSON.stringify(ticks)})`);
  check((await page.getByTestId("process-log-state").innerText()).includes("exited (0)"), "the end is said");
  step(`   the output was seen growing ${growing.length} times before its last line`);
  await shot(page, "processes");
}

/** The egress tab says what the daemon's record holds (an empty one says so). */
export async function egressTab(page: Page, id: string): Promise<void> {
  step("egress: the record as a table, or that it is empty");
  await page.click("a[data-tab=egress]");
  const record = (await api("GET", `/v1/sandboxes/${id}/egress`)) as { entries: unknown[] };
  if (record.entries.length === 0) {
    await page.getByTestId("egress-empty").waitFor({ timeout: 30_000 });
    check((await page.getByTestId("egress-empty").innerText()).includes("No egress record"), "the empty record says so");
  } else {
    await page.getByTestId("egress").waitFor({ timeout: 30_000 });
    const rows = await page.locator("[data-testid=egress] tbody tr").count();
    check(rows >= record.entries.length, `a row per entry (${rows} of ${record.entries.length})`);
  }
  await shot(page, "egress");
}
