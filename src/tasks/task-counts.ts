import { sql, type CommonQueryMethods, type DatabasePool } from 'slonik';
import { z } from 'zod';
import { TASK_STATES, TERMINAL_TASK_STATES, type TaskState } from '../protocol/wire.js';

// How many tasks an owner has per agent and state, for ListTasks' totalSize (sql/0009): the
// folded totals plus the deltas the triggers appended since the last fold. A delta row adds n to
// its state and, when it is a move (from_state set, sql/0016), takes n from from_state; each
// statement appends one row per key it changed, so N tasks created or moved together are one row.

const countRow = z.object({ n: z.number() });

export type TaskCountKey = { owner: string; agent: string; state?: TaskState | undefined };

/** The exact number of the owner's tasks of an agent (in one state, when given). */
export async function countTasks(db: CommonQueryMethods, key: TaskCountKey): Promise<number> {
  // Unfiltered, a move adds as much as it takes: only creations and deletions count.
  const deltas =
    key.state === undefined
      ? sql.fragment`SELECT n FROM a2a_task_count_deltas WHERE owner = ${key.owner} AND agent = ${key.agent} AND from_state IS NULL`
      : sql.fragment`
          SELECT CASE WHEN state = ${key.state} THEN n ELSE 0 END - CASE WHEN from_state = ${key.state} THEN n ELSE 0 END
          FROM a2a_task_count_deltas
          WHERE owner = ${key.owner} AND agent = ${key.agent} AND (state = ${key.state} OR from_state = ${key.state})`;
  const state = key.state === undefined ? sql.fragment`` : sql.fragment`AND state = ${key.state}`;
  return db.oneFirst(sql.type(countRow)`
    SELECT coalesce(sum(n), 0)::int AS n FROM (
      SELECT n FROM a2a_task_counts WHERE owner = ${key.owner} AND agent = ${key.agent} ${state}
      UNION ALL
      ${deltas}
    ) AS parts (n)`);
}

/**
 * Folds the appended deltas into the totals, in one transaction so a reader sees each delta in
 * exactly one of the two tables. One folder at a time (an advisory lock; a second one skips).
 */
export async function foldTaskCountDeltas(pool: DatabasePool): Promise<number> {
  return pool.transaction(async (transaction) => {
    const locked = await transaction.oneFirst(sql.type(z.object({ locked: z.boolean() }))`
      SELECT pg_try_advisory_xact_lock(hashtext('keel.fold_task_counts')) AS locked`);
    if (!locked) return 0;
    return transaction.oneFirst(sql.type(countRow)`
      WITH taken AS (
        DELETE FROM a2a_task_count_deltas RETURNING owner, agent, state, from_state, n
      ), keyed AS (
        -- A move is two changes to the totals: n into its state, n out of from_state.
        SELECT owner, agent, state, n FROM taken
        UNION ALL
        SELECT owner, agent, from_state, -n FROM taken WHERE from_state IS NOT NULL
      ), summed AS (
        INSERT INTO a2a_task_counts (owner, agent, state, n)
        SELECT owner, agent, state, sum(n) FROM keyed GROUP BY owner, agent, state
        ON CONFLICT (owner, agent, state) DO UPDATE SET n = a2a_task_counts.n + excluded.n
        RETURNING 1
      )
      SELECT (SELECT count(*) FROM taken)::int AS n`);
  });
}

/** The states a task holds a run slot of its client in: every state but the terminal ones. */
const ACTIVE_STATES: readonly TaskState[] = TASK_STATES.filter((state) => !TERMINAL_TASK_STATES.includes(state));

const ownerCountRow = z.object({ owner: z.string(), n: z.number() });

/**
 * Every owner's tasks not in a terminal state, over all agents (the concurrentRuns limit,
 * src/limits/): the folded totals and the unfolded deltas of those states, read in one statement.
 * Owners without such a task are left out.
 */
export async function countActiveTasksByOwner(db: CommonQueryMethods): Promise<Map<string, number>> {
  const active = sql.array([...ACTIVE_STATES], 'text');
  const rows = await db.any(sql.type(ownerCountRow)`
    SELECT owner::text AS owner, sum(n)::int AS n FROM (
      SELECT owner, n FROM a2a_task_counts WHERE state = ANY(${active})
      UNION ALL
      SELECT owner, n FROM a2a_task_count_deltas WHERE state = ANY(${active})
      UNION ALL
      SELECT owner, -n FROM a2a_task_count_deltas WHERE from_state = ANY(${active})
    ) AS parts (owner, n)
    GROUP BY owner
    HAVING sum(n) > 0`);
  return new Map(rows.map((row) => [row.owner, row.n]));
}
