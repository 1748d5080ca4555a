import type { AnyStateMachine } from 'xstate';
import { finalStates, machineEdges, machineStates, type MachineEdge } from '../../machines/transitions.js';
import { escapeHtml } from './html.js';

// Diagrams of the statecharts, generated from their XState definitions (machineStates,
// machineEdges): a state or transition added to a machine appears in every picture. Three forms:
// JSON, Mermaid text (stateDiagram-v2) and SVG laid out here, server-side, without a browser.
//
// The SVG layout is a small layered (Sugiyama-style) one, left to right: states are ranked by the
// longest path from the initial state over the machine's edges with cycles broken by a depth-first
// search, final states share the last column; every edge gets a label node in the column after its
// source (as Graphviz dot does), long edges get waypoints in every column they cross, the order in
// each column is chosen by barycenter sweeps that keep the fewest crossings, and vertical positions
// are solved per column as an isotonic regression towards the neighbours' mean (edges straighten
// without items overlapping). The text is monospace, so widths are known without font metrics.

export type StateModel = { name: string; final: boolean; description: string | null };
export type MachineModel = { id: string; initial: string | null; states: StateModel[]; edges: MachineEdge[] };

export function describeMachine(machine: AnyStateMachine): MachineModel {
  const finals = new Set(finalStates(machine));
  const nodes = machine.root.states as Record<string, { description?: string }>;
  const initial = (machine.config as { initial?: unknown }).initial;
  return {
    id: machine.id,
    initial: typeof initial === 'string' ? initial : null,
    states: machineStates(machine).map((name) => ({ name, final: finals.has(name), description: nodes[name]?.description ?? null })),
    edges: machineEdges(machine),
  };
}

// ---------------------------------------------------------------------------------------------
// Mermaid
// ---------------------------------------------------------------------------------------------

export function toMermaid(model: MachineModel): string {
  const lines = ['stateDiagram-v2', '  direction LR'];
  for (const state of model.states) if (state.description) lines.push(`  %% ${state.name}: ${state.description.replace(/\s+/g, ' ')}`);
  if (model.initial) lines.push(`  [*] --> ${model.initial}`);
  for (const edge of model.edges) lines.push(`  ${edge.from} --> ${edge.to} : ${edge.event}${edge.guarded ? ' [guarded]' : ''}`);
  for (const state of model.states) {
    if (state.final) lines.push(`  ${state.name} --> [*]`);
    else if (state.name !== model.initial && !model.edges.some((edge) => edge.from === state.name || edge.to === state.name)) lines.push(`  ${state.name}`);
  }
  return lines.join('\n');
}

// ---------------------------------------------------------------------------------------------
// Layout
// ---------------------------------------------------------------------------------------------

const STATE_FONT = 12;
const LABEL_FONT = 10;
/** Monospace advance is 0.6 em in the common monospace faces. */
const charWidth = (fontSize: number) => fontSize * 0.6;
const STATE_HEIGHT = 44;
const LOOP_SPACE = 30;
const LABEL_HEIGHT = 15;
const COLUMN_GAP = 30;
const MARGIN = 16;
const INITIAL_SPACE = 30;

type ItemKind = 'state' | 'label' | 'waypoint';
type Item = {
  key: string;
  kind: ItemKind;
  column: number;
  width: number;
  height: number;
  /** Extra space above a state for its self-loop. */
  top: number;
  y: number;
  left: string[];
  right: string[];
  text?: string;
  guarded?: boolean;
};

type Route = { from: string; to: string; events: string[]; guarded: boolean; items: string[]; back: boolean };
type SelfLoop = { state: string; events: string[]; guarded: boolean };

export type Layout = {
  width: number;
  height: number;
  items: Map<string, Item & { x: number }>;
  routes: Route[];
  loops: SelfLoop[];
  model: MachineModel;
};

