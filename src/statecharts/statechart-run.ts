import type { AnyMachineSnapshot, AnyStateNode, StateValue } from 'xstate';
import { inertScope, type ExecutableAction } from '../../machines/step-machine.js';
import type { ArtifactEmission, Part } from '../providers/provider.js';
import { stateIdsOf, type StatechartDefinition } from './statechart-definition.js';
import { errorClassOf, stepErrorOf, stepFailureWhat, type StepError } from './step-failure.js';
import type { StatechartOutput, StepMarker } from './steps.js';

// Runs a statechart agent's machine durably, transition by transition (docs/statechart-agents.md).
// Like machines/step-machine.ts it computes each macrostep with the machine's own pure transition
// function, with no actor: the invokes a state starts are steps the host performs. Unlike it, every
// transition is committed (the persisted snapshot, the steps in flight, the timers) before the
// machine goes on, and a run starts from the last committed record:
//   - a step's outcome reaches the machine as the done (or error) event a promise actor would send,
//     and the transition it causes commits with the step's output in the new snapshot; a crash
//     before that commit leaves the step in the record's `running` list, and the restored run
//     performs it again (the host refuses a non-idempotent one: it dead-letters the run);
//   - a step that waits for someone (askInput, askApproval, callRemoteAgent) suspends the run once
//     nothing else is in flight; the answer comes back as that step's done event;
//   - a delayed transition (`after`, a delayed raise) is a timer with a due time in the record: a
//     short one is waited for in process, a longer one suspends the run until the sweep wakes it;
//   - entering a state with meta.status shows that message; emit({ type: 'artifact', ... }) shows
//     an artifact. Both are committed with the transition that caused them.
// The host does the I/O (steps, commits); this module decides.

/** A step the machine started and has not had the outcome of. */
export type RunningStep = { id: string; src: string; input: unknown; key: string };
/** A delayed event: an `after` transition or a delayed raise. */
export type DurableTimer = { id: string; event: { type: string }; dueAt: number };

/** What is committed with every transition (sealed, in the run's suspended_state). */
export type MachineRecord = {
  /** The definition that wrote this record. */
  hash: string;
  /** The definition the run started with. */
  startedWith: string;
  snapshot: unknown;
  running: RunningStep[];
  timers: DurableTimer[];
  /** Steps started so far: the next step's key. */
  nextStep: number;
  /** Transitions committed so far: the next row of the run's path. */
  transitions: number;
};

export type WaitStatus = 'waiting_for_input' | 'waiting_for_approval' | 'waiting_for_dependency';

export type StepOutcome =
  | { kind: 'done'; output: unknown }
  | { kind: 'error'; error: unknown }
  /** The step waits for someone: the run suspends (once nothing else is in flight) until it is answered. */
  | { kind: 'wait'; status: WaitStatus; pending: unknown }
  | { kind: 'stop'; why: 'lease_lost' | 'cancelled' };

/** What a transition shows a client: status messages of entered states, emitted artifacts. */
export type Shown = { statuses: string[]; artifacts: ArtifactEmission[] };

export type CommitInput = { record: MachineRecord; value: StateValue; event: string; shown: Shown };

export type StatechartHost = {
  perform: (step: RunningStep, marker: StepMarker, signal: AbortSignal) => Promise<StepOutcome>;
  /** Commits the transition; false: the run is no longer this worker's (lease lost, cancelled). */
  commit: (input: CommitInput) => Promise<boolean>;
  /** Whether the run may go on before the next step (lease, cancellation). */
  checkpoint: () => Promise<{ alive: true } | { alive: false; why: 'lease_lost' | 'cancelled' }>;
  /** Aborted when the run is cancelled: a wait for a step or an in-process timer ends at once. */
  cancelled?: AbortSignal;
};

export type StatechartResult =
  | { kind: 'complete'; output: unknown; record: MachineRecord }
  /** error: the step's error no transition handled (step: its invoke's id; null when the error was not a step's). */
  | { kind: 'fail'; detail: Record<string, unknown>; error?: { step: string | null } & StepError }
  /** dueAt: the machine also waits for a timer there; it wakes the run if nobody answers first. */
  | { kind: 'wait'; status: WaitStatus; pending: unknown; step: RunningStep; record: MachineRecord; dueAt?: number }
  | { kind: 'sleep'; dueAt: number; record: MachineRecord }
  | { kind: 'stop'; why: 'lease_lost' | 'cancelled' };

export type StatechartStart = {
  record: MachineRecord | null;
  input: unknown;
  /**
   * The answer to the step the run waited for (a resume), delivered as its done event, or as its
   * error event when `error` is set. Without an answer, a step left in the record runs again.
   */
  answer: { stepId: string; output: unknown; error?: unknown } | null;
};

