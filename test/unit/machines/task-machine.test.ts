import { describe, expect, it } from 'vitest';
import { runMachine, RUN_STATUSES, type RunStatus } from '../../../machines/run.machine.js';
import { taskMachine, TASK_STATES } from '../../../machines/task.machine.js';
import { finalStates, machineEdges, machineStates } from '../../../machines/transitions.js';
import { TERMINAL_TASK_STATES } from '../../../src/protocol/wire.js';
import { taskStateOf } from '../../../src/tasks/task-state.js';

// The task machine is the run machine seen through taskStateOf (the mapping the database trigger
// repeats): every run transition that changes the derived state is a task transition with the same
// event, and the task machine has no transition the run cannot make.

describe('task machine', () => {
  it('has exactly the A2A task states, the terminal ones final', () => {
    expect(machineStates(taskMachine)).toEqual([...TASK_STATES]);
    expect(finalStates(taskMachine).sort()).toEqual([...TERMINAL_TASK_STATES].sort());
  });

  it('follows every run transition that changes the task state', () => {
    const taskEdges = machineEdges(taskMachine).map((edge) => `${edge.from} ${edge.event} ${edge.to}`);
    const derived = new Set<string>();
    for (const edge of machineEdges(runMachine)) {
      const from = taskStateOf(edge.from as RunStatus, null);
      const variants: Array<[string, string]> = [[edge.event, taskStateOf(edge.to as RunStatus, null)]];
      // An agent's refusal ends the run failed with failure_detail.rejected: the task says REJECTED.
      if (edge.to === 'failed' && edge.event === 'FAIL' && (edge.from === 'queued' || edge.from === 'running')) variants.push(['REJECT', 'TASK_STATE_REJECTED']);
      for (const [event, to] of variants) {
        if (from === to) continue;
        const wanted = `${from} ${event} ${to}`;
        derived.add(wanted);
        expect(taskEdges, `run ${edge.from} -${edge.event}-> ${edge.to}`).toContain(wanted);
      }
    }
    // Nothing in the task machine that no run transition produces.
    expect([...derived].sort()).toEqual([...new Set(taskEdges)].sort());
  });

  it('starts SUBMITTED, like a queued run, and AUTH_REQUIRED is never entered', () => {
    expect(taskMachine.config.initial).toBe(taskStateOf('queued', null));
    for (const status of RUN_STATUSES) expect(taskStateOf(status, null)).not.toBe('TASK_STATE_AUTH_REQUIRED');
    expect(machineEdges(taskMachine).some((edge) => edge.to === 'TASK_STATE_AUTH_REQUIRED' || edge.from === 'TASK_STATE_AUTH_REQUIRED')).toBe(false);
  });
});
