import { Task } from '@a2a-js/sdk';
import pg from 'pg';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { queueConnectionLimits } from '../../../src/queue/keel-queues.js';
import { newClientToken } from '../push/push-support.js';
import { sdkClient, textMessage } from '../../support/a2a-client.js';
import { ADMIN_URL } from '../../support/test-database.js';
import { testQueueKind } from '../../support/test-queues.js';
import { startTestKeel, type TestKeel } from '../../support/test-keel.js';

// database.maxConnections and queue.connectionsPerWorker (decision 0040): an operator whose
// Postgres has few connections to spare sizes a process's pools, and the process does the same work
// within them. Sampled on the server, by each connection's application name: the process's own
// pool is `keel`, its LISTEN connection `keel-journal-listener`; on the Postgres queue backend the
// queues' pools are `keel-queues` and each worker's LISTEN connection carries its queue's name.

const QUEUE = testQueueKind();
const OWN = 3;
const PER_WORKER = 2;
const TASKS = 60;

let keel: TestKeel;
let observer: pg.Client;
let token = '';

beforeAll(async () => {
  keel = await startTestKeel({ overrides: { KEEL_DATABASE_MAX_CONNECTIONS: String(OWN), KEEL_QUEUE_CONNECTIONS_PER_WORKER: String(PER_WORKER) } });
  observer = new pg.Client({ connectionString: ADMIN_URL });
  await observer.connect();
  token = await newClientToken(keel.context.pool, 'connection-limits');
});
afterAll(async () => {
  await observer?.end();
  await keel?.dispose();
});

/** The process's connections on its database, by role. */
async function connections(): Promise<{ own: number; listener: number; queues: number }> {
  const { rows } = await observer.query<{ application_name: string; n: number }>(
    `SELECT application_name, count(*)::int AS n FROM pg_stat_activity WHERE datname = $1 GROUP BY 1`,
    [new URL(keel.databaseUrl).pathname.slice(1)],
  );
  const count = (name: string) => rows.find((row) => row.application_name === name)?.n ?? 0;
  return { own: count('keel'), listener: count('keel-journal-listener'), queues: rows.reduce((sum, row) => sum + row.n, 0) - count('keel') - count('keel-journal-listener') };
}

describe(`a process with small pools on the ${QUEUE} queue backend`, () => {
  it(`answers ${TASKS} concurrent blocking SendMessages within database.maxConnections ${OWN} and queue.connectionsPerWorker ${PER_WORKER}`, async () => {
    expect(keel.config.database.maxConnections).toBe(OWN);
    expect(keel.config.queue.connectionsPerWorker).toBe(PER_WORKER);
    const a2a = await sdkClient(keel.url, 'echo', token);
    const peak = { own: 0, listener: 0, queues: 0 };
    let samples = 0;
    const sampling = setInterval(() => {
      void connections().then((seen) => {
        samples += 1;
        for (const key of ['own', 'listener', 'queues'] as const) peak[key] = Math.max(peak[key], seen[key]);
      }, () => undefined);
    }, 10);
    let answers: Record<string, unknown>[];
    try {
      answers = await Promise.all(
        Array.from({ length: TASKS }, async (_, i) =>
          Task.toJSON((await a2a.sendMessage(textMessage(`hello ${i}`, { messageId: `limits-${i}` }))) as Task) as Record<string, unknown>,
        ),
      );
    } finally {
      clearInterval(sampling);
    }
    expect(answers.map((task) => (task.status as { state: string }).state)).toEqual(Array(TASKS).fill('TASK_STATE_COMPLETED'));
    expect(samples).toBeGreaterThan(0);
    expect(peak.own).toBeGreaterThan(0);
    expect(peak.own).toBeLessThanOrEqual(OWN);
    expect(peak.listener).toBe(1);
    // Five workers' pools of two and the queues' pool of one; nothing on Postgres when the queues run on Redis.
    if (QUEUE === 'postgres') expect(peak.queues).toBeLessThanOrEqual(queueConnectionLimits(PER_WORKER).total);
    else expect(peak.queues).toBe(0);
  });
});
