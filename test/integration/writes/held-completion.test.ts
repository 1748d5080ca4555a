import { pino } from 'pino';
import { sql } from 'slonik';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { z } from 'zod';
import { createPushConfig } from '../../../src/push/push-config-repository.js';
import { cancelRun, getRun } from '../../../src/runs/run-repository.js';
import { completeHeldRuns } from '../../../src/writes/complete-held-runs.js';
import { CompletionBatch } from '../../../src/writes/completion-batch.js';
import { countTasks } from '../../../src/tasks/task-counts.js';
import { createTasksInNewContexts } from '../../../src/writes/task-creation.js';
import { getTaskRowById, recordAgentStatusMessage } from '../../../src/tasks/task-repository.js';
import { createTestClient, createTestDatabase, type TestDatabase } from '../../support/test-database.js';
import { storedSettledRun } from '../../support/run-helpers.js';
import { testSealer } from '../../support/test-sealer.js';
import { journalOf } from '../push/push-support.js';
import { fastTask as fastTaskOf, heldCompletion } from '../../support/fast-tasks.js';
import { writesOf } from '../../support/table-writes.js';

// A fast run's completion written without reading first (decision 0029): one statement checks,
// under its lock, that the run and task rows are as the fast run's insert left them, and writes
// the audit rows, result, settle, journal and NOTIFY for the runs that pass. A run whose rows
// changed meanwhile gets nothing written by it and is completed by the transaction instead.

const sealer = testSealer();
const logger = pino<'notice'>({ level: 'silent', customLevels: { notice: 35 } });
const claim = { workerId: 'held-worker', leaseMs: 60_000 };

let db: TestDatabase;
let owner = '';
beforeAll(async () => {
  db = await createTestDatabase();
  owner = await createTestClient(db, 'held-completion');
});
afterAll(async () => db?.drop());

const fastTask = (text = 'hello') => fastTaskOf({ sealer, owner, claim, text, metadata: { asked: text } });

const stampRow = z.object({ run_changed: z.number(), task_status: z.number(), audit_kinds: z.array(z.string()), events: z.number(), deliveries: z.number() });
const stampsOf = (id: string) =>
  db.pool.one(sql.type(stampRow)`
    SELECT r.status_changed_at AS run_changed, t.status_timestamp AS task_status,
      ARRAY(SELECT e.kind FROM run_events e WHERE e.run_id = r.id ORDER BY e.sequence) AS audit_kinds,
      (SELECT count(*)::int FROM a2a_events e WHERE e.task_id = t.id) AS events,
      (SELECT count(*)::int FROM push_deliveries d WHERE d.task_id = t.id) AS deliveries
    FROM runs r JOIN a2a_tasks t ON t.id = r.task_id WHERE r.id = ${id}`);

