import { createPostgresBackend, Worker, type Job } from 'bullmq';
import pg from 'pg';
import { afterAll, beforeAll, describe, expect, it, vi } from 'vitest';
import { KeelQueues } from '../../../src/queue/keel-queues.js';
import { silentLogger } from '../../../src/log/logger.js';
import { createEmptyDatabase } from '../../support/test-database.js';
import { deleteQueueKeys, testQueueBackend, testQueueKind } from '../../support/test-queues.js';
import { waitFor } from '../../support/wait-for.js';

// A job a worker took and then lost (the call that took it committed, its answer never came: a
// crash, a dropped connection) is 'active', locked to that worker, and no processor runs it; only
// BullMQ's stalled-job check would hand it out again, 30-60 s later. Keel's workers name themselves
// on every job they take, and after a worker's error the process hands out again the jobs with its
// worker's name that none of its processors runs (src/queue/orphaned-jobs.ts). On both backends.
//
// The lost job is made as it happens: a second BullMQ worker under the Keel worker's name takes it
// through the backend's own call (`getNextJob`) and never processes it.

const LOCK_MS = 30_000;

let database: { url: string; drop: () => Promise<void> };
let queues: KeelQueues;
let keelWorker: Worker;
let thief: Worker;
const started: string[] = [];
const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));

beforeAll(async () => {
  database = await createEmptyDatabase();
  queues = new KeelQueues(testQueueBackend(database.url), silentLogger(), { lockDurationMs: LOCK_MS });
  keelWorker = queues.createWorker('push', async (job: Job<{ slowMs?: number }>) => {
    started.push(job.id!);
    if (job.data.slowMs) await sleep(job.data.slowMs);
  }, { returnLostJobs: true }) as unknown as Worker;
  await keelWorker.waitUntilReady();
  const queue = queues.queue('push');
  // The Keel worker's name, its queue's connection: what the backend records of the worker that takes a job.
  const options = { ...queue.opts, name: keelWorker.opts.name, autorun: false };
  thief = testQueueKind() === 'postgres' ? new Worker('push', null, options as never, createPostgresBackend as never) : new Worker('push', null, options as never);
  await thief.waitUntilReady();
});

afterAll(async () => {
  await thief?.close(true).catch(() => undefined);
  const prefix = queues?.backend.prefix;
  await queues?.close();
  if (testQueueKind() === 'redis' && prefix) await deleteQueueKeys([prefix]);
  await database?.drop();
});

/** Adds a job while the Keel worker is paused and has the second worker take it under the Keel worker's name. */
async function loseJob(id: string, name = keelWorker.opts.name): Promise<void> {
  // Paused once its current jobs ended and its fetch returned: it takes nothing meanwhile.
  await keelWorker.pause();
  try {
    await queues.addJob('push', id, {});
    thief.opts.name = name;
    const taken = await thief.getNextJob(`lost-${id}`, { block: false });
    expect(taken?.id).toBe(id);
  } finally {
    keelWorker.resume();
  }
}

const stateOf = async (id: string) => (await queues.queue('push').getJob(id))?.getState() ?? 'removed';

