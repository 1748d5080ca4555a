import type { Job } from 'bullmq';
import { sql } from 'slonik';
import { z } from 'zod';
import { handoffJobId, inboxJobId, projectionJobId, runJobId, timerJobId } from '../src/queue/job-ids.js';
import { restoreJobs } from '../src/queue/restore-jobs.js';
import { timeOutApprovals } from '../src/runs/approval-timeout.js';
import { deadLetterRun, HANDOFF_PREFIX, listQueuedRunIds, listTimerWaits, OPEN_RUN, requeueRun } from '../src/runs/run-repository.js';
import type { KeelContext } from '../src/context/keel-context.js';
import { purgeExpiredRuns } from '../src/tasks/retention.js';
import { foldTaskCountDeltas } from '../src/tasks/task-counts.js';
import { wakePendingHeads } from '../src/push/wake-deliveries.js';

// The maintenance queue's processor. The sweep is the repair path of the outbox rule: every debt
// recorded in Postgres whose job is missing gets its job again, so wiping Redis loses no work.

export const SWEEP_JOB = 'sweep';
/** The reaper (reapExpiredLeases), every sweep interval, a job of its own (see createMaintenanceProcessor). */
export const REAP_JOB = 'reap';
export const PURGE_JOB = 'purge';
const PURGE_EVERY_MS = 24 * 60 * 60 * 1000;
export const SWEEP_EVERY_MS = 15_000;
const SWEEP_BATCH = 1000;

export type SweepReport = { queuedRuns: number; restored: number; projections?: number };
export type ReapReport = { requeued: number; deadLettered: number };
export type ReaperPolicy = { maxRequeues: number; requeueBaseMs: number; requeueMaxMs: number };

const dueRow = z.object({ id: z.string(), requeue_count: z.number(), delay_ms: z.number() });

export async function sweepDebts(context: Pick<KeelContext, 'pool' | 'queues' | 'logger'>): Promise<SweepReport> {
  const ids = await listQueuedRunIds(context.pool, SWEEP_BATCH);
  // A delayed (requeued) run gets its job back with the remaining delay. No QUEUED run does not end
  // the sweep: the hand-offs below are looked at all the same (returning here left a lost hand-off
  // wake-up to its 60 s lease and the reaper whenever nothing was queued, the usual case).
  const rows = ids.length === 0 ? [] : await context.pool.any(sql.type(dueRow)`
    SELECT id, requeue_count, greatest(0, extract(epoch FROM (available_at - now())) * 1000)::float8 AS delay_ms
    FROM runs WHERE id = ANY(${sql.array(ids, 'uuid')}) AND status = 'queued'`);
  let restored = await restoreJobs(rows, (row) => context.queues.ensureJob('runs', runJobId(row.id, row.requeue_count), { runId: row.id }, { delayMs: row.delay_ms }));
  // A resume handed to a worker ('handoff:') is a debt too until a worker takes it, under the
  // hand-off's own job id (a job under the run's usual id may be the suspended stretch's, finishing).
  const handoffs = await context.pool.any(sql.type(z.object({ id: z.string(), revision: z.number() }))`
    SELECT id, revision FROM runs WHERE ${OPEN_RUN} AND status = 'running' AND claimed_by LIKE ${`${HANDOFF_PREFIX}%`} LIMIT ${SWEEP_BATCH}`);
  restored += await restoreJobs(handoffs, ({ id, revision }) => context.queues.ensureJob('runs', handoffJobId(id, revision), { runId: id }));
  // A statechart run waiting for its durable timer owes the delayed job that wakes it.
  restored += await restoreJobs(await listTimerWaits(context.pool, SWEEP_BATCH), (timer) =>
    context.queues.ensureJob('runs', timerJobId(timer.id, timer.revision), { runId: timer.id }, { delayMs: timer.delay_ms }),
  );
  if (restored > 0) context.logger.info({ restored }, 'sweeper restored missing run jobs');
  return { queuedRuns: rows.length, restored };
}

const debtRow = z.object({ id: z.string(), revision: z.number() });

/**
 * Projection debts: runs of A2A tasks with committed revisions not yet in the journal. Only those
 * older than a few seconds are restored, so the sweeper does not race the in-process projection.
 */
export async function sweepProjectionDebts(context: Pick<KeelContext, 'pool' | 'queues' | 'logger'>): Promise<number> {
  const debts = await context.pool.any(sql.type(debtRow)`
    SELECT r.id, r.revision FROM a2a_tasks t JOIN runs r ON r.id = t.run_id
    WHERE t.projected_state NOT IN ('TASK_STATE_COMPLETED', 'TASK_STATE_FAILED', 'TASK_STATE_CANCELED', 'TASK_STATE_REJECTED')
      AND r.revision > t.projected_revision AND r.updated_at < now() - interval '2 seconds'
    ORDER BY r.updated_at LIMIT ${SWEEP_BATCH}`);
  const restored = await restoreJobs(debts, (debt) => context.queues.ensureJob('projector', projectionJobId(debt.id, debt.revision), { runId: debt.id }));
  if (restored > 0) context.logger.info({ restored }, 'sweeper restored missing projection jobs');
  return restored;
}

