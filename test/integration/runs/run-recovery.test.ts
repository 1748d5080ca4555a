import { sql } from 'slonik';
import { z } from 'zod';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { Task } from '@a2a-js/sdk';
import { createClient } from '../../../src/auth/client-repository.js';
import { getRun } from '../../../src/runs/run-repository.js';
import { bulkCancel, bulkRetry, checkRetry, retryRun, type RecoveryDeps } from '../../../src/recovery/run-recovery.js';
import { loadStatechart } from '../../../src/statecharts/statechart-definition.js';
import { readJournal } from '../../../src/tasks/journal.js';
import { sdkClient, textMessage } from '../../support/a2a-client.js';
import { insertMachineRun } from '../../support/statechart-rows.js';
import { startTestKeel, type TestKeel } from '../../support/test-keel.js';
import { waitForRunStatus } from '../../support/wait-for.js';
import { failNext, recoveryCounters } from '../../fixtures/statecharts/recovery-steps.js';

// Operator recovery against a real Keel (Postgres, and the queue backend KEEL_TEST_QUEUE names): a
// failed statechart run retried from its last committed state or an earlier one, as a new revision
// of the same run and task, which works on to its end; the refusals (not failed, not a statechart
// run, a state never passed through, a machine version that lacks the state, a non-idempotent step
// that would run again: the fixture's charge counter never moves); bulk cancel and retry chosen by
// agent, status, state or reason, whose dry run changes no row.

const MACHINE = new URL('../../fixtures/statecharts/recovery.machine.ts', import.meta.url).pathname;
const V2 = new URL('../../fixtures/statecharts/recovery-v2.machine.ts', import.meta.url).pathname;
const OPERATOR = { name: 'alice', via: 'cli' } as const;

let keel: TestKeel;
let token = '';
let deps: RecoveryDeps;

beforeAll(async () => {
  keel = await startTestKeel({
    overrides: {
      KEEL_PROVIDERS: { echo: { type: 'echo' } },
      KEEL_AGENTS: [
        { id: 'recovery', name: 'Recovery', machine: MACHINE },
        { id: 'echo', name: 'Echo', provider: 'echo' },
      ],
    },
  });
  const client = await createClient(keel.context.pool, 'recovery');
  if (!client.ok) throw new Error('client');
  token = client.token;
  const { pool, sealer, queues, logger } = keel.context;
  deps = { pool, sealer, queues, logger, definitionOf: async (agent) => keel.registry.agents.get(agent)?.statechart ?? null };
}, 60_000);
afterAll(async () => keel?.dispose());

type Json = Record<string, any>; // eslint-disable-line @typescript-eslint/no-explicit-any
const asJson = (result: unknown) => Task.toJSON(result as Task) as Json;

/** A run of the recovery agent for `text`, failed in its `step` (which throws once). */
async function failedRun(text: string, step: 'charge' | 'notify'): Promise<string> {
  failNext(text, step, 1);
  const client = await sdkClient(keel.url, 'recovery', token);
  const task = asJson(await client.sendMessage(textMessage(text)));
  expect(task.status.state).toBe('TASK_STATE_FAILED');
  return task.id as string;
}

const row = async (id: string) => (await getRun(keel.context.pool, id))!;
const taskStates = async (id: string) =>
  (await readJournal(keel.context.pool, keel.context.sealer, id, 0, 100)).map((entry) => (entry.response as Json).statusUpdate?.status.state as string | undefined).filter(Boolean);
const path = (id: string) =>
  keel.context.pool.any(sql.type(z.object({ sequence: z.number(), state: z.unknown(), event: z.string() }))`SELECT sequence, state, event FROM run_machine_steps WHERE run_id = ${id} ORDER BY sequence`);

