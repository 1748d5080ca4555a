import { sql, type CommonQueryMethods } from 'slonik';
import { z } from 'zod';

// A client's waiting tasks: SUBMITTED, their run QUEUED (the a2a_tasks trigger keeps the two
// equal), counted on the partial index of sql/0027_waiting_tasks_per_client.sql. The runs queue
// orders a new task's job by its rank in its client's backlog (docs/decisions/0062-fair-run-slots.md).

/**
 * The most a rank counts: BullMQ's largest priority is 2^21 - 1, and past a few thousand the order
 * among one client's tasks is FIFO anyway; the bound keeps the count's cost bounded too.
 */
export const MAX_WAITING_RANK = 10_000;

/** How many of `owner`'s tasks are waiting, the one just written included (at least 1, at most MAX_WAITING_RANK). */
export async function waitingRankOf(db: CommonQueryMethods, owner: string): Promise<number> {
  const waiting = await db.oneFirst(sql.type(z.object({ n: z.number() }))`
    SELECT count(*)::int AS n FROM (
      SELECT 1 FROM a2a_tasks WHERE owner = ${owner} AND state = 'TASK_STATE_SUBMITTED' LIMIT ${MAX_WAITING_RANK}
    ) waiting`);
  return Math.max(1, waiting);
}

/** For /metrics: how many clients have waiting tasks, and the longest backlog of one client. */
export async function waitingByClient(db: CommonQueryMethods): Promise<{ clients: number; most: number }> {
  return db.one(sql.type(z.object({ clients: z.number(), most: z.number() }))`
    SELECT count(*)::int AS clients, coalesce(max(n), 0)::int AS most FROM (
      SELECT count(*) AS n FROM a2a_tasks WHERE state = 'TASK_STATE_SUBMITTED' GROUP BY owner
    ) per_client`);
}
