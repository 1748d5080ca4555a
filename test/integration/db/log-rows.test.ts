import { sql } from 'slonik';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { z } from 'zod';
import { completeHeldRuns } from '../../../src/writes/complete-held-runs.js';
import { purgeExpiredRuns } from '../../../src/tasks/retention.js';
import { createTasksInNewContexts } from '../../../src/writes/task-creation.js';
import { fastTask, heldCompletion, type FastTask } from '../../support/fast-tasks.js';
import { createTestClient, createTestDatabase, type TestDatabase } from '../../support/test-database.js';
import { testSealer } from '../../support/test-sealer.js';

// The journal (a2a_events) and the audit trail (run_events) carry no foreign key: their rows are
// not checked one by one on the hot path, and the task or run they hang off takes them with it
// when it is deleted, by a statement trigger (docs/decisions/0049-log-rows-without-foreign-key-checks.md).

const sealer = testSealer();
const claim = { workerId: 'log-rows-worker', leaseMs: 60_000 };

let db: TestDatabase;
let owner = '';
beforeAll(async () => {
  db = await createTestDatabase();
  owner = await createTestClient(db, 'log-rows');
});
afterAll(async () => db?.drop());

/** Tasks created and completed on the fast path: three journal rows and two audit rows each. */
async function completedTasks(count: number): Promise<string[]> {
  const tasks: FastTask[] = Array.from({ length: count }, () => fastTask({ sealer, owner, claim }));
  await createTasksInNewContexts(db.pool, sealer, tasks.map((task) => task.creation));
  await completeHeldRuns(db.pool, sealer, tasks.map(heldCompletion));
  return tasks.map((task) => task.run.id);
}

const rowCounts = z.object({ tasks: z.number(), runs: z.number(), journal: z.number(), audit: z.number() });
/** What is left of each task (its id is also its run's): rows in a2a_tasks, runs, a2a_events, run_events. */
const rowsOf = (ids: readonly string[]) =>
  db.pool.one(sql.type(rowCounts)`
    SELECT (SELECT count(*)::int FROM a2a_tasks WHERE id = ANY(${sql.array(ids, 'uuid')})) AS tasks,
      (SELECT count(*)::int FROM runs WHERE id = ANY(${sql.array(ids, 'uuid')})) AS runs,
      (SELECT count(*)::int FROM a2a_events WHERE task_id = ANY(${sql.array(ids, 'uuid')})) AS journal,
      (SELECT count(*)::int FROM run_events WHERE run_id = ANY(${sql.array(ids, 'uuid')})) AS audit`);

describe('the journal and the audit trail', () => {
  it('carry no foreign key; push deliveries still reference the journal', async () => {
    const keys = await db.pool.any(sql.type(z.object({ table: z.string(), references: z.string() }))`
      SELECT conrelid::regclass::text AS table, confrelid::regclass::text AS references FROM pg_constraint
      WHERE contype = 'f' AND conrelid::regclass::text IN ('a2a_events', 'run_events', 'push_deliveries') ORDER BY 1, 2`);
    expect(keys).toEqual([
      { table: 'push_deliveries', references: 'a2a_events' },
      { table: 'push_deliveries', references: 'push_configs' },
    ]);
  });

  it('go with the runs retention deletes, and only with those', async () => {
    const [expired, kept] = [await completedTasks(3), await completedTasks(2)];
    expect(await rowsOf(expired)).toEqual({ tasks: 3, runs: 3, journal: 9, audit: 6 });
    await db.pool.query(sql.unsafe`UPDATE runs SET settled_at = now() - interval '40 days' WHERE id = ANY(${sql.array(expired, 'uuid')})`);

    const report = await purgeExpiredRuns(db.pool, 30);

    expect(report.runs).toBe(3);
    expect(await rowsOf(expired)).toEqual({ tasks: 0, runs: 0, journal: 0, audit: 0 });
    expect(await rowsOf(kept)).toEqual({ tasks: 2, runs: 2, journal: 6, audit: 4 });
  });

  it('go with tasks and runs deleted by hand, several in one statement', async () => {
    const [gone, kept] = [await completedTasks(3), await completedTasks(1)];

    await db.pool.query(sql.unsafe`DELETE FROM a2a_tasks WHERE id = ANY(${sql.array(gone, 'uuid')})`);
    expect(await rowsOf(gone), 'the tasks took their journal; their runs keep their audit rows').toEqual({ tasks: 0, runs: 3, journal: 0, audit: 6 });

    await db.pool.query(sql.unsafe`DELETE FROM runs WHERE id = ANY(${sql.array(gone, 'uuid')})`);
    expect(await rowsOf(gone)).toEqual({ tasks: 0, runs: 0, journal: 0, audit: 0 });
    expect(await rowsOf(kept)).toEqual({ tasks: 1, runs: 1, journal: 3, audit: 2 });
  });
});
