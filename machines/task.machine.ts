import { setup } from 'xstate';
import { TASK_STATES, type TaskState } from '../src/protocol/wire.js';

// The A2A task, as its client sees it. A task's state is derived from its
// current run: the trigger keel_sync_task_state (sql/0004_a2a_tasks.sql) writes a2a_tasks.state in
// the transaction of every run transition, by src/tasks/task-state.ts's mapping:
//   queued -> SUBMITTED; running, waiting_for_approval, waiting_for_dependency, waiting_for_timer -> WORKING;
//   waiting_for_input -> INPUT_REQUIRED; completed -> COMPLETED; failed -> FAILED (REJECTED when the
//   agent rejected the task); cancelled -> CANCELED.
// So each transition here is a run event that changes the derived state; run events that keep it
// (a suspension for approval or a dependency, and their resumption) are not task transitions.
// AUTH_REQUIRED is part of the A2A vocabulary but no run status maps to it: Keel never enters it.
// The state keys are the stored values of a2a_tasks.state. The machine holds no I/O.

export { TASK_STATES };
export type { TaskState };

export type TaskEvent =
  | { type: 'CLAIM' }
  | { type: 'SUSPEND_FOR_INPUT' }
  | { type: 'INPUT_RECEIVED' }
  /** A statechart agent's deadline ran out while the task waited for input: the machine moves on. */
  | { type: 'TIMER_DUE' }
  | { type: 'REQUEUE' }
  | { type: 'COMPLETE' }
  | { type: 'FAIL' }
  | { type: 'DEAD_LETTER' }
  | { type: 'APPROVAL_TIMED_OUT' }
  | { type: 'REJECT' }
  | { type: 'CANCEL' }
  /** An operator retried the failed statechart run: the task is submitted again and works on to a new end. */
  | { type: 'RETRY' };

const ended = { FAIL: 'TASK_STATE_FAILED', REJECT: 'TASK_STATE_REJECTED', CANCEL: 'TASK_STATE_CANCELED' } as const;

export const taskMachine = setup({ types: { events: {} as TaskEvent } }).createMachine({
  id: 'task',
  initial: 'TASK_STATE_SUBMITTED',
  states: {
    TASK_STATE_SUBMITTED: {
      description: 'Its run is queued, waiting for a worker',
      on: { CLAIM: 'TASK_STATE_WORKING', ...ended },
    },
    TASK_STATE_WORKING: {
      description: 'Its run is running, or waiting for an approval or a remote agent',
      on: {
        SUSPEND_FOR_INPUT: 'TASK_STATE_INPUT_REQUIRED',
        COMPLETE: 'TASK_STATE_COMPLETED',
        DEAD_LETTER: 'TASK_STATE_FAILED',
        APPROVAL_TIMED_OUT: 'TASK_STATE_FAILED',
        REQUEUE: 'TASK_STATE_SUBMITTED',
        ...ended,
      },
    },
    TASK_STATE_INPUT_REQUIRED: {
      description: 'Its run waits for the client to send typed input',
      on: { INPUT_RECEIVED: 'TASK_STATE_WORKING', TIMER_DUE: 'TASK_STATE_WORKING', FAIL: 'TASK_STATE_FAILED', CANCEL: 'TASK_STATE_CANCELED' },
    },
    TASK_STATE_AUTH_REQUIRED: {
      description: 'A2A vocabulary only: no run status maps to it, so Keel never enters it',
    },
    TASK_STATE_COMPLETED: { type: 'final', description: 'Answered; the result is stored with the task' },
    TASK_STATE_FAILED: {
      type: 'final',
      description: 'Its run failed; the status message says why. An operator may retry a statechart run, which submits the task again',
      on: { RETRY: 'TASK_STATE_SUBMITTED' },
    },
    TASK_STATE_CANCELED: { type: 'final', description: 'Cancelled by its client or an operator' },
    TASK_STATE_REJECTED: { type: 'final', description: 'The agent refused the task' },
  },
});
