import { sql } from 'slonik';
import { z } from 'zod';
import type { KeelContext } from '../context/keel-context.js';
import { deliveryJobId } from '../queue/job-ids.js';
import { restoreJobs } from '../queue/restore-jobs.js';

// Wake-ups for push deliveries: one job for the due head of each config, never one per delivery.
// Used after the projector's commit, by the sweeper and when an operator resumes a config.

const headRow = z.object({ id: z.string(), attempts: z.number(), next_attempt_at: z.number() });

/**
 * The due head (earliest pending delivery) of each config with pending work, optionally of one
 * config. Not before it is due: a head waiting for its retry, or with an attempt in flight (leased),
 * has its own job; and a delivery behind it is not a head.
 */
function dueHeads(scope: ReturnType<typeof sql.fragment>) {
  return sql.type(headRow)`
    SELECT id, attempts, next_attempt_at FROM (
      SELECT DISTINCT ON (d.task_id, d.config_id) d.id, d.attempts, d.next_attempt_at
      FROM push_deliveries d JOIN push_configs c ON c.task_id = d.task_id AND c.id = d.config_id
      WHERE d.state = 'pending' AND (c.state <> 'paused' OR c.deleted_at IS NOT NULL) AND ${scope}
      ORDER BY d.task_id, d.config_id, d.event_sequence
    ) heads
    WHERE next_attempt_at <= now()
    LIMIT 1000`;
}

/** Wakes the head delivery of every config that has pending work (sweeper, resume). */
export async function wakePendingHeads(context: Pick<KeelContext, 'pool' | 'queues'>, filter?: { taskId: string; configId: string }): Promise<number> {
  const heads = await context.pool.any(
    dueHeads(filter ? sql.fragment`d.task_id = ${filter.taskId} AND d.config_id = ${filter.configId}` : sql.fragment`true`),
  );
  return restoreJobs(heads, (head) =>
    context.queues.ensureJob('push', deliveryJobId(head.id, head.attempts), { deliveryId: head.id }, { delayMs: head.next_attempt_at - Date.now() }),
  );
}

/**
 * After the projector's commit: a wake-up for the due head of each config that got new
 * deliveries, not a job per delivery. A delivery behind an earlier one of its config gets no job:
 * the earlier one wakes it when it ends (otherwise a burst of events queues thousands of jobs that
 * only find they must wait, ahead of the wake-ups that move each config on). Looking for heads
 * after the commit closes the race with a delivery ending meanwhile: whichever of the two commits
 * last sees the other's row.
 */
export async function wakeHeadsOfNewDeliveries(context: Pick<KeelContext, 'pool' | 'queues'>, deliveryIds: readonly string[]): Promise<void> {
  if (deliveryIds.length === 0) return;
  const heads = await context.pool.any(
    dueHeads(sql.fragment`(d.task_id, d.config_id) IN (SELECT task_id, config_id FROM push_deliveries WHERE id = ANY(${sql.array([...deliveryIds], 'uuid')}))`),
  );
  for (const head of heads) {
    await context.queues.addJob('push', deliveryJobId(head.id, head.attempts), { deliveryId: head.id }, { delayMs: head.next_attempt_at - Date.now() });
  }
}
