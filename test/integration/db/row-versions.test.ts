import { testClaim } from '../../support/run-helpers.js';
import { randomUUID } from 'node:crypto';
import { pino } from 'pino';
import { sql, type CommonQueryMethods } from 'slonik';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { z } from 'zod';
import {
  claimForResume,
  claimQueuedRun,
  claimQueuedRuns,
  listApprovalsPastTimeout,
  listQueuedRunIds,
  listRuns,
  renewLease,
  settleRun,
  suspendRun,
} from '../../../src/runs/run-repository.js';
import { countTasks, foldTaskCountDeltas } from '../../../src/tasks/task-counts.js';
import { createTasksInNewContexts } from '../../../src/writes/task-creation.js';
import { createTestClient, createTestDatabase, type TestDatabase } from '../../support/test-database.js';
import { testSealer } from '../../support/test-sealer.js';
import { writesOf } from '../../support/table-writes.js';

// What sql/0016 and 0020 promise, read from Postgres's own statistics on a real database:
// task-count deltas are appended once per statement and key, not once per task, whoever writes the
// state, and a state change is one row (a move from one state to another), not two; the writes a
// run goes through before its settle are HOT updates (no index entry, pg_stat_user_tables'
// n_tup_hot_upd grows); and the lookups of open runs use the index of open runs.

let db: TestDatabase;
const sealer = testSealer();
const logger = pino<'notice'>({ level: 'silent', customLevels: { notice: 35 } });
const ANONYMOUS = '00000000-0000-0000-0000-000000000000';
let otherOwner = '';
const worker = testClaim('rows-worker');

beforeAll(async () => {
  db = await createTestDatabase();
  otherOwner = await createTestClient(db, 'rows-other');
});
afterAll(async () => {
  await db?.drop();
});

const deltaRow = z.object({ owner: z.string(), agent: z.string(), state: z.string(), from_state: z.string().nullable(), n: z.number() });
const deltaCount = () => db.pool.oneFirst(sql.type(z.object({ n: z.number() }))`SELECT count(*)::int AS n FROM a2a_task_count_deltas`);

/** The delta rows appended after the first `before` (the table is insert-only between folds and this file never folds, so its physical order is the order of the appends). */
async function deltasAfter(before: number) {
  const rows = await db.pool.any(sql.type(deltaRow)`SELECT owner::text, agent, state, from_state, n FROM a2a_task_count_deltas ORDER BY ctid OFFSET ${before}`);
  return [...rows].sort((a, b) => `${a.owner}${a.agent}${a.state}`.localeCompare(`${b.owner}${b.agent}${b.state}`));
}

/** N new tasks (each a context, a queued run and a task row) in one INSERT statement, as a batch of creations would write them. */
async function createTasksInOneStatement(tasks: ReadonlyArray<{ owner: string; agent: string }>, connection: CommonQueryMethods = db.pool): Promise<string[]> {
  const ids = tasks.map(() => randomUUID());
  await connection.query(sql.unsafe`
    WITH input AS (
      SELECT * FROM ${sql.unnest(tasks.map((task, index) => [ids[index]!, task.owner, task.agent]), ['uuid', 'uuid', 'text'])} AS i(id, owner, agent)
    ), new_contexts AS (
      INSERT INTO contexts (owner, id) SELECT owner, id::text FROM input RETURNING id
    ), new_runs AS (
      INSERT INTO runs (id, agent, status, audit_level, answer_level, task_id) SELECT id, agent, 'queued', 'metadata', 'full', id FROM input RETURNING id
    )
    INSERT INTO a2a_tasks (id, context_id, owner, agent, run_id, state, answer_level)
    SELECT id, id::text, owner, agent, id, 'TASK_STATE_SUBMITTED', 'full' FROM input`);
  return ids;
}

/** One task as SendMessage creates it: context, queued run and task row in one statement. */
async function createTask(): Promise<string> {
  const id = randomUUID();
  await createTasksInNewContexts(db.pool, sealer, [
    {
      task: { id, contextId: id, owner: ANONYMOUS, agent: 'echo', answerLevel: 'full', history: [], metadata: {} },
      run: { id, agent: 'echo', auditLevel: 'metadata', answerLevel: 'full', taskId: id, request: { text: 'hi' } },
      fast: null,
    },
  ]);
  return id;
}

const taskState = (id: string) =>
  db.pool.one(sql.type(z.object({ state: z.string(), status_timestamp: z.number() }))`SELECT state, status_timestamp FROM a2a_tasks WHERE id = ${id}`);

