import type { RunStatus } from '../../machines/run.machine.js';
import type { TaskState } from '../protocol/wire.js';

/** The A2A state of a run's status (machines/task.machine.ts); the trigger keel_task_state mirrors it. */
export function taskStateOf(status: RunStatus, failureDetail: Record<string, unknown> | null): TaskState {
  switch (status) {
    case 'queued':
      return 'TASK_STATE_SUBMITTED';
    case 'running':
    case 'waiting_for_approval':
    case 'waiting_for_dependency':
    case 'waiting_for_timer':
      return 'TASK_STATE_WORKING';
    case 'waiting_for_input':
      return 'TASK_STATE_INPUT_REQUIRED';
    case 'completed':
      return 'TASK_STATE_COMPLETED';
    case 'failed':
      return failureDetail?.rejected === true ? 'TASK_STATE_REJECTED' : 'TASK_STATE_FAILED';
    case 'cancelled':
      return 'TASK_STATE_CANCELED';
  }
}

/** Run statuses that show as a task state (ListTasks filters by state). */
export function runStatusesFor(state: TaskState): RunStatus[] {
  const all: RunStatus[] = ['queued', 'running', 'waiting_for_approval', 'waiting_for_input', 'waiting_for_dependency', 'waiting_for_timer', 'completed', 'failed', 'cancelled'];
  return all.filter((status) => taskStateOf(status, null) === state || (state === 'TASK_STATE_REJECTED' && status === 'failed'));
}
