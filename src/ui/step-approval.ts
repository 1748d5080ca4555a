import type { PendingApproval } from '../../machines/agent-loop.machine.js';
import type { PrivacyLevel } from '../privacy/privacy-level.js';
import { redactText, redactValue } from '../privacy/redact.js';
import { summaryName } from '../privacy/summarize.js';
import { stateText } from '../statecharts/definition-graph.js';

// A statechart run waiting in an askApproval step, as an operator deciding on it reads it: which
// state and which step wait (the approval is stored as a call named askApproval, the form the
// decision path shares with a model's tool calls, so the page must not speak of a model or a tool),
// and what the step asks, as far as the run's audit level keeps content: `full` as it is,
// `redacted` redacted, `metadata` and `none` only the names of its fields.

export type StepApproval = {
  /** The state the run stands in, as a path ("review.approval"). */
  state: string;
  /** The invoke's own id when the machine gives one, else the step's name in setup({ actors }). */
  step: string;
  /** The step's name in setup({ actors }). */
  src: string;
  level: PrivacyLevel;
  /** What the step asks, at a level that keeps content; null at `metadata` and `none`. */
  input: { summary: string; details: Record<string, unknown> | null } | null;
  /** The names of the details' fields (names are no content), where the content is not kept; none at `none`. */
  fields: string[];
};

type Waiting = { id: string; src: string; key: string; input: unknown };

const isWaiting = (value: unknown): value is Waiting =>
  typeof value === 'object' &&
  value !== null &&
  typeof (value as Waiting).id === 'string' &&
  typeof (value as Waiting).src === 'string' &&
  typeof (value as Waiting).key === 'string';

const isRecord = (value: unknown): value is Record<string, unknown> => typeof value === 'object' && value !== null && !Array.isArray(value);

/**
 * The step approval a suspended run waits on, or null when its approval is another (a model's tool
 * calls, a guardrail, a statechart's callTool of a tool that needs approval): `waiting` is the step
 * the sealed state records, `machineState` the run's runs.machine_state, `level` its audit level.
 */
export function stepApprovalOf(pending: PendingApproval | null, waiting: unknown, machineState: unknown, level: PrivacyLevel): StepApproval | null {
  if (pending?.kind !== 'tools' || pending.calls.length !== 1 || !isWaiting(waiting)) return null;
  const call = pending.calls[0]!;
  if (call.name !== 'askApproval' || call.id !== waiting.key) return null;
  const input = isRecord(waiting.input) ? waiting.input : {};
  const summary = typeof input.summary === 'string' ? input.summary : '';
  const details = isRecord(input.details) ? input.details : null;
  // XState names an invoke without an id `${index}.${state id}`: such a step is named by its src.
  const step = /^\d+\./.test(waiting.id) ? waiting.src : waiting.id;
  const kept =
    level === 'full' ? { summary, details } : level === 'redacted' ? { summary: redactText(summary), details: details && (redactValue(details) as Record<string, unknown>) } : null;
  return {
    state: stateText(machineState),
    step,
    src: waiting.src,
    level,
    input: kept,
    fields: kept === null && level !== 'none' ? Object.keys(details ?? {}).map(summaryName) : [],
  };
}

/** The step a statechart run's sealed state records as waiting (workers/statechart-agent-run.ts); absent for an agent loop's run. */
export const waitingStep = (state: object): unknown => (state as { waiting?: unknown }).waiting;