function ranks(model: MachineModel, pairs: Array<{ from: string; to: string }>): { rank: Map<string, number>; back: Set<string> } {
  const names = model.states.map((state) => state.name);
  const out = new Map(names.map((name) => [name, [] as string[]]));
  for (const pair of pairs) out.get(pair.from)?.push(pair.to);
  const back = new Set<string>();
  const visited = new Set<string>();
  const onStack = new Set<string>();
  const visit = (name: string) => {
    visited.add(name);
    onStack.add(name);
    for (const next of out.get(name) ?? []) {
      if (onStack.has(next)) back.add(`${name}\u0000${next}`);
      else if (!visited.has(next)) visit(next);
    }
    onStack.delete(name);
  };
  if (model.initial && out.has(model.initial)) visit(model.initial);
  for (const name of names) if (!visited.has(name)) visit(name);

  // Longest path over the forward edges, in a topological order.
  const forward = pairs.filter((pair) => !back.has(`${pair.from}\u0000${pair.to}`));
  const indegree = new Map(names.map((name) => [name, 0]));
  for (const pair of forward) indegree.set(pair.to, indegree.get(pair.to)! + 1);
  const rank = new Map(names.map((name) => [name, 0]));
  const ready = names.filter((name) => indegree.get(name) === 0);
  while (ready.length > 0) {
    const name = ready.shift()!;
    for (const pair of forward.filter((candidate) => candidate.from === name)) {
      rank.set(pair.to, Math.max(rank.get(pair.to)!, rank.get(name)! + 1));
      indegree.set(pair.to, indegree.get(pair.to)! - 1);
      if (indegree.get(pair.to) === 0) ready.push(pair.to);
    }
  }
  // Final states share the last column.
  const finals = model.states.filter((state) => state.final).map((state) => state.name);
  const others = names.filter((name) => !finals.includes(name));
  const lastOther = Math.max(0, ...others.map((name) => rank.get(name)!));
  if (others.length > 0) for (const name of finals) rank.set(name, lastOther + 1);
  return { rank, back };
}

function crossings(columns: Item[][], items: Map<string, Item>): number {
  let total = 0;
  for (let column = 0; column + 1 < columns.length; column += 1) {
    const position = new Map(columns[column + 1]!.map((item, index) => [item.key, index]));
    const segments: Array<[number, number]> = [];
    columns[column]!.forEach((item, index) => {
      for (const key of item.right) segments.push([index, position.get(key) ?? 0]);
    });
    for (let a = 0; a < segments.length; a += 1) {
      for (let b = a + 1; b < segments.length; b += 1) {
        const [a0, a1] = segments[a]!;
        const [b0, b1] = segments[b]!;
        if ((a0 < b0 && a1 > b1) || (a0 > b0 && a1 < b1)) total += 1;
      }
    }
  }
  void items;
  return total;
}

/** Minimises Σ (y_i − d_i)² subject to y_{i+1} ≥ y_i + gap_i (pool adjacent violators). */
function placeInOrder(desired: number[], minGaps: number[]): number[] {
  const offsets: number[] = [0];
  for (let index = 1; index < desired.length; index += 1) offsets.push(offsets[index - 1]! + minGaps[index - 1]!);
  const targets = desired.map((value, index) => value - offsets[index]!);
  const blocks: Array<{ value: number; weight: number; count: number }> = [];
  for (const target of targets) {
    blocks.push({ value: target, weight: 1, count: 1 });
    while (blocks.length > 1 && blocks[blocks.length - 2]!.value > blocks[blocks.length - 1]!.value) {
      const last = blocks.pop()!;
      const previous = blocks.pop()!;
      const weight = previous.weight + last.weight;
      blocks.push({ value: (previous.value * previous.weight + last.value * last.weight) / weight, weight, count: previous.count + last.count });
    }
  }
  const result: number[] = [];
  for (const block of blocks) for (let index = 0; index < block.count; index += 1) result.push(block.value + offsets[result.length]!);
  return result;
}

