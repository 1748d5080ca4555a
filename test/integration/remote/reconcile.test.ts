import { sql } from 'slonik';
import { z } from 'zod';
import { afterAll, beforeAll, describe, expect, it, vi } from 'vitest';
import { startTestKeel, type TestKeel } from '../../support/test-keel.js';
import { waitFor } from '../../support/wait-for.js';
import {
  artifactText,
  callbacksOfDependency,
  callbacksOfRegistration,
  completedCallback,
  delegateToFake,
  delegatedText,
  delegatingOverrides,
  dependenciesOf,
  dependencyById,
  fakeResultFor,
  newToken,
  postCallback,
  registrationIdOf,
  registrationsOf,
  runSummary,
  sdkResultFor,
  sendLocal,
  sleep,
  startFakeRemote,
  startSdkRemote,
  waitForLocalTask,
  workingCallback,
  type CallbackView,
  type FakeRemote,
  type FakeSend,
  type SdkRemote,
} from './remote-support.js';
import { GetTaskRequest } from '@a2a-js/sdk';
import { sdkClient } from '../../support/a2a-client.js';

// Reconciliation asks the remote; the callback body decides nothing. A body claiming COMPLETED
// while GetTask says WORKING resolves nothing. A remote that never pushes is repaired by the poller.
// A callback that arrives before the remote task id is stored is kept against the pending
// registration and used once the id is known. A callback that arrives while a reconcile of the
// same dependency is in flight is not swallowed by that reconcile's WORKING answer.

let keel: TestKeel;
let token = '';
let liar: FakeRemote;
let silent: SdkRemote;
let early: FakeRemote;
let slow: FakeRemote;
type EarlyRecord = { status: number; dependency: { state: string; remote_task_id: string | null } | null; rows: readonly CallbackView[]; at: number };
const earlyRecords: EarlyRecord[] = [];

beforeAll(async () => {
  vi.spyOn(console, 'info').mockImplementation(() => undefined);
  liar = await startFakeRemote({ push: true });
  // Held WORKING until the test releases it (below), once Keel has asked: a remote that finished on
  // a timer of its own had finished before the first poll on saturated cores, and no poll saw it working.
  silent = await startSdkRemote({ push: true, sender: 'drop', hold: true });
  // Finishes at once and pushes COMPLETED to the callback URL before it answers SendMessage (WORKING).
  // Until it has answered, its GetTask is unavailable: the reconcile the callback wakes would
  // otherwise adopt the task the body names (decision 0015) before the test reads the kept row, and
  // this test is about the other way, the id stored by the sender.
  early = await startFakeRemote({
    push: true,
    beforeAnswer: async (send: Omit<FakeSend, 'answeredAt'>) => {
      early.setState(send.taskId, 'TASK_STATE_COMPLETED');
      early.setGetTask('unavailable');
      const registrationId = registrationIdOf(send.pushConfig!.url);
      const dependency = await keel.context.pool.maybeOne(sql.type(z.object({ state: z.string(), remote_task_id: z.string().nullable() }))`
        SELECT d.state, d.remote_task_id FROM dependencies d JOIN inbox_registrations g ON g.dependency_id = d.id WHERE g.id = ${registrationId}`);
      const response = await postCallback(send.pushConfig!.url, completedCallback(send.taskId, send.contextId), { bearer: send.pushConfig!.authentication!.credentials });
      earlyRecords.push({ status: response.status, dependency, rows: await callbacksOfRegistration(keel.context.pool, registrationId), at: Date.now() });
      // Available again once the answer is recorded (the remote records it right after this hook).
      setImmediate(() => early.setGetTask('answer'));
    },
  });
  slow = await startFakeRemote({ push: true, getTaskDelayMs: 400 });
  keel = await startTestKeel({
    overrides: delegatingOverrides([
      { id: 'liar', cardUrl: liar.cardUrl },
      { id: 'silent', cardUrl: silent.cardUrl },
      { id: 'early', cardUrl: early.cardUrl },
      { id: 'slow', cardUrl: slow.cardUrl },
    ]),
  });
  token = await newToken(keel.context.pool);
});
afterAll(async () => {
  await keel?.dispose();
  await Promise.all([liar, silent, early, slow].map((remote) => remote?.close()));
});