describe('a fast run whose rows are as its insert left them', () => {
  it('is completed by one statement: result, settle, journal and audit, its status time the same everywhere, the answer the row as stored', async () => {
    const items = [fastTask('one'), fastTask('two'), fastTask('three')];
    await createTasksInNewContexts(db.pool, sealer, items.map((item) => item.creation));
    const results = await completeHeldRuns(db.pool, sealer, items.map(heldCompletion));

    for (const [index, item] of items.entries()) {
      const id = item.run.id;
      const result = results[index];
      expect(result, `run ${index} completed`).toMatchObject({ settled: true, run: { status: 'completed', termination_reason: 'completed' } });
      if (!result?.settled) throw new Error('not settled');
      expect(await getRun(db.pool, id)).toMatchObject({ status: 'completed', termination_reason: 'completed', claimed_by: null });
      // The answer is the task row exactly as the statement left it, and the run as it is.
      expect(result.journaled!.task).toEqual(await getTaskRowById(db.pool, id));
      expect(result.run).toEqual(await storedSettledRun(db.pool, id));
      expect(item.rolledBack).toBe(0);

      const stamps = await stampsOf(id);
      expect(stamps.audit_kinds).toEqual(['claimed', 'completed']);
      expect(stamps.events).toBe(3);
      // One status time: the run's, the task's, and the COMPLETED event's, as sealed before the statement.
      expect(stamps.task_status).toBe(stamps.run_changed);
      expect(stamps.run_changed).toBeGreaterThan(item.run.at);
      const journal = await journalOf(db.pool, sealer, id);
      expect(journal.map((event) => event.state)).toEqual(['TASK_STATE_WORKING', null, 'TASK_STATE_COMPLETED']);
      const completed = journal[2]!.response as { statusUpdate: { status: { timestamp: string } } };
      expect(Date.parse(completed.statusUpdate.status.timestamp)).toBe(stamps.run_changed);
      const artifact = (journal[1]!.response as { artifactUpdate: { artifact: { parts: Array<{ text: string }> } } }).artifactUpdate.artifact;
      expect(artifact.parts[0]!.text).toBe(`echo: ${id}`);
      expect(result.journaled!.write).toMatchObject({ events: 2, deliveryIds: [], notice: { taskId: id, lastSequence: 3, ends: true }, statusTimestamp: stamps.run_changed });
    }
  });

  it('writes each task row once: result, watermark, state and status time in one version; the move counted once, in one row for the statement', async () => {
    const items = [fastTask('a'), fastTask('b'), fastTask('c')];
    await createTasksInNewContexts(db.pool, sealer, items.map((item) => item.creation));
    const ids = items.map((item) => item.run.id);
    const deltas = () =>
      db.pool.any(sql.type(z.object({ state: z.string(), from_state: z.string().nullable(), n: z.number() }))`
        SELECT state, from_state, sum(n)::int AS n FROM a2a_task_count_deltas WHERE owner = ${owner} AND from_state IS NOT NULL GROUP BY 1, 2 ORDER BY 1, 2`);
    const movedBefore = await deltas();
    const deltaRows = () => db.pool.oneFirst(sql.type(z.object({ n: z.number() }))`SELECT count(*)::int AS n FROM a2a_task_count_deltas`);
    const rowsBefore = await deltaRows();
    const written = await db.pool.connect((connection) => writesOf(connection, 'a2a_tasks', () => completeHeldRuns(connection, sealer, items.map(heldCompletion))));
    // Three tasks, three row updates: the runs trigger found them COMPLETED already and wrote none.
    expect(written.updates).toBe(3);
    const tasks = await db.pool.any(sql.type(z.object({ state: z.string(), projected_state: z.string() }))`
      SELECT state, projected_state FROM a2a_tasks WHERE id = ANY(${sql.array(ids, 'uuid')})`);
    expect(tasks).toEqual(ids.map(() => ({ state: 'TASK_STATE_COMPLETED', projected_state: 'TASK_STATE_COMPLETED' })));
    for (const id of ids) {
      const stamps = await stampsOf(id);
      expect(stamps.task_status).toBe(stamps.run_changed);
    }
    // Counted once each: three more WORKING → COMPLETED moves, and the counts agree.
    const moved = (rows: ReadonlyArray<{ state: string; from_state: string | null; n: number }>) =>
      rows.find((row) => row.state === 'TASK_STATE_COMPLETED' && row.from_state === 'TASK_STATE_WORKING')?.n ?? 0;
    expect(moved(await deltas()) - moved(movedBefore)).toBe(3);
    // In one delta row for the statement, not one per task (sql/0020).
    expect(await deltaRows()).toBe(rowsBefore + 1);
    const counted = await countTasks(db.pool, { owner, agent: 'echo', state: 'TASK_STATE_COMPLETED' });
    const stored = await db.pool.oneFirst(sql.type(z.object({ n: z.number() }))`
      SELECT count(*)::int AS n FROM a2a_tasks WHERE owner = ${owner} AND agent = 'echo' AND state = 'TASK_STATE_COMPLETED'`);
    expect(counted).toBe(stored);
  });
});

