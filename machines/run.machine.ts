import { setup } from 'xstate';

// The run lifecycle (DESIGN.md, "Run"). This machine is the single source of which transitions
// exist: the run repository derives each guarded UPDATE's allowed-from statuses from it, and the
// operator UI draws it. It holds no I/O.

export const RUN_STATUSES = [
  'queued',
  'running',
  'waiting_for_approval',
  'waiting_for_input',
  'waiting_for_dependency',
  'completed',
  'failed',
  'cancelled',
] as const;
export type RunStatus = (typeof RUN_STATUSES)[number];

export const TERMINAL_RUN_STATUSES = ['completed', 'failed', 'cancelled'] as const satisfies readonly RunStatus[];
export type TerminalRunStatus = (typeof TERMINAL_RUN_STATUSES)[number];

export const TERMINATION_REASONS = [
  'completed',
  'max_iterations',
  'budget_exhausted',
  'policy_denied',
  'approval_denied',
  'provider_failed',
  'retries_exhausted',
  'not_retryable',
  'result_not_retainable',
  'cancelled',
] as const;
export type TerminationReason = (typeof TERMINATION_REASONS)[number];

/** Which reasons each terminal status may carry; the database enforces the same pairs. */
export const REASONS_BY_TERMINAL_STATUS = {
  completed: ['completed', 'max_iterations', 'budget_exhausted'],
  failed: [
    'policy_denied',
    'approval_denied',
    'provider_failed',
    'retries_exhausted',
    'not_retryable',
    'result_not_retainable',
  ],
  cancelled: ['cancelled'],
} as const satisfies Record<TerminalRunStatus, readonly TerminationReason[]>;

/** Iteration cap and budget stop end COMPLETED but truncated. */
export const TRUNCATING_REASONS: readonly TerminationReason[] = ['max_iterations', 'budget_exhausted'];
/** Only a provider failure may be worth retrying by a caller. */
export const RETRYABLE_REASONS: readonly TerminationReason[] = ['provider_failed'];

export type RunEvent =
  | { type: 'CLAIM' }
  | { type: 'SUSPEND_FOR_APPROVAL' }
  | { type: 'SUSPEND_FOR_INPUT' }
  | { type: 'SUSPEND_FOR_DEPENDENCY' }
  | { type: 'APPROVAL_DECIDED' }
  /** Nobody decided within `runs.approvalTimeoutHours`: the run ends FAILED (`approval_denied`). */
  | { type: 'APPROVAL_TIMED_OUT' }
  | { type: 'INPUT_RECEIVED' }
  | { type: 'DEPENDENCY_RESOLVED' }
  | { type: 'COMPLETE'; reason: TerminationReason }
  | { type: 'FAIL'; reason: TerminationReason }
  | { type: 'CANCEL' }
  | { type: 'REQUEUE' }
  | { type: 'DEAD_LETTER' };
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
        COMPLETE: complete,
        FAIL: fail,
        CANCEL: cancel,
        REQUEUE: 'queued',
        DEAD_LETTER: 'failed',
      },
    },
    waiting_for_approval: {
      description: 'A turn waits for an operator decision',
      on: { APPROVAL_DECIDED: 'running', APPROVAL_TIMED_OUT: 'failed', FAIL: fail, CANCEL: cancel },
    },
    waiting_for_input: {
      description: 'A tool asked the user for typed input',
      on: { INPUT_RECEIVED: 'running', FAIL: fail, CANCEL: cancel },
    },
    waiting_for_dependency: {
      description: 'Waits for a remote agent task',
      on: { DEPENDENCY_RESOLVED: 'running', FAIL: fail, CANCEL: cancel },
    },
    completed: { type: 'final', description: 'Answered (possibly truncated)' },
    failed: { type: 'final', description: 'Ended without an answer; the reason says why' },
    cancelled: { type: 'final', description: 'Cancelled by a client or an operator' },
  },
});