const expiredRow = z.object({ id: z.string(), requeue_count: z.number(), inside_non_idempotent_call: z.string().nullable() });

/** Delay before the n-th requeue (n from 0): min(base × 2^n, max). */
export function requeueDelayMs(policy: ReaperPolicy, requeueCount: number): number {
  return Math.min(policy.requeueMaxMs, policy.requeueBaseMs * 2 ** requeueCount);
}

/**
 * The reaper: RUNNING runs whose lease expired belong to a worker that crashed or hung. Each is
 * requeued after a growing delay, at most `maxRequeues` times, else dead-lettered. A run that was
 * inside a non-idempotent tool call is dead-lettered at once: retrying could repeat the write.
 */
export async function reapExpiredLeases(context: Pick<KeelContext, 'pool' | 'queues' | 'logger'>, policy: ReaperPolicy): Promise<ReapReport> {
  const expired = await context.pool.any(sql.type(expiredRow)`
    SELECT id, requeue_count, inside_non_idempotent_call FROM runs
    WHERE ${OPEN_RUN} AND status = 'running' AND lease_expires_at < now()
    ORDER BY lease_expires_at LIMIT ${SWEEP_BATCH}`);
  const report: ReapReport = { requeued: 0, deadLettered: 0 };
  for (const run of expired) {
    if (run.inside_non_idempotent_call !== null || run.requeue_count >= policy.maxRequeues) {
      if (await deadLetterRun(context.pool, run.id)) {
        report.deadLettered += 1;
        context.logger.warn(
          { runId: run.id, requeues: run.requeue_count, insideNonIdempotentCall: run.inside_non_idempotent_call !== null },
          'run dead-lettered after its lease expired',
        );
      }
      continue;
    }
    const delayMs = requeueDelayMs(policy, run.requeue_count);
    if (await requeueRun(context.pool, run.id, delayMs)) {
      report.requeued += 1;
      await context.queues.ensureJob('runs', runJobId(run.id, run.requeue_count + 1), { runId: run.id }, { delayMs });
      context.logger.info({ runId: run.id, delayMs, requeues: run.requeue_count + 1 }, 'run requeued after its lease expired');
    }
  }
  return report;
}

/**
 * The poller: every open dependency whose next poll is due is reconciled (with backoff), which
 * repairs a lost callback; a dependency resolved while its run still waits is handed over again.
 * A callback whose wake-up found the dependency's reconcile job still active enqueued nothing: an
 * unprocessed callback of a resolved or failed dependency, or of an open one stored around or after
 * its last reconcile (the slack covers a row that committed after that reconcile looked), is
 * reconciled too, so none stays unprocessed and a completion push is not left to the backoff.
 */
export async function pollDependencies(context: Pick<KeelContext, 'pool' | 'queues'>): Promise<number> {
  const due = await context.pool.anyFirst(sql.type(z.object({ id: z.string() }))`
    SELECT d.id FROM dependencies d
    WHERE (d.state IN ('pending', 'waiting') AND d.next_poll_at <= now())
       OR (d.state IN ('resolved', 'failed') AND EXISTS (SELECT 1 FROM runs r WHERE r.id = d.run_id AND r.status = 'waiting_for_dependency'))
       OR EXISTS (SELECT 1 FROM inbox_callbacks c JOIN inbox_registrations g ON g.id = c.registration_id
                  WHERE g.dependency_id = d.id AND c.processed_at IS NULL
                    AND (d.state IN ('resolved', 'failed') OR c.received_at > d.updated_at - interval '5 seconds'))
    ORDER BY d.next_poll_at LIMIT ${SWEEP_BATCH}`);
  return restoreJobs(due, (id) => context.queues.ensureJob('inbox', inboxJobId(id), { dependencyId: id }));
}

/**
 * The maintenance queue's processor. The reaper is a job of its own, not the sweep's first step: a
 * sweep restores every debt it finds (a few queue round trips each, RESTORE_CONCURRENCY at a time;
 * one at a time when this was decided), and after
 * the worker-partition fault one with 132 projection debts took 42 s on the loaded test machine,
 * during which no sweep, so no reaper, ran anywhere: the cut-off worker's runs were taken over 38 s
 * after the cut instead of within the lease (decision 0093). The maintenance worker runs two jobs
 * at once (start-keel.ts), and at most one job of each name per process: one that finds another of
 * its name still running here ends at once, so a long sweep, or a reap stuck on a database this
 * process cannot reach, never takes the other slot, and the next one goes to a process that can.
 */
