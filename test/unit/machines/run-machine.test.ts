import { describe, expect, it } from 'vitest';
import { createActor } from 'xstate';
import { RUN_STATUSES, TERMINAL_RUN_STATUSES, runMachine } from '../../../machines/run.machine.js';
import { allowedFrom, finalStates, machineEdges, machineStates, targetOf } from '../../../machines/transitions.js';

describe('run machine', () => {
  it('has exactly the eight run statuses, the last three final', () => {
    expect(machineStates(runMachine)).toEqual([...RUN_STATUSES]);
    expect(finalStates(runMachine)).toEqual([...TERMINAL_RUN_STATUSES]);
  });

  it('derives allowed-from sets for the repository', () => {
    expect(allowedFrom(runMachine, 'CLAIM')).toEqual(['queued']);
    expect(allowedFrom(runMachine, 'COMPLETE')).toEqual(['running']);
    expect(allowedFrom(runMachine, 'CANCEL')).toEqual(['queued', 'running', 'waiting_for_approval', 'waiting_for_input', 'waiting_for_dependency', 'waiting_for_timer']);
    expect(allowedFrom(runMachine, 'SUSPEND_FOR_TIMER')).toEqual(['running']);
    expect(allowedFrom(runMachine, 'TIMER_DUE')).toEqual(['waiting_for_approval', 'waiting_for_input', 'waiting_for_dependency', 'waiting_for_timer']);
    expect(allowedFrom(runMachine, 'APPROVAL_DECIDED')).toEqual(['waiting_for_approval']);
    expect(targetOf(runMachine, 'REQUEUE')).toBe('queued');
    expect(() => allowedFrom(runMachine, 'NOPE')).toThrow();
  });

  it('never leaves a final state but by an operator\'s guarded retry of a failed run', () => {
    const terminal = new Set<string>(TERMINAL_RUN_STATUSES);
    expect(machineEdges(runMachine).filter((edge) => terminal.has(edge.from))).toEqual([{ from: 'failed', event: 'RETRY', to: 'queued', guarded: true }]);
    expect(allowedFrom(runMachine, 'RETRY')).toEqual(['failed']);
  });

  it('retries a failed run only from a committed state of its machine', () => {
    const guard = runMachine.implementations.guards.fromCommittedState as (args: { event: unknown }) => boolean;
    expect(runMachine.root.states.failed!.on.RETRY![0]!.guard).toBe('fromCommittedState');
    expect(guard({ event: { type: 'RETRY', machineState: null } })).toBe(false);
    expect(guard({ event: { type: 'RETRY', machineState: 'notifying' } })).toBe(true);
  });

  it('guards termination reasons by status', () => {
    const actor = createActor(runMachine).start();
    actor.send({ type: 'CLAIM' });
    actor.send({ type: 'COMPLETE', reason: 'policy_denied' });
    expect(actor.getSnapshot().value).toBe('running');
    actor.send({ type: 'COMPLETE', reason: 'budget_exhausted' });
    expect(actor.getSnapshot().value).toBe('completed');
    expect(actor.getSnapshot().status).toBe('done');
  });
});
