import pg from 'pg';
import { sql } from 'slonik';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { z } from 'zod';
import { createDatabasePool, type DatabasePool } from '../../../src/db/pool.js';
import { callA2A, expectA2AResult } from '../../support/a2a-wire.js';
import { startCuttingProxy, type CuttingProxy } from '../../support/cutting-proxy.js';
import { createEmptyDatabase } from '../../support/test-database.js';
import { startTestKeel, type TestKeel } from '../../support/test-keel.js';
import { waitFor } from '../../support/wait-for.js';
import { newClientToken } from '../push/push-support.js';

// A blocking SendMessage whose run's end is written by this process, and the connection carrying
// that write is cut while the server still runs it: Keel does not know whether it committed (the
// server finishes the statement and commits; Keel's side saw "Connection terminated"). A fast
// task nobody streams is ended without a NOTIFY (decision 0047), so nothing else wakes the wait.
// The answer must come from what the database holds as soon as it answers again, not after
// a2a.blockingCapSeconds; and the run, which this process still holds, is not left to its lease.
// The same when the end was lost with its connection (the backend terminated before COMMIT): the
// process that holds the run writes it again as soon as the database answers (no requeue).

const CAP_SECONDS = 20;
const providers = { slow: { type: 'scripted', steps: [{ reply: 'slow done', delayMs: 1500 }] } };
const agents = [{ id: 'slow', name: 'Slow', provider: 'slow', privacy: { answerLevel: 'full' } }];

const taskRow = z.object({ id: z.string(), state: z.string() });
const waiting = z.object({ pid: z.number(), client_port: z.number().nullable(), query: z.string() });
const runRow = z.object({ status: z.string(), requeue_count: z.number() });

describe('a run end whose commit outcome is unknown', () => {
  let proxy: CuttingProxy;
  let keel: TestKeel;
  let direct: DatabasePool;
  let drop: () => Promise<void> = async () => undefined;
  let databaseName = '';
  let databaseUrl = '';
  let token = '';

  beforeAll(async () => {
    proxy = await startCuttingProxy();
    const database = await createEmptyDatabase();
    drop = database.drop;
    databaseName = database.name;
    databaseUrl = database.url;
    keel = await startTestKeel({
      databaseUrl: proxy.urlFor(database.url),
      overrides: { KEEL_PRIVACY_LEVEL: 'full', KEEL_A2A_BLOCKING_CAP_SECONDS: String(CAP_SECONDS), KEEL_PROVIDERS: providers, KEEL_AGENTS: agents },
    });
    direct = await createDatabasePool(database.url, { maximumPoolSize: 3 });
    token = await newClientToken(direct);
  });
  afterAll(async () => {
    await keel?.dispose();
    await direct?.end();
    await proxy?.close();
    await drop();
  });

  /**
   * Sends a blocking message to the slow agent and, once its run's end waits on the task row's
   * lock (held by a connection of the test), does `strike` to the connection carrying that end,
   * then lets go of the lock. Returns the answer, the task and how long after the strike it came.
   */
  async function struckEnd(strike: (blocked: z.infer<typeof waiting>) => Promise<void>) {
    const sent = callA2A(
      keel.url,
      'slow',
      'JSONRPC',
      'SendMessage',
      { message: { messageId: `unknown-${Date.now()}-${Math.random()}`, role: 'ROLE_USER', parts: [{ text: 'cut me' }] } },
      { token },
    );
    // The task, WORKING on the fast path, while its run waits on the provider.
    const task = await waitFor(() => direct.maybeOne(sql.type(taskRow)`SELECT id, state FROM a2a_tasks WHERE state = 'TASK_STATE_WORKING' LIMIT 1`), 'the task', 5000);
    const taskId = task.id;
    const holder = new pg.Client({ connectionString: databaseUrl });
    await holder.connect();
    let struckAt = 0;
    try {
      await holder.query('BEGIN');
      await holder.query('SELECT 1 FROM a2a_tasks WHERE id = $1 FOR UPDATE', [taskId]);
      const blocked = await waitFor(
        () =>
          direct.maybeOne(sql.type(waiting)`
            SELECT pid, client_port, query FROM pg_stat_activity
            WHERE datname = ${databaseName} AND wait_event_type = 'Lock' AND pid <> pg_backend_pid()
            LIMIT 1`),
        "the run's end waiting on the task row's lock",
        10_000,
      );
      await strike(blocked);
      struckAt = Date.now();
    } finally {
      await holder.query('COMMIT');
      await holder.end();
    }
    const answer = expectA2AResult('JSONRPC', await sent) as { task: { id: string; status: { state: string }; artifacts?: Array<{ parts: Array<{ text: string }> }> } };
    return { answer, taskId, answeredAfterMs: Date.now() - struckAt };
  }

  async function expectCompletedAsCommitted(taskId: string, answer: Awaited<ReturnType<typeof struckEnd>>['answer'], answeredAfterMs: number) {
    expect(answer.task.id).toBe(taskId);
    expect(answer.task.status.state).toBe('TASK_STATE_COMPLETED');
    expect(answer.task.artifacts?.[0]?.parts[0]?.text).toBe('slow done');
    expect(answeredAfterMs, 'answered within seconds, not after the cap').toBeLessThan(5000);
    // What GetTask reads is what the answer said, and the run was neither requeued nor left open.
    expect(expectA2AResult('JSONRPC', await callA2A(keel.url, 'slow', 'JSONRPC', 'GetTask', { id: taskId }, { token }))).toEqual(answer.task);
    expect(await direct.one(sql.type(runRow)`SELECT status, requeue_count FROM runs WHERE id = ${taskId}`)).toEqual({ status: 'completed', requeue_count: 0 });
    const states = await direct.anyFirst(sql.type(z.object({ state: z.string().nullable() }))`SELECT state FROM a2a_events WHERE task_id = ${taskId} ORDER BY sequence`);
    expect(states.filter((state) => state !== null), 'no event twice, no way back to SUBMITTED').toEqual(['TASK_STATE_WORKING', 'TASK_STATE_COMPLETED']);
  }

  it('the end committed, Keel never heard: the answer is the task as committed, within seconds, not after the blocking cap', async () => {
    // Cut at the proxy: the server writes the end and commits it once the lock is let go.
    const { answer, taskId, answeredAfterMs } = await struckEnd(async (blocked) => {
      expect(proxy.cut(blocked.client_port!), 'the blocked connection goes through the proxy').toBe(true);
    });
    await expectCompletedAsCommitted(taskId, answer, answeredAfterMs);
  }, 60_000);

  it('the end was lost with its connection: the process writes it again at once under the same claim, and the answer is COMPLETED', async () => {
    // The backend terminated while it waits: its transaction never commits.
    const { answer, taskId, answeredAfterMs } = await struckEnd(async (blocked) => {
      await direct.query(sql.unsafe`SELECT pg_terminate_backend(${blocked.pid})`);
    });
    await expectCompletedAsCommitted(taskId, answer, answeredAfterMs);
  }, 60_000);
});
