import type { AnyStateMachine, AnyStateNode } from 'xstate';
import { stateNodesOf } from '../../machines/step-machine.js';

// A statechart agent's machine as a graph of named states and transitions, read from the JSON of
// its definition (docs/statechart-agents.md, "Seen live"). The same reading serves the machine a process runs
// now and a definition stored in machine_definitions by an earlier process, so the machines page,
// a run's page and `keel machines diff` all speak of the same states:
//   - a state is named by its path below the machine ("review", "review.asking"), the form a state
//     value takes once flattened; a compound or parallel state is a state of its own;
//   - a transition is its source, its target and the event type XState gives it, with a label an
//     operator can read: done(id) and error(id) for an invoked step's outcome, named by the invoke's
//     own id where the machine gives one (the name the machine's author chose: `classify`, not the
//     step `callTool` it runs) and by its step otherwise; after(10s) for a delay, after(reminder 5s)
//     for a named one whose duration is a number; always for an eventless transition; done for a
//     compound state reaching its final state; and the name of its guard, if it has one;
//   - a compound state leads to its initial child (and a parallel state to each region) by an edge
//     marked `nest`, which is how the flat drawing shows the hierarchy;
//   - transitions of the machine itself (an `on` at the root) start from the pseudo-state "*".

/** The state a transition on the machine itself leaves from: any state. */
export const ANY_STATE = '*';
/** The event of a nest edge (a compound state entering its initial child) and of a run's first step. */
export const INIT_EVENT = 'xstate.init';
/** The event of a run's path row an operator's retry writes: the run stands in that state again (src/recovery/run-recovery.ts). */
export const RETRY_EVENT = 'keel.retry';

export type StateKind = 'atomic' | 'compound' | 'parallel' | 'final' | 'history';

export type GraphState = {
  path: string;
  parent: string | null;
  kind: StateKind;
  description: string | null;
  /** meta.status: the WORKING message shown on entering the state. */
  status: string | null;
  /** The steps it invokes: a waiting run's answer is delivered by the invoke's id. */
  invokes: Array<{ id: string; src: string }>;
};

export type GraphEdge = {
  from: string;
  to: string;
  /** The event type as XState names it (and as a run's path records it). */
  event: string;
  label: string;
  guarded: boolean;
  /** The guard's name (a named guard, an inline function's name, and(a, b) for a combined one); null without a guard. */
  guard: string | null;
  /** A compound state entering its initial child, or a parallel state its regions. */
  nest: boolean;
};

export type DefinitionGraph = {
  id: string;
  /** The root's initial state. */
  initial: string | null;
  states: GraphState[];
  edges: GraphEdge[];
};

// ---------------------------------------------------------------------------------------------
// The JSON of a definition
// ---------------------------------------------------------------------------------------------

type TransitionJson = { target?: unknown; guard?: unknown; eventType?: unknown; event?: unknown; delay?: unknown; delayMs?: unknown };
type NodeJson = {
  id?: unknown;
  key?: unknown;
  type?: unknown;
  initial?: { target?: unknown } | null;
  states?: Record<string, NodeJson>;
  on?: Record<string, TransitionJson[]>;
  always?: TransitionJson[];
  invoke?: Array<{ id?: unknown; src?: unknown }>;
  description?: unknown;
  meta?: { status?: unknown } | null;
};

/** A guard as its name: a named guard, an inline function's name, and(a, b), or(a, b), not(a) for XState's combined guards. */
function guardName(guard: unknown): string {
  if (typeof guard === 'string') return guard;
  if (typeof guard === 'function') {
    // XState's and/or/not are functions of those names carrying their operands as `guards` (and a `check`).
    const combined = guard as { guards?: unknown; check?: unknown };
    if (['and', 'or', 'not'].includes(guard.name) && combined.guards !== undefined && typeof combined.check === 'function') {
      const operands = Array.isArray(combined.guards) ? (combined.guards as unknown[]) : [combined.guards];
      return `${guard.name}(${operands.map(guardName).join(', ')})`;
    }
    return guard.name || 'inline';
  }
  if (typeof guard === 'object' && guard !== null && typeof (guard as { type?: unknown }).type === 'string') return (guard as { type: string }).type;
  return 'inline';
}

type LiveTransition = { target?: readonly AnyStateNode[] | undefined; guard?: unknown };

