import { setup } from 'xstate';

// A run's dependency on a remote A2A task. Resolution is one guarded update (waiting → resolved
// or failed), so duplicate callbacks, a callback racing a poll, or two workers resolve it once.

export const DEPENDENCY_STATES = ['pending', 'waiting', 'resolved', 'failed'] as const;
export type DependencyState = (typeof DEPENDENCY_STATES)[number];

export type DependencyEvent = { type: 'ACKNOWLEDGED' } | { type: 'RESOLVED' } | { type: 'FAILED' };

export const dependencyMachine = setup({ types: { events: {} as DependencyEvent } }).createMachine({
  id: 'dependency',
  initial: 'pending',
  states: {
    pending: {
      description: 'Registered locally; the message to the remote agent is not acknowledged yet',
      on: { ACKNOWLEDGED: 'waiting', FAILED: 'failed' },
    },
    waiting: {
      description: 'The remote task exists; callbacks and the poller reconcile it by GetTask',
      on: { RESOLVED: 'resolved', FAILED: 'failed' },
    },
    resolved: { type: 'final', description: 'The remote task completed; the run resumed with its artifacts' },
    failed: { type: 'final', description: 'The remote task failed, was rejected or cancelled, or could not be reached' },
  },
});