export function layoutMachine(model: MachineModel): Layout {
  const pairsByKey = new Map<string, Route>();
  const loops = new Map<string, SelfLoop>();
  for (const edge of model.edges) {
    if (edge.from === edge.to) {
      const loop = loops.get(edge.from) ?? { state: edge.from, events: [], guarded: false };
      if (!loop.events.includes(edge.event)) loop.events.push(edge.event);
      loop.guarded ||= edge.guarded;
      loops.set(edge.from, loop);
      continue;
    }
    const key = `${edge.from}\u0000${edge.to}`;
    const route = pairsByKey.get(key) ?? { from: edge.from, to: edge.to, events: [], guarded: false, items: [], back: false };
    if (!route.events.includes(edge.event)) route.events.push(edge.event);
    route.guarded ||= edge.guarded;
    pairsByKey.set(key, route);
  }
  const routes = [...pairsByKey.values()];
  const { rank, back } = ranks(model, routes);

  const items = new Map<string, Item>();
  const lastColumn = 2 * Math.max(0, ...[...rank.values()]);
  const columns: Item[][] = Array.from({ length: lastColumn + 1 }, () => []);
  const add = (item: Item) => {
    items.set(item.key, item);
    columns[item.column]!.push(item);
  };
  for (const state of model.states) {
    const loop = loops.get(state.name);
    const labelWidth = loop ? loop.events.join(', ').length * charWidth(LABEL_FONT) : 0;
    add({
      key: `s:${state.name}`,
      kind: 'state',
      column: 2 * rank.get(state.name)!,
      width: Math.max(state.name.length * charWidth(STATE_FONT) + 22, 64, labelWidth + 8),
      height: STATE_HEIGHT + (loop ? LOOP_SPACE : 0),
      top: loop ? LOOP_SPACE : 0,
      y: 0,
      left: [],
      right: [],
    });
  }
  routes.forEach((route, index) => {
    route.back = back.has(`${route.from}\u0000${route.to}`);
    const [low, high] = route.back ? [route.to, route.from] : [route.from, route.to];
    const start = 2 * rank.get(low)!;
    const end = 2 * rank.get(high)!;
    const labelColumn = route.back ? end - 1 : start + 1;
    const chain = [`s:${low}`];
    for (let column = start + 1; column < end; column += 1) {
      const key = `e:${index}:${column}`;
      const isLabel = column === labelColumn;
      const text = route.events.join(', ');
      add({
        key,
        kind: isLabel ? 'label' : 'waypoint',
        column,
        width: isLabel ? text.length * charWidth(LABEL_FONT) + 8 : 0,
        height: isLabel ? LABEL_HEIGHT : 4,
        top: 0,
        y: 0,
        left: [],
        right: [],
        ...(isLabel ? { text, guarded: route.guarded } : {}),
      });
      chain.push(key);
    }
    chain.push(`s:${high}`);
    for (let link = 0; link + 1 < chain.length; link += 1) {
      items.get(chain[link]!)!.right.push(chain[link + 1]!);
      items.get(chain[link + 1]!)!.left.push(chain[link]!);
    }
    // Drawn from the edge's source to its target.
    route.items = route.back ? [...chain].reverse() : chain;
  });

  // Order within columns: barycenter sweeps, keeping the order with the fewest crossings.
  const indexOf = () => new Map(columns.flatMap((column) => column.map((item, index) => [item.key, index] as const)));
  const sortBy = (column: Item[], neighbours: (item: Item) => string[], position: Map<string, number>) => {
    const keyed = column.map((item, index) => {
      const around = neighbours(item).map((key) => position.get(key)!);
      return { item, value: around.length > 0 ? around.reduce((sum, value) => sum + value, 0) / around.length : index, index };
    });
    keyed.sort((a, b) => a.value - b.value || a.index - b.index);
    column.splice(0, column.length, ...keyed.map((entry) => entry.item));
  };
  let best = columns.map((column) => [...column]);
  let fewest = crossings(columns, items);
  for (let sweep = 0; sweep < 12 && fewest > 0; sweep += 1) {
    if (sweep % 2 === 0) for (let column = 1; column < columns.length; column += 1) sortBy(columns[column]!, (item) => item.left, indexOf());
    else for (let column = columns.length - 2; column >= 0; column -= 1) sortBy(columns[column]!, (item) => item.right, indexOf());
    const count = crossings(columns, items);
    if (count < fewest) {
      fewest = count;
      best = columns.map((column) => [...column]);
    }
  }
  best.forEach((column, index) => columns[index]!.splice(0, columns[index]!.length, ...column));

  // Vertical positions (item centres), per column towards the mean of the neighbours' centres.
  const gapBetween = (a: Item, b: Item) => (a.kind === 'state' && b.kind === 'state' ? 16 : a.kind === 'state' || b.kind === 'state' ? 10 : 5);
  const centre = (item: Item) => item.y;
  for (const column of columns) {
    let cursor = 0;
    column.forEach((item, index) => {
      if (index > 0) cursor += gapBetween(column[index - 1]!, item);
      item.y = cursor + item.height / 2;
      cursor += item.height;
    });
  }
  for (let sweep = 0; sweep < 24; sweep += 1) {
    const order = sweep % 2 === 0 ? columns : [...columns].reverse();
    for (const column of order) {
      if (column.length === 0) continue;
      const desired = column.map((item) => {
        const around = [...item.left, ...item.right].map((key) => items.get(key)!);
        // A state's anchor is the centre of its box, below any self-loop space.
        const anchor = (other: Item) => centre(other) + other.top / 2;
        return around.length > 0 ? around.reduce((sum, other) => sum + anchor(other), 0) / around.length - item.top / 2 : item.y;
      });
      const gaps = column.slice(1).map((item, index) => gapBetween(column[index]!, item) + column[index]!.height / 2 + item.height / 2);
      const placed = placeInOrder(desired, gaps);
      column.forEach((item, index) => (item.y = placed[index]!));
    }
  }

  // Coordinates.
  const minTop = Math.min(...[...items.values()].map((item) => item.y - item.height / 2));
  const widths = columns.map((column) => Math.max(column.length === 0 ? 8 : 0, ...column.map((item) => item.width)));
  const placed = new Map<string, Item & { x: number }>();
  let x = MARGIN + (model.initial ? INITIAL_SPACE : 0);
  columns.forEach((column, index) => {
    for (const item of column) placed.set(item.key, { ...item, y: item.y - minTop + MARGIN, x: x + widths[index]! / 2 });
    x += widths[index]! + (index + 1 < columns.length ? COLUMN_GAP : 0);
  });
  const height = Math.max(...[...placed.values()].map((item) => item.y + item.height / 2)) + MARGIN;
  return { width: Math.ceil(x + MARGIN), height: Math.ceil(height), items: placed, routes, loops: [...loops.values()], model };
}

