import { setup } from 'xstate';

// The run lifecycle (docs/architecture.md, "The rooms"). This machine is the single source of which
// transitions exist: the run repository derives each guarded UPDATE's allowed-from statuses from
// it, and the operator UI draws it. It holds no I/O.

export const RUN_STATUSES = [
  'queued',
  'running',
  'waiting_for_approval',
  'waiting_for_input',
  'waiting_for_dependency',
  'waiting_for_timer',
  'completed',
  'failed',
  'cancelled',
] as const;
export type RunStatus = (typeof RUN_STATUSES)[number];

export const TERMINAL_RUN_STATUSES = ['completed', 'failed', 'cancelled'] as const satisfies readonly RunStatus[];
export type TerminalRunStatus = (typeof TERMINAL_RUN_STATUSES)[number];

/** What a termination reason means: the terminal status that carries it, and what it implies. */
type TerminationRule = {
  status: TerminalRunStatus;
  /** The run ends COMPLETED but its answer is cut short (iteration cap, budget stop). */
  truncates?: true;
  /** The failure may be worth retrying by a caller. */
  retryable?: true;
};

/**
 * The one table of termination reasons. Every list below is derived from it; the CHECK
 * constraints of the `runs` table cannot import it, so test/unit/machines/termination-reasons.test.ts
 * compares them with it.
 */
export const TERMINATION_REASON_RULES = {
  completed: { status: 'completed' },
  max_iterations: { status: 'completed', truncates: true },
  budget_exhausted: { status: 'completed', truncates: true },
  policy_denied: { status: 'failed' },
  approval_denied: { status: 'failed' },
  provider_failed: { status: 'failed', retryable: true },
  retries_exhausted: { status: 'failed' },
  not_retryable: { status: 'failed' },
  result_not_retainable: { status: 'failed' },
  cancelled: { status: 'cancelled' },
} as const satisfies Record<string, TerminationRule>;
export type TerminationReason = keyof typeof TERMINATION_REASON_RULES;
/** The reasons a terminal status `S` may carry. */
export type ReasonOfStatus<S extends TerminalRunStatus> = {
  [R in TerminationReason]: (typeof TERMINATION_REASON_RULES)[R]['status'] extends S ? R : never;
}[TerminationReason];
/** The reasons of a COMPLETED run (an answer, possibly truncated). */
export type CompletionReason = ReasonOfStatus<'completed'>;

// Object keys keep their insertion order, so this is the table's order (a tuple, as z.enum wants).
export const TERMINATION_REASONS = Object.keys(TERMINATION_REASON_RULES) as [TerminationReason, ...TerminationReason[]];

const reasonsWhere = (holds: (rule: TerminationRule) => boolean): readonly TerminationReason[] =>
  TERMINATION_REASONS.filter((reason) => holds(TERMINATION_REASON_RULES[reason]));

/** Which reasons each terminal status may carry; the database enforces the same pairs. */
export const REASONS_BY_TERMINAL_STATUS = Object.fromEntries(
  TERMINAL_RUN_STATUSES.map((status) => [status, reasonsWhere((rule) => rule.status === status)]),
) as Record<TerminalRunStatus, readonly TerminationReason[]>;

/** Iteration cap and budget stop end COMPLETED but truncated. */
export const TRUNCATING_REASONS = reasonsWhere((rule) => rule.truncates === true);
/** Only a provider failure may be worth retrying by a caller. */
export const RETRYABLE_REASONS = reasonsWhere((rule) => rule.retryable === true);