describe('retry a failed statechart run from a state', () => {
  it('from its last committed state: the same run and task at a new revision, working on to completion; the charge is not run again', async () => {
    const id = await failedRun('last', 'notify');
    expect(recoveryCounters('last')).toEqual({ lookups: 1, charges: 1, records: 1, notices: 1 });
    const failed = await row(id);
    expect(failed).toMatchObject({ status: 'failed', termination_reason: 'not_retryable' });

    const result = await retryRun(deps, id, OPERATOR);
    expect(result).toMatchObject({ ok: true, state: 'notifying' });
    if (!result.ok) return;
    expect(result.run).toMatchObject({ id, status: 'queued', termination_reason: null, settled_at: null, failure_detail: null });
    expect(result.run.revision).toBe(failed.revision + 1);

    const done = await waitForRunStatus(keel.context.pool, id, ['completed', 'failed']);
    expect(done.status).toBe('completed');
    expect(done.revision).toBeGreaterThan(result.run.revision);
    expect(recoveryCounters('last')).toEqual({ lookups: 1, charges: 1, records: 1, notices: 2 });

    // The same task: failed, submitted again, working, completed with the retried result.
    const client = await sdkClient(keel.url, 'recovery', token);
    const task = asJson(await client.getTask({ id } as never));
    expect(task.status.state).toBe('TASK_STATE_COMPLETED');
    expect(JSON.stringify(task)).toContain('charged r1-10');
    const states = await taskStates(id);
    // SUBMITTED and WORKING are journaled when a projection sees the run queued, or running, before
    // it moves on: on a quiet machine the retried run was claimed and completed before any did, and
    // its journal went from FAILED to COMPLETED. What the journal shows after FAILED is in this
    // order, and ends COMPLETED.
    const after = states.slice(states.indexOf('TASK_STATE_FAILED'));
    const order = ['TASK_STATE_FAILED', 'TASK_STATE_SUBMITTED', 'TASK_STATE_WORKING', 'TASK_STATE_COMPLETED'];
    expect(after.map((state) => order.indexOf(state!))).toEqual([...after.map((state) => order.indexOf(state!))].sort((a, b) => a - b));
    expect(after.filter((state) => state === 'TASK_STATE_FAILED' || state === 'TASK_STATE_COMPLETED')).toEqual(['TASK_STATE_FAILED', 'TASK_STATE_COMPLETED']);
    expect(after.filter((state) => !order.includes(state!))).toEqual([]);

    // The audit entry names the action, the operator and the state; the path shows the retry.
    const events = await keel.context.pool.any(sql.type(z.object({ kind: z.string(), payload: z.record(z.unknown()) }))`
      SELECT kind, payload FROM run_events WHERE run_id = ${id} ORDER BY sequence`);
    expect(events.find((event) => event.kind === 'operator_retried')?.payload).toMatchObject({ operator: 'alice', via: 'cli', state: 'notifying', failedWith: 'not_retryable' });
    const steps = await path(id);
    expect(steps.map((step) => `${JSON.stringify(step.state)} ${step.event.replace(/^xstate\.(done|error)\.actor\./, '$1:')}`)).toEqual([
      '"looking_up" xstate.init',
      '"charging" done:lookup',
      '"recording" done:charge',
      '"notifying" done:record',
      '"notifying" error:notify',
      '"notifying" keel.retry',
      '"done" done:notify',
    ]);

    // Completed, it is not retried again.
    const again = await retryRun(deps, id, OPERATOR);
    expect(again).toMatchObject({ ok: false, reason: 'not_failed' });
    if (!again.ok) expect(again.message).toBe(`run ${id} is completed: only a failed run can be retried`);
  });

  it('from an earlier state it passed through: the steps from there run again, the charge before it does not', async () => {
    const id = await failedRun('earlier', 'notify');
    const result = await retryRun(deps, id, OPERATOR, 'recording');
    expect(result).toMatchObject({ ok: true, state: 'recording' });
    await waitForRunStatus(keel.context.pool, id, ['completed']);
    expect(recoveryCounters('earlier')).toEqual({ lookups: 1, charges: 1, records: 2, notices: 2 });
  });

  it('refused when it would run the non-idempotent charge again: from a state before it, or when the charge itself failed; nothing changes', async () => {
    const before = await failedRun('before', 'notify');
    const unchanged = await row(before);
    const refused = await retryRun(deps, before, OPERATOR, 'looking_up');
    expect(refused).toMatchObject({ ok: false, reason: 'non_idempotent_step', step: 'charge', allowed: ['recording', 'notifying'] });
    if (!refused.ok) {
      expect(refused.message).toBe(
        `run ${before}: cannot retry from state looking_up: the run would run again step charge (charge), a non-idempotent write it already started; a retry may start from recording, notifying`,
      );
    }
    expect(await row(before)).toEqual(unchanged);
    expect(await retryRun(deps, before, OPERATOR, 'charging')).toMatchObject({ ok: false, reason: 'non_idempotent_step' });

    const inside = await failedRun('inside', 'charge');
    expect(recoveryCounters('inside')).toMatchObject({ charges: 1, records: 0 });
    const stuck = await retryRun(deps, inside, OPERATOR);
    expect(stuck).toMatchObject({ ok: false, reason: 'non_idempotent_step', step: 'charge', allowed: [] });
    if (!stuck.ok) expect(stuck.message).toContain('no state of this run is after it');
    expect((await row(inside)).status).toBe('failed');
    // Nothing ran again.
    await new Promise((resolve) => setTimeout(resolve, 300));
    expect(recoveryCounters('before')).toMatchObject({ lookups: 1, charges: 1 });
    expect(recoveryCounters('inside')).toMatchObject({ lookups: 1, charges: 1 });
  });

  it('refused for a run that is not failed, not a statechart run, a state never passed through, and a machine version that lacks the state', async () => {
    const client = await sdkClient(keel.url, 'echo', token);
    const echoed = asJson(await client.sendMessage(textMessage('hi')));
    const notFailed = await retryRun(deps, echoed.id, OPERATOR);
    expect(notFailed).toMatchObject({ ok: false, reason: 'not_failed', status: 'completed' });

    const loopRun = await insertMachineRun(keel.context.pool, { agent: 'echo', status: 'failed', hash: null, state: null });
    expect(await retryRun(deps, loopRun, OPERATOR)).toMatchObject({
      ok: false,
      reason: 'not_statechart',
      message: `run ${loopRun} is not a statechart agent's run: only those are retried from a committed state`,
    });
    expect(await retryRun(deps, '00000000-0000-7000-8000-000000000000', OPERATOR)).toMatchObject({ ok: false, reason: 'not_found' });

    const id = await failedRun('refusals', 'notify');
    const nowhere = await retryRun(deps, id, OPERATOR, 'shipping');
    expect(nowhere).toMatchObject({ ok: false, reason: 'state_not_passed', passed: ['looking_up', 'charging', 'recording', 'notifying'] });
    if (!nowhere.ok) expect(nowhere.message).toBe(`run ${id}: the run never stood in state shipping; it passed through looking_up, charging, recording, notifying`);

    // The configuration now names the next version, which renamed `notifying`.
    const v2 = await loadStatechart(V2, '/', 'test');
    if (!v2.ok) throw new Error(v2.problems.join('\n'));
    const underV2: RecoveryDeps = { ...deps, definitionOf: async () => v2.definition };
    const incompatible = await retryRun(underV2, id, OPERATOR);
    expect(incompatible).toMatchObject({ ok: false, reason: 'machine_incompatible' });
    if (!incompatible.ok) {
      expect(incompatible.message).toBe(
        `run ${id}: cannot retry from state notifying: the current version of the machine (${v2.definition.hash}) has no state notifying (\`keel machines diff recovery\` lists what changed)`,
      );
    }
    const run = await row(id);
    expect((await checkRetry(underV2, run, 'recording')).ok).toBe(true);
    expect(run.status).toBe('failed');
  });
});

