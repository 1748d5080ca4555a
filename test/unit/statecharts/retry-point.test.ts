import { describe, expect, it } from 'vitest';
import { buildRunTimeline } from '../../../src/runs/run-timeline.js';
import { planRetry, type CommittedPoint } from '../../../src/statecharts/retry-point.js';
import { checkStatechart, definitionHash, type StatechartDefinition } from '../../../src/statecharts/statechart-definition.js';
import type { MachineRecord } from '../../../src/statecharts/statechart-run.js';
import { machine } from '../../fixtures/statecharts/recovery.machine.js';

// Where an operator's retry starts (src/statecharts/retry-point.ts), from hand-made restore points
// of the recovery fixture: lookup → charge (non-idempotent) → record → notify.

const checked = checkStatechart(machine, 'test');
if (!checked.ok) throw new Error(checked.problems.join('\n'));
const definition: StatechartDefinition = { machine, path: 'recovery.machine.ts', hash: definitionHash(machine), steps: checked.steps };

const step = (index: number, id: string) => ({ id, src: id, input: {}, key: `${index}-${id}` });
const effects = { lookup: 'read_only', charge: 'non_idempotent_write', record: 'idempotent_write', notify: 'idempotent_write' } as const;
const record = (value: string, running: ReturnType<typeof step>[], nextStep: number, status = 'active'): MachineRecord => ({
  hash: definition.hash,
  startedWith: definition.hash,
  snapshot: { status, value, context: {}, children: {} },
  running,
  timers: [],
  nextStep,
  transitions: 0,
});
/** The path of a run that failed on notify: each point's restore point lists the steps started so far. */
function failedPath(): CommittedPoint[] {
  const order = ['lookup', 'charge', 'record', 'notify'] as const;
  const started = (upTo: number) => Object.fromEntries(order.slice(0, upTo + 1).map((id, index) => [`${index}-${id}`, { id, src: id, effect: effects[id] }]));
  const states = ['looking_up', 'charging', 'recording', 'notifying'];
  const points: CommittedPoint[] = states.map((value, index) => ({
    sequence: index + 1,
    value,
    event: 'x',
    hash: definition.hash,
    state: { machine: record(value, [step(index, order[index]!)], index + 1), startedSteps: started(index) },
  }));
  points.push({ sequence: 5, value: 'notifying', event: 'xstate.error.actor.notify', hash: definition.hash, state: { machine: record('notifying', [], 4, 'error'), startedSteps: started(3) } });
  return points;
}

describe('planRetry', () => {
  it('starts from the last state the machine was active in, not its error', () => {
    const plan = planRetry(failedPath(), definition, 'recovery');
    expect(plan.ok && plan.retry).toMatchObject({ name: 'notifying', point: { sequence: 4 } });
  });

  it('refuses a state before the non-idempotent step, or the state running it, and names where a retry may start', () => {
    for (const state of ['looking_up', 'charging']) {
      expect(planRetry(failedPath(), definition, 'recovery', state)).toMatchObject({ ok: false, reason: 'non_idempotent_step', step: 'charge', allowed: ['recording', 'notifying'] });
    }
    expect(planRetry(failedPath(), definition, 'recovery', 'recording')).toMatchObject({ ok: true });
  });

  it('refuses a state never passed through, a run without restore points, and a state the definition lacks', () => {
    expect(planRetry(failedPath(), definition, 'recovery', 'done')).toMatchObject({ ok: false, reason: 'state_not_passed' });
    expect(planRetry(failedPath().map((point) => ({ ...point, state: null })), definition, 'recovery')).toMatchObject({ ok: false, reason: 'no_restore_point' });
    const renamed = failedPath().map((point) => (point.value === 'notifying' ? { ...point, value: 'mailing', state: { ...point.state, machine: { ...point.state!.machine!, snapshot: { status: 'active', value: 'mailing' } } } } : point));
    const refused = planRetry(renamed.slice(0, 4), definition, 'recovery');
    expect(refused).toMatchObject({ ok: false, reason: 'machine_incompatible' });
    if (!refused.ok) expect(refused.message).toContain('has no state mailing (`keel machines diff recovery` lists what changed)');
  });
});

describe('the timeline of a retried run', () => {
  it('draws the time the run lay failed until an operator retried it', () => {
    const run = { status: 'completed', created_at: 0, settled_at: 10_000 } as never;
    const events = [
      { sequence: 1, kind: 'claimed', payload: {}, created_at: 100 },
      { sequence: 2, kind: 'failed', payload: {}, created_at: 2000 },
      { sequence: 3, kind: 'operator_retried', payload: { operator: 'alice', state: 'notifying' }, created_at: 5000 },
    ];
    const timeline = buildRunTimeline(run, events as never, [], 10_000);
    expect(timeline.segments.find((segment) => segment.kind === 'retry')).toMatchObject({ label: 'retried by alice from state notifying', start: 2000, end: 5000 });
  });
});
