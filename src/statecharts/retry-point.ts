import type { ToolEffect } from '../tools/tool.js';
import { activePaths, graphOfMachine, stateText } from './definition-graph.js';
import { stateIdsOf, type StatechartDefinition } from './statechart-definition.js';
import type { MachineRecord, RunningStep } from './statechart-run.js';

// Where an operator's retry of a failed statechart run starts (docs/operator.md, "Recovering runs";
// docs/decisions/0079-a-retry-never-repeats-a-non-idempotent-step.md). Pure: it is given the run's
// committed transitions with their opened restore points and the agent's current definition, and
// picks the point, or says why the retry is refused:
//   - the run committed no state with a restore point, or never stood in the state asked for;
//   - the current version of the machine lacks the state, or no longer runs there a step the
//     state was running (what `keel machines diff` marks as stranding a run);
//   - from that point the run would run again a non-idempotent step it already started: a step in
//     flight at that point, or any step started after it. Such a retry is refused, never replayed.

/** What a restore point holds of the run's durable state (workers/statechart-agent-run.ts). */
export type RestoredState = {
  machine?: MachineRecord | null;
  startedSteps?: Record<string, { id: string; src: string; effect: ToolEffect }>;
  [key: string]: unknown;
};

/** One committed transition of the run, its restore point opened (null: none stored, or it cannot be opened). */
export type CommittedPoint = { sequence: number; value: unknown; event: string; hash: string; state: RestoredState | null };

export type RetryRefusal =
  | { reason: 'no_restore_point'; message: string }
  | { reason: 'state_not_passed'; message: string; passed: string[] }
  | { reason: 'machine_incompatible'; message: string }
  | { reason: 'non_idempotent_step'; message: string; step: string; allowed: string[] };

export type RetryPoint = { point: CommittedPoint & { state: RestoredState & { machine: MachineRecord } }; name: string };

export type RetryPlan = { ok: true; retry: RetryPoint } | ({ ok: false } & RetryRefusal);

const statusOf = (record: MachineRecord) => (record.snapshot as { status?: unknown } | null)?.status;

/** The points a run may restart from: a restore point whose machine was still active (not its error, not its end). */
function restartable(points: readonly CommittedPoint[]): Array<RetryPoint['point']> {
  return points.filter((point): point is RetryPoint['point'] => point.state?.machine != null && statusOf(point.state.machine) === 'active');
}

/** Whether `name` names the point's state: its text ("review.approval") or one of its active paths ("review"). */
const names = (point: CommittedPoint, name: string) => stateText(point.value) === name || activePaths(point.value).includes(name);

const stepIndex = (key: string) => Number.parseInt(key, 10);

/** The non-idempotent steps a restart from `record` would run again: in flight there, or started after it. */
function repeatedWrites(record: MachineRecord, started: Record<string, { id: string; src: string; effect: ToolEffect }>): Array<{ key: string; id: string; src: string }> {
  const inFlight = new Set(record.running.map((step) => step.key));
  return Object.entries(started)
    .filter(([key, step]) => step.effect === 'non_idempotent_write' && (inFlight.has(key) || stepIndex(key) >= record.nextStep))
    .map(([key, step]) => ({ key, id: step.id, src: step.src }));
}

/** Why the current definition cannot take the run on from `value` with these steps in flight, or null. */
export function incompatibility(definition: StatechartDefinition, value: unknown, running: readonly RunningStep[]): string | null {
  const { missing } = stateIdsOf(definition.machine, value);
  if (missing.length > 0) return `the current version of the machine (${definition.hash}) has no state ${missing.join(', ')}`;
  const graph = graphOfMachine(definition.machine);
  const invoked = new Map(activePaths(value).flatMap((path) => graph.states.find((state) => state.path === path)?.invokes ?? []).map((invoke) => [invoke.id, invoke.src]));
  for (const step of running) {
    if (!invoked.has(step.id)) return `the current version of the machine (${definition.hash}) no longer runs step ${step.id} in state ${stateText(value)}`;
    if (!definition.steps.has(step.src)) return `the current version of the machine (${definition.hash}) has no step ${step.src}`;
  }
  return null;
}

/**
 * The point a retry starts from: the latest restartable point standing in `stateName`, or the
 * latest of all without one; or the refusal.
 */
export function planRetry(points: readonly CommittedPoint[], definition: StatechartDefinition, agent: string, stateName?: string): RetryPlan {
  const candidates = restartable(points);
  if (candidates.length === 0) {
    return { ok: false, reason: 'no_restore_point', message: 'the run committed no state of its machine a retry can start from' };
  }
  const passed = [...new Set(candidates.map((point) => stateText(point.value)))];
  const chosen = stateName === undefined ? candidates.at(-1)! : candidates.filter((point) => names(point, stateName)).at(-1);
  if (!chosen) {
    return { ok: false, reason: 'state_not_passed', passed, message: `the run never stood in state ${stateName}; it passed through ${passed.join(', ')}` };
  }
  const name = stateText(chosen.value);
  const why = incompatibility(definition, chosen.value, chosen.state.machine.running);
  if (why !== null) {
    return { ok: false, reason: 'machine_incompatible', message: `cannot retry from state ${name}: ${why} (\`keel machines diff ${agent}\` lists what changed)` };
  }
  // Every step the run ever started is in its latest restore point (each is committed with the transition that started it).
  const started: Record<string, { id: string; src: string; effect: ToolEffect }> = {};
  for (const point of points) Object.assign(started, point.state?.startedSteps ?? {});
  const repeated = repeatedWrites(chosen.state.machine, started);
  if (repeated.length > 0) {
    const step = repeated[0]!;
    const allowed = [...new Set(candidates.filter((point) => repeatedWrites(point.state.machine, started).length === 0).map((point) => stateText(point.value)))];
    return {
      ok: false,
      reason: 'non_idempotent_step',
      step: step.id,
      allowed,
      message:
        `cannot retry from state ${name}: the run would run again step ${step.id} (${step.src}), a non-idempotent write it already started` +
        (allowed.length > 0 ? `; a retry may start from ${allowed.join(', ')}` : '; no state of this run is after it'),
    };
  }
  return { ok: true, retry: { point: chosen, name } };
}
