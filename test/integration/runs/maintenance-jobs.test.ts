import type { Job } from 'bullmq';
import pg from 'pg';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createMaintenanceProcessor, REAP_JOB } from '../../../workers/maintenance.js';
import { startTestKeel, type TestKeel } from '../../support/test-keel.js';

// The maintenance jobs of one process (decision 0093): at most one of each name at once, and a
// reap still running after a lease, as one stuck on a silent link is, stops holding the next one
// up; one such reap is left behind at a time. A reap is held here by a lock on the runs table
// (the reaper's first SELECT waits for it) instead of a cut link.

const LEASE_SECONDS = 1;

let keel: TestKeel;
let locker: pg.Client;

beforeAll(async () => {
  keel = await startTestKeel({ overrides: { KEEL_RUNS_LEASE_SECONDS: String(LEASE_SECONDS), KEEL_RUNS_HEARTBEAT_SECONDS: '0.3' } });
  locker = new pg.Client({ connectionString: keel.databaseUrl });
  await locker.connect();
});
afterAll(async () => {
  await locker?.query('ROLLBACK').catch(() => undefined);
  await locker?.end();
  await keel?.dispose();
});

const reapJob = (id: string) => ({ name: REAP_JOB, id, data: {} }) as Job;

/** Whether `promise` settled within `ms`, and with what. */
async function within<T>(promise: Promise<T>, ms: number): Promise<{ settled: true; value: T } | { settled: false }> {
  let timer: NodeJS.Timeout | undefined;
  const late = new Promise<{ settled: false }>((resolve) => (timer = setTimeout(() => resolve({ settled: false }), ms)));
  try {
    return await Promise.race([promise.then((value) => ({ settled: true as const, value })), late]);
  } finally {
    clearTimeout(timer);
  }
}

describe('maintenance jobs in one process', () => {
  it('runs one reap at a time, leaves a reap stuck past a lease behind once, and the next one runs beside it', async () => {
    const runJob = createMaintenanceProcessor(keel.context);
    await locker.query('BEGIN');
    await locker.query('LOCK TABLE runs IN ACCESS EXCLUSIVE MODE');

    const first = runJob(reapJob('1'));
    // A second reap while the first runs (and is not yet past a lease) ends at once.
    expect(await within(runJob(reapJob('2')), 500)).toMatchObject({ settled: true, value: { skipped: expect.stringContaining('reap') } });
    // Past a lease the first is left behind: its job ends, and the next one may start.
    expect(await within(first, LEASE_SECONDS * 1000 + 2000)).toEqual({ settled: true, value: { stuck: true } });
    const third = runJob(reapJob('3'));
    // The third is stuck as well, but one reap is left behind already: it keeps its job and its place.
    expect(await within(third, LEASE_SECONDS * 1000 + 1000)).toEqual({ settled: false });
    expect(await within(runJob(reapJob('4')), 500)).toMatchObject({ settled: true, value: { skipped: expect.stringContaining('reap') } });

    await locker.query('ROLLBACK');
    expect(await within(third, 10_000)).toMatchObject({ settled: true, value: { requeued: 0, deadLettered: 0 } });
    // Both done: the next reap runs at once.
    expect(await within(runJob(reapJob('5')), 10_000)).toMatchObject({ settled: true, value: { requeued: 0, deadLettered: 0 } });
  }, 60_000);
});
