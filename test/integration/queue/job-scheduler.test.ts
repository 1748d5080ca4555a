import { Redis } from 'ioredis';
import { sql } from 'slonik';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { KeelQueues } from '../../../src/queue/keel-queues.js';
import { silentLogger } from '../../../src/log/logger.js';
import { scheduleMaintenance, SWEEP_JOB } from '../../../workers/maintenance.js';
import { createTestDatabase, type TestDatabase } from '../../support/test-database.js';
import { TEST_REDIS_URL, testQueueBackend, testQueueKind, testQueuePrefix } from '../../support/test-queues.js';
import { waitFor } from '../../support/wait-for.js';

// The maintenance sweep is a job scheduler in the queue backend, and the repair path of every other
// debt: it must come back however it was lost. Deleting a Redis queue's keys while the scheduler is
// writing them can keep the scheduler's entry and lose its next job; such a scheduler looks present
// and never fires again (CI caught a push delivery left pending for good that way).

const QUEUE = testQueueKind();
const prefix = testQueuePrefix();
let db: TestDatabase;
let queues: KeelQueues;
const logger = silentLogger();

beforeAll(async () => {
  db = await createTestDatabase();
  queues = new KeelQueues(testQueueBackend(db.url, prefix), logger);
  await queues.waitUntilReady();
});
afterAll(async () => {
  await Promise.all(queues.allQueues().map((queue) => queue.obliterate({ force: true }).catch(() => undefined)));
  await queues.close();
  await db.drop();
});

/** The id of the job the scheduler will run next, and that job's state ('none' when it is gone). */
async function nextJobOf(schedulerId: string): Promise<{ id: string; state: string }> {
  const queue = queues.queue('maintenance');
  const scheduler = await queue.getJobScheduler(schedulerId);
  expect(scheduler).toBeTruthy();
  const id = `repeat:${schedulerId}:${scheduler!.next}`;
  const job = await queue.getJob(id);
  return { id, state: job ? await job.getState() : 'none' };
}

/** Deletes a job behind BullMQ's back, leaving its scheduler in place, as a partial wipe does. */
async function loseJob(jobId: string): Promise<void> {
  if (QUEUE === 'redis') {
    const redis = new Redis(TEST_REDIS_URL, { maxRetriesPerRequest: 1 });
    try {
      await redis.del(`${prefix}:maintenance:${jobId}`);
      await redis.zrem(`${prefix}:maintenance:delayed`, jobId);
      await redis.lrem(`${prefix}:maintenance:wait`, 0, jobId);
    } finally {
      await redis.quit();
    }
  } else {
    await db.pool.query(sql.unsafe`DELETE FROM bullmq.job WHERE id = ${jobId}`);
  }
}

describe(`maintenance schedulers on the ${QUEUE} queue backend`, () => {
  it('ensureJobScheduler adds a missing scheduler, leaves a live one, and gives a scheduler that lost its next job a new one', async () => {
    expect(await queues.ensureJobScheduler('maintenance', 'probe', 60_000, 'probe')).toBe('scheduled');
    // An interval scheduler's first job is due at once; no worker takes it here.
    const first = await nextJobOf('probe');
    expect(first.state).toBe('waiting');
    expect(await queues.ensureJobScheduler('maintenance', 'probe', 60_000, 'probe')).toBe('present');
    expect(await nextJobOf('probe')).toEqual(first);

    await loseJob(first.id);
    expect(await nextJobOf('probe')).toEqual({ id: first.id, state: 'none' });
    expect(await queues.ensureJobScheduler('maintenance', 'probe', 60_000, 'probe')).toBe('scheduled');
    const replaced = await nextJobOf('probe');
    expect(['waiting', 'delayed']).toContain(replaced.state);
    const job = await queues.queue('maintenance').getJob(replaced.id);
    expect(job!.name).toBe('probe');
    expect(await queues.ensureJobScheduler('maintenance', 'probe', 60_000, 'probe')).toBe('present');
    await queues.queue('maintenance').removeJobScheduler('probe');
  });

  it('the sweep keeps running after its next job is lost: the watchdog puts it back', async () => {
    const sweeps: number[] = [];
    const countSweeps = () =>
      queues.createWorker('maintenance', async (job) => {
        if (job.name === SWEEP_JOB) sweeps.push(Date.now());
        return null;
      });
    countSweeps();
    await scheduleMaintenance({ queues }, 300);
    await waitFor(async () => sweeps.length >= 2, 'two sweeps on the schedule', 10_000);

    // While the worker runs the sweep, the scheduler is never taken for stuck: its job is always
    // waiting, delayed or active, whenever the watchdog looks.
    const outcomes = new Set<string>();
    for (const until = Date.now() + 2000; Date.now() < until; ) {
      outcomes.add(await queues.ensureJobScheduler('maintenance', SWEEP_JOB, 300, SWEEP_JOB));
    }
    expect([...outcomes]).toEqual(['present']);

    // Stop the worker from moving the scheduler on while its job is taken away.
    await queues.closeWorkers();
    const lost = await nextJobOf(SWEEP_JOB);
    await loseJob(lost.id);
    expect((await nextJobOf(SWEEP_JOB)).state).toBe('none');
    const before = sweeps.length;
    countSweeps();
    await waitFor(async () => sweeps.length >= before + 2, 'the sweep to run again after its job was lost', 15_000);
    expect(['delayed', 'waiting', 'active']).toContain((await nextJobOf(SWEEP_JOB)).state);
  });
});
