import type { AnyStateMachine } from 'xstate';

// Reads transition tables out of XState definitions, so repositories and diagrams never keep a
// second, hand-written list of which status may follow which.

/** Whether a module's export is an XState machine (made with createMachine or setup().createMachine). */
export function isMachine(value: unknown): value is AnyStateMachine {
  if (typeof value !== 'object' || value === null) return false;
  const candidate = value as { root?: { states?: unknown }; config?: unknown; id?: unknown; transition?: unknown; getInitialSnapshot?: unknown };
  return (
    typeof candidate.id === 'string' &&
    typeof candidate.transition === 'function' &&
    typeof candidate.getInitialSnapshot === 'function' &&
    typeof candidate.root?.states === 'object' &&
    typeof candidate.config === 'object'
  );
}

export type MachineEdge = { from: string; event: string; to: string; guarded: boolean };

export function machineStates(machine: AnyStateMachine): string[] {
  return Object.keys(machine.root.states);
}

export function finalStates(machine: AnyStateMachine): string[] {
  return Object.entries(machine.root.states)
    .filter(([, node]) => node.type === 'final')
    .map(([key]) => key);
}

// Machine definitions never change once built: their edges are read once (repositories ask for
// allowed-from lists on every guarded write).
const edgesOf = new WeakMap<AnyStateMachine, readonly MachineEdge[]>();

export function machineEdges(machine: AnyStateMachine): MachineEdge[] {
  let edges = edgesOf.get(machine);
  if (!edges) {
    edges = readEdges(machine);
    edgesOf.set(machine, edges);
  }
  return edges.map((edge) => ({ ...edge }));
}

function readEdges(machine: AnyStateMachine): MachineEdge[] {
  const edges: MachineEdge[] = [];
  for (const [from, node] of Object.entries(machine.root.states)) {
    for (const [event, transitions] of Object.entries(node.on)) {
      for (const transition of transitions) {
        for (const target of transition.target ?? []) {
          edges.push({ from, event, to: target.key, guarded: transition.guard !== undefined });
        }
      }
    }
  }
  return edges;
}

const allowedCache = new WeakMap<AnyStateMachine, Map<string, readonly string[]>>();

/** The statuses from which `event` is accepted, optionally only those leading to `to`. */
export function allowedFrom(machine: AnyStateMachine, event: string, to?: string): string[] {
  let cache = allowedCache.get(machine);
  if (!cache) {
    cache = new Map();
    allowedCache.set(machine, cache);
  }
  const key = to === undefined ? event : `${event}\u0000${to}`;
  let sources = cache.get(key);
  if (!sources) {
    sources = Object.freeze(readAllowedFrom(machine, event, to));
    cache.set(key, sources);
  }
  return [...sources];
}

function readAllowedFrom(machine: AnyStateMachine, event: string, to?: string): string[] {
  const sources = (edgesOf.get(machine) ?? machineEdges(machine))
    .filter((edge) => edge.event === event && (to === undefined || edge.to === to))
    .map((edge) => edge.from);
  if (sources.length === 0) throw new Error(`machine ${machine.id} has no transition for event ${event}`);
  return [...new Set(sources)];
}

/** The status `event` leads to; every Keel machine maps one event to one target. */
export function targetOf(machine: AnyStateMachine, event: string): string {
  const targets = [...new Set((edgesOf.get(machine) ?? machineEdges(machine)).filter((edge) => edge.event === event).map((edge) => edge.to))];
  if (targets.length !== 1) throw new Error(`event ${event} of machine ${machine.id} does not have exactly one target`);
  return targets[0]!;
}
