import type { DatabaseReturn } from '../db/database-return.js';
import type { KeelLogger } from '../log/logger.js';
import type { QueueName } from './queue-names.js';

/** How long a job that lost its database connection waits for the database to answer again. */
export const JOB_DATABASE_WAIT_MS = 30_000;

/** How many times a job is processed again after losing its database connection. */
export const JOB_DATABASE_RETRIES = 3;

/**
 * Wraps a queue's processor so that a job whose database connection was lost (a crash, a restart,
 * a cut link) waits for the database to answer and is processed again, instead of failing.
 *
 * A failed job is retried by the queue, so this looks like a shortcut, but on the Postgres queue
 * backend the failure cannot be recorded while the database is away: the job stayed 'active' with
 * its lock, the sweeper took it for one that will still run, and its work waited for BullMQ's
 * stalled-job check, 30-60 s after the database came back (push deliveries 54 s after a crash).
 * Only for processors whose job is a wake-up: they read their work again from the database and
 * every write is guarded (a delivery's attempt is leased, a projection goes by revision, a sweep
 * and a reconciliation look again). The runs queue's processor does this itself, for its claim and
 * its drive (workers/run-executor.ts).
 */
export function onceDatabaseAnswers(databaseReturn: DatabaseReturn, logger: KeelLogger, stop: AbortSignal) {
  return <J extends { id?: string }, R>(queue: QueueName, processor: (job: J) => Promise<R>) =>
    (job: J): Promise<R> =>
      databaseReturn.again(() => processor(job), {
        withinMs: JOB_DATABASE_WAIT_MS,
        times: JOB_DATABASE_RETRIES,
        stop,
        onLost: (error) => logger.warn({ err: error, queue, jobId: job.id }, 'a job lost its database connection; processing it again once the database answers'),
      });
}
