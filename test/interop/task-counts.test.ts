import { ListTasksRequest, type Task } from '@a2a-js/sdk';
import { sql } from 'slonik';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { z } from 'zod';
import { createClient } from '../../src/auth/client-repository.js';
import { migrate } from '../../src/db/migrate.js';
import { foldTaskCountDeltas } from '../../src/tasks/task-counts.js';
import { purgeExpiredRuns } from '../../src/tasks/retention.js';
import { sdkClient, textMessage } from '../support/a2a-client.js';
import { startTestKeel, type TestKeel } from '../support/test-keel.js';

// ListTasks is scoped to the agent whose endpoint is called, and its totalSize comes from the
// per-owner, per-agent, per-state counters (sql/0009) rather than a count over the table: checked
// here against the rows themselves before and after the sweep folds the deltas, after state
// changes, after the retention purge deletes tasks, and after the migration backfills a
// database that already holds tasks.

let keel: TestKeel;
let token = '';

const countsRow = z.object({ owner: z.string(), agent: z.string(), state: z.string(), n: z.number() });
const key = (row: z.infer<typeof countsRow>) => `${row.owner}/${row.agent}/${row.state}`;

/** The counts as the rows say, and as counters plus deltas say, keyed owner/agent/state (zeros left out). */
async function countsBothWays() {
  const pool = keel.context.pool;
  const exact = await pool.any(sql.type(countsRow)`SELECT owner::text, agent, state, count(*)::int AS n FROM a2a_tasks GROUP BY 1, 2, 3`);
  // A delta that moves tasks (from_state set, sql/0016) adds n to its state and takes n from from_state.
  const counted = await pool.any(sql.type(countsRow)`
    SELECT owner::text, agent, state, sum(n)::int AS n FROM (
      SELECT owner, agent, state, n FROM a2a_task_counts
      UNION ALL SELECT owner, agent, state, n FROM a2a_task_count_deltas
      UNION ALL SELECT owner, agent, from_state, -n FROM a2a_task_count_deltas WHERE from_state IS NOT NULL
    ) AS parts GROUP BY 1, 2, 3 HAVING sum(n) <> 0`);
  const asMap = (rows: readonly z.infer<typeof countsRow>[]) => Object.fromEntries(rows.map((row) => [key(row), row.n]));
  return { exact: asMap(exact), counted: asMap(counted) };
}

const deltaRows = () => keel.context.pool.oneFirst(sql.type(z.object({ n: z.number() }))`SELECT count(*)::int AS n FROM a2a_task_count_deltas`);

async function listAll(agent: string, filter: Record<string, unknown> = {}): Promise<{ ids: string[]; totalSize: number }> {
  const client = await sdkClient(keel.url, agent, token);
  const ids: string[] = [];
  let pageToken = '';
  let totalSize = -1;
  do {
    const page = await client.listTasks(ListTasksRequest.fromJSON({ pageSize: 3, pageToken, ...filter }));
    if (totalSize !== -1) expect(page.totalSize, 'totalSize is the same on every page').toBe(totalSize);
    totalSize = page.totalSize;
    ids.push(...page.tasks.map((task: Task) => task.id));
    pageToken = page.nextPageToken;
  } while (pageToken);
  return { ids, totalSize };
}

async function send(agent: string, count: number, contextId?: string): Promise<void> {
  const client = await sdkClient(keel.url, agent, token);
  for (let index = 0; index < count; index += 1) await client.sendMessage(textMessage(`${agent} ${index}`, contextId ? { contextId } : {}));
}

const tasksOf = (agent: string, state?: string) =>
  keel.context.pool.anyFirst(sql.type(z.object({ id: z.string() }))`
    SELECT id::text FROM a2a_tasks WHERE agent = ${agent} ${state ? sql.fragment`AND state = ${state}` : sql.fragment``}`);

beforeAll(async () => {
  keel = await startTestKeel({
    overrides: {
      // The test folds the deltas itself, at the moments it chooses.
      KEEL_MAINTENANCE_SWEEP_SECONDS: '3600',
      KEEL_RUNS_PROVIDER_ATTEMPTS: '1',
      KEEL_PROVIDERS: { echo: { type: 'echo' }, broken: { type: 'scripted', steps: [{ fail: 'server_error' }] } },
      KEEL_AGENTS: [
        { id: 'echo', name: 'Echo', provider: 'echo' },
        { id: 'other', name: 'Other', provider: 'echo' },
        { id: 'broken', name: 'Broken', provider: 'broken' },
      ],
    },
  });
  const created = await createClient(keel.context.pool, 'counted');
  if (!created.ok) throw new Error(created.reason);
  token = created.token;
  await send('echo', 5);
  await send('echo', 2, 'shared-context');
  await send('other', 3);
  await send('broken', 2);
});
afterAll(async () => keel?.dispose());