export function createMaintenanceProcessor(context: KeelContext) {
  const policy: ReaperPolicy = {
    maxRequeues: context.config.runs.maxRequeues,
    requeueBaseMs: context.config.runs.requeueBaseSeconds * 1000,
    requeueMaxMs: context.config.runs.requeueMaxSeconds * 1000,
  };
  /** The job of each name running in this process (a stuck reap's entry is taken over by the next). */
  const running = new Map<string, Job>();
  const processJob = async (job: Job): Promise<unknown> => {
    switch (job.name) {
      case REAP_JOB: {
        const startedAt = Date.now();
        const reaped = await reapExpiredLeases(context, policy);
        context.logger.debug({ jobId: job.id, ...reaped, ms: Date.now() - startedAt }, 'reaper done');
        return reaped;
      }
      case SWEEP_JOB: {
        const startedAt = Date.now();
        const approvalsTimedOut = await timeOutApprovals(context, context.config.runs.approvalTimeoutHours);
        const swept = await sweepDebts(context);
        const projections = await sweepProjectionDebts(context);
        // Pending deliveries whose job is missing (a flushed Redis, a lost wake-up): wake each config's head.
        const deliveries = await wakePendingHeads(context);
        const dependencies = await pollDependencies(context);
        const countDeltas = await foldTaskCountDeltas(context.pool);
        const report = { approvalsTimedOut, ...swept, projections, deliveries, dependencies, countDeltas };
        context.logger.debug({ jobId: job.id, ...report, ms: Date.now() - startedAt }, 'maintenance sweep done');
        return report;
      }
      case PURGE_JOB: {
        const report = await purgeExpiredRuns(context.pool, context.config.privacy.retention.agentRun);
        if (report.runs > 0) context.logger.info(report, 'retention purge removed expired runs');
        return report;
      }
      default:
        context.logger.warn({ name: job.name }, 'unknown maintenance job ignored');
        return null;
    }
  };
  // A reap still running after a lease is presumed stuck on a silent link (its queries wait for
  // TCP to retransmit once the link is back: tens of seconds after a 20 s cut, minutes after a
  // long one). It no longer stops this process's next reap, which takes another connection; the
  // stuck one ends by itself. One stuck reap per process at a time is left behind (each holds a
  // pool connection); two reaps at once are safe: each run is taken under SKIP LOCKED and the
  // lease guard. The sweep has no such bound: under load it takes tens of seconds of real work.
  const stuckAfterMs: Partial<Record<string, number>> = { [REAP_JOB]: context.config.runs.leaseSeconds * 1000 };
  const leftBehind = new Set<string>();
  return async (job: Job): Promise<unknown> => {
    if (running.has(job.name)) return { skipped: `a ${job.name} job is still running in this process` };
    running.set(job.name, job);
    const release = () => {
      if (running.get(job.name) === job) running.delete(job.name);
    };
    const work = processJob(job).finally(release);
    const stuckMs = stuckAfterMs[job.name];
    if (stuckMs === undefined) return work;
    let timer: NodeJS.Timeout | undefined;
    const stuck = new Promise<{ stuck: true }>((resolve) => {
      timer = setTimeout(() => resolve({ stuck: true }), stuckMs);
      timer.unref();
    });
    try {
      const outcome = await Promise.race([work, stuck]);
      if (outcome !== null && typeof outcome === 'object' && 'stuck' in outcome) {
        if (leftBehind.has(job.name)) return await work;
        leftBehind.add(job.name);
        release();
        work.catch((error: Error) => context.logger.warn({ err: error, job: job.name }, 'a stuck maintenance job failed')).finally(() => leftBehind.delete(job.name));
        context.logger.warn({ job: job.name, afterMs: stuckMs }, 'maintenance job still running after a lease; the next one runs beside it');
      }
      return outcome;
    } finally {
      clearTimeout(timer);
    }
  };
}

export async function scheduleMaintenance(context: Pick<KeelContext, 'queues'>, everyMs = SWEEP_EVERY_MS): Promise<void> {
  const queue = context.queues.queue('maintenance');
  const schedules = [
    { id: SWEEP_JOB, every: everyMs },
    { id: REAP_JOB, every: everyMs },
    // The retention purge, daily.
    { id: PURGE_JOB, every: PURGE_EVERY_MS },
  ];
  // Upserted at start whatever is there, so a changed interval takes effect.
  for (const { id, every } of schedules) await queue.upsertJobScheduler(id, { every }, { name: id, data: {} });
  // The schedulers live in the queue backend: a wiped Redis takes them along, a partly wiped one
  // can keep a scheduler and lose its next job, and without a sweep nothing would restore the
  // other debts' jobs. Put back whichever is gone or stuck (until the queue closes).
  const watchdog = setInterval(() => {
    if (queue.closing) {
      clearInterval(watchdog);
      return;
    }
    void (async () => {
      for (const { id, every } of schedules) await context.queues.ensureJobScheduler('maintenance', id, every, id);
    })().catch(() => undefined);
  }, Math.max(everyMs, 1000));
  watchdog.unref();
}
