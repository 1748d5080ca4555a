import { testClaim, testHolder } from '../../support/run-helpers.js';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { sql } from 'slonik';
import { z } from 'zod';
import {
  cancelRun,
  claimForResume,
  claimQueuedRun,
  claimQueuedRuns,
  createRun,
  deadLetterRun,
  getRun,
  renewLease,
  requeueRun,
  settleRun,
  suspendRun,
  suspendedStateContext,
} from '../../../src/runs/run-repository.js';
import { pino } from 'pino';
import { createTestDatabase, type TestDatabase } from '../../support/test-database.js';
import { testSealer } from '../../support/test-sealer.js';
import { Writable } from 'node:stream';

let db: TestDatabase;
const sealer = testSealer();
// Capture what the repository logs, so a refused late settle can be checked at notice level.
const logLines: string[] = [];
const sink = new Writable({
  write(chunk, _encoding, callback) {
    logLines.push(String(chunk));
    callback();
  },
});
const captureLogger = pino<'notice'>({ level: 'debug', customLevels: { notice: 35 } }, sink);

const worker = (id: string) => testClaim(id);
const newRun = () => createRun(db.pool, sealer, { agent: 'echo', auditLevel: 'metadata', answerLevel: 'full', request: { text: 'hi' } });

beforeAll(async () => {
  db = await createTestDatabase();
});
afterAll(async () => {
  await db?.drop();
});

