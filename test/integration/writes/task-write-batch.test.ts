import { pino } from 'pino';
import { sql } from 'slonik';
import { afterAll, afterEach, beforeAll, beforeEach, describe, expect, it } from 'vitest';
import { z } from 'zod';
import { getRun } from '../../../src/runs/run-repository.js';
import { CompletionBatch } from '../../../src/writes/completion-batch.js';
import { createTasksInNewContexts } from '../../../src/writes/task-creation.js';
import { getTaskRowById } from '../../../src/tasks/task-repository.js';
import { TaskWriteBatch } from '../../../src/writes/task-write-batch.js';
import { storedSettledRun } from '../../support/run-helpers.js';
import { recordStatements, type StatementLog } from '../../support/statement-log.js';
import { createTestClient, createTestDatabase, type TestDatabase } from '../../support/test-database.js';
import { testSealer } from '../../support/test-sealer.js';
import { journalOf } from '../push/push-support.js';
import { fastTask as fastTaskOf, heldCompletion } from '../../support/fast-tasks.js';

// The creations of new tasks and the held completions of fast runs ready at the same moment are
// one statement and one commit (docs/decisions/0048-creations-and-completions-in-one-statement.md).
// A statement that fails is written again write by write, so a bad write fails alone.

const sealer = testSealer();
const logger = pino<'notice'>({ level: 'silent', customLevels: { notice: 35 } });
const claim = { workerId: 'together-worker', leaseMs: 60_000 };

let db: TestDatabase;
let owner = '';
let log: StatementLog;
beforeAll(async () => {
  db = await createTestDatabase();
  owner = await createTestClient(db, 'task-write-batch');
});
afterAll(async () => db?.drop());
beforeEach(() => {
  log = recordStatements();
});
afterEach(() => log.stop());

const fastTask = (options: { text?: string; id?: string } = {}) =>
  fastTaskOf({ sealer, owner, claim, ...(options.text ? { text: options.text } : {}), ...(options.id ? { contextId: options.id } : {}) });

const taskRow = z.object({ state: z.string(), run_status: z.string(), claimed_by: z.string().nullable(), audit_kinds: z.array(z.string()), events: z.number() });
const rowsOf = (id: string) =>
  db.pool.maybeOne(sql.type(taskRow)`
    SELECT t.state, r.status AS run_status, r.claimed_by,
      ARRAY(SELECT e.kind FROM run_events e WHERE e.run_id = r.id ORDER BY e.sequence) AS audit_kinds,
      (SELECT count(*)::int FROM a2a_events e WHERE e.task_id = t.id) AS events
    FROM a2a_tasks t JOIN runs r ON r.id = t.run_id WHERE t.id = ${id}`);

/** The statements this process sent since `from` that write tasks: the prepared hot-path statements. */
const writesSince = (from: number) => log.since(from, /keel:prepared/).map((entry) => entry.text);

const WORKING = { state: 'TASK_STATE_WORKING', run_status: 'running', claimed_by: claim.workerId, audit_kinds: [], events: 1 };
const COMPLETED = { state: 'TASK_STATE_COMPLETED', run_status: 'completed', claimed_by: null, audit_kinds: ['claimed', 'completed'], events: 3 };

