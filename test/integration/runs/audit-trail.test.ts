import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { sql } from 'slonik';
import { z } from 'zod';
import { pino } from 'pino';
import { AuditTrail, auditRowsOf, insertAuditRowsStatement } from '../../../src/runs/audit-trail.js';
import { createRun } from '../../../src/runs/run-repository.js';
import { createTestDatabase, type TestDatabase } from '../../support/test-database.js';
import { testSealer } from '../../support/test-sealer.js';

let db: TestDatabase;
const sealer = testSealer();
const logger = pino<'notice'>({ level: 'silent', customLevels: { notice: 35 } });

beforeAll(async () => {
  db = await createTestDatabase();
});
afterAll(async () => {
  await db?.drop();
});

const newRun = () => createRun(db.pool, sealer, { agent: 'echo', auditLevel: 'full', answerLevel: 'full', request: { text: 'hi' } });
const kinds = async (runId: string) =>
  db.pool.anyFirst(sql.type(z.object({ kind: z.string() }))`SELECT kind FROM run_events WHERE run_id = ${runId} ORDER BY sequence`);

describe('AuditTrail.flushWithin: the trail rides in the caller transaction and never aborts it', () => {
  it('stores plain ASCII events with the transaction', async () => {
    const run = await newRun();
    const trail = new AuditTrail(run.id, 'full', 0, logger);
    trail.record({ kind: 'claimed', meta: { worker: 'w' } });
    trail.record({ kind: 'model_reply', meta: {}, content: { text: 'echo: hello\nworld "quoted" \\u0000 typed literally' } });
    const stored = await db.pool.transaction(async (transaction) => {
      const ok = await trail.flushWithin(transaction);
      await transaction.query(sql.unsafe`UPDATE runs SET updated_at = now() WHERE id = ${run.id}`);
      return ok;
    });
    expect(stored).toBe(true);
    expect(await kinds(run.id)).toEqual(['claimed', 'model_reply']);
  });

  it.each([
    ['a NUL character', 'a\u0000b'],
    ['a lone surrogate', 'a\ud800b'],
    ['non-ASCII text', 'héllo 😀'],
  ])('%s: stored when Postgres accepts it, else lost alone; the transaction commits either way', async (name, text) => {
    const run = await newRun();
    const trail = new AuditTrail(run.id, 'full', 0, logger);
    trail.record({ kind: 'model_reply', meta: {}, content: { text } });
    const stored = await db.pool.transaction(async (transaction) => {
      const ok = await trail.flushWithin(transaction);
      await transaction.query(sql.unsafe`UPDATE runs SET failure_detail = '{"after":"audit"}'::jsonb WHERE id = ${run.id}`);
      return ok;
    });
    const detail = await db.pool.oneFirst(sql.type(z.object({ d: z.unknown() }))`SELECT failure_detail AS d FROM runs WHERE id = ${run.id}`);
    expect(detail).toEqual({ after: 'audit' });
    expect(await kinds(run.id)).toEqual(stored ? ['model_reply'] : []);
    if (name === 'non-ASCII text') expect(stored).toBe(true);
    else expect(stored).toBe(false);
  });
});

describe('AuditTrail.takeUnrefusableRows: the trail rides in the caller statement', () => {
  it('gives the rows of ASCII events and empties the buffer; nothing when a row could be refused', async () => {
    const run = await newRun();
    const trail = new AuditTrail(run.id, 'full', 0, logger);
    expect(trail.takeUnrefusableRows()).toEqual([]);
    trail.record({ kind: 'claimed', meta: { worker: 'w' } });
    trail.record({ kind: 'completed', meta: { reason: 'completed' } });
    const rows = trail.takeUnrefusableRows();
    expect(rows).toHaveLength(2);
    expect(trail.takeUnrefusableRows()).toEqual([]);
    const insert = insertAuditRowsStatement(auditRowsOf(run.id, rows!));
    await db.pool.query(sql.unsafe`WITH alongside AS (${insert}) UPDATE runs SET updated_at = now() WHERE id = ${run.id}`);
    expect(await kinds(run.id)).toEqual(['claimed', 'completed']);

    const refusable = new AuditTrail(run.id, 'full', 2, logger);
    refusable.record({ kind: 'model_reply', meta: {}, content: { text: 'a\u0000b' } });
    expect(refusable.takeUnrefusableRows()).toBeNull();
    // Still buffered: flushWithin writes it (here refused, alone).
    expect(await db.pool.transaction((transaction) => refusable.flushWithin(transaction))).toBe(false);
  });
});
