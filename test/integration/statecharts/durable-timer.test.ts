import { readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { SendMessageRequest, Task } from '@a2a-js/sdk';
import { Redis } from 'ioredis';
import { sql } from 'slonik';
import { afterAll, describe, expect, it } from 'vitest';
import { z } from 'zod';
import { createClient } from '../../../src/auth/client-repository.js';
import { silentLogger } from '../../../src/log/logger.js';
import { timerJobId } from '../../../src/queue/job-ids.js';
import { KeelQueues } from '../../../src/queue/keel-queues.js';
import { listRunEvents, type RunEventRow } from '../../../src/runs/run-event-repository.js';
import { getRun } from '../../../src/runs/run-repository.js';
import type { RunRow } from '../../../src/runs/run-row.js';
import { encodeMasterKey, generateMasterKey } from '../../../src/sealing/master-key.js';
import { sdkClient } from '../../support/a2a-client.js';
import { createTestDatabase, type TestDatabase } from '../../support/test-database.js';
import { startTestKeel, tempDir, type TestKeel } from '../../support/test-keel.js';
import { TEST_REDIS_URL, testQueueBackend, testQueueKind, testQueuePrefix } from '../../support/test-queues.js';
import { waitFor, waitForRunStatus } from '../../support/wait-for.js';

// A durable `after` (issue 16, "Time"): a statechart run that waits 10 s is suspended
// (waiting_for_timer, due at timer_due_at) with a delayed wake-up job; Keel stops in the middle of
// the wait and another Keel starts on the same database and queues. The run goes on at its due
// time, not before, and exactly once; a wake-up job lost while no Keel ran (a wiped Redis, a
// dropped job) is restored by the sweep with what is left of the wait.

const QUEUE = testQueueKind();
const MACHINE = new URL('../../fixtures/statecharts/order.machine.ts', import.meta.url).pathname;
const WAIT_MS = 10_000;

const redisUrl = QUEUE === 'redis' ? TEST_REDIS_URL : null;
const queuePrefix = testQueuePrefix();
const stepLog = join(tempDir('keel-statechart-timer-'), 'steps.log');

let database: TestDatabase | null = null;
const keels: TestKeel[] = [];
const queueSets: KeelQueues[] = [];

afterAll(async () => {
  for (const keel of keels) await keel.dispose().catch(() => undefined);
  for (const queues of queueSets) await queues.close().catch(() => undefined);
  await database?.drop().catch(() => undefined);
  delete process.env.KEEL_TEST_STEP_LOG;
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
const stepLines = () => readFileSync(stepLog, 'utf8').split('\n').filter(Boolean);
const eventsOf = (events: readonly RunEventRow[], kind: string) => events.filter((event) => event.kind === kind);
const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));

async function pathOf(pool: TestDatabase['pool'], runId: string): Promise<string[]> {
  const rows = await pool.any(sql.type(z.object({ state: z.unknown() }))`
    SELECT state FROM run_machine_steps WHERE run_id = ${runId} ORDER BY sequence`);
  return rows.map((row) => JSON.stringify(row.state));
}

/** The journal of a task: each status event's state, else the event's kind. */
async function journalStates(pool: TestDatabase['pool'], taskId: string): Promise<readonly string[]> {
  return pool.anyFirst(sql.type(z.object({ state: z.string() }))`
    SELECT coalesce(state, kind) AS state FROM a2a_events WHERE task_id = ${taskId} ORDER BY sequence`);
}

describe(`a durable after on the ${QUEUE} queue backend`, () => {
  it('a 10 s wait survives a restart in the middle: the run goes on at its due time, once; a wake-up lost meanwhile is restored by the sweep', { timeout: 120_000 }, async () => {
    writeFileSync(stepLog, '');
    process.env.KEEL_TEST_STEP_LOG = stepLog;
    delete process.env.KEEL_TEST_STEP_HOLD_MS;
    database = await createTestDatabase();
    const { pool } = database;
    // Both Keels: one database, master key and queue prefix, as two processes of one installation.
    const env: Record<string, string> = {
      KEEL_MASTER_KEY: encodeMasterKey(generateMasterKey()),
      KEEL_QUEUE_PREFIX: queuePrefix,
      KEEL_DATA_DIR: tempDir('keel-statechart-timer-data-'),
      KEEL_MAINTENANCE_SWEEP_SECONDS: '1',
      KEEL_AGENTS: JSON.stringify([{ id: 'order', name: 'Order', machine: MACHINE, privacy: { answerLevel: 'full' } }]),
    };
    const client = await createClient(pool, 'statechart-timer');
    if (!client.ok) throw new Error('cannot create the client');

    const first = await startTestKeel({ databaseUrl: database.url, env });
    keels.push(first);
    const a2a = await sdkClient(first.url, 'order', client.token);
    const send = async (messageId: string) =>
      asJson(
        await a2a.sendMessage(
          SendMessageRequest.fromJSON({
            message: { messageId, role: 'ROLE_USER', parts: [{ text: 'refund later' }, { data: { amount: 10, waitMs: WAIT_MS } }] },
            configuration: { returnImmediately: true },
          }),
        ),
      );

    const sentAt = Date.now();
    // `kept` keeps its wake-up job across the restart; `lost` loses it while no Keel runs.
    const kept = String((await send('timer-kept')).id);
    const lost = String((await send('timer-lost')).id);

    const waiting = new Map<string, RunRow>();
    for (const id of [kept, lost]) {
      waiting.set(id, await waitForRunStatus(pool, id, ['waiting_for_timer', 'completed', 'failed', 'cancelled'], 10_000));
    }
    const observedAt = Date.now();
    for (const [id, row] of waiting) {
      expect(row).toMatchObject({ status: 'waiting_for_timer', claimed_by: null, lease_expires_at: null });
      expect(row.machine_state).toBe('pausing');
      // Due 10 s after the transition into `pausing` committed, which happened between the send and now.
      expect(row.timer_due_at!).toBeGreaterThanOrEqual(sentAt + WAIT_MS - 50);
      expect(row.timer_due_at!).toBeLessThanOrEqual(observedAt + WAIT_MS + 50);
      // The wake-up job is added just after the suspension commits (run-executor), so it may land a
      // moment after the row shows waiting_for_timer; it must then be there, and delayed.
      const job = await waitFor(() => first.context.queues.queue('runs').getJob(timerJobId(id, row.revision)), `${id}'s wake-up job`, 5_000);
      expect(await job.getState()).toBe('delayed');
      expect(asJson(await a2a.getTask({ id } as never)).status.state).toBe('TASK_STATE_WORKING');
    }

    // Keel stops in the middle of the wait; nothing about the waiting runs changes.
    keels.splice(keels.indexOf(first), 1);
    await first.dispose();
    for (const [id, row] of waiting) expect(await getRun(pool, id)).toMatchObject({ status: 'waiting_for_timer', revision: row.revision, timer_due_at: row.timer_due_at });

    // While no Keel runs, `lost`'s wake-up job disappears.
    const queues = new KeelQueues(testQueueBackend(database.url, queuePrefix), silentLogger());
    queueSets.push(queues);
    const lostJobId = timerJobId(lost, waiting.get(lost)!.revision);
    await (await queues.queue('runs').getJob(lostJobId))!.remove();
    expect(await queues.queue('runs').getJob(lostJobId)).toBeFalsy();
    // A moment with no Keel at all, well before the due time.
    await sleep(1000);
    expect(stepLines().filter((line) => line.startsWith('pay '))).toHaveLength(0);

    const second = await startTestKeel({ databaseUrl: database.url, env });
    keels.push(second);
    const restartedAt = Date.now();
    expect(restartedAt).toBeLessThan(Math.min(...[...waiting.values()].map((row) => row.timer_due_at!)));

    // The sweep gives `lost` its wake-up back, still delayed, before the due time.
    const restored = await waitFor(async () => {
      const job = await queues.queue('runs').getJob(lostJobId);
      return job && (await job.getState()) === 'delayed' ? job : null;
    }, 'the sweep to restore the lost wake-up', 5_000);
    expect(restored.data).toEqual({ runId: lost });

    const settled = new Map<string, RunRow>();
    for (const id of [kept, lost]) settled.set(id, await waitForRunStatus(pool, id, ['completed', 'failed', 'cancelled'], 30_000));

    const a2aAfter = await sdkClient(second.url, 'order', client.token);
    for (const [id, row] of settled) {
      const due = waiting.get(id)!.timer_due_at!;
      expect(row).toMatchObject({ status: 'completed', termination_reason: 'completed', machine_state: 'done', requeue_count: 0 });
      // Not before the due time: the wake-up claim and the completion both came after it.
      expect(row.settled_at!).toBeGreaterThanOrEqual(due);
      // And at it: woken by its delayed job (the kept one, or the one the sweep restored), not by a later repair.
      expect(row.settled_at!).toBeLessThan(due + 5000);
      const events = await listRunEvents(pool, id);
      const resumed = eventsOf(events, 'resumed');
      expect(resumed).toHaveLength(1);
      expect((resumed[0]!.payload as { worker?: unknown }).worker).toBe(second.context.workerId);
      expect(resumed[0]!.created_at).toBeGreaterThanOrEqual(due);
      expect(eventsOf(events, 'completed')).toHaveLength(1);

      // Once: each transition committed once, one COMPLETED in the journal, the answer of one payment.
      expect(await pathOf(pool, id)).toEqual(['"checking"', '"pausing"', '"paying"', '"done"']);
      expect((await journalStates(pool, id)).filter((state) => state === 'TASK_STATE_COMPLETED')).toHaveLength(1);
      const task = asJson(await a2aAfter.getTask({ id } as never));
      expect(task.status.state).toBe('TASK_STATE_COMPLETED');
      expect((task.artifacts as Json[]).find((artifact) => artifact.name === 'answer')!.parts[0].text).toBe('paid 10');
    }
    // One payment per run, each after its due time (the step ran in the second Keel).
    const pays = stepLines().filter((line) => line.startsWith('pay '));
    expect(pays).toHaveLength(2);

    // Later sweeps find nothing more to do: no run is woken again.
    await sleep(2500);
    for (const [id, row] of settled) expect(await getRun(pool, id)).toMatchObject({ status: 'completed', revision: row.revision });
    expect(stepLines().filter((line) => line.startsWith('pay '))).toHaveLength(2);
  });
});