const pool = () => keel.context.pool;

async function localState(agent: string, taskId: string): Promise<number | undefined> {
  const client = await sdkClient(keel.url, agent, token);
  const task = (await client.getTask(GetTaskRequest.fromJSON({ id: taskId, historyLength: 0 }))) as { status?: { state: number } };
  return task.status?.state;
}

describe('reconciliation asks the remote', () => {
  it('a callback claiming COMPLETED while GetTask says WORKING resolves nothing; GetTask’s answer decides', async () => {
    const delegation = await delegateToFake(keel, token, 'liar', liar);
    const asked = liar.count('GetTask');
    const forged = {
      task: {
        id: delegation.send.taskId,
        contextId: delegation.send.contextId,
        status: { state: 'TASK_STATE_COMPLETED' },
        artifacts: [{ artifactId: 'forged', parts: [{ text: 'FORGED RESULT' }] }],
      },
    };
    expect((await postCallback(delegation.inboxUrl, completedCallback(delegation.send.taskId, delegation.send.contextId), { bearer: delegation.credential })).status).toBe(200);
    expect((await postCallback(delegation.inboxUrl, forged, { bearer: delegation.credential })).status).toBe(200);
    await waitFor(async () => {
      const rows = await callbacksOfDependency(pool(), delegation.dependency.id);
      return rows.length === 2 && rows.every((row) => row.processed_at !== null);
    }, 'both callbacks to be reconciled');
    expect(liar.count('GetTask')).toBeGreaterThan(asked);
    await sleep(300);

    // Nothing resolved: the dependency waits, the run waits, the local task is WORKING.
    expect(await dependencyById(pool(), delegation.dependency.id)).toMatchObject({ state: 'waiting', outcome: null, resolved_at: null });
    expect(await runSummary(pool(), delegation.runId)).toMatchObject({ status: 'waiting_for_dependency', tool_calls: 1, iterations: 1 });
    expect(await localState('to-liar', delegation.taskId)).toBe(2);

    // When the remote itself says COMPLETED, the result is what GetTask returns, never the body's.
    liar.setState(delegation.send.taskId, 'TASK_STATE_COMPLETED');
    expect((await postCallback(delegation.inboxUrl, forged, { bearer: delegation.credential })).status).toBe(200);
    const task = await waitForLocalTask(keel, token, 'to-liar', delegation.taskId);
    expect(task.status?.state).toBe(3);
    expect(artifactText(task)).toBe(`remote said: ${JSON.stringify({ state: 'completed', result: fakeResultFor(delegation.send.taskId) })}`);
    expect(artifactText(task)).not.toContain('FORGED');
  });

  it('a lost callback (the remote never pushes): the poller resolves the dependency', async () => {
    const { taskId, runId } = await sendLocal(keel, token, 'to-silent', 'nobody will call back');
    await waitFor(async () => silent.calls.getTask >= 1, 'a GetTask of the remote task while it works', 20_000);
    silent.release();
    const task = await waitForLocalTask(keel, token, 'to-silent', taskId);
    expect(task.status?.state).toBe(3);
    expect(artifactText(task)).toContain(sdkResultFor(delegatedText('silent')));

    const [dependency] = await dependenciesOf(pool(), runId);
    expect(dependency).toMatchObject({ state: 'resolved', outcome: 'completed' });
    // The remote was given a callback config and had events to push, but no callback ever came.
    expect(silent.pushConfigs).toHaveLength(1);
    expect(silent.pushEvents()).toBeGreaterThan(0);
    expect(await registrationsOf(pool(), dependency!.id)).toHaveLength(1);
    expect(await callbacksOfDependency(pool(), dependency!.id)).toEqual([]);
    // Polled: asked while WORKING, then again (after the backoff) once done.
    expect(dependency!.polls).toBeGreaterThanOrEqual(1);
    expect(silent.calls.getTaskDone).toBeGreaterThanOrEqual(1);
    expect(await runSummary(pool(), runId)).toMatchObject({ status: 'completed', tool_calls: 1, iterations: 2 });
  });

  it('a callback that arrives before the remote task id is stored is kept, then used', async () => {
    const { taskId, runId } = await sendLocal(keel, token, 'to-early', 'finish before you answer');
    const task = await waitForLocalTask(keel, token, 'to-early', taskId);
    expect(task.status?.state).toBe(3);
    const send = early.sends.at(-1)!;
    expect(artifactText(task)).toBe(`remote said: ${JSON.stringify({ state: 'completed', result: fakeResultFor(send.taskId) })}`);

    // At the callback, the dependency was pending without a remote task id; the inbox took it (200)
    // and kept it, unprocessed, against the pending registration.
    expect(earlyRecords).toHaveLength(1);
    const record = earlyRecords[0]!;
    expect(record.status).toBe(200);
    expect(record.dependency).toEqual({ state: 'pending', remote_task_id: null });
    expect(record.rows).toHaveLength(1);
    expect(record.rows[0]!.processed_at).toBeNull();

    // Once SendMessage answered, the id was stored, the kept callback was reconciled by GetTask.
    const [dependency] = await dependenciesOf(pool(), runId);
    expect(dependency).toMatchObject({ state: 'resolved', outcome: 'completed', remote_task_id: send.taskId });
    const callbacks = await waitFor(async () => {
      const rows = await callbacksOfDependency(pool(), dependency!.id);
      return rows.every((row) => row.processed_at !== null) ? rows : null;
    }, 'the early callback to be processed');
    expect(callbacks.map((row) => row.id)).toEqual([record.rows[0]!.id]);
    expect(callbacks[0]!.received_at).toBeLessThan(send.answeredAt);
    expect(callbacks[0]!.processed_at!).toBeGreaterThanOrEqual(send.answeredAt);
    expect(early.count('GetTask')).toBeGreaterThanOrEqual(1);
  });

  it('a completion callback arriving while a reconcile of the same dependency is in flight is not swallowed', async () => {
    const delegation = await delegateToFake(keel, token, 'slow', slow);
    // The reconcile the executor starts at the suspension has asked already; let it end.
    await waitFor(async () => slow.count('GetTask') >= 1, 'the first GetTask');
    await sleep(700);
    // A dependency that has waited long: its next poll is minutes away (backoff at its ceiling).
    await pool().query(sql.unsafe`UPDATE dependencies SET polls = 10, next_poll_at = now() + interval '10 minutes' WHERE id = ${delegation.dependency.id}`);

    const asked = slow.count('GetTask');
    expect((await postCallback(delegation.inboxUrl, workingCallback(delegation.send.taskId, delegation.send.contextId), { bearer: delegation.credential })).status).toBe(200);
    // That callback's reconcile is now waiting 400 ms for a GetTask that will say WORKING ...
    await waitFor(async () => slow.count('GetTask') > asked, 'the in-flight GetTask', 5000, 5);
    // ... when the remote finishes and pushes its completion.
    slow.setState(delegation.send.taskId, 'TASK_STATE_COMPLETED');
    expect((await postCallback(delegation.inboxUrl, completedCallback(delegation.send.taskId, delegation.send.contextId), { bearer: delegation.credential })).status).toBe(200);

    // Resolved within a few sweeps, not after the 5-minute backoff.
    const task = await waitForLocalTask(keel, token, 'to-slow', delegation.taskId, 15_000);
    expect(task.status?.state).toBe(3);
    expect(artifactText(task)).toContain(fakeResultFor(delegation.send.taskId));
    const callbacks = await callbacksOfDependency(pool(), delegation.dependency.id);
    expect(callbacks).toHaveLength(2);
    await waitFor(async () => (await callbacksOfDependency(pool(), delegation.dependency.id)).every((row) => row.processed_at !== null), 'both callbacks processed');
  });
});
