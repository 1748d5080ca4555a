import { testClaim, testHolder } from '../../support/run-helpers.js';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { timeOutApprovals } from '../../../src/runs/approval-timeout.js';
import { listRunEvents } from '../../../src/runs/run-event-repository.js';
import { claimQueuedRun, createRun, getRun, suspendRun } from '../../../src/runs/run-repository.js';
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

describe(`approval timeout in the maintenance sweep on the ${testQueueKind()} queue backend`, () => {
  /** A run waiting for an approval since `hoursAgo`, at the given audit level. */
  async function waitingRun(auditLevel: 'none' | 'metadata', hoursAgo: number) {
    const run = await createRun(db.pool, sealer, { agent: 'mailer', auditLevel, answerLevel: 'full', request: {} });
    await claimQueuedRun(db.pool, run.id, testClaim('w1'));
    await suspendRun(db.pool, sealer, run.id, testHolder('w1'), 'waiting_for_approval', { pendingApproval: null });
    await db.pool.query(sql.unsafe`
      UPDATE runs SET status_changed_at = now() - ${sql.interval({ seconds: hoursAgo * 3600 })} WHERE id = ${run.id}`);
    return run.id;
  }

  it('fails only the runs past the timeout, with the event within the audit level and the detail at every level', async () => {
    const silent = await waitingRun('none', 2);
    const audited = await waitingRun('metadata', 2);
    const recent = await waitingRun('metadata', 0.4);
    expect(await timeOutApprovals({ pool: db.pool, queues, logger }, 0.5)).toBe(2);

    for (const id of [silent, audited]) {
      expect(await getRun(db.pool, id)).toMatchObject({
        status: 'failed',
        termination_reason: 'approval_denied',
        suspended_state: null,
        failure_detail: { reason: 'approval_timed_out', timeoutHours: 0.5 },
      });
    }
    expect(await listRunEvents(db.pool, silent)).toEqual([]);
    expect((await listRunEvents(db.pool, audited)).map((event) => [event.kind, event.payload])).toEqual([
      ['approval_timed_out', { message: 'approval timed out after 0.5 h', timeoutHours: 0.5 }],
    ]);
    expect(await getRun(db.pool, recent)).toMatchObject({ status: 'waiting_for_approval', termination_reason: null });
    // Nothing is left for a second sweep.
    expect(await timeOutApprovals({ pool: db.pool, queues, logger }, 0.5)).toBe(0);
  });
});
