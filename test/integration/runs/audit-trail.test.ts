import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { sql } from 'slonik';
import { z } from 'zod';
import { pino } from 'pino';
import { AuditTrail, auditRowsOf, insertAuditRowsStatement } from '../../../src/runs/audit-trail.js';
import { createRun, getRun } from '../../../src/runs/run-repository.js';
import { completeRun } from '../../../src/writes/complete-run.js';
import type { CompletionInput } from '../../../src/writes/completion-input.js';
import { CompletionBatch } from '../../../src/writes/completion-batch.js';
import { createTasksInNewContexts } from '../../../src/writes/task-creation.js';
import { fastTask, heldCompletion } from '../../support/fast-tasks.js';
import { createTestClient, createTestDatabase, type TestDatabase } from '../../support/test-database.js';
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

describe('whatever a transaction takes from the trail it gives back when it rolls back (issue 39, defect 2)', () => {
  /** An echo task on the fast path, created, and its completion as the executor submits it, without the held rows (so a transaction writes it). */
  async function createdTask(owner: string): Promise<{ id: string; input: CompletionInput }> {
    const item = fastTask({ sealer, owner, claim: { workerId: 'trail-worker', leaseMs: 60_000 } });
    await createTasksInNewContexts(db.pool, sealer, [item.creation]);
    const { held: _held, ...input } = heldCompletion(item);
    return { id: item.run.id, input };
  }

  const writers: Array<[string, (input: CompletionInput) => Promise<unknown>]> = [
    ['its own transaction (completeRun)', (input) => completeRun(db.pool, sealer, logger, input)],
    ['a completion batch (completeRunsTogether)', (input) => new CompletionBatch(db.pool, sealer, logger, { maxBatch: 8 }).complete(input)],
  ];

  it.each(writers)('a completion refused once with a serialization failure and retried stores the trail: %s', async (_name, write) => {
    const owner = await createTestClient(db, `trail-retry-${Math.random().toString(36).slice(2, 8)}`);
    const { id, input } = await createdTask(owner);
    // The COMPLETED journal row is refused once (40001), as a serializable conflict would be; a
    // sequence counts the refusals, since a marker row would roll back with the attempt.
    await db.pool.query(sql.unsafe`CREATE SEQUENCE keel_test_refusals`);
    await db.pool.query(sql.unsafe`
      CREATE FUNCTION keel_test_refuse_completed_once() RETURNS trigger LANGUAGE plpgsql AS $$
      BEGIN
        IF NEW.state = 'TASK_STATE_COMPLETED' THEN
          IF nextval('keel_test_refusals') = 1 THEN
            RAISE EXCEPTION 'refused once' USING ERRCODE = 'serialization_failure';
          END IF;
        END IF;
        RETURN NEW;
      END $$`);
    await db.pool.query(sql.unsafe`
      CREATE TRIGGER keel_test_refuse_completed_once BEFORE INSERT ON a2a_events
      FOR EACH ROW EXECUTE FUNCTION keel_test_refuse_completed_once()`);
    try {
      await write(input);
      const refusals = await db.pool.oneFirst(sql.type(z.object({ n: z.number() }))`SELECT last_value::int AS n FROM keel_test_refusals`);
      expect(refusals, 'the first attempt was refused, the retry journaled COMPLETED').toBe(2);
    } finally {
      await db.pool.query(sql.unsafe`DROP TRIGGER keel_test_refuse_completed_once ON a2a_events`);
      await db.pool.query(sql.unsafe`DROP FUNCTION keel_test_refuse_completed_once()`);
      await db.pool.query(sql.unsafe`DROP SEQUENCE keel_test_refusals`);
    }
    expect(await getRun(db.pool, id)).toMatchObject({ status: 'completed' });
    expect(await kinds(id), 'the retry wrote the trail the first attempt took').toEqual(['claimed', 'completed']);
  });

  it('a savepoint rolled back gives back what it took: the transaction around it stores it', async () => {
    const run = await newRun();
    const trail = new AuditTrail(run.id, 'full', 0, logger);
    trail.record({ kind: 'claimed', meta: { worker: 'w' } });
    trail.record({ kind: 'tool_call', meta: { tool: 't' } });
    await db.pool.transaction(async (transaction) => {
      await transaction
        .transaction(async (nested) => {
          const rows = trail.takeUnrefusableRows(nested)!;
          await nested.query(sql.unsafe`${insertAuditRowsStatement(auditRowsOf(run.id, rows))}`);
          throw new Error('the savepoint is undone');
        })
        .catch(() => undefined);
      expect(await trail.flushWithin(transaction)).toBe(true);
    });
    expect(await kinds(run.id)).toEqual(['claimed', 'tool_call']);
  });

  it('a savepoint kept inside a transaction that rolls back gives back with the transaction', async () => {
    const run = await newRun();
    const trail = new AuditTrail(run.id, 'full', 0, logger);
    trail.record({ kind: 'claimed', meta: { worker: 'w' } });
    const refusal = new Error('the transaction is undone');
    await expect(
      db.pool.transaction(async (transaction) => {
        await transaction.transaction(async (nested) => {
          const rows = trail.takeUnrefusableRows(nested)!;
          await nested.query(sql.unsafe`${insertAuditRowsStatement(auditRowsOf(run.id, rows))}`);
        });
        throw refusal;
      }),
    ).rejects.toBe(refusal);
    expect(await kinds(run.id)).toEqual([]);
    trail.record({ kind: 'completed', meta: {} });
    expect(await trail.flush(db.pool)).toBe(true);
    expect(await kinds(run.id), 'given back ahead of what was recorded since, with their sequence numbers').toEqual(['claimed', 'completed']);
  });

  it('an event recorded inside a transaction that is retried is stored once', async () => {
    const run = await newRun();
    const trail = new AuditTrail(run.id, 'full', 0, logger);
    trail.record({ kind: 'claimed', meta: { worker: 'w' } });
    let attempts = 0;
    await db.pool.transaction(async (transaction) => {
      attempts += 1;
      trail.recordWithin(transaction, { kind: 'suspended', meta: { status: 'waiting_for_input' } });
      await trail.flushWithin(transaction);
      if (attempts === 1) await transaction.query(sql.unsafe`DO $$ BEGIN RAISE EXCEPTION 'refused' USING ERRCODE = 'serialization_failure'; END $$`);
    });
    expect(attempts).toBe(2);
    expect(await kinds(run.id)).toEqual(['claimed', 'suspended']);
  });
});

describe('AuditTrail.recordNow: true means the trail up to this event is stored', () => {
  it('waits for an earlier flush still on its way (a heartbeat flush), so a step never runs ahead of its trail', async () => {
    // The worker-kill test's lost `claimed` event: a heartbeat flush took the buffered events, the
    // step's recordNow stored its own event on another connection and the step began; the worker
    // was killed before the heartbeat's insert reached the server. Here the earlier flush waits
    // behind a sleep on its connection.
    const run = await newRun();
    const trail = new AuditTrail(run.id, 'full', 0, logger);
    trail.record({ kind: 'claimed', meta: { worker: 'w' } });
    await db.pool.connect(async (slow) => {
      const busy = slow.query(sql.unsafe`SELECT pg_sleep(0.5)`);
      const earlier = trail.flush(slow);
      const stored = await trail.recordNow(db.pool, { kind: 'tool_call', meta: { tool: 'step:pay' } });
      expect(stored).toBe(true);
      expect(await kinds(run.id), 'the step may run: everything before it is stored').toEqual(['claimed', 'tool_call']);
      await busy;
      expect(await earlier).toBe(true);
    });
  });
});