/** Timers due within this are waited for in the process; later ones suspend the run durably. */
export const INLINE_TIMER_MS = 3000;

type Action = ExecutableAction;
type Settled = { id: string; outcome: StepOutcome };

const doneEvent = (id: string, output: unknown) => ({ type: `xstate.done.actor.${id}`, output, actorId: id });
const ERROR_EVENT = 'xstate.error.actor.';
const errorEvent = (id: string, error: unknown) => ({ type: `${ERROR_EVENT}${id}`, error, actorId: id });

/** Plain JSON of an error, so a machine can read it and a record can hold it. */
function errorValue(error: unknown): unknown {
  if (error instanceof Error) return { message: error.message, name: errorClassOf(error) };
  return error;
}

/** The parts of an emitted artifact or an output artifact: parts as given, else text, else data. */
function partsOf(item: { parts?: unknown; text?: unknown; data?: unknown }): Part[] {
  if (Array.isArray(item.parts)) return item.parts as Part[];
  const parts: Part[] = [];
  if (typeof item.text === 'string') parts.push({ text: item.text });
  if (item.data !== undefined) parts.push({ data: item.data } as Part);
  return parts;
}

/** The answer text and the artifacts of a machine's output (StatechartOutput, documented in docs/statechart-agents.md). */
export function resultOfOutput(output: unknown): { answer: string | null; artifacts: ArtifactEmission[] } {
  if (output === undefined || output === null) return { answer: null, artifacts: [] };
  if (typeof output === 'string') return { answer: output, artifacts: [] };
  if (typeof output !== 'object') return { answer: JSON.stringify(output), artifacts: [] };
  const shaped = output as Exclude<StatechartOutput, string>;
  const artifacts: ArtifactEmission[] = [];
  if (shaped.data !== undefined) artifacts.push({ artifactId: 'result', name: 'result', parts: [{ data: shaped.data } as Part], lastChunk: true });
  for (const [index, artifact] of (shaped.artifacts ?? []).entries()) {
    artifacts.push({
      artifactId: `output-${index}`,
      name: artifact.name,
      ...(artifact.description ? { description: artifact.description } : {}),
      parts: partsOf(artifact),
      lastChunk: true,
    });
  }
  const known = 'text' in shaped || 'data' in shaped || 'artifacts' in shaped;
  return { answer: typeof shaped.text === 'string' ? shaped.text : known ? null : JSON.stringify(output), artifacts };
}

/** A state value as one name: "asking", or JSON for a nested or parallel value. */
const stateName = (value: unknown): string => (typeof value === 'string' ? value : JSON.stringify(value));

/** The state nodes the machine stands in (XState keeps them on the snapshot). */
const nodesOf = (snapshot: AnyMachineSnapshot): readonly AnyStateNode[] => (snapshot as unknown as { _nodes: AnyStateNode[] })._nodes;
const activeIds = (snapshot: AnyMachineSnapshot) => new Set(nodesOf(snapshot).map((node) => node.id));
/** The invokes of the states the machine stands in: the only steps it can have. */
const invokeIdsOf = (snapshot: AnyMachineSnapshot) => new Set(nodesOf(snapshot).flatMap((node) => node.invoke.map((invoke) => invoke.id)));

/** The persisted snapshot without children: a run's steps are in the record, not actors. */
function persisted(snapshot: AnyMachineSnapshot): unknown {
  const { children: _children, ...rest } = snapshot.machine.getPersistedSnapshot(snapshot) as Record<string, unknown>;
  return { ...rest, children: {} };
}

