import { Redis } from 'ioredis';
import { SendMessageRequest, Task } from '@a2a-js/sdk';
import { sql } from 'slonik';
import { afterAll, describe, expect, it } from 'vitest';
import { z } from 'zod';
import { createClient } from '../../../src/auth/client-repository.js';
import { decideApproval, readSuspendedRun } from '../../../src/runs/resume-run.js';
import { getRun } from '../../../src/runs/run-repository.js';
import { encodeMasterKey, generateMasterKey } from '../../../src/sealing/master-key.js';
import { definitionHash } from '../../../src/statecharts/statechart-definition.js';
import { machine as v1 } from '../../fixtures/statecharts/order-v1.machine.js';
import { machine as v2 } from '../../fixtures/statecharts/order-v2.machine.js';
import { sdkClient } from '../../support/a2a-client.js';
import { createTestDatabase, type TestDatabase } from '../../support/test-database.js';
import { startTestKeel, tempDir, type TestKeel } from '../../support/test-keel.js';
import { TEST_REDIS_URL, testQueueKind, testQueuePrefix } from '../../support/test-queues.js';
import { waitFor, waitForRunStatus } from '../../support/wait-for.js';

// A changed definition with runs in flight (issue 16, "Versions"): Keel runs v1 of the order
// machine and leaves one run waiting for an approval in `approving` and another waiting for input
// in `asking`; it restarts with v2, which renamed `approving` to `reviewing`. Approving the first
// run makes it fail with not_retryable, naming the state and the version it started with; the
// second goes on and completes on v2. A run keeps the version (hash) it started with; each
// transition of its path records the version that took it.

const QUEUE = testQueueKind();
const V1 = new URL('../../fixtures/statecharts/order-v1.machine.ts', import.meta.url).pathname;
const V2 = new URL('../../fixtures/statecharts/order-v2.machine.ts', import.meta.url).pathname;

const redisUrl = QUEUE === 'redis' ? TEST_REDIS_URL : null;
const queuePrefix = testQueuePrefix();
let database: TestDatabase | null = null;
const keels: TestKeel[] = [];

afterAll(async () => {
  for (const keel of keels) await keel.dispose().catch(() => undefined);
  await database?.drop().catch(() => undefined);
  if (redisUrl) {
    const redis = new Redis(redisUrl, { maxRetriesPerRequest: 1 });
    for (let cursor = '0'; ; ) {
      const [next, keys] = await redis.scan(cursor, 'MATCH', `${queuePrefix}:*`, 'COUNT', 500);
      if (keys.length > 0) await redis.del(...keys);
      cursor = next;
      if (cursor === '0') break;
    }
    await redis.quit();
  }
});

type Json = Record<string, any>; // eslint-disable-line @typescript-eslint/no-explicit-any
const asJson = (result: unknown) => Task.toJSON(result as Task) as Json;

async function pathOf(pool: TestDatabase['pool'], runId: string): Promise<{ state: string; hash: string }[]> {
  const rows = await pool.any(sql.type(z.object({ state: z.unknown(), machine_hash: z.string() }))`
    SELECT state, machine_hash FROM run_machine_steps WHERE run_id = ${runId} ORDER BY sequence`);
  return rows.map((row) => ({ state: JSON.stringify(row.state), hash: row.machine_hash }));
}

