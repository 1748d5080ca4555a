import dagre, { type EdgeLabel, type GraphLabel, type NodeLabel } from '@dagrejs/dagre';
import type { AnyStateMachine } from 'xstate';
import { finalStates, machineEdges, machineStates, type MachineEdge } from '../../machines/transitions.js';
import { ANY_STATE, graphOfMachine, type DefinitionGraph, type StateKind } from '../statecharts/definition-graph.js';
import { escapeHtml } from './html.js';

// Diagrams of the statecharts, generated from their XState definitions (machineStates,
// machineEdges): a state or transition added to a machine appears in every picture. Three forms:
// JSON, Mermaid text (stateDiagram-v2) and SVG laid out here, server-side, without a browser.
//
// The SVG layout is dagre's (a layered, Sugiyama-style layout, left to right; each edge label is a
// node of its own): docs/decisions/0018-maintained-libraries-for-ranges-layout-and-logs.md says why
// it replaced a home-made one. The text is monospace, so widths are known without font metrics.
//
// A lifecycle machine of machines/ is flat: its states and the events between them. A statechart
// agent's machine may nest states and invoke steps: it is drawn from its definition graph
// (src/statecharts/definition-graph.ts), every state named by its path ("review.asking"), a
// compound state leading to its initial child by a dotted edge, and transitions labelled with the
// machine's own names (done(classify) by the invoke's id, after(5s), always), a guarded one with
// its guard's name in brackets: done(classify) [large].
//
// One event leading to a final state from many states (the run lifecycle's CANCEL and FAIL, a
// statechart's error(step) → failed) is drawn once: its sources join at a dot, and a single
// labelled edge goes on from the dot, instead of a pile of identical labels at the final state.

export type StateModel = {
  name: string;
  final: boolean;
  description: string | null;
  /** A nested machine's state kind; "any" is the pseudo-state of transitions on the machine itself. */
  kind?: StateKind | 'any';
};
/**
 * A transition; `label` is what is drawn when it differs from the event type, `guard` its guard's
 * name (absent: a guarded edge shows [guarded]), `nest` marks a compound state's edge to its initial child.
 */
export type EdgeModel = MachineEdge & { label?: string; guard?: string; nest?: boolean };
export type MachineModel = { id: string; initial: string | null; states: StateModel[]; edges: EdgeModel[] };

/** What an edge is drawn with: its label, and its guard in brackets (UML's `event [guard]`). */
const labelOf = (edge: EdgeModel) => `${edge.label ?? edge.event}${edge.guarded ? ` [${edge.guard ?? 'guarded'}]` : ''}`;

/** Whether a machine is more than flat states and events (nested states, invoked steps, delays, eventless transitions). */
function isNested(machine: AnyStateMachine): boolean {
  return Object.values(machine.root.states).some(
    (node) => Object.keys(node.states).length > 0 || node.invoke.length > 0 || node.after.length > 0 || (node.always?.length ?? 0) > 0,
  );
}

/** The model of a definition graph (a statechart agent's machine, current or stored). */
export function describeGraph(graph: DefinitionGraph, id: string = graph.id): MachineModel {
  const states: StateModel[] = graph.states.map((state) => ({
    name: state.path,
    final: state.kind === 'final',
    description: state.description ?? (state.status ? `status "${state.status}"` : null),
    kind: state.kind,
  }));
  if (graph.edges.some((edge) => edge.from === ANY_STATE)) {
    states.unshift({ name: ANY_STATE, final: false, description: 'any state: the transitions of the machine itself', kind: 'any' });
  }
  return {
    id,
    initial: graph.initial,
    states,
    edges: graph.edges.map((edge) => ({
      from: edge.from,
      to: edge.to,
      event: edge.event,
      guarded: edge.guarded,
      label: edge.label,
      ...(edge.guard !== null ? { guard: edge.guard } : {}),
      nest: edge.nest,
    })),
  };
}