export async function runStatechart(definition: StatechartDefinition, start: StatechartStart, host: StatechartHost): Promise<StatechartResult> {
  const { machine, hash } = definition;
  let collected: Action[] = [];
  const scope = inertScope((action) => collected.push(action));
  const computed = (compute: () => AnyMachineSnapshot): [AnyMachineSnapshot, Action[]] => {
    const actions: Action[] = [];
    collected = actions;
    try {
      return [compute(), actions];
    } finally {
      collected = [];
    }
  };

  let record: MachineRecord;
  let snapshot: AnyMachineSnapshot;
  let actions: Action[];
  let eventType: string;
  let before = new Set<string>();

  if (start.record === null) {
    record = { hash, startedWith: hash, snapshot: null, running: [], timers: [], nextStep: 0, transitions: 0 };
    [snapshot, actions] = computed(() => machine.getInitialSnapshot(scope, start.input));
    eventType = 'xstate.init';
  } else {
    record = { ...start.record };
    const stored = record.snapshot as { value?: unknown };
    const { missing } = stateIdsOf(machine, stored.value);
    if (missing.length > 0) {
      return {
        kind: 'fail',
        detail: { reason: 'machine_version', state: missing[0]!, startedWith: record.startedWith, current: hash },
      };
    }
    try {
      snapshot = machine.restoreSnapshot(stored as never, scope) as AnyMachineSnapshot;
    } catch (error) {
      return { kind: 'fail', detail: { reason: 'machine_version', state: stateName(stored.value), startedWith: record.startedWith, current: hash, error: (error as Error).message } };
    }
    record.hash = hash;
    before = activeIds(snapshot);
    // A step of the record must still be an invoke of a state the run stands in, or its outcome
    // would reach nothing (an invoke renamed in the new definition): the run cannot go on.
    const invokes = invokeIdsOf(snapshot);
    const orphan = [...record.running, ...(start.answer ? [{ id: start.answer.stepId }] : [])].find((step) => !invokes.has(step.id));
    if (orphan) {
      return {
        kind: 'fail',
        detail: { reason: 'machine_version', state: stateName(stored.value), step: orphan.id, startedWith: record.startedWith, current: hash },
      };
    }
    if (start.answer) {
      const answered = start.answer;
      record.running = record.running.filter((step) => step.id !== answered.stepId);
      const current = snapshot;
      const event = answered.error === undefined ? doneEvent(answered.stepId, answered.output) : errorEvent(answered.stepId, answered.error);
      [snapshot, actions] = computed(() => machine.transition(current, event, scope));
      eventType = event.type;
    } else {
      actions = [];
      eventType = '';
    }
  }

  /** Steps performed in this process, by id; a wait is answered at once and kept apart. */
  const inFlight = new Map<string, { settled: Promise<Settled>; abort: AbortController }>();
  const waits = new Map<string, Extract<StepOutcome, { kind: 'wait' }>>();

  const stopAll = () => {
    for (const entry of inFlight.values()) entry.abort.abort();
    inFlight.clear();
  };

  /** Carries out a transition's actions into the record; returns what it shows. */
  function carryOut(list: readonly Action[], next: AnyMachineSnapshot, entered: Set<string>): Shown {
    const shown: Shown = { statuses: [], artifacts: [] };
    for (const node of nodesOf(next)) {
      const status = (node.meta as { status?: unknown } | undefined)?.status;
      if (!entered.has(node.id) && typeof status === 'string') shown.statuses.push(status);
    }
    for (const action of list) {
      const params = action.params as Record<string, unknown> | undefined;
      switch (action.type) {
        case 'xstate.spawnChild': {
          const { id, src, input } = params as { id: string; src: unknown; input: unknown };
          // A state re-entered starts its invoke again: the new step replaces the old one.
          forget(id);
          record.running.push({ id, src: String(src), input: input ?? null, key: `${record.nextStep}-${id}` });
          record.nextStep += 1;
          break;
        }
        case 'xstate.raise':
          if (typeof params?.delay === 'number') {
            const id = String(params.id ?? `raise-${record.transitions}-${record.timers.length}`);
            record.timers = [...record.timers.filter((timer) => timer.id !== id), { id, event: params.event as { type: string }, dueAt: Date.now() + params.delay }];
          }
          break;
        case 'xstate.cancel':
          record.timers = record.timers.filter((timer) => timer.id !== String(params?.sendId));
          break;
        case 'xstate.emit': {
          const event = params?.event as { type?: string; artifactId?: string; name?: string; description?: string; append?: boolean; lastChunk?: boolean } | undefined;
          if (event?.type === 'artifact') {
            shown.artifacts.push({
              ...(event.artifactId ? { artifactId: event.artifactId } : {}),
              ...(event.name ? { name: event.name } : {}),
              ...(event.description ? { description: event.description } : {}),
              parts: partsOf(event as never),
              append: event.append ?? false,
              lastChunk: event.lastChunk ?? false,
            });
          }
          break;
        }
        default:
          break;
      }
    }
    // The steps of states left are dropped here, not by XState's stopChild: a restored snapshot has
    // no children, so stopChild names none. Only the invokes of the states the machine stands in
    // now keep their steps.
    const invoked = invokeIdsOf(next);
    for (const step of record.running) if (!invoked.has(step.id)) forget(step.id);
    return shown;
  }

  /** A step whose invoking state was left: out of the record, and its outcome, if it still comes, goes nowhere. */
  function forget(id: string): void {
    record.running = record.running.filter((step) => step.id !== id);
    inFlight.get(id)?.abort.abort();
    inFlight.delete(id);
    waits.delete(id);
  }

  async function commit(shown: Shown): Promise<boolean> {
    record.snapshot = persisted(snapshot);
    record.transitions += 1;
    return host.commit({ record: structuredClone(record), value: snapshot.value, event: eventType, shown });
  }

  try {
    if (eventType !== '') {
      const shown = carryOut(actions, snapshot, before);
      if (!(await commit(shown))) return { kind: 'stop', why: 'lease_lost' };
    }
    for (;;) {
      if (snapshot.status === 'error') {
        // The detail is stored in clear (runs.failure_detail): names only (the state, the step, the
        // error's class); the error's message, which may carry content, is the host's to keep at
        // the run's audit level (step-failure.ts).
        const step = eventType.startsWith(ERROR_EVENT) ? eventType.slice(ERROR_EVENT.length) : null;
        const error = stepErrorOf(snapshot.error);
        return {
          kind: 'fail',
          detail: {
            reason: 'machine_error',
            state: stateName(snapshot.value),
            ...(step === null ? {} : { step }),
            errorClass: error.errorClass,
            error: stepFailureWhat(step),
          },
          error: { step, ...error },
        };
      }
      if (snapshot.status === 'done') return { kind: 'complete', output: snapshot.output, record };

      // Steps of the record not performed yet in this process (new ones, or those a crash interrupted).
      for (const step of record.running) {
        if (inFlight.has(step.id) || waits.has(step.id)) continue;
        const marker = definition.steps.get(step.src);
        if (!marker) return { kind: 'fail', detail: { reason: 'machine_version', state: `a step of ${step.src}`, startedWith: record.startedWith, current: hash } };
        const checked = await host.checkpoint();
        if (!checked.alive) return { kind: 'stop', why: checked.why };
        const abort = new AbortController();
        const settled = Promise.resolve()
          .then(() => host.perform(step, marker, abort.signal))
          .then(
            (outcome): Settled => ({ id: step.id, outcome }),
            (error: unknown): Settled => ({ id: step.id, outcome: { kind: 'error', error: errorValue(error) } }),
          );
        inFlight.set(step.id, { settled, abort });
      }

      const earliest = record.timers.reduce<DurableTimer | null>((first, timer) => (first === null || timer.dueAt < first.dueAt ? timer : first), null);
      if (inFlight.size === 0) {
        const dueIn = earliest ? earliest.dueAt - Date.now() : null;
        if (dueIn === null || dueIn > INLINE_TIMER_MS) {
          // Someone must answer, or a long timer runs: the run suspends either way, until the answer
          // or the timer's due time, whichever comes first.
          const first = waits.entries().next().value;
          if (first) {
            const [id, wait] = first;
            const step = record.running.find((candidate) => candidate.id === id)!;
            return { kind: 'wait', status: wait.status, pending: wait.pending, step, record, ...(earliest ? { dueAt: earliest.dueAt } : {}) };
          }
          if (earliest) return { kind: 'sleep', dueAt: earliest.dueAt, record };
          return {
            kind: 'fail',
            detail: { reason: 'machine_error', state: stateName(snapshot.value), error: 'the machine rests with no step running and no timer: it waits for an event nothing can send' },
          };
        }
      }

      // The next thing to happen: a step's outcome or a timer running out.
      const racers: Promise<Settled | { timer: DurableTimer } | { cancelled: true }>[] = [...inFlight.values()].map((entry) => entry.settled);
      let clock: NodeJS.Timeout | undefined;
      if (earliest) {
        racers.push(new Promise((resolve) => (clock = setTimeout(() => resolve({ timer: earliest }), Math.min(Math.max(0, earliest.dueAt - Date.now()), 2 ** 31 - 1)))));
      }
      const cancelled = host.cancelled;
      let stopListening = () => undefined as void;
      if (cancelled) {
        racers.push(
          new Promise((resolve) => {
            const onCancel = () => resolve({ cancelled: true });
            if (cancelled.aborted) return onCancel();
            cancelled.addEventListener('abort', onCancel, { once: true });
            stopListening = () => cancelled.removeEventListener('abort', onCancel);
          }),
        );
      }
      const next = await Promise.race(racers);
      if (clock) clearTimeout(clock);
      stopListening();
      if ('cancelled' in next) return { kind: 'stop', why: 'cancelled' };

      let event: { type: string };
      if ('timer' in next) {
        record.timers = record.timers.filter((timer) => timer.id !== next.timer.id);
        event = next.timer.event;
      } else {
        inFlight.delete(next.id);
        const { outcome } = next;
        if (outcome.kind === 'stop') return { kind: 'stop', why: outcome.why };
        if (outcome.kind === 'wait') {
          waits.set(next.id, outcome);
          continue;
        }
        record.running = record.running.filter((step) => step.id !== next.id);
        event = outcome.kind === 'done' ? doneEvent(next.id, outcome.output) : errorEvent(next.id, outcome.error);
      }
      before = activeIds(snapshot);
      const current = snapshot;
      [snapshot, actions] = computed(() => machine.transition(current, event, scope));
      eventType = event.type;
      const shown = carryOut(actions, snapshot, before);
      if (!(await commit(shown))) return { kind: 'stop', why: 'lease_lost' };
    }
  } finally {
    stopAll();
  }
}
