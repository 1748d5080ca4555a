import type { Job, Queue, Worker } from 'bullmq';
import type { KeelLogger } from '../log/logger.js';
import type { QueueName } from './queue-names.js';

/** How long after a worker's error the first look is made, and between looks until one succeeds. */
const LOOK_AFTER_MS = 2_000;
/**
 * A job taken at least this long ago (half the wait before a look) that its worker does not hold
 * was lost: a job whose take committed is held within a turn of the event loop of its answer.
 */
const TAKEN_BEFORE_MS = 1_000;

/** A worker whose lost jobs are looked for: its name (stored on every job it takes) and the ids of the jobs it holds (`holdJobs`). */
export type WatchedWorker = { queue: QueueName; name: string; held: ReadonlySet<string>; jobs: () => Queue };

/**
 * The ids of the jobs `worker` holds: from the moment it takes one until BullMQ's `processJob` of it
 * has ended (the processor, then moving the job to completed, failed or delayed, with the retries
 * of that move while the backend is away). A job is taken in two places, a fetch and a finish that
 * takes the next job, and both hand the job's data to BullMQ's `nextJobFromJobData`; a job the
 * finish took waits there until the main loop starts its `processJob`, which during an outage can
 * be seconds. A job BullMQ gave up finishing (an error it does not take for a lost connection, on a
 * call that may have committed) is no longer held, and is the worker's to lose. Set on the worker
 * as it is made, before its main loop has taken anything. Both methods are BullMQ 6's (its version
 * is pinned); were either gone, making a worker would fail at once.
 */
export function holdJobs(worker: Worker): ReadonlySet<string> {
  const held = new Set<string>();
  const internals = worker as unknown as { nextJobFromJobData: (jobData?: unknown, jobId?: string, token?: string) => Promise<Job | undefined> };
  const take = internals.nextJobFromJobData.bind(worker);
  internals.nextJobFromJobData = async (jobData, jobId, token) => {
    if (jobData && jobId) held.add(jobId);
    const job = await take(jobData, jobId, token);
    if (!job && jobId) held.delete(jobId);
    return job;
  };
  const processJob = worker.processJob.bind(worker);
  worker.processJob = async (job, token, fetchNextCallback) => {
    try {
      return await processJob(job, token, fetchNextCallback);
    } finally {
      if (job.id !== undefined) held.delete(job.id);
    }
  };
  return held;
}

/**
 * Hands out again the jobs a worker of this process took and then lost (docs/reliability.md, "What
 * the suite found"; decision 0100).
 *
 * Taking a job and finishing it are each one call to the queue backend. When the connection drops
 * during such a call (Postgres crashed, Redis restarted, a link was cut), the call may have
 * committed while its answer never came: the job is 'active', locked to this worker, and no
 * processor runs it. Keel's sweeper takes an active job for one that will still run, so only
 * BullMQ's stalled-job check would hand it out again, once its lock expired and two checks saw it:
 * 30-60 s after the database came back, with the push deliveries behind it.
 *
 * After a worker's error, this looks at the worker's active jobs until a look succeeds (the backend
 * answers again). A job goes back to waiting when its worker took it no later than the latest error (in
 * the same millisecond counts: a take's time is this process's clock, in milliseconds) and more than
 * `TAKEN_BEFORE_MS` ago, does not hold it (`holdJobs`), and a fresh read just before the move still
 * shows that take: a job finished and taken again since the list was read is its new take's.
 * Only for workers whose job is a wake-up that a second processing finds done (`returnLostJobs`):
 * between that read and the move a take can still come, and the job is then processed twice. A
 * first version that looked only at the processor, for every queue, returned run jobs whose finish
 * BullMQ was still retrying during a 20 s outage, and `hosts-postgres-cutoff` lost a run's wake-up.
 */
export class OrphanedJobs {
  private watched: WatchedWorker[] = [];
  private timer: NodeJS.Timeout | null = null;
  /**
   * When the latest error since the last look that read every worker's jobs came: a job lost to
   * any of them was taken before it. (The first error's time left out a job lost to a later error
   * before the look.)
   */
  private suspectedAt: number | null = null;
  private looking: Promise<boolean> | null = null;

  constructor(private readonly logger: KeelLogger) {}

  watch(worker: WatchedWorker): void {
    this.watched.push(worker);
  }

  /** A worker's call to the backend failed: one of its jobs may have been taken or finished unseen. */
  suspect(): void {
    if (this.watched.length === 0) return;
    this.suspectedAt = Date.now();
    if (this.timer) return;
    this.timer = setTimeout(() => void this.look(), LOOK_AFTER_MS);
    this.timer.unref();
  }

  /** Looks now (one look at a time); true when every worker's jobs could be read. */
  look(): Promise<boolean> {
    if (this.timer) clearTimeout(this.timer);
    this.timer = null;
    this.looking ??= this.lookOnce().finally(() => (this.looking = null));
    return this.looking;
  }

  /** The workers are closing: none is watched any more (workers made afterwards are). */
  forgetWorkers(): void {
    this.watched = [];
    if (this.timer) clearTimeout(this.timer);
    this.timer = null;
    this.suspectedAt = null;
  }

  private async lookOnce(): Promise<boolean> {
    // Jobs taken no later than the latest error and more than a moment before this look.
    const suspectedAt = this.suspectedAt;
    const takenBefore = Math.min(suspectedAt ?? Date.now(), Date.now() - TAKEN_BEFORE_MS);
    // An error in the moment before this look: a job it lost is still too fresh to tell from one
    // on its way into a processor. It stays suspected, for a look once that job is not.
    this.suspectedAt = suspectedAt !== null && suspectedAt > takenBefore ? suspectedAt : null;
    try {
      for (const worker of [...this.watched]) await this.returnLost(worker, takenBefore);
      // What this look could not judge, and errors that came while it read (a `look()` then
      // joined this one, which began before them): the next look takes them.
      if (this.suspectedAt !== null) {
        this.timer ??= setTimeout(() => void this.look(), LOOK_AFTER_MS);
        this.timer.unref();
      }
      return true;
    } catch (error) {
      this.logger.debug({ err: error }, 'cannot look for lost jobs yet; looking again shortly');
      // The failed look is an error too: the next look takes what was taken before it.
      this.suspect();
      return false;
    }
  }

  private async returnLost(worker: WatchedWorker, takenBefore: number): Promise<void> {
    const lost = (job: Job | undefined): job is Job =>
      job !== undefined && job.id !== undefined && job.processedBy === worker.name && !worker.held.has(job.id) && job.processedOn !== undefined && job.processedOn <= takenBefore;
    const returned: string[] = [];
    for (const listed of await worker.jobs().getJobs(['active'])) {
      if (!this.watched.includes(worker)) return;
      if (!lost(listed)) continue;
      // Read again: finished and taken anew since the list was read, it is no longer the lost take.
      const job = await worker.jobs().getJob(listed.id!);
      if (!lost(job) || job.processedOn !== listed.processedOn || (await job.getState()) !== 'active') continue;
      await job.moveToWait().catch((error: unknown) => {
        // Finished or handed out meanwhile (by BullMQ's own retry, or the stalled-job check).
        if (!isGone(error)) throw error;
      });
      returned.push(job.id!);
    }
    if (returned.length > 0) {
      this.logger.warn({ queue: worker.queue, jobIds: returned }, 'jobs this process had taken and no longer held are handed out again');
    }
  }
}

/** BullMQ's finished-errors codes for a job that no longer exists (-1) or is no longer active (-3). */
function isGone(error: unknown): boolean {
  const code = (error as { code?: unknown } | null)?.code;
  return code === -1 || code === -3;
}
