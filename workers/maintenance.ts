import type { Job } from 'bullmq';
import { listQueuedRunIds } from '../src/runs/run-repository.js';
import { runJobId } from '../src/queue/job-ids.js';
import type { KeelContext } from '../src/runtime/keel-context.js';
import { sql } from 'slonik';
import { z } from 'zod';

// The maintenance queue's processor. The sweep is the repair path of the outbox rule: every debt
// recorded in Postgres whose job is missing gets its job again, so wiping Redis loses no work.

export const SWEEP_JOB = 'sweep';
export const SWEEP_EVERY_MS = 15_000;
const SWEEP_BATCH = 1000;

export type SweepReport = { queuedRuns: number; restored: number };

const dueRow = z.object({ id: z.string(), delay_ms: z.number() });

export async function sweepDebts(context: Pick<KeelContext, 'pool' | 'queues' | 'logger'>): Promise<SweepReport> {
  const ids = await listQueuedRunIds(context.pool, SWEEP_BATCH);
  if (ids.length === 0) return { queuedRuns: 0, restored: 0 };
  // A delayed (requeued) run gets its job back with the remaining delay.
  const rows = await context.pool.any(sql.type(dueRow)`
    SELECT id, greatest(0, extract(epoch FROM (available_at - now())) * 1000)::float8 AS delay_ms
    FROM runs WHERE id = ANY(${sql.array(ids, 'uuid')}) AND status = 'queued'`);
  let restored = 0;
  for (const row of rows) {
    const outcome = await context.queues.ensureJob('runs', runJobId(row.id), { runId: row.id }, { delayMs: row.delay_ms });
    if (outcome === 'added') restored += 1;
  }
  if (restored > 0) context.logger.info({ restored }, 'sweeper restored missing run jobs');
  return { queuedRuns: rows.length, restored };
}

export function createMaintenanceProcessor(context: KeelContext) {
  return async (job: Job): Promise<unknown> => {
    switch (job.name) {
      case SWEEP_JOB:
        return sweepDebts(context);
      default:
        context.logger.warn({ name: job.name }, 'unknown maintenance job ignored');
        return null;
    }
  };
}

export async function scheduleMaintenance(context: Pick<KeelContext, 'queues'>, everyMs = SWEEP_EVERY_MS): Promise<void> {
  await context.queues.queue('maintenance').upsertJobScheduler(SWEEP_JOB, { every: everyMs }, { name: SWEEP_JOB, data: {} });
}