describe('bulk cancel and retry', () => {
  it('a dry run lists what would change and changes no row; then the operation does it', async () => {
    const pool = keel.context.pool;
    const waiting = [
      await insertMachineRun(pool, { agent: 'recovery', status: 'waiting_for_input', hash: 'h', state: 'recording' }),
      await insertMachineRun(pool, { agent: 'recovery', status: 'waiting_for_approval', hash: 'h', state: 'recording' }),
    ];
    const elsewhere = await insertMachineRun(pool, { agent: 'recovery', status: 'waiting_for_input', hash: 'h', state: 'charging' });
    const snapshot = () =>
      pool.any(sql.type(z.object({ id: z.string(), status: z.string(), revision: z.number(), updated_at: z.number() }))`
        SELECT id, status, revision, updated_at FROM runs ORDER BY id`);
    const before = await snapshot();

    const dry = await bulkCancel(deps, { agent: 'recovery', state: 'recording' }, { dryRun: true, operator: OPERATOR });
    expect(dry.items.filter((item) => item.outcome === 'would_cancel').map((item) => item.id).sort()).toEqual([...waiting].sort());
    expect(dry.items.map((item) => item.id)).not.toContain(elsewhere);
    expect(dry.changed).toBe(0);
    expect(await snapshot()).toEqual(before);

    const cancelled = await bulkCancel(deps, { agent: 'recovery', state: 'recording' }, { dryRun: false, operator: OPERATOR });
    expect(cancelled.changed).toBe(2);
    for (const id of waiting) expect((await row(id)).status).toBe('cancelled');
    expect((await row(elsewhere)).status).toBe('waiting_for_input');

    const a = await failedRun('bulk-a', 'notify');
    const b = await failedRun('bulk-b', 'notify');
    const selection = { agent: 'recovery', status: 'failed' as const, reason: 'not_retryable' };
    const failedBefore = await snapshot();
    const preview = await bulkRetry(deps, selection, { dryRun: true, operator: OPERATOR });
    const outcome = (report: typeof preview, id: string) => report.items.find((item) => item.id === id);
    expect(outcome(preview, a)).toMatchObject({ outcome: 'would_retry', detail: 'from state notifying', state: 'notifying' });
    expect(outcome(preview, b)).toMatchObject({ outcome: 'would_retry' });
    // The run that failed inside the charge would be refused, and the dry run says so.
    expect(preview.items.find((item) => item.outcome === 'refused')?.detail).toContain('non-idempotent write');
    expect(await snapshot()).toEqual(failedBefore);
    expect(recoveryCounters('bulk-a').notices).toBe(1);

    const retried = await bulkRetry(deps, selection, { dryRun: false, operator: OPERATOR });
    expect(outcome(retried, a)).toMatchObject({ outcome: 'retried' });
    expect(outcome(retried, b)).toMatchObject({ outcome: 'retried' });
    for (const id of [a, b]) expect((await waitForRunStatus(pool, id, ['completed', 'failed'])).status).toBe('completed');
    expect(recoveryCounters('bulk-a')).toEqual({ lookups: 1, charges: 1, records: 1, notices: 2 });
    expect(recoveryCounters('inside').charges).toBe(1);
  });
});
