import { testClaim, testHolder } from '../../support/run-helpers.js';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import {
  announceRunOutputs,
  cancelRun,
  claimQueuedRun,
  createRun,
  getRun,
  lockHeldRun,
  switchRunProvider,
} from '../../../src/runs/run-repository.js';
import { silentLogger } from '../../../src/log/logger.js';
import { createTestDatabase, type TestDatabase } from '../../support/test-database.js';
import { testSealer } from '../../support/test-sealer.js';

// The writes a worker makes beside the run it holds (a provider switch, stored outputs) are guarded
// like every run transition: only the worker holding the running run changes its row.

let db: TestDatabase;
const sealer = testSealer();
const logger = silentLogger();
const worker = (id: string) => testClaim(id);
const newRun = () => createRun(db.pool, sealer, { agent: 'echo', auditLevel: 'full', answerLevel: 'full', provider: 'primary', request: { text: 'hi' } });

beforeAll(async () => {
  db = await createTestDatabase();
});
afterAll(async () => {
  await db?.drop();
});

describe('writes beside a held run', () => {
  it('lets the holder lock the run, switch its provider and announce outputs, each a revision', async () => {
    const run = await newRun();
    await claimQueuedRun(db.pool, run.id, worker('w1'));
    const held = await db.pool.transaction((transaction) => lockHeldRun(transaction, run.id, testHolder('w1')));
    expect(held).toEqual({ auditLevel: 'full', answerLevel: 'full', revision: 2 });

    expect(await switchRunProvider(db.pool, run.id, testHolder('w1'), 'fallback', { auditLevel: 'metadata', answerLevel: 'redacted' })).toBe(true);
    expect(await getRun(db.pool, run.id)).toMatchObject({ status: 'running', provider: 'fallback', audit_level: 'metadata', answer_level: 'redacted', revision: 3 });

    expect(await announceRunOutputs(db.pool, run.id, testHolder('w1'))).toBe(true);
    expect(await getRun(db.pool, run.id)).toMatchObject({ status: 'running', claimed_by: 'w1', revision: 4 });
  });

  it('refuses another worker: nothing is locked and the row is unchanged', async () => {
    const run = await newRun();
    await claimQueuedRun(db.pool, run.id, worker('w1'));
    expect(await db.pool.transaction((transaction) => lockHeldRun(transaction, run.id, testHolder('w2')))).toBeNull();
    expect(await switchRunProvider(db.pool, run.id, testHolder('w2'), 'fallback', { auditLevel: 'none', answerLevel: 'none' })).toBe(false);
    expect(await announceRunOutputs(db.pool, run.id, testHolder('w2'))).toBe(false);
    expect(await getRun(db.pool, run.id)).toMatchObject({ provider: 'primary', audit_level: 'full', answer_level: 'full', revision: 2 });
  });

  it('refuses the former holder once the run left RUNNING (cancelled, or still queued)', async () => {
    const queued = await newRun();
    expect(await announceRunOutputs(db.pool, queued.id, testHolder('w1'))).toBe(false);
    expect(await getRun(db.pool, queued.id)).toMatchObject({ status: 'queued', revision: 1 });

    const run = await newRun();
    await claimQueuedRun(db.pool, run.id, worker('w1'));
    await cancelRun(db.pool, logger, run.id);
    const cancelled = await getRun(db.pool, run.id);
    expect(await db.pool.transaction((transaction) => lockHeldRun(transaction, run.id, testHolder('w1')))).toBeNull();
    expect(await switchRunProvider(db.pool, run.id, testHolder('w1'), 'fallback', { auditLevel: 'none', answerLevel: 'none' })).toBe(false);
    expect(await announceRunOutputs(db.pool, run.id, testHolder('w1'))).toBe(false);
    expect(await getRun(db.pool, run.id)).toMatchObject({ status: 'cancelled', provider: 'primary', answer_level: 'full', revision: cancelled!.revision });
  });
});