describe('a fast run whose rows changed under it', () => {
  it('gets nothing written by the statement (its audit rows given back); the others in it complete', async () => {
    const [untouched, cancelled, tightened, pushed, prompted] = [fastTask(), fastTask(), fastTask(), fastTask(), fastTask()] as const;
    const all = [untouched, cancelled, tightened, pushed, prompted];
    await createTasksInNewContexts(db.pool, sealer, all.map((item) => item.creation));
    // The client cancelled; the answer ceiling tightened under the run; a push config was added; an
    // interim status message was written (the task's status and history moved on).
    await cancelRun(db.pool, logger, cancelled.run.id);
    await db.pool.query(sql.unsafe`UPDATE runs SET answer_level = 'redacted' WHERE id = ${tightened.run.id}`);
    await createPushConfig(db.pool, sealer, { taskId: pushed.run.id, owner, url: 'https://receiver.example/hook' });
    await recordAgentStatusMessage(db.pool, sealer, prompted.run.id, 'full', { messageId: 'interim', role: 'ROLE_AGENT', parts: [{ text: 'still thinking' }], taskId: prompted.run.id });
    const before = await Promise.all(all.map((item) => stampsOf(item.run.id)));

    const results = await completeHeldRuns(db.pool, sealer, all.map(heldCompletion));

    expect(results[0]).toMatchObject({ settled: true, run: { status: 'completed' } });
    expect((await stampsOf(untouched.run.id)).audit_kinds).toEqual(['claimed', 'completed']);
    for (const [index, item] of all.entries()) {
      if (index === 0) continue;
      expect(results[index], `run ${index} is left to the transaction`).toBeNull();
      expect(item.rolledBack, 'its audit rows were given back').toBe(1);
      expect(await stampsOf(item.run.id), 'nothing of it was written').toEqual(before[index]);
    }
    expect((await getRun(db.pool, tightened.run.id))?.status).toBe('running');
    expect((await getRun(db.pool, cancelled.run.id))?.status).toBe('cancelled');
  });

  it('is completed by the batch through its transaction, which reads the rows as they now are', async () => {
    const [plain, pushed, tightened] = [fastTask(), fastTask(), fastTask()] as const;
    await createTasksInNewContexts(db.pool, sealer, [plain, pushed, tightened].map((item) => item.creation));
    await createPushConfig(db.pool, sealer, { taskId: pushed.run.id, owner, url: 'https://receiver.example/hook' });
    await db.pool.query(sql.unsafe`UPDATE runs SET answer_level = 'metadata' WHERE id = ${tightened.run.id}`);

    const batches: number[] = [];
    const completions = new CompletionBatch(db.pool, sealer, logger, { maxBatch: 32, onBatch: (size) => batches.push(size) });
    const [first, second, third] = await Promise.all([plain, pushed, tightened].map((item) => completions.complete(heldCompletion(item))));
    // The three try the one statement together; the two whose rows changed then share a transaction.
    expect(batches).toEqual([3, 2]);
    expect(first).toMatchObject({ settled: true, run: { status: 'completed' }, journaled: { write: { deliveryIds: [] } } });
    // The push config's COMPLETED event has its delivery, written with the journal.
    expect(second).toMatchObject({ settled: true, run: { status: 'completed' } });
    if (!second.settled) throw new Error('not settled');
    expect(second.journaled!.write.deliveryIds.length).toBeGreaterThan(0);
    expect((await stampsOf(pushed.run.id)).deliveries).toBe(second.journaled!.write.deliveryIds.length);
    expect(await getTaskRowById(db.pool, pushed.run.id)).toEqual(second.journaled!.task);
    // No result may be kept any more: the transaction fails it, as it fails any such run.
    expect(third).toMatchObject({ settled: true, run: { status: 'failed', termination_reason: 'result_not_retainable' } });
    for (const item of [plain, pushed, tightened]) expect((await stampsOf(item.run.id)).audit_kinds).toEqual(['claimed', 'completed']);
  });
});