describe('creations and held completions ready together', () => {
  it('are one statement and one commit: the new tasks WORKING, the ended ones COMPLETED with result, journal and audit, each answer the row as stored', async () => {
    const running = [fastTask({ text: 'one' }), fastTask({ text: 'two' }), fastTask({ text: 'three' })];
    await createTasksInNewContexts(db.pool, sealer, running.map((item) => item.creation));
    const fresh = [fastTask({ text: 'four' }), fastTask({ text: 'five' })];
    const statements: Array<{ creations: number; completions: number }> = [];
    const writes = new TaskWriteBatch(db.pool, sealer, { maxBatch: 64, onBatch: (sizes) => statements.push(sizes) });

    const from = log.entries.length;
    const [completions, created] = await Promise.all([
      Promise.all(running.map((item) => writes.completeHeld(heldCompletion(item)))),
      Promise.all(fresh.map((item) => writes.create(item.creation))),
    ]);

    expect(statements).toEqual([{ creations: 2, completions: 3 }]);
    expect(writesSince(from)).toHaveLength(1);
    expect(log.commitsSince(from)).toBe(1);
    expect(created, 'both creations inserted (no message key used before)').toEqual([true, true]);
    for (const item of fresh) expect(await rowsOf(item.run.id)).toEqual(WORKING);
    for (const [index, item] of running.entries()) {
      const id = item.run.id;
      const result = completions[index];
      expect(result, `run ${index}`).toMatchObject({ settled: true, run: { status: 'completed', termination_reason: 'completed' } });
      if (!result?.settled) throw new Error('not settled');
      expect(result.journaled!.task).toEqual(await getTaskRowById(db.pool, id));
      expect(result.run).toEqual(await storedSettledRun(db.pool, id));
      expect(await rowsOf(id)).toEqual(COMPLETED);
      const journal = await journalOf(db.pool, sealer, id);
      expect(journal.map((event) => event.state)).toEqual(['TASK_STATE_WORKING', null, 'TASK_STATE_COMPLETED']);
      const artifact = (journal[1]!.response as { artifactUpdate: { artifact: { parts: Array<{ text: string }> } } }).artifactUpdate.artifact;
      expect(artifact.parts[0]!.text).toBe(`echo: ${id}`);
      expect(item.rolledBack).toBe(0);
    }
  });

  it('a lone write is the statement of its kind alone, as a lone request writes it', async () => {
    const item = fastTask();
    const writes = new TaskWriteBatch(db.pool, sealer, { maxBatch: 64 });
    const from = log.entries.length;
    await writes.create(item.creation);
    const [creation] = writesSince(from);
    expect(writesSince(from)).toHaveLength(1);
    expect(creation).toContain('new_tasks AS');
    expect(creation).not.toContain('held AS');

    const next = log.entries.length;
    const result = await writes.completeHeld(heldCompletion(item));
    expect(result).toMatchObject({ settled: true, run: { status: 'completed' } });
    const [completion] = writesSince(next);
    expect(writesSince(next)).toHaveLength(1);
    expect(completion).toContain('held AS');
    expect(completion).not.toContain('new_tasks AS');
    expect(await rowsOf(item.run.id)).toEqual(COMPLETED);
  });

  it('one creation that cannot be written fails alone: the statement is written again write by write, every other write of it committed once', async () => {
    const taken = fastTask();
    await createTasksInNewContexts(db.pool, sealer, [taken.creation]);
    const running = [fastTask(), fastTask()];
    await createTasksInNewContexts(db.pool, sealer, running.map((item) => item.creation));
    // A new task in a new context whose id is taken: the statement's insert of contexts fails.
    const clash = fastTask({ id: taken.creation.task.contextId });
    const fresh = fastTask();
    const statements: Array<{ creations: number; completions: number }> = [];
    const writes = new TaskWriteBatch(db.pool, sealer, { maxBatch: 64, onBatch: (sizes) => statements.push(sizes) });

    const from = log.entries.length;
    const outcomes = await Promise.allSettled([
      writes.completeHeld(heldCompletion(running[0]!)),
      writes.create(clash.creation),
      writes.create(fresh.creation),
      writes.completeHeld(heldCompletion(running[1]!)),
    ]);

    // The statement of four, then each write alone: the two completions, the clash (refused) and the fresh task.
    expect(writesSince(from)).toHaveLength(5);
    expect(statements).toEqual([{ creations: 2, completions: 2 }]);
    expect(outcomes[1]).toMatchObject({ status: 'rejected' });
    expect(await rowsOf(clash.run.id)).toBeNull();
    expect(outcomes[2]).toEqual({ status: 'fulfilled', value: true });
    expect(await rowsOf(fresh.run.id)).toEqual(WORKING);
    for (const index of [0, 3] as const) {
      expect(outcomes[index]).toMatchObject({ status: 'fulfilled', value: { settled: true, run: { status: 'completed' } } });
    }
    for (const item of running) {
      // Its audit rows were given back once and written once, by its statement alone.
      expect(item.rolledBack).toBe(1);
      expect(await rowsOf(item.run.id)).toEqual(COMPLETED);
    }
    expect(await rowsOf(taken.run.id)).toEqual(WORKING);
  });

  it('creations repeating a message key write nothing, in the statement with completions and other creations: the statement says which were inserted', async () => {
    const running = [fastTask()];
    await createTasksInNewContexts(db.pool, sealer, running.map((item) => item.creation));
    const keyed = (key: string) => {
      const item = fastTask();
      item.creation.task.messageKey = key;
      item.creation.task.messageFingerprint = Buffer.alloc(40, 1);
      return item;
    };
    const earlierKey = `earlier-${Date.now()}`;
    const earlier = keyed(earlierKey);
    await createTasksInNewContexts(db.pool, sealer, [earlier.creation]);
    const sameKey = `same-${Date.now()}`;
    // Two creations with one key in the same statement, one with the key of a task written before, one without a key.
    const items = [keyed(sameKey), keyed(sameKey), keyed(earlierKey), fastTask()];
    const statements: Array<{ creations: number; completions: number }> = [];
    const writes = new TaskWriteBatch(db.pool, sealer, { maxBatch: 64, onBatch: (sizes) => statements.push(sizes) });

    const from = log.entries.length;
    const [completed, ...created] = await Promise.all([writes.completeHeld(heldCompletion(running[0]!)), ...items.map((item) => writes.create(item.creation))]);

    expect(statements).toEqual([{ creations: 4, completions: 1 }]);
    expect(writesSince(from), 'one statement, no retry').toHaveLength(1);
    expect(created).toEqual([true, false, false, true]);
    expect(completed).toMatchObject({ settled: true, run: { status: 'completed' } });
    expect(await rowsOf(items[0]!.run.id)).toEqual(WORKING);
    expect(await rowsOf(items[3]!.run.id)).toEqual(WORKING);
    for (const repeat of [items[1]!, items[2]!]) {
      // Neither task, run, context nor event of a repeat exists.
      expect(await rowsOf(repeat.run.id)).toBeNull();
      expect(await getRun(db.pool, repeat.run.id)).toBeNull();
      const contexts = await db.pool.oneFirst(sql.type(z.object({ n: z.number() }))`SELECT count(*)::int AS n FROM contexts WHERE id = ${repeat.creation.task.contextId}`);
      expect(contexts).toBe(0);
    }
    expect(await rowsOf(earlier.run.id)).toEqual(WORKING);
  });

  it('a fast run whose rows changed gets nothing written by the statement and is completed by the transaction; the creations with it are written', async () => {
    const plain = fastTask();
    const tightened = fastTask();
    await createTasksInNewContexts(db.pool, sealer, [plain.creation, tightened.creation]);
    await db.pool.query(sql.unsafe`UPDATE runs SET answer_level = 'metadata' WHERE id = ${tightened.run.id}`);
    const fresh = fastTask();
    const statements: Array<{ creations: number; completions: number }> = [];
    const writes = new TaskWriteBatch(db.pool, sealer, { maxBatch: 64, onBatch: (sizes) => statements.push(sizes) });
    const transactions: number[] = [];
    const completions = new CompletionBatch(db.pool, sealer, logger, { maxBatch: 32, onBatch: (size) => transactions.push(size) }, writes);

    const from = log.entries.length;
    const [first, second] = await Promise.all([completions.complete(heldCompletion(plain)), completions.complete(heldCompletion(tightened)), writes.create(fresh.creation)]);

    expect(statements).toEqual([{ creations: 1, completions: 2 }]);
    expect(transactions).toEqual([1]);
    expect(writesSince(from)[0]).toContain('new_tasks AS');
    expect(writesSince(from)[0]).toContain('held AS');
    expect(first).toMatchObject({ settled: true, run: { status: 'completed' } });
    // No result may be kept any more: the transaction fails it, as it fails any such run.
    expect(second).toMatchObject({ settled: true, run: { status: 'failed', termination_reason: 'result_not_retainable' } });
    expect(tightened.rolledBack).toBe(1);
    expect((await rowsOf(tightened.run.id))?.audit_kinds).toEqual(['claimed', 'completed']);
    expect((await getRun(db.pool, tightened.run.id))?.status).toBe('failed');
    expect(await rowsOf(plain.run.id)).toEqual(COMPLETED);
    expect(await rowsOf(fresh.run.id)).toEqual(WORKING);
  });
});
