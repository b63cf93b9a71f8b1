// The tree layout and the list filter, without a browser: node --test.
import assert from "node:assert/strict";
import { test } from "node:test";
import { COL_GAP, layoutTree, NODE_H, NODE_W, ROW_GAP, type Layout, type LayoutInput } from "../src/layout";
import { matches } from "../src/list";
import type { SandboxInfo } from "../src/api";

/** No two boxes overlap, and every child is right of its parent. */
function checkSound(input: LayoutInput[], layout: Layout): void {
  assert.equal(layout.nodes.length, input.length, "every node is placed once");
  assert.equal(new Set(layout.nodes.map((n) => n.id)).size, input.length);
  const byColumn = new Map<number, number[]>();
  for (const n of layout.nodes) {
    assert.ok(n.x >= 0 && n.y >= 0 && n.x + NODE_W <= layout.width && n.y + NODE_H <= layout.height, `${n.id} inside`);
    const ys = byColumn.get(n.x) ?? [];
    ys.push(n.y);
    byColumn.set(n.x, ys);
  }
  for (const ys of byColumn.values()) {
    ys.sort((a, b) => a - b);
    for (let i = 1; i < ys.length; i++) assert.ok(ys[i] - ys[i - 1] >= NODE_H, "boxes in a column do not overlap");
  }
  const pos = new Map(layout.nodes.map((n) => [n.id, n]));
  for (const [from, to] of layout.edges) assert.ok(pos.get(from)!.x < pos.get(to)!.x, `${from} left of ${to}`);
}

test("a 256-child fan-out is one column, with its parent centred", () => {
  const input: LayoutInput[] = [{ id: "root", parent: null }];
  for (let i = 0; i < 256; i++) input.push({ id: `c${i}`, parent: "root" });
  const layout = layoutTree(input);
  checkSound(input, layout);
  assert.equal(layout.edges.length, 256);
  const pos = new Map(layout.nodes.map((n) => [n.id, n]));
  for (let i = 0; i < 256; i++) {
    const c = pos.get(`c${i}`)!;
    assert.equal(c.x, NODE_W + COL_GAP);
    assert.equal(c.y, i * (NODE_H + ROW_GAP), "children in input order");
  }
  assert.equal(pos.get("root")!.y, (pos.get("c0")!.y + pos.get("c255")!.y) / 2);
  assert.equal(layout.height, 256 * (NODE_H + ROW_GAP) - ROW_GAP);
  assert.equal(layout.width, 2 * NODE_W + COL_GAP);
});

test("a deep chain and a large random tree stay sound", () => {
  const chain: LayoutInput[] = Array.from({ length: 2000 }, (_, i) => ({ id: `n${i}`, parent: i ? `n${i - 1}` : null }));
  const deep = layoutTree(chain);
  checkSound(chain, deep);
  assert.equal(deep.height, NODE_H, "a chain is one row");

  let seed = 42;
  const rand = (n: number) => ((seed = (seed * 1103515245 + 12345) % 2 ** 31) % n);
  const input: LayoutInput[] = [{ id: "n0", parent: null }];
  for (let i = 1; i < 1000; i++) input.push({ id: `n${i}`, parent: `n${rand(i)}` });
  // Any order in: children after their parents is not required.
  input.reverse();
  checkSound(input, layoutTree(input));
});

test("orphans become roots and a cycle loses no node", () => {
  const input: LayoutInput[] = [
    { id: "a", parent: "gone" },
    { id: "b", parent: "a" },
    { id: "x", parent: "y" },
    { id: "y", parent: "x" },
    { id: "self", parent: "self" },
  ];
  const layout = layoutTree(input);
  assert.equal(layout.nodes.length, 5);
  assert.deepEqual(layout.edges[0], ["a", "b"]);
});

test("the list filter takes labels and text", () => {
  const s = { id: "abc123", name: "web", state: "running", origin: { image: { name: "minimal" } }, metadata: { team: "search", gpu: "" } } as unknown as SandboxInfo;
  assert.ok(matches(s, ""));
  assert.ok(matches(s, "team=search"));
  assert.ok(!matches(s, "team=ads"));
  assert.ok(matches(s, "gpu"), "a label by its key");
  assert.ok(matches(s, "team=search minimal abc"));
  assert.ok(!matches(s, "team=search paused"));
});