describe('task-count deltas are appended per statement and key', () => {
  it('a statement creating N tasks appends one delta row per owner, agent and state', async () => {
    const before = await deltaCount();
    const ids = await createTasksInOneStatement([
      ...Array.from({ length: 8 }, () => ({ owner: ANONYMOUS, agent: 'echo' })),
      ...Array.from({ length: 4 }, () => ({ owner: otherOwner, agent: 'other' })),
    ]);
    expect(ids).toHaveLength(12);
    expect(await deltasAfter(before)).toEqual([
      { owner: ANONYMOUS, agent: 'echo', state: 'TASK_STATE_SUBMITTED', from_state: null, n: 8 },
      { owner: otherOwner, agent: 'other', state: 'TASK_STATE_SUBMITTED', from_state: null, n: 4 },
    ]);
    expect(await countTasks(db.pool, { owner: ANONYMOUS, agent: 'echo', state: 'TASK_STATE_SUBMITTED' })).toBe(8);
    expect(await countTasks(db.pool, { owner: otherOwner, agent: 'other' })).toBe(4);
  });

  it('a statement moving N runs moves their tasks in one update and appends one move per key, every task in its new state', async () => {
    const before = await deltaCount();
    const claimed = await claimQueuedRuns(db.pool, 100, worker);
    expect(claimed).toHaveLength(12);
    expect(await deltasAfter(before)).toEqual([
      { owner: ANONYMOUS, agent: 'echo', state: 'TASK_STATE_WORKING', from_state: 'TASK_STATE_SUBMITTED', n: 8 },
      { owner: otherOwner, agent: 'other', state: 'TASK_STATE_WORKING', from_state: 'TASK_STATE_SUBMITTED', n: 4 },
    ]);
    for (const run of claimed) {
      const task = await taskState(run.id);
      expect(task.state).toBe('TASK_STATE_WORKING');
      // The status timestamp of the task and the run's status change are the transaction's.
      expect(task.status_timestamp).toBe(run.status_changed_at);
    }
    expect(await countTasks(db.pool, { owner: ANONYMOUS, agent: 'echo', state: 'TASK_STATE_WORKING' })).toBe(8);
    expect(await countTasks(db.pool, { owner: ANONYMOUS, agent: 'echo', state: 'TASK_STATE_SUBMITTED' })).toBe(0);
    expect(await countTasks(db.pool, { owner: ANONYMOUS, agent: 'echo' })).toBe(8);

    // The sweep's fold turns each move into its two changes of the totals; no count changes.
    expect(await foldTaskCountDeltas(db.pool)).toBeGreaterThan(0);
    expect(await deltaCount()).toBe(0);
    const folded = await db.pool.any(sql.type(z.object({ state: z.string(), n: z.number() }))`
      SELECT state, n::int AS n FROM a2a_task_counts WHERE owner = ${ANONYMOUS} AND agent = 'echo' ORDER BY state`);
    expect(folded).toEqual([
      { state: 'TASK_STATE_SUBMITTED', n: 0 },
      { state: 'TASK_STATE_WORKING', n: 8 },
    ]);
    expect(await countTasks(db.pool, { owner: ANONYMOUS, agent: 'echo', state: 'TASK_STATE_WORKING' })).toBe(8);
    expect(await countTasks(db.pool, { owner: otherOwner, agent: 'other' })).toBe(4);

    // Writes that leave the status alone append nothing.
    const unchanged = await deltaCount();
    for (const run of claimed) expect(await renewLease(db.pool, run.id, worker)).toBe(true);
    expect(await deltaCount()).toBe(unchanged);
  });

  it('any update of tasks is counted once per statement (sql/0020): N states written by hand are one move per key, an agent written by hand is -1 and +1, other columns nothing', async () => {
    const ids = await createTasksInOneStatement(Array.from({ length: 5 }, () => ({ owner: ANONYMOUS, agent: 'hand' })));
    const moved = await deltaCount();
    await db.pool.query(sql.unsafe`UPDATE a2a_tasks SET state = 'TASK_STATE_FAILED' WHERE id = ANY(${sql.array(ids.slice(0, 4), 'uuid')})`);
    expect(await deltasAfter(moved)).toEqual([{ owner: ANONYMOUS, agent: 'hand', state: 'TASK_STATE_FAILED', from_state: 'TASK_STATE_SUBMITTED', n: 4 }]);

    const rekeyed = await deltaCount();
    await db.pool.query(sql.unsafe`UPDATE a2a_tasks SET agent = 'handed', state = 'TASK_STATE_CANCELED' WHERE id = ${ids[4]!}`);
    expect(await deltasAfter(rekeyed)).toEqual([
      { owner: ANONYMOUS, agent: 'handed', state: 'TASK_STATE_CANCELED', from_state: null, n: 1 },
      { owner: ANONYMOUS, agent: 'hand', state: 'TASK_STATE_SUBMITTED', from_state: null, n: -1 },
    ]);

    const untouched = await deltaCount();
    await db.pool.query(sql.unsafe`UPDATE a2a_tasks SET metadata = '{"repaired": true}' WHERE id = ANY(${sql.array(ids, 'uuid')})`);
    expect(await deltaCount()).toBe(untouched);
    expect(await countTasks(db.pool, { owner: ANONYMOUS, agent: 'hand', state: 'TASK_STATE_FAILED' })).toBe(4);
    expect(await countTasks(db.pool, { owner: ANONYMOUS, agent: 'hand' })).toBe(4);
    expect(await countTasks(db.pool, { owner: ANONYMOUS, agent: 'handed', state: 'TASK_STATE_CANCELED' })).toBe(1);

    await db.pool.query(sql.unsafe`DELETE FROM runs WHERE id = ANY(${sql.array(ids.slice(0, 4), 'uuid')})`);
    expect(await countTasks(db.pool, { owner: ANONYMOUS, agent: 'hand' })).toBe(0);
    expect(await countTasks(db.pool, { owner: ANONYMOUS, agent: 'handed' })).toBe(1);
    await db.pool.query(sql.unsafe`DELETE FROM runs WHERE id = ${ids[4]!}`);
    expect(await countTasks(db.pool, { owner: ANONYMOUS, agent: 'handed' })).toBe(0);
  });

  it('a state written by hand (an operator repair) is counted too, and a statement deleting N tasks appends one row per key', async () => {
    const [first] = await db.pool.anyFirst(sql.type(z.object({ id: z.string() }))`SELECT id FROM a2a_tasks WHERE agent = 'echo' ORDER BY id LIMIT 1`);
    await db.pool.query(sql.unsafe`UPDATE a2a_tasks SET state = 'TASK_STATE_CANCELED' WHERE id = ${first!}`);
    expect(await countTasks(db.pool, { owner: ANONYMOUS, agent: 'echo', state: 'TASK_STATE_CANCELED' })).toBe(1);
    expect(await countTasks(db.pool, { owner: ANONYMOUS, agent: 'echo', state: 'TASK_STATE_WORKING' })).toBe(7);

    const before = await deltaCount();
    // Deleting the runs deletes their tasks (ON DELETE CASCADE), as the retention purge does.
    await db.pool.query(sql.unsafe`DELETE FROM runs WHERE agent IN ('echo', 'other')`);
    expect(await deltasAfter(before)).toEqual([
      { owner: ANONYMOUS, agent: 'echo', state: 'TASK_STATE_CANCELED', from_state: null, n: -1 },
      { owner: ANONYMOUS, agent: 'echo', state: 'TASK_STATE_WORKING', from_state: null, n: -7 },
      { owner: otherOwner, agent: 'other', state: 'TASK_STATE_WORKING', from_state: null, n: -4 },
    ]);
    expect(await countTasks(db.pool, { owner: ANONYMOUS, agent: 'echo' })).toBe(0);
    expect(await countTasks(db.pool, { owner: otherOwner, agent: 'other' })).toBe(0);
  });
});

