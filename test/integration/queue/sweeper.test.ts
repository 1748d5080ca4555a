import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createRun } from '../../../src/runs/run-repository.js';
import { runJobId } from '../../../src/queue/job-ids.js';
import { KeelQueues } from '../../../src/queue/keel-queues.js';
import { silentLogger } from '../../../src/log/logger.js';
import { sweepDebts } from '../../../workers/maintenance.js';
import { createTestDatabase, type TestDatabase } from '../../support/test-database.js';
import { testQueueBackend, testQueueKind } from '../../support/test-queues.js';
import { testSealer } from '../../support/test-sealer.js';
import { sql } from 'slonik';

let db: TestDatabase;
let queues: KeelQueues;
const sealer = testSealer();
const logger = silentLogger();

beforeAll(async () => {
  db = await createTestDatabase();
  queues = new KeelQueues(testQueueBackend(db.url), logger);
  await queues.waitUntilReady();
});
afterAll(async () => {
  await Promise.all(queues.allQueues().map((queue) => queue.obliterate({ force: true }).catch(() => undefined)));
  await queues.close();
  await db.drop();
});

describe(`maintenance sweep on the ${testQueueKind()} queue backend`, () => {
  it('restores the job of a QUEUED run whose job was deleted, and only that one', async () => {
    const run = await createRun(db.pool, sealer, { agent: 'echo', auditLevel: 'metadata', answerLevel: 'full', request: {} });
    const other = await createRun(db.pool, sealer, { agent: 'echo', auditLevel: 'metadata', answerLevel: 'full', request: {} });
    await queues.addJob('runs', runJobId(run.id), { runId: run.id });
    await queues.addJob('runs', runJobId(other.id), { runId: other.id });

    const job = await queues.queue('runs').getJob(runJobId(run.id));
    await job!.remove();
    expect(await queues.queue('runs').getJob(runJobId(run.id))).toBeFalsy();

    const report = await sweepDebts({ pool: db.pool, queues, logger });
    expect(report).toEqual({ queuedRuns: 2, restored: 1 });
    const restored = await queues.queue('runs').getJob(runJobId(run.id));
    expect(restored?.data).toEqual({ runId: run.id });
    expect(await restored!.getState()).toBe('waiting');

    // A second sweep finds every debt covered.
    expect(await sweepDebts({ pool: db.pool, queues, logger })).toEqual({ queuedRuns: 2, restored: 0 });
  });

  it('restores a requeued run with its remaining delay', async () => {
    const run = await createRun(db.pool, sealer, { agent: 'echo', auditLevel: 'metadata', answerLevel: 'full', request: {} });
    await db.pool.query(sql.unsafe`UPDATE runs SET available_at = now() + interval '60 seconds' WHERE id = ${run.id}`);
    await sweepDebts({ pool: db.pool, queues, logger });
    const job = await queues.queue('runs').getJob(runJobId(run.id));
    expect(await job!.getState()).toBe('delayed');
    expect(job!.opts.delay).toBeGreaterThan(50_000);
  });

  it('ignores runs that owe nothing', async () => {
    const run = await createRun(db.pool, sealer, { agent: 'echo', auditLevel: 'metadata', answerLevel: 'full', request: {} });
    await db.pool.query(sql.unsafe`UPDATE runs SET status = 'cancelled', termination_reason = 'cancelled' WHERE id = ${run.id}`);
    await sweepDebts({ pool: db.pool, queues, logger });
    expect(await queues.queue('runs').getJob(runJobId(run.id))).toBeFalsy();
  });
});
