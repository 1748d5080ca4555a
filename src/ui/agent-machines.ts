import type { CommonQueryMethods } from 'slonik';
import type { AgentRegistry } from '../agents/agent-registry.js';
import {
  activePaths,
  countRunsInStates,
  graphOfMachine,
  readDefinitionGraph,
  runPathOf,
  stateText,
  type DefinitionGraph,
  type RunPath,
  type StateCounts,
} from '../statecharts/definition-graph.js';
import { definitionOf, openRunsByState } from '../statecharts/definition-repository.js';
import { describeGraph, type MachineModel } from './statechart.js';
import { machineStepsOf } from './ui-queries.js';

// The statechart agents the operator UI draws (docs/statechart-agents.md, "Seen live"): each agent whose
// config names a `machine`, drawn from the definition this process runs, with the open runs of the
// agent counted per state from runs.machine_state.

export type AgentMachine = {
  agent: string;
  /** The key of its counts beside the lifecycle machines' (/ui/api/counts, data-machine): "agent/<id>". */
  key: string;
  /** The hash of the definition this process runs (its version). */
  hash: string;
  /** The module, as configured. */
  file: string;
  graph: DefinitionGraph;
  model: MachineModel;
};

/** Keys of a statechart agent's counts that are not states (no state path has a #). */
export const NOT_STARTED = '#not-started';
export const ELSEWHERE = '#elsewhere';

export const agentMachineKey = (agent: string) => `agent/${agent}`;
export const agentStateHref = (agent: string, state: string) => `/ui/agents/${encodeURIComponent(agent)}/${encodeURIComponent(state)}`;

/** The statechart agents of a registry, in the config's order. */
export function agentMachinesOf(registry: Pick<AgentRegistry, 'agents'> | undefined): AgentMachine[] {
  if (!registry) return [];
  return [...registry.agents.entries()].flatMap(([agent, registered]) => {
    if (!registered.statechart) return [];
    const graph = graphOfMachine(registered.statechart.machine);
    const key = agentMachineKey(agent);
    return [{ agent, key, hash: registered.statechart.hash, file: registered.statechart.path, graph, model: describeGraph(graph, key) }];
  });
}

/** A stored definition drawn the same way (a run that started with an older version); null when it is not a definition. */
export function storedAgentMachine(agent: string, hash: string, definition: unknown): AgentMachine | null {
  const graph = readDefinitionGraph(definition);
  if (!graph) return null;
  const key = agentMachineKey(agent);
  return { agent, key, hash, file: '', graph, model: describeGraph(graph, key) };
}

/**
 * Open runs per state of each statechart agent, keyed as the counts of /ui/api/counts are: every
 * state of the drawing (a compound state counting the runs anywhere inside it), plus NOT_STARTED
 * (runs before their first transition) and ELSEWHERE (runs in a state this version lacks).
 */
export async function countAgentStates(db: CommonQueryMethods, machines: readonly AgentMachine[]): Promise<Record<string, Record<string, number>>> {
  if (machines.length === 0) return {};
  const rows = await openRunsByState(
    db,
    machines.map((machine) => machine.agent),
  );
  const result: Record<string, Record<string, number>> = {};
  for (const machine of machines) {
    const counted: StateCounts = countRunsInStates(
      machine.graph,
      rows.filter((row) => row.agent === machine.agent).map((row) => ({ state: row.machine_state, n: row.n })),
    );
    result[machine.key] = { ...counted.states, [NOT_STARTED]: counted.notStarted, [ELSEWHERE]: counted.elsewhere };
  }
  return result;
}

/** What a run's page shows of its machine. */
export type RunMachineView = {
  /** The drawing: the definition the run records (when stored), else the current one; null when neither is known. */
  machine: AgentMachine | null;
  /** The version the run records (runs.machine_hash), null before its first transition. */
  runHash: string | null;
  note: string | null;
  path: RunPath;
  /** The states the run stands in now (runs.machine_state), ancestors included. */
  current: string[];
  currentText: string;
};

const NO_GRAPH: DefinitionGraph = { id: '', initial: null, states: [], edges: [] };

/**
 * The machine of a run of a statechart agent with the path it took (run_machine_steps) and where
 * it stands (runs.machine_state); null for a run of any other agent. The run is drawn on the
 * version its latest transition ran on (each path row names it; before any, the version it started
 * with, runs.machine_hash) when that version is stored, so its path is drawn on the states it went
 * through; else on the current version, with a note.
 */
export async function runMachineView(
  db: CommonQueryMethods,
  run: { id: string; agent: string; machine_hash?: string | null | undefined; machine_state?: unknown },
  machines: readonly AgentMachine[],
): Promise<RunMachineView | null> {
  const current = machines.find((machine) => machine.agent === run.agent) ?? null;
  const runHash = run.machine_hash ?? null;
  if (!current && runHash === null) return null;
  const steps = await machineStepsOf(db, run.id);
  const drawnHash = steps.at(-1)?.machine_hash ?? runHash;
  let machine = current;
  const notes: string[] = [];
  if (runHash !== null && drawnHash !== runHash) notes.push(`The run started with version ${runHash}; its latest transition ran on version ${drawnHash}.`);
  if (drawnHash !== null && current?.hash !== drawnHash) {
    const stored = await definitionOf(db, run.agent, drawnHash);
    const drawn = stored ? storedAgentMachine(run.agent, drawnHash, stored.definition) : null;
    if (drawn) {
      machine = drawn;
      notes.push(
        current
          ? `Drawn is version ${drawnHash}, the one the run went through; this process runs version ${current.hash} (keel machines diff ${run.agent} shows what changed).`
          : `Agent ${run.agent} is no statechart agent in this process's config; drawn is version ${drawnHash}, as recorded.`,
      );
    } else {
      notes.push(
        current
          ? `Version ${drawnHash} is not recorded in machine_definitions: drawn is the current version ${current.hash}.`
          : `Agent ${run.agent} is no statechart agent in this process's config and version ${drawnHash} is not recorded: the machine cannot be drawn.`,
      );
    }
  }
  const state = run.machine_state ?? null;
  return {
    machine,
    runHash,
    note: notes.length > 0 ? notes.join(' ') : null,
    path: runPathOf(machine?.graph ?? NO_GRAPH, steps),
    current: activePaths(state),
    currentText: state === null ? 'no state yet' : stateText(state),
  };
}