describe('the runs trigger finds each task by its primary key (sql/0019)', () => {
  it('a session whose first update of runs came while the tables were small reads no task sequentially once they have grown', async () => {
    // A database of its own: the session's first update of runs must come while it is nearly empty.
    const fresh = await createTestDatabase();
    try {
      await fresh.pool.connect(async (session) => {
        const echoTasks = (n: number) => Array.from({ length: n }, () => ({ owner: ANONYMOUS, agent: 'echo' }));
        // The session's first update of runs moves 32 tasks of 40: PL/pgSQL plans the trigger's
        // statement now and keeps that plan for the session.
        await createTasksInOneStatement(echoTasks(40), session);
        expect(await claimQueuedRuns(session, 32, worker)).toHaveLength(32);
        await createTasksInOneStatement(echoTasks(3_000), session);
        const taskScans = (connection: CommonQueryMethods) =>
          connection.one(sql.type(z.object({ scans: z.number(), rows: z.number() }))`
            SELECT seq_scan::int AS scans, seq_tup_read::int AS rows FROM pg_stat_xact_user_tables WHERE relname = 'a2a_tasks'`);
        const claimed = await session.transaction(async (transaction) => {
          const before = await taskScans(transaction);
          const runs = await claimQueuedRuns(transaction, 5, worker);
          for (const run of runs) expect(await renewLease(transaction, run.id, worker)).toBe(true);
          // Counted for this transaction only: the claim and the renewals read no task but by its key.
          expect(await taskScans(transaction)).toEqual(before);
          return runs;
        });
        expect(claimed).toHaveLength(5);
        for (const run of claimed) expect((await session.one(sql.type(z.object({ state: z.string() }))`SELECT state FROM a2a_tasks WHERE id = ${run.id}`)).state).toBe('TASK_STATE_WORKING');
        expect(await countTasks(session, { owner: ANONYMOUS, agent: 'echo', state: 'TASK_STATE_WORKING' })).toBe(37);
        expect(await countTasks(session, { owner: ANONYMOUS, agent: 'echo', state: 'TASK_STATE_SUBMITTED' })).toBe(3_003);
      });
    } finally {
      await fresh.drop();
    }
  });
});