// ---------------------------------------------------------------------------------------------
// SVG
// ---------------------------------------------------------------------------------------------

export type SvgOptions = {
  /** Rows in each state now; null: the table is not there (shown as "–"); absent: no counts. */
  counts?: Record<string, number | null> | null;
  /** Where clicking a state goes. */
  hrefFor?: (state: string) => string;
  /** Prefix for ids inside the SVG (several diagrams on one page). */
  idPrefix?: string;
};

const f = (value: number) => Number(value.toFixed(1)).toString();

function curveThrough(points: Array<{ x: number; y: number }>): string {
  let path = `M${f(points[0]!.x)},${f(points[0]!.y)}`;
  for (let index = 1; index < points.length; index += 1) {
    const from = points[index - 1]!;
    const to = points[index]!;
    const dx = (to.x - from.x) / 2;
    path += ` C${f(from.x + dx)},${f(from.y)} ${f(to.x - dx)},${f(to.y)} ${f(to.x)},${f(to.y)}`;
  }
  return path;
}

export function renderSvg(model: MachineModel, options: SvgOptions = {}): string {
  const layout = layoutMachine(model);
  const id = (options.idPrefix ?? model.id).replace(/[^A-Za-z0-9_-]/g, '_');
  const parts: string[] = [];
  parts.push(
    `<svg xmlns="http://www.w3.org/2000/svg" class="statechart" role="img" aria-label="${escapeHtml(`statechart of ${model.id}`)}" ` +
      `viewBox="0 0 ${layout.width} ${layout.height}" width="${layout.width}" height="${layout.height}" data-machine="${escapeHtml(model.id)}">`,
  );
  parts.push(
    `<defs><marker id="${id}-arrow" viewBox="0 0 10 10" refX="9" refY="5" markerWidth="7" markerHeight="7" orient="auto-start-reverse">` +
      `<path d="M0,0 L10,5 L0,10 z" class="arrowhead"/></marker></defs>`,
  );
  const stateBox = (name: string) => {
    const item = layout.items.get(`s:${name}`)!;
    const top = item.y - item.height / 2 + item.top;
    return { left: item.x - item.width / 2, right: item.x + item.width / 2, top, bottom: top + STATE_HEIGHT, cy: top + STATE_HEIGHT / 2, cx: item.x, width: item.width };
  };

  // Ports: the edges meeting one side of a state are spread over its height, in the order of the
  // items they lead to, so they leave and arrive without crossing at the box.
  const ports = new Map<string, number>();
  const sides = new Map<string, Array<{ key: string; towards: number }>>();
  const endpoint = (state: string, side: 'left' | 'right', key: string, neighbour: string) => {
    const list = sides.get(`${state}\u0000${side}`) ?? [];
    list.push({ key, towards: layout.items.get(neighbour)!.y });
    sides.set(`${state}\u0000${side}`, list);
  };
  layout.routes.forEach((route, index) => {
    endpoint(route.from, route.back ? 'left' : 'right', `${index}:start`, route.items[1]!);
    endpoint(route.to, route.back ? 'right' : 'left', `${index}:end`, route.items[route.items.length - 2]!);
  });
  for (const [sideKey, list] of sides) {
    const box = stateBox(sideKey.split('\u0000')[0]!);
    list.sort((a, b) => a.towards - b.towards);
    const span = Math.min(STATE_HEIGHT - 12, (list.length - 1) * 7);
    list.forEach((entry, index) => ports.set(entry.key, box.cy - span / 2 + (list.length > 1 ? (index * span) / (list.length - 1) : 0)));
  }

  // Edges first, states over them.
  layout.routes.forEach((route, index) => {
    const source = stateBox(route.from);
    const target = stateBox(route.to);
    const waypoints = route.items.slice(1, -1).map((key) => layout.items.get(key)!);
    const forward = !route.back;
    const start = { x: forward ? source.right : source.left, y: ports.get(`${index}:start`)! };
    const end = { x: forward ? target.left - 1 : target.right + 1, y: ports.get(`${index}:end`)! };
    const title = `${route.from} → ${route.to}: ${route.events.join(', ')}${route.guarded ? ' (guarded)' : ''}`;
    parts.push(
      `<path class="edge${route.back ? ' back' : ''}" d="${curveThrough([start, ...waypoints.map((item) => ({ x: item.x, y: item.y })), end])}" marker-end="url(#${id}-arrow)"><title>${escapeHtml(title)}</title></path>`,
    );
  });
  for (const item of layout.items.values()) {
    if (item.kind !== 'label') continue;
    parts.push(
      `<g class="edge-label${item.guarded ? ' guarded' : ''}"><rect x="${f(item.x - item.width / 2)}" y="${f(item.y - LABEL_HEIGHT / 2)}" width="${f(item.width)}" height="${LABEL_HEIGHT}" rx="3"/>` +
        `<text x="${f(item.x)}" y="${f(item.y + 3.5)}" text-anchor="middle">${escapeHtml(item.text ?? '')}</text></g>`,
    );
  }
  for (const loop of layout.loops) {
    const box = stateBox(loop.state);
    const spread = Math.min(18, box.width / 4);
    parts.push(
      `<path class="edge loop" d="M${f(box.cx - spread)},${f(box.top)} C${f(box.cx - spread - 10)},${f(box.top - 24)} ${f(box.cx + spread + 10)},${f(box.top - 24)} ${f(box.cx + spread)},${f(box.top - 1)}" marker-end="url(#${id}-arrow)"><title>${escapeHtml(`${loop.state} → ${loop.state}: ${loop.events.join(', ')}`)}</title></path>`,
      `<g class="edge-label${loop.guarded ? ' guarded' : ''}"><text x="${f(box.cx)}" y="${f(box.top - 22)}" text-anchor="middle">${escapeHtml(loop.events.join(', '))}</text></g>`,
    );
  }
  if (model.initial && layout.items.has(`s:${model.initial}`)) {
    const box = stateBox(model.initial);
    parts.push(
      `<circle class="initial" cx="${f(box.left - INITIAL_SPACE + 6)}" cy="${f(box.cy)}" r="5"/>` +
        `<path class="edge" d="M${f(box.left - INITIAL_SPACE + 11)},${f(box.cy)} L${f(box.left - 1)},${f(box.cy)}" marker-end="url(#${id}-arrow)"/>`,
    );
  }
  for (const state of model.states) {
    const box = stateBox(state.name);
    const count = options.counts === undefined || options.counts === null ? undefined : options.counts[state.name];
    const hasCount = count !== undefined;
    const busy = typeof count === 'number' && count > 0;
    const title = `${state.name}${state.final ? ' (final)' : ''}${state.description ? `: ${state.description}` : ''}`;
    const nameY = hasCount ? box.cy - 4 : box.cy + 4;
    let group =
      `<g class="state${state.final ? ' final' : ''}${busy ? ' busy' : ''}" data-machine="${escapeHtml(model.id)}" data-state="${escapeHtml(state.name)}"${hasCount ? ` data-count="${count === null ? '' : count}"` : ''}>` +
      `<title>${escapeHtml(title)}</title>` +
      `<rect class="box" x="${f(box.left)}" y="${f(box.top)}" width="${f(box.width)}" height="${STATE_HEIGHT}" rx="9"/>` +
      (state.final ? `<rect class="inner" x="${f(box.left + 3)}" y="${f(box.top + 3)}" width="${f(box.width - 6)}" height="${STATE_HEIGHT - 6}" rx="7"/>` : '') +
      `<text class="name" x="${f(box.cx)}" y="${f(nameY)}" text-anchor="middle">${escapeHtml(state.name)}</text>` +
      (hasCount ? `<text class="count" x="${f(box.cx)}" y="${f(box.cy + 13)}" text-anchor="middle">${count === null ? '–' : count}</text>` : '') +
      `</g>`;
    if (options.hrefFor) group = `<a href="${escapeHtml(options.hrefFor(state.name))}" class="state-link">${group}</a>`;
    parts.push(group);
  }
  parts.push('</svg>');
  return parts.join('\n');
}