/**
 * The JSON of a machine's definition as Keel stores it: `machine.definition` serialized, with what
 * that serialization leaves out added back, so a drawing or a diff of a stored definition misses
 * nothing: the eventless transitions (`always`, under each state's `always`), inline guards
 * (functions, which JSON drops), named by their function's name or "inline", and the duration of
 * a named delay set to a number in setup({ delays }) (as `delayMs`, so a drawing says how long).
 */
export function definitionJson(machine: AnyStateMachine): Record<string, unknown> {
  const json = JSON.parse(JSON.stringify(machine.definition)) as NodeJson;
  const delays = (machine.implementations as { delays?: Record<string, unknown> }).delays ?? {};
  const nodes = new Map(stateNodesOf(machine.root).map((node) => [node.id, node]));
  const walk = (entry: NodeJson) => {
    const node = typeof entry.id === 'string' ? nodes.get(entry.id) : undefined;
    if (node) {
      const always = (node.always ?? []) as readonly LiveTransition[];
      if (always.length > 0) {
        entry.always = always.map((transition) => ({
          target: (transition.target ?? []).map((target) => `#${target.id}`),
          ...(transition.guard !== undefined ? { guard: guardName(transition.guard) } : {}),
          eventType: '',
        }));
      }
      for (const [eventType, transitions] of node.transitions) {
        const serialized = entry.on?.[eventType];
        if (!serialized) continue;
        (transitions as readonly LiveTransition[]).forEach((transition, index) => {
          const target = serialized[index];
          if (target && transition.guard !== undefined && target.guard === undefined) target.guard = guardName(transition.guard);
          if (target && typeof target.delay === 'string' && typeof delays[target.delay] === 'number') target.delayMs = delays[target.delay];
        });
      }
    }
    for (const child of Object.values(entry.states ?? {})) walk(child);
  };
  walk(json);
  return json as Record<string, unknown>;
}

// ---------------------------------------------------------------------------------------------
// Reading a definition
// ---------------------------------------------------------------------------------------------

const KINDS = new Set<StateKind>(['atomic', 'compound', 'parallel', 'final', 'history']);

/** A delay as a person reads it: 500ms, 10s, 2m, 1.5s; a named delay as its name. */
export function formatDelay(delay: string): string {
  if (!/^\d+(\.\d+)?$/.test(delay)) return delay;
  const ms = Number(delay);
  if (ms < 1000) return `${ms}ms`;
  if (ms % 3_600_000 === 0) return `${ms / 3_600_000}h`;
  if (ms % 60_000 === 0) return `${ms / 60_000}m`;
  return `${Number((ms / 1000).toFixed(3))}s`;
}

/**
 * The name an invoke goes by in a label: its own id when the machine gives it one, else its step.
 * XState names an invoke without an id `${index}.${state id}` (0.refund.classifying), which says
 * nothing to a reader: such an invoke is named by its step (`src`).
 */
function invokeName(source: NodeJson | null, id: string): string {
  const invokes = source?.invoke ?? [];
  const index = invokes.findIndex((candidate) => candidate.id === id);
  if (index === -1) return id;
  const invoke = invokes[index]!;
  const generated = typeof source?.id === 'string' && id === `${index}.${source.id}`;
  if (!generated) return id;
  return typeof invoke.src === 'string' ? invoke.src : id;
}

/** The label of an event type on a transition leaving `source` (whose invokes name the steps). */
function labelOf(eventType: string, source: NodeJson | null, sourceId: string, transition?: TransitionJson): string {
  if (eventType === '') return 'always';
  if (eventType.startsWith('xstate.done.actor.')) return `done(${invokeName(source, eventType.slice('xstate.done.actor.'.length))})`;
  if (eventType.startsWith('xstate.error.actor.')) return `error(${invokeName(source, eventType.slice('xstate.error.actor.'.length))})`;
  if (eventType.startsWith('xstate.done.state.')) return 'done';
  if (eventType.startsWith('xstate.after.')) {
    const rest = eventType.slice('xstate.after.'.length);
    const delay = rest.endsWith(`.${sourceId}`) ? rest.slice(0, -(sourceId.length + 1)) : rest;
    // A named delay whose duration is known says both: after(reminder 5s).
    const duration = typeof transition?.delayMs === 'number' && !/^\d+(\.\d+)?$/.test(delay) ? ` ${formatDelay(String(transition.delayMs))}` : '';
    return `after(${formatDelay(delay)}${duration})`;
  }
  return eventType;
}