describe('ListTasks totalSize from the task counters', () => {
  it('lists only the called agent\'s tasks, each once over the pages, with totalSize equal to the rows', async () => {
    for (const agent of ['echo', 'other', 'broken']) {
      const listed = await listAll(agent);
      const rows = await tasksOf(agent);
      expect([...listed.ids].sort()).toEqual([...rows].sort());
      expect(listed.totalSize).toBe(rows.length);
    }
    expect((await listAll('echo')).totalSize).toBe(7);
    expect((await listAll('broken', { status: 'TASK_STATE_FAILED' })).totalSize).toBe(2);
    expect((await listAll('broken', { status: 'TASK_STATE_COMPLETED' })).totalSize).toBe(0);
    expect((await listAll('echo', { status: 'TASK_STATE_COMPLETED' })).totalSize).toBe(7);
    // A context (counted over its own index) and a time window (counted over the window).
    expect((await listAll('echo', { contextId: 'shared-context' })).totalSize).toBe(2);
    expect((await listAll('other', { contextId: 'shared-context' })).totalSize).toBe(0);
    expect((await listAll('echo', { statusTimestampAfter: new Date(Date.now() + 60_000).toISOString() })).totalSize).toBe(0);
  });

  it('counters plus unfolded deltas equal the rows; the fold moves every delta and changes no count', async () => {
    const before = await countsBothWays();
    expect(before.counted).toEqual(before.exact);
    expect(await deltaRows()).toBeGreaterThan(0);

    const moved = await foldTaskCountDeltas(keel.context.pool);
    expect(moved).toBeGreaterThan(0);
    expect(await deltaRows()).toBe(0);
    const after = await countsBothWays();
    expect(after.counted).toEqual(after.exact);
    expect(after.exact).toEqual(before.exact);
    // The folded table alone now holds the totals; a terminal task went through SUBMITTED and
    // WORKING on its way, which are folded to zero.
    const folded = await keel.context.pool.any(sql.type(countsRow)`SELECT owner::text, agent, state, n::int AS n FROM a2a_task_counts WHERE n <> 0`);
    expect(Object.fromEntries(folded.map((row) => [key(row), row.n]))).toEqual(after.exact);
    expect(await foldTaskCountDeltas(keel.context.pool)).toBe(0);
  });

  it('stays exact as tasks are added on top of folded totals and as the purge deletes them', async () => {
    await send('other', 2);
    await send('broken', 1);
    expect((await listAll('other')).totalSize).toBe(5);
    expect((await listAll('broken', { status: 'TASK_STATE_FAILED' })).totalSize).toBe(3);
    const mixed = await countsBothWays();
    expect(mixed.counted).toEqual(mixed.exact);

    // Everything settled before now is past a retention of 0 days.
    const purged = await purgeExpiredRuns(keel.context.pool, 0);
    expect(purged.runs).toBe(15);
    for (const agent of ['echo', 'other', 'broken']) expect((await listAll(agent)).totalSize).toBe(0);
    const emptied = await countsBothWays();
    expect(emptied).toEqual({ exact: {}, counted: {} });
    await foldTaskCountDeltas(keel.context.pool);
    expect(await keel.context.pool.oneFirst(sql.type(z.object({ n: z.number() }))`SELECT count(*)::int AS n FROM a2a_task_counts WHERE n <> 0`)).toBe(0);
  });

  it('the migration counts the tasks a database already holds', async () => {
    await send('echo', 3);
    await send('broken', 1);
    // Take 0009 back out of this database (its tasks stay), with the per-statement count triggers
    // 0016 and 0020 put in its trigger's place, and apply the three again (0016 and 0020 may run again).
    await keel.context.pool.transaction(async (transaction) => {
      for (const trigger of ['a2a_tasks_count_inserts', 'a2a_tasks_count_deletes', 'a2a_tasks_count_updates']) {
        await transaction.query(sql.unsafe`DROP TRIGGER ${sql.identifier([trigger])} ON a2a_tasks`);
      }
      await transaction.query(sql.unsafe`DROP FUNCTION keel_count_inserted_tasks(), keel_count_deleted_tasks(), keel_count_updated_tasks()`);
      await transaction.query(sql.unsafe`DROP TABLE a2a_task_counts, a2a_task_count_deltas`);
      await transaction.query(sql.unsafe`DROP INDEX a2a_tasks_agent_list_idx`);
      await transaction.query(sql.unsafe`CREATE INDEX a2a_tasks_owner_list_idx ON a2a_tasks (owner, status_timestamp DESC, id DESC)`);
      await transaction.query(sql.unsafe`DELETE FROM keel_migrations WHERE id IN (9, 16, 20)`);
    });
    const migrated = await migrate(keel.databaseUrl);
    expect(migrated).toMatchObject({ ok: true, applied: ['0009_task_counts.sql', '0016_fewer_row_versions.sql', '0020_task_counts_per_statement.sql'] });
    // 0016 put its row trigger back; 0020, applied after it, took it out again.
    expect(await keel.context.pool.anyFirst(sql.type(z.object({ name: z.string() }))`
      SELECT tgname AS name FROM pg_trigger WHERE tgrelid = 'a2a_tasks'::regclass AND tgname LIKE 'a2a_tasks_count%' ORDER BY 1`)).toEqual([
      'a2a_tasks_count_deletes',
      'a2a_tasks_count_inserts',
      'a2a_tasks_count_updates',
    ]);
    expect(await deltaRows()).toBe(0);
    const backfilled = await countsBothWays();
    expect(backfilled.counted).toEqual(backfilled.exact);
    expect((await listAll('echo')).totalSize).toBe(3);
    expect((await listAll('broken', { status: 'TASK_STATE_FAILED' })).totalSize).toBe(1);
  });
});
