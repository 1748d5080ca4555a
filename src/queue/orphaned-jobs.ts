import type { Job, Queue } from 'bullmq';
import type { KeelLogger } from '../log/logger.js';
import type { QueueName } from './queue-names.js';

/** How long after a worker's error the first look is made, and between looks until one succeeds. */
const LOOK_AFTER_MS = 2_000;
/**
 * A job taken at least this long ago (half the wait before a look) and in none of the worker's processors was lost on its way in
 * or out of one: a job is inside its processor within a turn of the event loop of being taken.
 */
const TAKEN_BEFORE_MS = 1_000;

/** A worker whose lost jobs are looked for: its name (stored on every job it takes) and the ids inside its processor. */
export type WatchedWorker = { queue: QueueName; name: string; running: ReadonlySet<string>; jobs: () => Queue };

/**
 * Hands out again the jobs a worker of this process took and then lost (docs/reliability.md,
 * "Jobs a worker lost"; decision 0100).
 *
 * Taking a job and finishing it are each one call to the queue backend. When the connection drops
 * during such a call (Postgres crashed, Redis restarted, a link was cut), the call may have
 * committed while its answer never came: the job is 'active', locked to this worker, and no
 * processor runs it. Keel's sweeper takes an active job for one that will still run, so only
 * BullMQ's stalled-job check would hand it out again, once its lock expired and two checks saw it:
 * 30-60 s after the database came back, with the push deliveries behind it (a postgres-crash run
 * saw one or two such jobs in most crashes, and deliveries 48 s late in one).
 *
 * After any error of a worker, this looks at the worker's active jobs until a look succeeds (the
 * backend answers again): a job this worker took more than `TAKEN_BEFORE_MS` ago that none of its
 * processors is running goes back to waiting, whoever holds its lock (BullMQ's `moveToWait`
 * without a token). Every queue's job is a wake-up whose work is read again and whose writes are
 * guarded, so a job returned while BullMQ was still trying to finish it is processed once more and
 * finds nothing to do.
 */
export class OrphanedJobs {
  private readonly watched: WatchedWorker[] = [];
  private timer: NodeJS.Timeout | null = null;
  private closed = false;

  constructor(private readonly logger: KeelLogger) {}

  watch(worker: WatchedWorker): void {
    this.watched.push(worker);
  }

  /** A worker's call to the backend failed: one of its jobs may have been taken or finished unseen. */
  suspect(): void {
    if (this.closed || this.timer) return;
    this.timer = setTimeout(() => void this.look(), LOOK_AFTER_MS);
    this.timer.unref();
  }

  /** Looks now; true when every worker's jobs could be read. */
  async look(): Promise<boolean> {
    if (this.timer) clearTimeout(this.timer);
    this.timer = null;
    try {
      for (const worker of this.watched) await this.returnLost(worker);
      return true;
    } catch (error) {
      this.logger.debug({ err: error }, 'cannot look for lost jobs yet; looking again shortly');
      this.suspect();
      return false;
    }
  }

  close(): void {
    this.closed = true;
    if (this.timer) clearTimeout(this.timer);
    this.timer = null;
  }

  private async returnLost(worker: WatchedWorker): Promise<void> {
    const active: Job[] = await worker.jobs().getJobs(['active']);
    const takenBefore = Date.now() - TAKEN_BEFORE_MS;
    const returned: string[] = [];
    for (const job of active) {
      if (this.closed) return;
      if (job.id === undefined || job.processedBy !== worker.name || worker.running.has(job.id)) continue;
      if (job.processedOn === undefined || job.processedOn > takenBefore) continue;
      const moved = await job.moveToWait().then(
        () => true,
        // Finished or returned meanwhile (by BullMQ's own retry, or the stalled-job check).
        (error: unknown) => (isNotActive(error) ? false : Promise.reject(error)),
      );
      if (moved) returned.push(job.id);
    }
    if (returned.length > 0) {
      this.logger.warn({ queue: worker.queue, jobIds: returned }, 'jobs this process had taken and was not running are handed out again');
    }
  }
}

/** BullMQ's finished-errors codes for a job that no longer exists (-1) or is no longer active (-3). */
function isNotActive(error: unknown): boolean {
  const code = (error as { code?: unknown } | null)?.code;
  return code === -1 || code === -3;
}