/** The stylesheet the SVG's classes expect (inlined by the UI; added to standalone files). */
export const STATECHART_CSS = `
svg.statechart { font-family: "DejaVu Sans Mono", Menlo, Consolas, "Liberation Mono", monospace; max-width: 100%; height: auto; }
svg.statechart .edge { fill: none; stroke: #7a8494; stroke-width: 1.3; }
svg.statechart .edge.back { stroke-dasharray: 5 3; }
svg.statechart .arrowhead { fill: #7a8494; }
svg.statechart .edge-label rect { fill: #ffffff; stroke: none; }
svg.statechart .edge-label text { font-size: ${LABEL_FONT}px; fill: #4a5261; }
svg.statechart .edge-label.guarded text { font-style: italic; }
svg.statechart .initial { fill: #1f2733; }
svg.statechart .state .box { fill: #f4f6f9; stroke: #5b6576; stroke-width: 1.2; }
svg.statechart .state.final .box { fill: #eceef2; }
svg.statechart .state .inner { fill: none; stroke: #5b6576; stroke-width: 0.8; }
svg.statechart .state.busy .box { fill: #e3efff; stroke: #2a63c7; }
svg.statechart .state .name { font-size: ${STATE_FONT}px; font-weight: bold; fill: #1f2733; }
svg.statechart .state .count { font-size: ${STATE_FONT}px; fill: #2a63c7; }
svg.statechart a.state-link:hover .box, svg.statechart a.state-link:focus .box { stroke: #2a63c7; stroke-width: 2; }
`;

/** A standalone SVG file (the CLI's `--format svg`). */
export function standaloneSvg(model: MachineModel): string {
  return renderSvg(model).replace(/<defs>/, `<style>${STATECHART_CSS}</style><defs>`);
}
