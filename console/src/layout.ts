// The branch tree's layout, kept free of the DOM so node can test it: a layered tree
// drawn left to right (depth on x), leaves one row each in order, each parent centred
// on its children. A 256-child fan-out is then a tall column that scrolls, not a row
// 256 nodes wide; the work is linear in the number of nodes.

export interface LayoutInput {
  id: string;
  /** The parent's id; a node whose parent is absent (or null) is a root. */
  parent: string | null;
}

export interface Placed {
  id: string;
  x: number;
  y: number;
  depth: number;
}

export interface Layout {
  nodes: Placed[];
  /** [parent, child] for every drawn edge. */
  edges: [string, string][];
  width: number;
  height: number;
}

export const NODE_W = 210;
export const NODE_H = 44;
export const COL_GAP = 60;
export const ROW_GAP = 12;

/**
 * Places `input` (any order; children keep their relative input order). Roots stack
 * one below the other. Positions are the nodes' top-left corners.
 */
export function layoutTree(input: LayoutInput[]): Layout {
  const ids = new Set(input.map((n) => n.id));
  const children = new Map<string, string[]>();
  const roots: string[] = [];
  for (const n of input) {
    if (n.parent !== null && ids.has(n.parent) && n.parent !== n.id) {
      const list = children.get(n.parent);
      if (list) list.push(n.id);
      else children.set(n.parent, [n.id]);
    } else {
      roots.push(n.id);
    }
  }
  const placed = new Map<string, Placed>();
  const edges: [string, string][] = [];
  let row = 0;
  let maxDepth = 0;
  // Iterative post-order walk: a node is placed once all its children are.
  for (const root of roots) {
    const stack: { id: string; depth: number; next: number }[] = [{ id: root, depth: 0, next: 0 }];
    const onPath = new Set<string>([root]);
    while (stack.length > 0) {
      const top = stack[stack.length - 1];
      const kids = children.get(top.id) ?? [];
      if (top.next < kids.length) {
        const kid = kids[top.next++];
        // A cycle (corrupt input) or a node already placed is not walked twice.
        if (onPath.has(kid) || placed.has(kid)) continue;
        edges.push([top.id, kid]);
        onPath.add(kid);
        stack.push({ id: kid, depth: top.depth + 1, next: 0 });
        continue;
      }
      stack.pop();
      onPath.delete(top.id);
      maxDepth = Math.max(maxDepth, top.depth);
      const x = top.depth * (NODE_W + COL_GAP);
      const kidYs = kids.map((k) => placed.get(k)).filter((p): p is Placed => p !== undefined);
      let y: number;
      if (kidYs.length === 0) {
        y = row * (NODE_H + ROW_GAP);
        row++;
      } else {
        y = (kidYs[0].y + kidYs[kidYs.length - 1].y) / 2;
      }
      placed.set(top.id, { id: top.id, x, y, depth: top.depth });
    }
  }
  // Nodes only reachable through a cycle: placed as roots of their own, so none is lost.
  for (const n of input) {
    if (!placed.has(n.id)) {
      placed.set(n.id, { id: n.id, x: 0, y: row * (NODE_H + ROW_GAP), depth: 0 });
      row++;
    }
  }
  return {
    nodes: [...placed.values()],
    edges,
    width: (maxDepth + 1) * (NODE_W + COL_GAP) - COL_GAP,
    height: Math.max(0, row * (NODE_H + ROW_GAP) - ROW_GAP),
  };
}