describe('run transitions are guarded writes', () => {
  it('creates a queued run at revision 1 with its request sealed', async () => {
    const run = await newRun();
    expect(run).toMatchObject({ status: 'queued', revision: 1, termination_reason: null, truncated: false });
    expect(run.queued_request).toBeInstanceOf(Buffer);
    expect(run.queued_request!.includes(Buffer.from('hi'))).toBe(false);
  });

  it('claim racing claim: exactly one worker gets the run', async () => {
    const run = await newRun();
    const results = await Promise.all(Array.from({ length: 8 }, (_, index) => claimQueuedRun(db.pool, run.id, worker(`w${index}`))));
    const winners = results.filter((row) => row !== null);
    expect(winners).toHaveLength(1);
    const stored = await getRun(db.pool, run.id);
    expect(stored).toMatchObject({ status: 'running', claimed_by: winners[0]!.claimed_by, revision: 2 });
    expect(stored!.lease_expires_at).toBeGreaterThan(Date.now());
  });

  it('batch claims skip rows other claimers hold and never double-claim', async () => {
    const ids = await Promise.all(Array.from({ length: 30 }, () => newRun().then((run) => run.id)));
    const batches = await Promise.all([1, 2, 3].map((index) => claimQueuedRuns(db.pool, 20, worker(`batch${index}`))));
    const claimed = batches.flat().map((row) => row.id).filter((id) => ids.includes(id));
    expect(new Set(claimed).size).toBe(claimed.length);
    expect(claimed.length).toBe(30);
  });

  it('two concurrent settles: exactly one wins and the row keeps the first outcome', async () => {
    const run = await newRun();
    await claimQueuedRun(db.pool, run.id, worker('a'));
    const [first, second] = await Promise.all([
      settleRun(db.pool, captureLogger, run.id, { status: 'completed', reason: 'completed' }),
      settleRun(db.pool, captureLogger, run.id, { status: 'failed', reason: 'provider_failed', errorClass: 'server_error' }),
    ]);
    expect([first.settled, second.settled].filter(Boolean)).toHaveLength(1);
    const winner = first.settled ? first.run : second.settled ? second.run : null;
    if (!winner) throw new Error('no settle won');
    const stored = await getRun(db.pool, run.id);
    expect(stored!.status).toBe(winner.status);
    expect(stored!.termination_reason).toBe(winner.termination_reason);
    expect(stored!.revision).toBe(3);
    expect(stored!.claimed_by).toBeNull();
    expect(stored!.lease_expires_at).toBeNull();

    // A late settle changes nothing and is logged at notice level.
    const late = await settleRun(db.pool, captureLogger, run.id, { status: 'completed', reason: 'max_iterations' });
    expect(late).toEqual({ settled: false, current: stored!.status });
    expect(await getRun(db.pool, run.id)).toEqual(stored);
    const notice = logLines.map((line) => JSON.parse(line)).find((line) => line.runId === run.id && line.msg.includes('late settle'));
    expect(notice?.level).toBe(35);
  });

  it('cancel racing a settle: one outcome, terminal stays terminal', async () => {
    for (let round = 0; round < 10; round += 1) {
      const run = await newRun();
      await claimQueuedRun(db.pool, run.id, worker('c'));
      const [cancelled, completed] = await Promise.all([
        cancelRun(db.pool, captureLogger, run.id),
        settleRun(db.pool, captureLogger, run.id, { status: 'completed', reason: 'completed', holder: testHolder('c') }),
      ]);
      expect(Number(cancelled.settled) + Number(completed.settled)).toBe(1);
      const stored = await getRun(db.pool, run.id);
      expect(stored!.status).toBe(cancelled.settled ? 'cancelled' : 'completed');
      expect(stored!.termination_reason).toBe(cancelled.settled ? 'cancelled' : 'completed');
      expect(stored!.revision).toBe(3);
    }
  });

  it('refuses transitions the machine forbids', async () => {
    const run = await newRun();
    // COMPLETE is only accepted from running.
    expect((await settleRun(db.pool, captureLogger, run.id, { status: 'completed', reason: 'completed' })).settled).toBe(false);
    // Resuming a run that is not waiting.
    expect(await claimForResume(db.pool, run.id, 'waiting_for_approval', worker('x'))).toBeNull();
    // Suspending a run nobody claimed.
    expect(await suspendRun(db.pool, sealer, run.id, testHolder('x'), 'waiting_for_input', { q: 1 })).toBeNull();
    // Requeue and dead-letter only apply to running runs with an expired lease.
    expect(await requeueRun(db.pool, run.id, 0)).toBeNull();
    expect(await deadLetterRun(db.pool, run.id)).toBeNull();
    // A reason that does not belong to the status is a programming error, refused before any write.
    await expect(settleRun(db.pool, captureLogger, run.id, { status: 'completed', reason: 'policy_denied' })).rejects.toThrow(/does not belong/);
    // The database refuses the pair as well, even for a writer that bypasses the repository.
    await expect(
      db.pool.query(sql.unsafe`UPDATE runs SET status = 'completed', termination_reason = 'cancelled' WHERE id = ${run.id}`),
    ).rejects.toThrow();
    const stored = await getRun(db.pool, run.id);
    expect(stored).toMatchObject({ status: 'queued', revision: 1 });
  });

  it('a terminal run cannot be claimed, suspended, resumed or cancelled', async () => {
    const run = await newRun();
    await claimQueuedRun(db.pool, run.id, worker('t'));
    await settleRun(db.pool, captureLogger, run.id, { status: 'completed', reason: 'completed' });
    expect(await claimQueuedRun(db.pool, run.id, worker('t2'))).toBeNull();
    expect((await cancelRun(db.pool, captureLogger, run.id)).settled).toBe(false);
    expect(await claimForResume(db.pool, run.id, 'waiting_for_input', worker('t3'))).toBeNull();
    expect((await getRun(db.pool, run.id))!.status).toBe('completed');
  });

  it('lease renewal is ownership-guarded; a worker that lost the lease cannot settle', async () => {
    const run = await newRun();
    await claimQueuedRun(db.pool, run.id, worker('owner'));
    expect(await renewLease(db.pool, run.id, worker('owner'))).toBe(true);
    expect(await renewLease(db.pool, run.id, worker('intruder'))).toBe(false);
    // Expire the lease, requeue, and let another worker claim it.
    await db.pool.query(sql.unsafe`UPDATE runs SET lease_expires_at = now() - interval '1 second' WHERE id = ${run.id}`);
    const requeued = await requeueRun(db.pool, run.id, 0);
    expect(requeued).toMatchObject({ status: 'queued', requeue_count: 1, claimed_by: null });
    await claimQueuedRun(db.pool, run.id, worker('second'));
    expect(await renewLease(db.pool, run.id, worker('owner'))).toBe(false);
    const stale = await settleRun(db.pool, captureLogger, run.id, { status: 'completed', reason: 'completed', holder: testHolder('owner') });
    expect(stale.settled).toBe(false);
    const fresh = await settleRun(db.pool, captureLogger, run.id, { status: 'completed', reason: 'completed', holder: testHolder('second') });
    expect(fresh.settled).toBe(true);
  });

  it('requeue honours its delay; dead-letter ends the run with retries_exhausted', async () => {
    const run = await newRun();
    await claimQueuedRun(db.pool, run.id, worker('d'));
    await db.pool.query(sql.unsafe`UPDATE runs SET lease_expires_at = now() - interval '1 second' WHERE id = ${run.id}`);
    await requeueRun(db.pool, run.id, 60_000);
    expect(await claimQueuedRun(db.pool, run.id, worker('early'))).toBeNull();
    await db.pool.query(sql.unsafe`UPDATE runs SET available_at = now() WHERE id = ${run.id}`);
    await claimQueuedRun(db.pool, run.id, worker('d2'));
    await db.pool.query(sql.unsafe`UPDATE runs SET lease_expires_at = now() - interval '1 second' WHERE id = ${run.id}`);
    const dead = await deadLetterRun(db.pool, run.id);
    expect(dead).toMatchObject({ status: 'failed', termination_reason: 'retries_exhausted' });
  });

  it('the reaper skips a run whose row another session holds locked, and takes it once the lock is gone (decision 0093)', async () => {
    const run = await newRun();
    await claimQueuedRun(db.pool, run.id, worker('cut-off'));
    await db.pool.query(sql.unsafe`UPDATE runs SET lease_expires_at = now() - interval '1 second' WHERE id = ${run.id}`);
    // A transaction of the cut-off worker's, still open on the server, holding the run's row.
    let release = () => undefined as void;
    const held = new Promise<void>((resolve) => (release = resolve));
    let locked = () => undefined as void;
    const isLocked = new Promise<void>((resolve) => (locked = resolve));
    const holder = db.pool.transaction(async (transaction) => {
      await transaction.query(sql.unsafe`SELECT id FROM runs WHERE id = ${run.id} FOR NO KEY UPDATE`);
      locked();
      await held;
    });
    await isLocked;
    const startedAt = Date.now();
    expect(await requeueRun(db.pool, run.id, 0)).toBeNull();
    expect(await deadLetterRun(db.pool, run.id)).toBeNull();
    expect(Date.now() - startedAt, 'neither waited for the lock').toBeLessThan(2000);
    release();
    await holder;
    expect(await requeueRun(db.pool, run.id, 0)).toMatchObject({ status: 'queued', requeue_count: 1 });
  });

  it('suspension stores sealed state; two resumes race and exactly one claims', async () => {
    const run = await newRun();
    await claimQueuedRun(db.pool, run.id, worker('s'));
    const suspended = await suspendRun(db.pool, sealer, run.id, testHolder('s'), 'waiting_for_approval', { pending: ['tool'] });
    expect(suspended).toMatchObject({ status: 'waiting_for_approval', claimed_by: null, lease_expires_at: null });
    const opened = sealer.openJson(suspendedStateContext(run.id), suspended!.suspended_state!);
    expect(opened).toEqual({ ok: true, value: { pending: ['tool'] } });
    const claims = await Promise.all(
      Array.from({ length: 5 }, (_, index) => claimForResume(db.pool, run.id, 'waiting_for_approval', worker(`r${index}`), suspended!.revision)),
    );
    expect(claims.filter(Boolean)).toHaveLength(1);
    // A resume bound to an older revision is refused.
    expect(await claimForResume(db.pool, run.id, 'waiting_for_approval', worker('late'), suspended!.revision)).toBeNull();
  });

  it('every committed change increments the revision', async () => {
    const run = await newRun();
    await claimQueuedRun(db.pool, run.id, worker('v'));
    await suspendRun(db.pool, sealer, run.id, testHolder('v'), 'waiting_for_input', {});
    await claimForResume(db.pool, run.id, 'waiting_for_input', worker('v'));
    await settleRun(db.pool, captureLogger, run.id, { status: 'completed', reason: 'max_iterations' });
    const stored = await getRun(db.pool, run.id);
    expect(stored).toMatchObject({ revision: 5, status: 'completed', truncated: true, termination_reason: 'max_iterations' });
    const count = await db.pool.oneFirst(sql.type(z.object({ n: z.number() }))`SELECT count(*)::int AS n FROM runs WHERE id = ${run.id}`);
    expect(count).toBe(1);
  });
});
