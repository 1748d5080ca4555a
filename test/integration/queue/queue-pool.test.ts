import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import pg from 'pg';
import { KeelQueues, queueConnectionLimits } from '../../../src/queue/keel-queues.js';
import { QUEUE_NAMES } from '../../../src/queue/queue-names.js';
import { silentLogger } from '../../../src/log/logger.js';
import { createEmptyDatabase } from '../../support/test-database.js';
import { testQueuePrefix } from '../../support/test-queues.js';
import { waitFor } from '../../support/wait-for.js';

// The Postgres queue backend, whichever backend the rest of the suite runs on: a process's queues
// share one pool and each worker has one (its LISTEN connection included), so a process holds a
// bounded number of connections.

let database: { name: string; url: string; drop: () => Promise<void> };
let observer: pg.Client;

beforeAll(async () => {
  database = await createEmptyDatabase();
  observer = new pg.Client({ connectionString: database.url });
  await observer.connect();
});
afterAll(async () => {
  await observer.end();
  await database.drop();
});

/** Every connection on the test's database but the observer's own (workers rename their LISTEN ones). */
async function queueConnections(): Promise<number> {
  const { rows } = await observer.query<{ n: number }>(
    `SELECT count(*)::int AS n FROM pg_stat_activity WHERE datname = $1 AND pid <> pg_backend_pid()`,
    [database.name],
  );
  return rows[0]!.n;
}

/** The pool has ended every connection; their backends leave pg_stat_activity a moment later. */
async function allQueueConnectionsGone(): Promise<void> {
  await waitFor(async () => (await queueConnections()) === 0, 'every queue connection closed', 5_000);
}

async function bullmqTables(): Promise<number> {
  const { rows } = await observer.query<{ n: number }>(`SELECT count(*)::int AS n FROM pg_tables WHERE schemaname = 'bullmq'`);
  return rows[0]!.n;
}

describe('the Postgres queue backend: one pool for the queues, one per worker', () => {
  it("migrates BullMQ's schema on a fresh database at the first use, as a CLI command's probe would", async () => {
    expect(await bullmqTables()).toBe(0);
    const queues = new KeelQueues({ kind: 'postgres', connectionString: database.url, prefix: testQueuePrefix() }, silentLogger());
    try {
      const probe = await queues.probe(10_000);
      expect(probe).toEqual({ ok: true });
      expect(await bullmqTables()).toBeGreaterThan(0);
    } finally {
      await queues.close();
    }
    await allQueueConnectionsGone();
  });

  /** Five queues and five workers process 40 jobs each; the most connections seen on the database meanwhile. */
  async function peakUnderLoad(connectionsPerWorker?: number): Promise<number> {
    const queues = new KeelQueues({ kind: 'postgres', connectionString: database.url, prefix: testQueuePrefix(), connectionsPerWorker }, silentLogger());
    const processed = new Map<string, number>();
    const perQueue = 40;
    let peak = 0;
    const sampling = setInterval(() => {
      void queueConnections().then((n) => (peak = Math.max(peak, n)), () => undefined);
    }, 20);
    try {
      await queues.waitUntilReady();
      const done = new Promise<void>((resolve) => {
        for (const name of QUEUE_NAMES) {
          queues.createWorker(
            name,
            async () => {
              processed.set(name, (processed.get(name) ?? 0) + 1);
              if ([...processed.values()].reduce((a, b) => a + b, 0) === perQueue * QUEUE_NAMES.length) resolve();
            },
            { concurrency: 4 },
          );
        }
      });
      await Promise.all(
        QUEUE_NAMES.flatMap((name) => Array.from({ length: perQueue }, (_, i) => queues.addJob(name, `${name}-${i}`, { i }))),
      );
      await done;
      peak = Math.max(peak, await queueConnections());
    } finally {
      clearInterval(sampling);
      await queues.close();
    }
    expect(Object.fromEntries(processed)).toEqual(Object.fromEntries(QUEUE_NAMES.map((name) => [name, perQueue])));
    await allQueueConnectionsGone();
    return peak;
  }

  it('five queues and five workers under load hold at most 35 connections (five for the queues, six per worker with its LISTEN one), and none after close', async () => {
    // Before, each queue and worker owned a pool of up to five and each worker a LISTEN connection.
    expect(queueConnectionLimits()).toEqual({ producer: 5, worker: 6, total: 35 });
    const peak = await peakUnderLoad();
    expect(peak).toBeGreaterThan(QUEUE_NAMES.length);
    expect(peak).toBeLessThanOrEqual(35);
  });

  it('queue.connectionsPerWorker 2 (the least: a LISTEN connection and one for queries) does the same work in at most 11', async () => {
    expect(queueConnectionLimits(2)).toEqual({ producer: 1, worker: 2, total: 11 });
    const peak = await peakUnderLoad(2);
    expect(peak).toBeGreaterThan(QUEUE_NAMES.length);
    expect(peak).toBeLessThanOrEqual(11);
  });
});