describe('a run is written in place until its settle (HOT updates)', () => {
  it('the claim, a lease renewal, a suspension and the resume are HOT; the settle, which leaves the open runs, is not', async () => {
    const id = await createTask();
    await db.pool.connect(async (connection) => {
      const claim = await writesOf(connection, 'runs', async () => expect(await claimQueuedRun(connection, id, worker)).not.toBeNull());
      expect(claim).toEqual({ updates: 1, hot: 1 });
      expect((await taskState(id)).state).toBe('TASK_STATE_WORKING');

      expect(await writesOf(connection, 'runs', async () => expect(await renewLease(connection, id, worker)).toBe(true))).toEqual({ updates: 1, hot: 1 });

      const suspend = await writesOf(connection, 'runs', async () =>
        expect(await suspendRun(connection, sealer, id, worker, 'waiting_for_input', { turn: 1 })).not.toBeNull(),
      );
      expect(suspend).toEqual({ updates: 1, hot: 1 });
      expect((await taskState(id)).state).toBe('TASK_STATE_INPUT_REQUIRED');

      const resume = await writesOf(connection, 'runs', async () => expect(await claimForResume(connection, id, 'waiting_for_input', worker)).not.toBeNull());
      expect(resume).toEqual({ updates: 1, hot: 1 });
      expect((await taskState(id)).state).toBe('TASK_STATE_WORKING');

      const settle = await writesOf(connection, 'runs', async () =>
        expect(await settleRun(connection, logger, id, { status: 'completed', reason: 'completed', holder: worker })).toMatchObject({ settled: true }),
      );
      expect(settle).toEqual({ updates: 1, hot: 0 });
      expect((await taskState(id)).state).toBe('TASK_STATE_COMPLETED');
    });
    expect(await countTasks(db.pool, { owner: ANONYMOUS, agent: 'echo', state: 'TASK_STATE_COMPLETED' })).toBe(1);
    expect(await countTasks(db.pool, { owner: ANONYMOUS, agent: 'echo' })).toBe(1);
  });

  it('the lookups of open runs use the index of open runs, not a scan of every run ever settled', async () => {
    const queued = await createTask();
    const indexScans = async (connection: CommonQueryMethods) => {
      await connection.query(sql.unsafe`SELECT pg_stat_force_next_flush()`);
      await connection.query(sql.unsafe`SELECT pg_stat_clear_snapshot()`);
      return connection.oneFirst(sql.type(z.object({ n: z.number() }))`
        SELECT idx_scan::int AS n FROM pg_stat_user_indexes WHERE indexrelname = 'runs_open_idx'`);
    };
    await db.pool.connect(async (connection) => {
      // On a table this small a sequential scan would win; forbidding it shows which index each query can use.
      await connection.query(sql.unsafe`SET enable_seqscan = off`);
      const lookups: Array<[string, () => Promise<unknown>]> = [
        ['listQueuedRunIds', async () => expect(await listQueuedRunIds(connection, 10)).toContain(queued)],
        ['listApprovalsPastTimeout', () => listApprovalsPastTimeout(connection, 1, 10)],
        ['listRuns (an open status)', async () => expect((await listRuns(connection, { status: 'queued', limit: 10 })).map((run) => run.id)).toContain(queued)],
        ['claimQueuedRuns', async () => expect((await claimQueuedRuns(connection, 10, worker)).map((run) => run.id)).toContain(queued)],
      ];
      for (const [name, lookup] of lookups) {
        const before = await indexScans(connection);
        await lookup();
        expect({ name, scans: (await indexScans(connection)) - before }).toEqual({ name, scans: 1 });
      }
      await connection.query(sql.unsafe`RESET enable_seqscan`);
    });
  });
});