const targetsOf = (transition: TransitionJson): string[] =>
  Array.isArray(transition.target) ? transition.target.filter((target): target is string => typeof target === 'string').map((target) => target.replace(/^#/, '')) : [];

/**
 * The graph of a definition's JSON (definitionJson, or a row of machine_definitions); null when the
 * JSON is not a machine's definition.
 */
export function readDefinitionGraph(definition: unknown): DefinitionGraph | null {
  if (typeof definition !== 'object' || definition === null) return null;
  const root = definition as NodeJson;
  if (typeof root.id !== 'string' || typeof root.states !== 'object' || root.states === null) return null;
  const states: GraphState[] = [];
  const pathOfId = new Map<string, string>([[root.id, '']]);
  const nodeOfPath = new Map<string, NodeJson>([['', root]]);
  const visit = (node: NodeJson, path: string, parent: string | null) => {
    for (const [key, child] of Object.entries(node.states ?? {})) {
      if (typeof child !== 'object' || child === null) continue;
      const childPath = path === '' ? key : `${path}.${key}`;
      const kind = KINDS.has(child.type as StateKind) ? (child.type as StateKind) : 'atomic';
      states.push({
        path: childPath,
        parent,
        kind,
        description: typeof child.description === 'string' ? child.description : null,
        status: typeof child.meta?.status === 'string' ? child.meta.status : null,
        invokes: (Array.isArray(child.invoke) ? child.invoke : []).map((invoke) => ({ id: String(invoke.id), src: String(invoke.src) })),
      });
      if (typeof child.id === 'string') pathOfId.set(child.id, childPath);
      nodeOfPath.set(childPath, child);
      visit(child, childPath, childPath);
    }
  };
  visit(root, '', null);

  const edges: GraphEdge[] = [];
  for (const [path, node] of nodeOfPath) {
    const from = path === '' ? ANY_STATE : path;
    const sourceId = typeof node.id === 'string' ? node.id : root.id;
    const add = (transition: TransitionJson, eventType: string) => {
      for (const target of targetsOf(transition)) {
        const to = pathOfId.get(target);
        if (to === undefined || to === '') continue;
        const guarded = transition.guard !== undefined && transition.guard !== null;
        edges.push({ from, to, event: eventType, label: labelOf(eventType, node, sourceId, transition), guarded, guard: guarded ? guardName(transition.guard) : null, nest: false });
      }
    };
    for (const [eventType, transitions] of Object.entries(node.on ?? {})) {
      for (const transition of Array.isArray(transitions) ? transitions : []) add(transition, eventType);
    }
    for (const transition of Array.isArray(node.always) ? node.always : []) add(transition, '');
    if (path === '') continue;
    if (node.type === 'parallel') {
      for (const key of Object.keys(node.states ?? {})) edges.push({ from: path, to: `${path}.${key}`, event: INIT_EVENT, label: 'parallel', guarded: false, guard: null, nest: true });
    } else if (node.type === 'compound' && node.initial) {
      for (const target of targetsOf(node.initial as TransitionJson)) {
        const to = pathOfId.get(target);
        if (to !== undefined && to !== '') edges.push({ from: path, to, event: INIT_EVENT, label: 'initial', guarded: false, guard: null, nest: true });
      }
    }
  }
  const initial = root.initial ? (targetsOf(root.initial as TransitionJson).map((target) => pathOfId.get(target)).find((path) => path !== undefined && path !== '') ?? null) : null;
  return { id: root.id, initial, states, edges };
}

/** The graph of the machine a process runs now. */
export function graphOfMachine(machine: AnyStateMachine): DefinitionGraph {
  return readDefinitionGraph(definitionJson(machine))!;
}

// ---------------------------------------------------------------------------------------------
// State values
// ---------------------------------------------------------------------------------------------

/**
 * Every state a state value stands in, as paths, ancestors included: {"review":"asking"} stands in
 * "review" and "review.asking". A parallel state's value names each region.
 */
export function activePaths(value: unknown, prefix = ''): string[] {
  const join = (key: string) => (prefix === '' ? key : `${prefix}.${key}`);
  if (typeof value === 'string') return [join(value)];
  if (typeof value !== 'object' || value === null || Array.isArray(value)) return [];
  return Object.entries(value as Record<string, unknown>).flatMap(([key, sub]) => [join(key), ...activePaths(sub, join(key))]);
}

/** The innermost states of a state value: one path, or one per region of a parallel state. */
export function leafPaths(value: unknown): string[] {
  const all = activePaths(value);
  return all.filter((path) => !all.some((other) => other.startsWith(`${path}.`)));
}

/** A state value as a person reads it: its leaf paths, comma-separated. */
export function stateText(value: unknown): string {
  const leaves = leafPaths(value);
  return leaves.length === 0 ? '–' : leaves.join(', ');
}

// ---------------------------------------------------------------------------------------------
// Counting runs in states
// ---------------------------------------------------------------------------------------------

export type StateCounts = {
  /** Open runs in each state of the graph (every state present, 0 when none; a compound state counts the runs anywhere inside it). */
  states: Record<string, number>;
  /** Open runs that have not reached their first state yet (queued). */
  notStarted: number;
  /** Open runs standing in a state this graph lacks (they started with another definition). */
  elsewhere: number;
};

/**
 * Counts open runs per state from (state value, number of runs) rows. A run counts in every state
 * its value stands in: its leaf state and each compound state around it, so a compound state's
 * number is the runs anywhere inside it, and a run in a parallel state counts once in each region.
 */
export function countRunsInStates(graph: DefinitionGraph, rows: ReadonlyArray<{ state: unknown; n: number }>): StateCounts {
  const counts: StateCounts = { states: Object.fromEntries(graph.states.map((state) => [state.path, 0])), notStarted: 0, elsewhere: 0 };
  for (const row of rows) {
    const paths = activePaths(row.state);
    if (row.state === null || row.state === undefined || paths.length === 0) {
      counts.notStarted += row.n;
      continue;
    }
    if (!paths.every((path) => path in counts.states)) {
      counts.elsewhere += row.n;
      continue;
    }
    for (const path of paths) counts.states[path]! += row.n;
  }
  return counts;
}

// ---------------------------------------------------------------------------------------------
// A run's path
// ---------------------------------------------------------------------------------------------

export type PathStep = { sequence: number; state?: unknown; event: string; at?: number };

export type TakenEdge = { from: string; to: string; event: string };

export type RunPath = {
  /** Every state the run stood in, in the order first reached. */
  visited: string[];
  /** The transitions it took, each once, in the order first taken. */
  taken: TakenEdge[];
  /** Per step: the label of its event and the states it reached. */
  steps: Array<{ sequence: number; at: number | null; event: string; label: string; state: string }>;
};

/** How many transitions inside one macrostep a step may chain through before its recorded state. */
const ALWAYS_CHAIN = 8;

/** Transitions taken inside a macrostep without an event from outside: eventless ones, and a compound state's done (raised when it reaches a final child). */
const withinMacrostep = (edge: GraphEdge) => !edge.nest && (edge.event === '' || edge.event.startsWith('xstate.done.state.'));

/**
 * The path a run took through a graph, from its committed transitions in order. A step reached
 * its state by its event from a state the previous step stood in; the eventless transitions
 * (always) and compound states' done transitions the macrostep went through on the way are
 * followed, and the compound states it entered lead to their initial child. A step the graph has no transition for (a definition changed meanwhile)
 * still marks the states it reached.
 */
export function runPathOf(graph: DefinitionGraph, steps: readonly PathStep[]): RunPath {
  const visited: string[] = [];
  const taken: TakenEdge[] = [];
  const seen = new Set<string>();
  const known = new Set(graph.states.map((state) => state.path));
  const visit = (path: string) => {
    if (known.has(path) && !visited.includes(path)) visited.push(path);
  };
  const take = (edge: GraphEdge) => {
    const key = `${edge.from}\u0000${edge.to}\u0000${edge.event}`;
    if (seen.has(key)) return;
    seen.add(key);
    taken.push({ from: edge.from, to: edge.to, event: edge.event });
  };
  const labelFor = (event: string) => {
    if (event === INIT_EVENT) return 'start';
    if (event === RETRY_EVENT) return 'retried by an operator';
    return graph.edges.find((edge) => edge.event === event && !edge.nest)?.label ?? labelOf(event, null, '');
  };

  let before: string[] = [];
  const described: RunPath['steps'] = [];
  for (const step of steps) {
    const after = activePaths(step.state);
    const reached = new Set(after);
    if (step.event === INIT_EVENT) {
      if (graph.initial) visit(graph.initial);
    } else if (step.event !== RETRY_EVENT) {
      const from = new Set([...before, ANY_STATE]);
      const direct = graph.edges.filter((edge) => !edge.nest && edge.event === step.event && from.has(edge.from));
      for (const edge of direct) {
        if (reached.has(edge.to)) {
          take(edge);
          continue;
        }
        // Through eventless transitions (and compound states' done) to where the step ended.
        const chain = alwaysChain(graph, edge.to, reached);
        if (chain) {
          take(edge);
          visit(edge.to);
          for (const link of chain) {
            take(link);
            visit(link.to);
          }
        }
      }
    }
    const entered = after.filter((path) => !before.includes(path));
    for (const edge of graph.edges) if (edge.nest && reached.has(edge.from) && entered.includes(edge.to)) take(edge);
    for (const path of after) visit(path);
    described.push({ sequence: step.sequence, at: step.at ?? null, event: step.event, label: labelFor(step.event), state: stateText(step.state) });
    before = after;
  }
  return { visited, taken, steps: described };
}

function alwaysChain(graph: DefinitionGraph, start: string, goal: Set<string>): GraphEdge[] | null {
  let frontier: Array<{ at: string; chain: GraphEdge[] }> = [{ at: start, chain: [] }];
  for (let depth = 0; depth < ALWAYS_CHAIN && frontier.length > 0; depth += 1) {
    const next: typeof frontier = [];
    for (const { at, chain } of frontier) {
      for (const edge of graph.edges) {
        if (!withinMacrostep(edge) || (edge.from !== at && !at.startsWith(`${edge.from}.`))) continue;
        const extended = [...chain, edge];
        if (goal.has(edge.to)) return extended;
        if (!chain.some((link) => link.to === edge.to)) next.push({ at: edge.to, chain: extended });
      }
    }
    frontier = next;
  }
  return null;
}

// ---------------------------------------------------------------------------------------------
// What changed between two definitions
// ---------------------------------------------------------------------------------------------

export type DefinitionDiff = {
  statesAdded: string[];
  statesRemoved: string[];
  transitionsAdded: string[];
  transitionsRemoved: string[];
  /** States of both whose invokes changed (a run waiting there on a step whose id is gone cannot go on). */
  invokesChanged: string[];
};

const invokesText = (invokes: GraphState['invokes']) => (invokes.length === 0 ? 'none' : invokes.map((invoke) => `${invoke.src} (id ${invoke.id})`).join(', '));

/** A transition as a line of a diff: "classifying --done(classify)--> review", with [its guard's name] when it has one. */
export function transitionText(edge: GraphEdge): string {
  return `${edge.from} --${edge.label}--> ${edge.to}${edge.guarded ? ` [${edge.guard ?? 'guarded'}]` : ''}`;
}

/**
 * What changed from `older` to `current`: states by path, transitions by source, label, target and
 * guard (the label, not the raw event type: a step renamed under the same invoke id is the same
 * transition, an invoke given another id or a guard renamed is not), and the invokes of the states both have (by id and
 * step: the id is what a waiting run's answer is delivered by).
 */
export function diffDefinitions(older: DefinitionGraph, current: DefinitionGraph): DefinitionDiff {
  const statesOf = (graph: DefinitionGraph) => new Set(graph.states.map((state) => state.path));
  const transitionsOf = (graph: DefinitionGraph) => new Set(graph.edges.map(transitionText));
  const [oldStates, newStates] = [statesOf(older), statesOf(current)];
  const [oldEdges, newEdges] = [transitionsOf(older), transitionsOf(current)];
  const minus = (a: Set<string>, b: Set<string>) => [...a].filter((item) => !b.has(item)).sort();
  return {
    statesAdded: minus(newStates, oldStates),
    statesRemoved: minus(oldStates, newStates),
    transitionsAdded: minus(newEdges, oldEdges),
    transitionsRemoved: minus(oldEdges, newEdges),
    invokesChanged: older.states.flatMap((state) => {
      const now = current.states.find((candidate) => candidate.path === state.path);
      if (!now || invokesText(now.invokes) === invokesText(state.invokes)) return [];
      return [`${state.path}: ${invokesText(state.invokes)} -> ${invokesText(now.invokes)}`];
    }),
  };
}

/**
 * The steps a run standing in `value` under `older` runs that `current` no longer invokes there (by
 * id): resumed under `current`, the run cannot deliver their outcome and fails.
 */
export function orphanedSteps(older: DefinitionGraph, current: DefinitionGraph, value: unknown): string[] {
  return activePaths(value).flatMap((path) => {
    const before = older.states.find((state) => state.path === path);
    const now = current.states.find((state) => state.path === path);
    if (!before || !now) return [];
    return before.invokes.filter((invoke) => !now.invokes.some((candidate) => candidate.id === invoke.id)).map((invoke) => `${path}: ${invoke.src} (id ${invoke.id})`);
  });
}