/** The model of any machine: a flat lifecycle machine as its states and events, a nested one from its definition graph. */
export function describeMachine(machine: AnyStateMachine): MachineModel {
  if (isNested(machine)) return describeGraph(graphOfMachine(machine), machine.id);
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

/** A state's Mermaid id: its name where Mermaid takes it as is, else a sanitized one declared with the name as its label. */
const mermaidId = (name: string) => (name === ANY_STATE ? 'any_state' : /^[A-Za-z_][A-Za-z0-9_]*$/.test(name) ? name : `s_${name.replace(/[^A-Za-z0-9_]/g, '_')}`);

export function toMermaid(model: MachineModel): string {
  const lines = ['stateDiagram-v2', '  direction LR'];
  for (const state of model.states) if (mermaidId(state.name) !== state.name) lines.push(`  state "${state.name.replace(/"/g, "'")}" as ${mermaidId(state.name)}`);
  for (const state of model.states) if (state.description) lines.push(`  %% ${state.name}: ${state.description.replace(/\s+/g, ' ')}`);
  if (model.initial) lines.push(`  [*] --> ${mermaidId(model.initial)}`);
  for (const edge of model.edges) lines.push(`  ${mermaidId(edge.from)} --> ${mermaidId(edge.to)} : ${labelOf(edge)}`);
  for (const state of model.states) {
    if (state.final) lines.push(`  ${mermaidId(state.name)} --> [*]`);
    else if (state.name !== model.initial && !model.edges.some((edge) => edge.from === state.name || edge.to === state.name)) lines.push(`  ${mermaidId(state.name)}`);
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
const MARGIN = 16;
const INITIAL_SPACE = 30;
/** From this many states, one event into one final state is drawn joined at a dot. */
const GROUP_FROM = 3;
const JUNCTION_SIZE = 8;
/** The name of the dot where the sources of `label` into `target` join (no state's name starts with a control character). */
const junctionName = (target: string, label: string) => `\u0001${target}\u0001${label}`;

type Point = { x: number; y: number };

/** A state's box or an edge's label, placed: `x`, `y` are its centre; items of one column share `x`. */
export type LayoutItem = {
  key: string;
  kind: 'state' | 'label' | 'junction';
  column: number;
  x: number;
  y: number;
  width: number;
  height: number;
  /** Extra space above a state for its self-loop. */
  top: number;
  text?: string;
  guarded?: boolean;
};

/**
 * The transitions from one state (or dot) to another, drawn as one edge through `points`; `members`
 * are the transitions between states it stands for (several for the edge from a dot), by which a
 * run's path marks it taken.
 */
type Route = { from: string; to: string; events: string[]; guarded: boolean; back: boolean; points: Point[]; nest: boolean; members: Array<{ from: string; to: string }> };
type SelfLoop = { state: string; events: string[]; guarded: boolean };

export type Layout = {
  width: number;
  height: number;
  items: Map<string, LayoutItem>;
  routes: Route[];
  loops: SelfLoop[];
  /** The dots where the sources of one event into a final state join. */
  junctions: string[];
  model: MachineModel;
};

/** The junctions to draw: for each (final state, label) reached from GROUP_FROM states or more, its sources. */
function groupsOf(model: MachineModel): Map<string, Set<string>> {
  const finals = new Set(model.states.filter((state) => state.final).map((state) => state.name));
  const sources = new Map<string, Set<string>>();
  for (const edge of model.edges) {
    if (edge.nest || edge.from === edge.to || !finals.has(edge.to)) continue;
    const name = junctionName(edge.to, labelOf(edge));
    sources.set(name, (sources.get(name) ?? new Set()).add(edge.from));
  }
  return new Map([...sources].filter(([, from]) => from.size >= GROUP_FROM));
}

export function layoutMachine(model: MachineModel): Layout {
  const routesByKey = new Map<string, Route>();
  const loops = new Map<string, SelfLoop>();
  const groups = groupsOf(model);
  const addRoute = (from: string, to: string, label: string | null, edge: EdgeModel) => {
    const key = `${from}\u0000${to}`;
    const route = routesByKey.get(key) ?? { from, to, events: [], guarded: false, back: false, points: [], nest: true, members: [] };
    if (label !== null && !route.events.includes(label)) route.events.push(label);
    route.guarded ||= label !== null && edge.guarded;
    route.nest &&= edge.nest === true;
    if (!route.members.some((member) => member.from === edge.from && member.to === edge.to)) route.members.push({ from: edge.from, to: edge.to });
    routesByKey.set(key, route);
  };
  for (const edge of model.edges) {
    const label = labelOf(edge);
    if (edge.from === edge.to) {
      const loop = loops.get(edge.from) ?? { state: edge.from, events: [], guarded: false };
      if (!loop.events.includes(label)) loop.events.push(label);
      loop.guarded ||= edge.guarded;
      loops.set(edge.from, loop);
      continue;
    }
    const junction = junctionName(edge.to, label);
    if (!edge.nest && groups.has(junction)) {
      // The source joins the dot unlabelled; the dot's one edge carries the label.
      addRoute(edge.from, junction, null, edge);
      addRoute(junction, edge.to, label, edge);
      continue;
    }
    addRoute(edge.from, edge.to, label, edge);
  }
  const routes = [...routesByKey.values()];

  // dagre ranks the states left to right, makes each edge label a node of its own, orders the
  // ranks to keep crossings few and routes every edge; self-loops are drawn above their state.
  const graph = new dagre.graphlib.Graph<GraphLabel, NodeLabel, EdgeLabel>({ directed: true, multigraph: false });
  graph.setGraph({ rankdir: 'LR', ranksep: 28, nodesep: 14, edgesep: 8, marginx: MARGIN, marginy: MARGIN });
  graph.setDefaultEdgeLabel(() => ({}));
  for (const state of model.states) {
    const loop = loops.get(state.name);
    const labelWidth = loop ? loop.events.join(', ').length * charWidth(LABEL_FONT) : 0;
    graph.setNode(state.name, {
      width: Math.max(state.name.length * charWidth(STATE_FONT) + 22, 64, labelWidth + 8),
      height: STATE_HEIGHT + (loop ? LOOP_SPACE : 0),
    });
  }
  for (const junction of groups.keys()) graph.setNode(junction, { width: JUNCTION_SIZE, height: JUNCTION_SIZE });
  for (const route of routes) {
    const text = route.events.join(', ');
    graph.setEdge(route.from, route.to, text === '' ? { width: 0, height: 0 } : { width: text.length * charWidth(LABEL_FONT) + 8, height: LABEL_HEIGHT, labelpos: 'c' });
  }
  dagre.layout(graph);

  // Room on the left for the initial state's arrow.
  const shift = model.initial ? INITIAL_SPACE : 0;
  const items = new Map<string, LayoutItem>();
  for (const state of model.states) {
    const node = graph.node(state.name);
    const loop = loops.has(state.name);
    items.set(`s:${state.name}`, { key: `s:${state.name}`, kind: 'state', column: 0, x: node.x! + shift, y: node.y!, width: node.width, height: node.height, top: loop ? LOOP_SPACE : 0 });
  }
  for (const junction of groups.keys()) {
    const node = graph.node(junction);
    items.set(`s:${junction}`, { key: `s:${junction}`, kind: 'junction', column: 0, x: node.x! + shift, y: node.y!, width: JUNCTION_SIZE, height: JUNCTION_SIZE, top: 0 });
  }
  routes.forEach((route, index) => {
    const edge = graph.edge(route.from, route.to);
    const text = route.events.join(', ');
    if (text !== '') items.set(`e:${index}`, { key: `e:${index}`, kind: 'label', column: 0, x: edge.x! + shift, y: edge.y!, width: edge.width!, height: LABEL_HEIGHT, top: 0, text, guarded: route.guarded });
    const source = items.get(`s:${route.from}`)!;
    const target = items.get(`s:${route.to}`)!;
    route.back = target.x < source.x;
    route.points = (edge.points ?? []).map((point: Point) => ({ x: point.x + shift, y: point.y }));
  });
  // Columns: the distinct centres, left to right (dagre centres every item of a rank on one line).
  const columns = [...new Set([...items.values()].map((item) => Math.round(item.x)))].sort((a, b) => a - b);
  for (const item of items.values()) item.column = columns.indexOf(Math.round(item.x));

  const { width, height } = graph.graph();
  return { width: Math.ceil((width ?? 0) + shift), height: Math.ceil(height ?? 0), items, routes, loops: [...loops.values()], junctions: [...groups.keys()], model };
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
  /** A run's path to highlight: the states it stood in, the transitions it took (by source and target), where it stands now. */
  path?: { visited: readonly string[]; taken: ReadonlyArray<{ from: string; to: string }>; current: readonly string[] };
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
  const taken = new Set((options.path?.taken ?? []).map((edge) => `${edge.from}\u0000${edge.to}`));
  const visited = new Set(options.path?.visited ?? []);
  const current = new Set(options.path?.current ?? []);
  const routeTaken = (route: { from: string; to: string; members?: ReadonlyArray<{ from: string; to: string }> }) =>
    (route.members ?? [route]).some((member) => taken.has(`${member.from}\u0000${member.to}`));
  parts.push(
    `<defs><marker id="${id}-arrow" viewBox="0 0 10 10" refX="9" refY="5" markerWidth="7" markerHeight="7" orient="auto-start-reverse">` +
      `<path d="M0,0 L10,5 L0,10 z" class="arrowhead"/></marker>` +
      (options.path
        ? `<marker id="${id}-arrow-taken" viewBox="0 0 10 10" refX="9" refY="5" markerWidth="7" markerHeight="7" orient="auto-start-reverse"><path d="M0,0 L10,5 L0,10 z" class="arrowhead taken"/></marker>`
        : '') +
      `</defs>`,
  );
  const stateBox = (name: string) => {
    const item = layout.items.get(`s:${name}`)!;
    // A dot: edges meet at its centre.
    if (item.kind === 'junction') return { left: item.x, right: item.x, top: item.y, bottom: item.y, cy: item.y, cx: item.x, width: 0, centre: { x: item.x, y: item.y } };
    const top = item.y - item.height / 2 + item.top;
    const cy = top + STATE_HEIGHT / 2;
    return { left: item.x - item.width / 2, right: item.x + item.width / 2, top, bottom: top + STATE_HEIGHT, cy, cx: item.x, width: item.width, centre: { x: item.x, y: cy } };
  };

  // Edges meet a state on the side facing their next point (the layout runs left to right). dagre
  // aims every edge at the centre of its node, and that node includes the space above a self-loop;
  // the ends are spread over the box's side instead, in the order of the points they come from, so
  // that edges leave and arrive without crossing at the box.
  type End = { route: number; end: 'start' | 'end'; x: number; towards: number };
  const sides = new Map<string, End[]>();
  layout.routes.forEach((route, index) => {
    const inner = route.points.slice(1, -1);
    const ends: Array<[string, 'start' | 'end', Point]> = [
      [route.from, 'start', inner[0] ?? stateBox(route.to).centre],
      [route.to, 'end', inner[inner.length - 1] ?? stateBox(route.from).centre],
    ];
    for (const [state, end, towards] of ends) {
      const box = stateBox(state);
      const side = towards.x >= box.cx ? 'right' : 'left';
      const list = sides.get(`${state}\u0000${side}`) ?? [];
      list.push({ route: index, end, x: side === 'right' ? box.right + 1 : box.left - 1, towards: towards.y });
      sides.set(`${state}\u0000${side}`, list);
    }
  });
  const ports = new Map<string, Point>();
  for (const [sideKey, list] of sides) {
    const box = stateBox(sideKey.split('\u0000')[0]!);
    list.sort((a, b) => a.towards - b.towards);
    const span = layout.items.get(`s:${sideKey.split('\u0000')[0]!}`)!.kind === 'junction' ? 0 : Math.min(STATE_HEIGHT - 12, (list.length - 1) * 7);
    list.forEach((entry, index) => {
      ports.set(`${entry.route}:${entry.end}`, { x: entry.x, y: box.cy - span / 2 + (list.length > 1 ? (index * span) / (list.length - 1) : 0) });
    });
  }

  // Edges first, states over them.
  layout.routes.forEach((route, index) => {
    const points = [ports.get(`${index}:start`)!, ...route.points.slice(1, -1), ports.get(`${index}:end`)!];
    // An edge into or out of a dot is named by the transitions it stands for.
    const toDot = layout.junctions.includes(route.to);
    const fromDot = layout.junctions.includes(route.from);
    const from = fromDot ? route.members.map((member) => member.from).join(', ') : route.from;
    const to = toDot ? route.members[0]!.to : route.to;
    const events = toDot ? (route.to.split('\u0001')[2] ?? '') : route.events.join(', ');
    const title = `${from} → ${to}: ${events}`;
    const isTaken = routeTaken(route);
    const data = fromDot
      ? `data-from-group="${escapeHtml(from)}" data-to="${escapeHtml(to)}"`
      : `data-from="${escapeHtml(from)}" ${toDot ? `data-to-group="${escapeHtml(to)}"` : `data-to="${escapeHtml(to)}"`}`;
    parts.push(
      `<path class="edge${route.back ? ' back' : ''}${route.nest ? ' nest' : ''}${toDot || fromDot ? ' grouped' : ''}${isTaken ? ' taken' : ''}" ${data} ` +
        `d="${curveThrough(points)}"${toDot ? '' : ` marker-end="url(#${id}-arrow${isTaken ? '-taken' : ''})"`}><title>${escapeHtml(title)}</title></path>`,
    );
  });
  for (const junction of layout.junctions) {
    const item = layout.items.get(`s:${junction}`)!;
    const [, target, label] = junction.split('\u0001');
    const isTaken = layout.routes.some((route) => route.from === junction && routeTaken(route));
    parts.push(`<circle class="junction${isTaken ? ' taken' : ''}" data-to="${escapeHtml(target ?? '')}" data-event="${escapeHtml(label ?? '')}" cx="${f(item.x)}" cy="${f(item.y)}" r="3"/>`);
  }
  for (const item of layout.items.values()) {
    if (item.kind !== 'label') continue;
    const route = layout.routes[Number(item.key.slice(2))];
    parts.push(
      `<g class="edge-label${item.guarded ? ' guarded' : ''}${route?.nest ? ' nest' : ''}${route && routeTaken(route) ? ' taken' : ''}"><rect x="${f(item.x - item.width / 2)}" y="${f(item.y - LABEL_HEIGHT / 2)}" width="${f(item.width)}" height="${LABEL_HEIGHT}" rx="3"/>` +
        `<text x="${f(item.x)}" y="${f(item.y + 3.5)}" text-anchor="middle">${escapeHtml(item.text ?? '')}</text></g>`,
    );
  }
  for (const loop of layout.loops) {
    const box = stateBox(loop.state);
    const spread = Math.min(18, box.width / 4);
    const isTaken = routeTaken({ from: loop.state, to: loop.state });
    parts.push(
      `<path class="edge loop${isTaken ? ' taken' : ''}" data-from="${escapeHtml(loop.state)}" data-to="${escapeHtml(loop.state)}" d="M${f(box.cx - spread)},${f(box.top)} C${f(box.cx - spread - 10)},${f(box.top - 24)} ${f(box.cx + spread + 10)},${f(box.top - 24)} ${f(box.cx + spread)},${f(box.top - 1)}" marker-end="url(#${id}-arrow${isTaken ? '-taken' : ''})"><title>${escapeHtml(`${loop.state} → ${loop.state}: ${loop.events.join(', ')}`)}</title></path>`,
      `<g class="edge-label${loop.guarded ? ' guarded' : ''}${isTaken ? ' taken' : ''}"><text x="${f(box.cx)}" y="${f(box.top - 22)}" text-anchor="middle">${escapeHtml(loop.events.join(', '))}</text></g>`,
    );
  }
  if (model.initial && layout.items.has(`s:${model.initial}`)) {
    const box = stateBox(model.initial);
    // A run's path starts at the initial state.
    const started = visited.has(model.initial);
    parts.push(
      `<circle class="initial" cx="${f(box.left - INITIAL_SPACE + 6)}" cy="${f(box.cy)}" r="5"/>` +
        `<path class="edge${started ? ' taken' : ''}" d="M${f(box.left - INITIAL_SPACE + 11)},${f(box.cy)} L${f(box.left - 1)},${f(box.cy)}" marker-end="url(#${id}-arrow${started ? '-taken' : ''})"/>`,
    );
  }
  for (const state of model.states) {
    const box = stateBox(state.name);
    // The pseudo-state of the machine's own transitions is no state a row stands in: no count, no link, not counted live.
    const pseudo = state.kind === 'any';
    const count = pseudo || options.counts === undefined || options.counts === null ? undefined : options.counts[state.name];
    const hasCount = count !== undefined;
    const busy = typeof count === 'number' && count > 0;
    const kindText = state.kind === 'compound' || state.kind === 'parallel' || state.kind === 'history' ? ` (${state.kind})` : '';
    const title = `${state.name}${state.final ? ' (final)' : kindText}${state.description ? `: ${state.description}` : ''}`;
    const nameY = hasCount ? box.cy - 4 : box.cy + 4;
    const classes = [
      'state',
      ...(state.final ? ['final'] : []),
      ...(state.kind && state.kind !== 'atomic' && state.kind !== 'final' ? [state.kind] : []),
      ...(busy ? ['busy'] : []),
      ...(visited.has(state.name) ? ['visited'] : []),
      ...(current.has(state.name) ? ['current'] : []),
    ].join(' ');
    let group =
      `<g class="${classes}"${pseudo ? '' : ` data-machine="${escapeHtml(model.id)}"`} data-state="${escapeHtml(state.name)}"${hasCount ? ` data-count="${count === null ? '' : count}"` : ''}>` +
      `<title>${escapeHtml(title)}</title>` +
      `<rect class="box" x="${f(box.left)}" y="${f(box.top)}" width="${f(box.width)}" height="${STATE_HEIGHT}" rx="9"/>` +
      (state.final ? `<rect class="inner" x="${f(box.left + 3)}" y="${f(box.top + 3)}" width="${f(box.width - 6)}" height="${STATE_HEIGHT - 6}" rx="7"/>` : '') +
      `<text class="name" x="${f(box.cx)}" y="${f(nameY)}" text-anchor="middle">${escapeHtml(state.name)}</text>` +
      (hasCount ? `<text class="count" x="${f(box.cx)}" y="${f(box.cy + 13)}" text-anchor="middle">${count === null ? '–' : count}</text>` : '') +
      `</g>`;
    if (options.hrefFor && !pseudo) group = `<a href="${escapeHtml(options.hrefFor(state.name))}" class="state-link">${group}</a>`;
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
svg.statechart .junction { fill: #7a8494; }
svg.statechart .junction.taken { fill: #2f8a4c; }
svg.statechart .state .box { fill: #f4f6f9; stroke: #5b6576; stroke-width: 1.2; }
svg.statechart .state.final .box { fill: #eceef2; }
svg.statechart .state .inner { fill: none; stroke: #5b6576; stroke-width: 0.8; }
svg.statechart .state.busy .box { fill: #e3efff; stroke: #2a63c7; }
svg.statechart .state .name { font-size: ${STATE_FONT}px; font-weight: bold; fill: #1f2733; }
svg.statechart .state .count { font-size: ${STATE_FONT}px; fill: #2a63c7; }
svg.statechart a.state-link:hover .box, svg.statechart a.state-link:focus .box { stroke: #2a63c7; stroke-width: 2; }
svg.statechart .state.compound .box, svg.statechart .state.parallel .box { stroke-dasharray: 5 2; fill: #fbfcfd; }
svg.statechart .state.any .box { fill: none; stroke-dasharray: 2 2; }
svg.statechart .edge.nest { stroke-dasharray: 1.5 3; }
svg.statechart .edge-label.nest text { fill: #8a93a2; }
svg.statechart .state.visited .box { fill: #e3f3e8; stroke: #2f8a4c; }
svg.statechart .state.current .box { fill: #fff0d4; stroke: #d9822b; stroke-width: 2.6; }
svg.statechart .edge.taken { stroke: #2f8a4c; stroke-width: 2.4; stroke-dasharray: none; }
svg.statechart .arrowhead.taken { fill: #2f8a4c; }
svg.statechart .edge-label.taken text { fill: #1d6b34; font-weight: bold; }
`;

/** A standalone SVG file (the CLI's `--format svg`). */
export function standaloneSvg(model: MachineModel): string {
  return renderSvg(model).replace(/<defs>/, `<style>${STATECHART_CSS}</style><defs>`);
}