describe(`jobs a worker lost are handed out again (${testQueueKind()} backend)`, () => {
  it('a job taken under the worker’s name that no processor runs goes back to waiting and is processed, long before its lock ends', async () => {
    await loseJob('lost-1');
    // Taken more than a second ago: not one on its way into a processor.
    await sleep(2_200);
    expect(await stateOf('lost-1')).toBe('active');
    expect(started).not.toContain('lost-1');

    const lookedAt = Date.now();
    expect(await queues.orphanedJobs.look()).toBe(true);
    await waitFor(async () => started.includes('lost-1'), 'the lost job processed', 10_000);
    expect(Date.now() - lookedAt).toBeLessThan(LOCK_MS / 3);
    await waitFor(async () => (await stateOf('lost-1')) === 'removed', 'the lost job completed (and removed)', 10_000);
  });

  it("a job another worker took is left to that worker, and a job the worker holds is not handed out twice", async () => {
    await loseJob('other-1', 'push@another-host:1:abcdef');
    await queues.addJob('push', 'slow-1', { slowMs: 4_000 });
    await waitFor(async () => started.includes('slow-1'), 'the slow job started', 10_000);
    await sleep(2_500);
    expect(await queues.orphanedJobs.look()).toBe(true);
    await waitFor(async () => (await stateOf('slow-1')) === 'removed', 'the slow job completed', 10_000);
    expect(started.filter((id) => id === 'slow-1')).toHaveLength(1);
    expect(await stateOf('other-1')).toBe('active');
    expect(started).not.toContain('other-1');
  });

  // What a first version got wrong: it looked at the processor only, and during a 20 s outage
  // (hosts-postgres-cutoff) handed out again run jobs whose finish BullMQ was still retrying; their
  // second processing raced the first's finish. Here the finish waits for BullMQ's own
  // finalization lock on the queue, which a look's move to waiting does not take.
  it.skipIf(testQueueKind() !== 'postgres')('a job whose finish is still under way is held: it is not handed out again (Postgres backend: the finish waits for a lock)', async () => {
    const blocker = new pg.Client({ connectionString: database.url });
    await blocker.connect();
    try {
      await queues.addJob('push', 'finishing-1', { slowMs: 1_500 });
      await waitFor(async () => started.includes('finishing-1'), 'the job started', 10_000);
      await blocker.query('BEGIN');
      await blocker.query(`SELECT pg_advisory_xact_lock(hashtext('bullmq:finalization'), hashtext(queue)) FROM bullmq.job WHERE id = 'finishing-1'`);
      // The processor returns; its finish waits; the job was taken over a second ago.
      await sleep(2_500);
      expect(await stateOf('finishing-1')).toBe('active');
      expect(await queues.orphanedJobs.look()).toBe(true);
      await blocker.query('COMMIT');
      await waitFor(async () => (await stateOf('finishing-1')) === 'removed', 'the job completed', 10_000);
      await sleep(1_500);
      expect(started.filter((id) => id === 'finishing-1')).toHaveLength(1);
    } finally {
      await blocker.query('ROLLBACK').catch(() => undefined);
      await blocker.end();
    }
  });

  it("after a worker's error the process looks by itself, within seconds", async () => {
    await loseJob('lost-2');
    const erredAt = Date.now();
    // What the worker's 'error' listener does: a failed call may have taken a job unseen.
    keelWorker.emit('error', new Error('Connection terminated unexpectedly'));
    await waitFor(async () => started.includes('lost-2'), 'the lost job processed after the error', 15_000);
    // The look comes 2 s after the error, and the job must have been taken 2 s before it.
    expect(Date.now() - erredAt).toBeLessThan(LOCK_MS / 3);
  });

  // What a first version got wrong (found reading the code after a CI run on Redis failed the test
  // above): the look took only jobs taken before the first error since the last look, so a job
  // lost to a later error before that look was left to BullMQ's stalled-job check.
  it('errors in a row: a job lost to a later error than the first is handed out by the same look', async () => {
    keelWorker.emit('error', new Error('Connection is closed.'));
    // The look comes 2 s after the first error: the job is lost in the second before it (a CI run
    // under load took that long to pause the worker), too fresh for that look to tell it lost.
    await sleep(1_200);
    await loseJob('lost-3');
    const erredAt = Date.now();
    keelWorker.emit('error', new Error('Connection terminated unexpectedly'));
    await waitFor(async () => started.includes('lost-3'), 'the job lost after the second error processed', 15_000);
    expect(Date.now() - erredAt).toBeLessThan(LOCK_MS / 3);
  });

  // What a second version got wrong (a CI run on Redis failed both tests above, 1 in 4 runs of this
  // file alone failed the first): a job counted as lost only when taken strictly before the error,
  // and a take's time and the error's are this process's clock in milliseconds. On loopback Redis a
  // take's answer comes within the millisecond, and an error in that millisecond left its job to
  // BullMQ's stalled-job check. Here the error's millisecond is made the take's.
  it('a job taken in the millisecond of the error is taken before it', async () => {
    await loseJob('lost-4');
    const takenAt = (await queues.queue('push').getJob('lost-4'))!.processedOn!;
    vi.useFakeTimers({ toFake: ['Date'], now: takenAt });
    try {
      keelWorker.emit('error', new Error('Connection terminated unexpectedly'));
    } finally {
      vi.useRealTimers();
    }
    const erredAt = Date.now();
    await waitFor(async () => started.includes('lost-4'), 'the job lost in the millisecond of the error processed', 15_000);
    expect(Date.now() - erredAt).toBeLessThan(LOCK_MS / 3);
  });
});