export type RunEvent =
  | { type: 'CLAIM' }
  | { type: 'SUSPEND_FOR_APPROVAL' }
  | { type: 'SUSPEND_FOR_INPUT' }
  | { type: 'SUSPEND_FOR_DEPENDENCY' }
  /** A statechart agent's durable `after`: the run waits for its due time (available_at). */
  | { type: 'SUSPEND_FOR_TIMER' }
  | { type: 'APPROVAL_DECIDED' }
  /** Nobody decided within `runs.approvalTimeoutHours`: the run ends FAILED (`approval_denied`). */
  | { type: 'APPROVAL_TIMED_OUT' }
  | { type: 'INPUT_RECEIVED' }
  | { type: 'DEPENDENCY_RESOLVED' }
  /** A statechart run's timer is due (waiting_for_timer, or a wait its machine bounds with a timer): a worker takes the run. */
  | { type: 'TIMER_DUE' }
  | { type: 'COMPLETE'; reason: TerminationReason }
  | { type: 'FAIL'; reason: TerminationReason }
  | { type: 'CANCEL' }
  | { type: 'REQUEUE' }
  | { type: 'DEAD_LETTER' }
  /**
   * An operator retries a failed statechart run from a state it committed (`keel runs retry`, the
   * run page): the run is queued again, same id, same task, restored from that state's restore point.
   */
  | { type: 'RETRY'; machineState: string | null };
export type RunEventType = RunEvent['type'];

const completesWith = (reasons: readonly TerminationReason[]) => ({ event }: { event: RunEvent }) =>
  'reason' in event && reasons.includes(event.reason);

const complete = { target: 'completed', guard: 'completionReason' } as const;
const fail = { target: 'failed', guard: 'failureReason' } as const;
const cancel = { target: 'cancelled' } as const;

export const runMachine = setup({
  types: { events: {} as RunEvent },
  guards: {
    completionReason: completesWith(REASONS_BY_TERMINAL_STATUS.completed),
    failureReason: completesWith(REASONS_BY_TERMINAL_STATUS.failed),
    /** Only a statechart run, from a state its machine committed (src/runs/run-recovery.ts checks which). */
    fromCommittedState: ({ event }) => event.type === 'RETRY' && typeof event.machineState === 'string' && event.machineState !== '',
  },
}).createMachine({
  id: 'run',
  initial: 'queued',
  states: {
    queued: {
      description: 'Accepted and durable; waiting for a worker to claim it',
      on: { CLAIM: 'running', CANCEL: cancel, FAIL: fail },
    },
    running: {
      description: 'Claimed by a worker holding a lease',
      on: {
        SUSPEND_FOR_APPROVAL: 'waiting_for_approval',
        SUSPEND_FOR_INPUT: 'waiting_for_input',
        SUSPEND_FOR_DEPENDENCY: 'waiting_for_dependency',
        SUSPEND_FOR_TIMER: 'waiting_for_timer',
        COMPLETE: complete,
        FAIL: fail,
        CANCEL: cancel,
        REQUEUE: 'queued',
        DEAD_LETTER: 'failed',
      },
    },
    waiting_for_approval: {
      description: 'A turn waits for an operator decision',
      on: { APPROVAL_DECIDED: 'running', APPROVAL_TIMED_OUT: 'failed', TIMER_DUE: 'running', FAIL: fail, CANCEL: cancel },
    },
    waiting_for_input: {
      description: 'A tool asked the user for typed input',
      on: { INPUT_RECEIVED: 'running', TIMER_DUE: 'running', FAIL: fail, CANCEL: cancel },
    },
    waiting_for_dependency: {
      description: 'Waits for a remote agent task',
      on: { DEPENDENCY_RESOLVED: 'running', TIMER_DUE: 'running', FAIL: fail, CANCEL: cancel },
    },
    waiting_for_timer: {
      description: "A statechart agent's delayed transition waits for its due time",
      on: { TIMER_DUE: 'running', FAIL: fail, CANCEL: cancel },
    },
    completed: { type: 'final', description: 'Answered (possibly truncated)' },
    failed: {
      type: 'final',
      description: 'Ended without an answer; the reason says why. An operator may retry a statechart run from a committed state',
      // The one way out of a terminal status: an operator's retry, never a worker's or a sweep's.
      on: { RETRY: { target: 'queued', guard: 'fromCommittedState' } },
    },
    cancelled: { type: 'final', description: 'Cancelled by a client or an operator' },
  },
});
