import { CancelTaskRequest, Task } from '@a2a-js/sdk';
import { sql } from 'slonik';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { z } from 'zod';
import { listRunEvents } from '../../../src/runs/run-event-repository.js';
import { sdkClient, textMessage } from '../../support/a2a-client.js';
import { createTestDatabase, type TestDatabase } from '../../support/test-database.js';
import { startTestKeel, type TestKeel } from '../../support/test-keel.js';
import { testQueueKind } from '../../support/test-queues.js';
import { waitFor, waitForRunStatus } from '../../support/wait-for.js';
import { LOOPBACK, delegatingOverrides, dependenciesOf, freePort, newToken } from './remote-support.js';

// Issue 41: a cancelled parent never leaves a child running that Keel started. Keel A delegates to
// Keel B's slow worker (the `remote_agent` tool of an agent loop, and a statechart's
// callRemoteAgent); while B's task runs, A's task is cancelled. A cancels B's task through the
// client role (CancelTask as the client B issued to A), B's run stops, and A's timeline records it.

const QUEUE = testQueueKind();
const DELEGATE = new URL('../../fixtures/statecharts/delegate.machine.ts', import.meta.url).pathname;

let a: TestKeel;
let b: TestKeel;
const databases: TestDatabase[] = [];
let token = '';

beforeAll(async () => {
  const [databaseA, databaseB] = await Promise.all([createTestDatabase(), createTestDatabase()]);
  databases.push(databaseA, databaseB);
  const tokenForB = await newToken(databaseB.pool, 'keel-a');
  const portB = await freePort();
  const urlB = `http://${LOOPBACK}:${portB}`;
  b = await startTestKeel({
    databaseUrl: databaseB.url,
    overrides: {
      // B's worker takes a minute unless its run is cancelled (the scripted delay honours its signal).
      ...delegatingOverrides([], {
        providers: { worker: { type: 'scripted', steps: [{ delayMs: 60_000, reply: 'work done by keel-b' }] } },
        agents: [{ id: 'worker', name: 'Worker', provider: 'worker' }],
      }),
      KEEL_SERVER_PORT: String(portB),
    },
  });
  a = await startTestKeel({
    databaseUrl: databaseA.url,
    env: { KEEL_B_TOKEN: tokenForB },
    overrides: delegatingOverrides([{ id: 'keel-b', cardUrl: `${urlB}/a2a/worker/.well-known/agent-card.json`, credentialEnv: 'KEEL_B_TOKEN', registration: 'embedded' }], {
      agents: [{ id: 'delegates', name: 'Delegates', machine: DELEGATE, tools: ['remote_agent'] }],
    }),
  });
  token = await newToken(databaseA.pool, 'tester');
});
afterAll(async () => {
  await Promise.all([a?.dispose(), b?.dispose()]);
  await Promise.all(databases.map((database) => database.drop()));
});

const remoteTask = z.object({ state: z.string(), run_status: z.string() });

describe(`a cancelled parent cancels its remote child (${QUEUE} queue backend)`, () => {
  it.each([
    { how: 'the remote_agent tool of an agent loop', agent: 'to-keel-b' },
    { how: "a statechart's callRemoteAgent", agent: 'delegates' },
  ])('through $how: the child task on the second Keel ends CANCELED', async ({ agent }) => {
    const client = await sdkClient(a.url, agent, token);
    const sent = Task.toJSON((await client.sendMessage(textMessage('please do the slow work', { returnImmediately: true }))) as Task) as { id: string };
    await waitForRunStatus(a.context.pool, sent.id, ['waiting_for_dependency'], 20_000);
    const dependency = await waitFor(async () => (await dependenciesOf(a.context.pool, sent.id)).find((row) => row.remote_task_id !== null), 'the remote task id');
    const childId = dependency.remote_task_id!;
    // The child is running on B (its provider call in flight).
    await waitFor(
      async () => (await b.context.pool.maybeOneFirst(sql.type(z.object({ status: z.string() }))`SELECT status FROM runs WHERE task_id = ${childId}`)) === 'running',
      'the child run to be running on keel-b',
    );

    const cancelledAt = Date.now();
    const answer = Task.toJSON(await client.cancelTask(CancelTaskRequest.fromJSON({ id: sent.id }))) as { status: { state: string } };
    expect(answer.status.state).toBe('TASK_STATE_CANCELED');

    // B's task ends CANCELED, and its run stopped.
    const child = await waitFor(async () => {
      const row = await b.context.pool.one(sql.type(remoteTask)`
        SELECT t.state, r.status AS run_status FROM a2a_tasks t JOIN runs r ON r.id = t.run_id WHERE t.id = ${childId}`);
      return row.state === 'TASK_STATE_CANCELED' ? row : null;
    }, 'the child task to be CANCELED on keel-b', 15_000);
    expect(child).toEqual({ state: 'TASK_STATE_CANCELED', run_status: 'cancelled' });
    const childEndedInMs = Date.now() - cancelledAt;
    if (process.env.KEEL_PRINT_CANCEL_FIGURES) console.log(`[cancel] ${QUEUE} remote child CANCELED after the parent's CancelTask (${agent}): ${childEndedInMs} ms`);
    expect(childEndedInMs, 'the child ends well before its minute of work').toBeLessThan(10_000);

    // A's side: the dependency ended, and the parent's timeline says what was cancelled.
    const ended = await waitFor(async () => (await dependenciesOf(a.context.pool, sent.id)).find((row) => row.state !== 'waiting'), 'the dependency to end');
    expect(ended).toMatchObject({ state: 'failed', outcome: 'parent_cancelled', remote_task_id: childId });
    const events = await waitFor(async () => {
      const rows = await listRunEvents(a.context.pool, sent.id);
      return rows.some((row) => row.kind === 'remote_task_cancelled') ? rows : null;
    }, "remote_task_cancelled in the parent's timeline");
    expect(events.find((row) => row.kind === 'cancelled')?.payload).toEqual({ from: 'waiting_for_dependency' });
    // `canceled`, or `already_ended` when a reconcile woken by B's own CANCELED push asked again
    // and won the dependency's guarded end (either way, only A's cancel ended the child).
    expect(events.find((row) => row.kind === 'remote_task_cancelled')?.payload).toEqual({
      remoteAgent: 'keel-b',
      remoteTaskId: childId,
      dependencyId: ended.id,
      answer: expect.stringMatching(/^(canceled|already_ended)$/),
    });
    const kinds = events.map((row) => row.kind);
    expect(kinds.indexOf('cancelled')).toBeLessThan(kinds.indexOf('remote_task_cancelled'));
  }, 60_000);
});