describe(`a changed machine definition with runs in flight on the ${QUEUE} queue backend`, () => {
  it('the run waiting in a state v2 lacks fails naming the state and its version; the run in a state both have completes on v2', { timeout: 90_000 }, async () => {
    database = await createTestDatabase();
    const { pool } = database;
    // Both Keels: one database, master key and queue prefix; only the agent's machine module differs.
    const masterKey = encodeMasterKey(generateMasterKey());
    const dataDir = tempDir('keel-statechart-versions-data-');
    const env = (machine: string): Record<string, string> => ({
      KEEL_MASTER_KEY: masterKey,
      KEEL_QUEUE_PREFIX: queuePrefix,
      KEEL_DATA_DIR: dataDir,
      KEEL_AGENTS: JSON.stringify([{ id: 'order', name: 'Order', machine, privacy: { answerLevel: 'full' } }]),
    });
    const client = await createClient(pool, 'statechart-versions');
    if (!client.ok) throw new Error('cannot create the client');

    const hashV1 = definitionHash(v1);
    const hashV2 = definitionHash(v2);
    expect(hashV1).not.toBe(hashV2);

    // v1: one run waits for an operator in `approving`, another for the client's amount in `asking`.
    const first = await startTestKeel({ databaseUrl: database.url, env: env(V1) });
    keels.push(first);
    expect(first.registry.get('order')!.statechart!.hash).toBe(hashV1);
    const a2a = await sdkClient(first.url, 'order', client.token);
    const toApprove = asJson(
      await a2a.sendMessage(
        SendMessageRequest.fromJSON({
          message: { messageId: 'versions-approve', role: 'ROLE_USER', parts: [{ text: 'refund' }, { data: { amount: 500 } }] },
          configuration: { returnImmediately: true },
        }),
      ),
    );
    const asked = asJson(await a2a.sendMessage(SendMessageRequest.fromJSON({ message: { messageId: 'versions-ask', role: 'ROLE_USER', parts: [{ text: 'refund my order' }] } })));
    expect(asked.status.state).toBe('TASK_STATE_INPUT_REQUIRED');
    const waitingApproval = await waitForRunStatus(pool, toApprove.id, ['waiting_for_approval', 'completed', 'failed', 'cancelled']);
    expect(waitingApproval).toMatchObject({ status: 'waiting_for_approval', machine_hash: hashV1, machine_state: 'approving' });
    expect(await getRun(pool, asked.id)).toMatchObject({ status: 'waiting_for_input', machine_hash: hashV1, machine_state: 'asking' });
    keels.splice(keels.indexOf(first), 1);
    await first.dispose();

    // v2 deployed on the same database and queues.
    const second = await startTestKeel({ databaseUrl: database.url, env: env(V2) });
    keels.push(second);
    expect(second.registry.get('order')!.statechart!.hash).toBe(hashV2);
    const a2aV2 = await sdkClient(second.url, 'order', client.token);

    // The operator approves the run v1 left in `approving`: it cannot go on and says why.
    const suspended = await readSuspendedRun(pool, second.context.sealer, toApprove.id, 'waiting_for_approval');
    if (!suspended.ok) throw new Error(`the run does not wait for an approval: ${suspended.reason}`);
    expect((await decideApproval(second.context, toApprove.id, suspended.view.state.pendingApproval!.digest, true)).ok).toBe(true);
    const failed = await waitForRunStatus(pool, toApprove.id, ['completed', 'failed', 'cancelled']);
    expect(failed).toMatchObject({ status: 'failed', termination_reason: 'not_retryable', machine_hash: hashV1, machine_state: 'approving' });
    expect(failed.failure_detail).toEqual({ reason: 'machine_version', state: 'approving', startedWith: hashV1, current: hashV2 });
    // Nothing of v2 was committed for it: its path ends where v1 left it.
    expect(await pathOf(pool, toApprove.id)).toEqual([{ state: '"approving"', hash: hashV1 }]);
    const failedTask = await waitFor(async () => {
      const task = asJson(await a2aV2.getTask({ id: toApprove.id } as never));
      return task.status.state === 'TASK_STATE_FAILED' ? task : null;
    }, 'the task to show FAILED');
    const message = String(failedTask.status.message.parts[0].text);
    expect(message).toContain('"approving"');
    expect(message).toContain(hashV1);

    // The client answers the run v1 left in `asking`, a state v2 has: it completes on v2.
    await a2aV2.sendMessage(
      SendMessageRequest.fromJSON({
        message: { messageId: 'versions-reply', role: 'ROLE_USER', taskId: asked.id, contextId: asked.contextId, parts: [{ data: { amount: 50 } }] },
        configuration: { returnImmediately: true },
      }),
    );
    const completed = await waitForRunStatus(pool, asked.id, ['completed', 'failed', 'cancelled']);
    // runs.machine_hash keeps the version the run started with; each row of its path names the version that took that transition.
    expect(completed).toMatchObject({ status: 'completed', termination_reason: 'completed', machine_hash: hashV1, machine_state: 'done' });
    expect(await pathOf(pool, asked.id)).toEqual([
      { state: '"asking"', hash: hashV1 },
      { state: '"paying"', hash: hashV2 },
      { state: '"done"', hash: hashV2 },
    ]);
    const done = await waitFor(async () => {
      const task = asJson(await a2aV2.getTask({ id: asked.id } as never));
      return task.status.state === 'TASK_STATE_COMPLETED' ? task : null;
    }, 'the task to complete');
    expect((done.artifacts as Json[]).find((artifact) => artifact.name === 'answer')!.parts[0].text).toBe('paid 50: v2-r-50');

    // A new run on v2 waits in the renamed state.
    const fresh = asJson(
      await a2aV2.sendMessage(
        SendMessageRequest.fromJSON({
          message: { messageId: 'versions-fresh', role: 'ROLE_USER', parts: [{ text: 'refund' }, { data: { amount: 700 } }] },
          configuration: { returnImmediately: true },
        }),
      ),
    );
    expect(await waitForRunStatus(pool, fresh.id, ['waiting_for_approval', 'completed', 'failed', 'cancelled'])).toMatchObject({
      status: 'waiting_for_approval',
      machine_hash: hashV2,
      machine_state: 'reviewing',
    });
  });
});
