import { randomBytes } from 'node:crypto';
import { hostname } from 'node:os';
import { Queue, Worker, createPostgresBackend, type Job, type JobsOptions, type Processor } from 'bullmq';
import { withDeadline, type Probe } from '../health/probe.js';
import type { KeelLogger } from '../log/logger.js';
import { QUEUE_NAMES, type QueueName } from './queue-names.js';
import { BullmqSchema } from './bullmq-schema.js';
import { holdJobs, OrphanedJobs } from './orphaned-jobs.js';
import { QueuePool } from './queue-pool.js';

export type QueueBackend =
  | { kind: 'redis'; url: string; prefix?: string }
  | { kind: 'postgres'; connectionString: string; prefix?: string; connectionsPerWorker?: number; linkTimeoutSeconds?: number };

/** The idle time before TCP keepalive probes on the Redis connections (see baseOptions). */
const REDIS_KEEPALIVE_MS = 10_000;

export type WorkerOptions = {
  concurrency?: number;
  lockDurationMs?: number;
  /**
   * Put the worker's lost jobs back to waiting after its errors (OrphanedJobs, decision 0100): only
   * for a processor whose job is a wake-up that a second processing finds done.
   */
  returnLostJobs?: boolean;
};

/** Job states in which the job will still run; anything else means the debt needs a new job. */
const PENDING_STATES = new Set(['waiting', 'delayed', 'active', 'prioritized', 'waiting-children']);

/**
 * Connections on the Postgres backend: one pool per worker, its LISTEN connection and the rest for
 * its queries (take a job, extend locks, finish it), and one pool of one fewer for every queue of
 * the process (adding and reading jobs). By default six per worker, as many query connections as
 * BullMQ's own pool for a worker had. A worker's pool of its own keeps the maintenance sweep's
 * reads off the runs worker's lock extensions, and caps how many of its claims (`FOR UPDATE SKIP
 * LOCKED`) reach Postgres at once: one pool of 15 shared by everything cost Postgres 16 % more CPU
 * per task with two worker processes, and one of ten fell behind in the fault suite.
 * `queue.connectionsPerWorker` sizes them for a server with few connections to spare (decision 0040).
 */
export const DEFAULT_CONNECTIONS_PER_WORKER = 6;

/** The pools' sizes for a number of connections per worker, and the most they hold together. */
export function queueConnectionLimits(perWorker: number = DEFAULT_CONNECTIONS_PER_WORKER): { producer: number; worker: number; total: number } {
  const producer = perWorker - 1;
  return { producer, worker: perWorker, total: producer + QUEUE_NAMES.length * perWorker };
}

// Jobs are wake-ups; Postgres holds the truth. Finished jobs are removed so a deterministic id is
// free again for the next debt of the same name (a requeued run reuses `run-<id>`).
const DEFAULT_JOB_OPTIONS: JobsOptions = {
  removeOnComplete: true,
  removeOnFail: true,
  attempts: 5,
  backoff: { type: 'exponential', delay: 1000 },
};

/**
 * The one factory for BullMQ queues and workers: on Redis when `queue.redisUrl` is set, else on
 * BullMQ's Postgres backend in Keel's own database (schema `bullmq`). Callers never see which.
 */
export class KeelQueues {
  readonly backend: QueueBackend;
  private readonly queues = new Map<QueueName, Queue>();
  private readonly workers: Worker[] = [];
  private readonly logger: KeelLogger;
  /** On the Postgres backend: the queues' pool (made on first use), the workers' pools, the schema. */
  private producerPool: QueuePool | undefined;
  private readonly workerPools: QueuePool[] = [];
  private readonly schema = new BullmqSchema();
  /** Jobs a worker of this process took or finished unseen, handed out again after its errors. */
  readonly orphanedJobs: OrphanedJobs;
  /** This process's part of its workers' names: `queue@host:pid:tag`, stored on every job a worker takes. */
  private readonly workerTag = `${hostname()}:${process.pid}:${randomBytes(3).toString('hex')}`;

  /**
   * How long a worker's job lock lasts (renewed while the job runs) and how often stalled jobs are
   * looked for. A job a dead worker had taken is handed out again only once its lock expired: until
   * then the sweeper sees it 'active' and restores nothing (a run taken but not yet claimed stays
   * QUEUED), so this follows the run lease when that is shorter than BullMQ's 30 s.
   */
  private readonly lockDurationMs: number;

  constructor(backend: QueueBackend, logger: KeelLogger, options: { lockDurationMs?: number } = {}) {
    this.backend = backend;
    this.lockDurationMs = options.lockDurationMs ?? 30_000;
    this.logger = logger.child({ component: 'queues', backend: backend.kind });
    this.orphanedJobs = new OrphanedJobs(this.logger);
  }

  private baseOptions(role: 'producer' | 'worker') {
    const prefix = this.backend.prefix ?? 'keel';
    if (this.backend.kind === 'redis') {
      const url = new URL(this.backend.url);
      return {
        prefix,
        connection: {
          host: url.hostname,
          port: Number(url.port || 6379),
          username: url.username ? decodeURIComponent(url.username) : undefined,
          password: url.password ? decodeURIComponent(url.password) : undefined,
          db: url.pathname.length > 1 ? Number(url.pathname.slice(1)) : 0,
          tls: url.protocol === 'rediss:' ? {} : undefined,
          maxRetriesPerRequest: null,
          enableOfflineQueue: true,
          // ioredis's default (0) leaves the OS's two hours before a silent link is probed: a
          // connection waiting on a Redis behind a cut link (a worker's blocking fetch) then errs
          // within 10 s and ten one-second probes, and ioredis reconnects (decision 0092).
          keepAlive: REDIS_KEEPALIVE_MS,
        },
      };
    }
    const limits = queueConnectionLimits(this.backend.connectionsPerWorker);
    if (role === 'producer') {
      this.producerPool ??= new QueuePool(this.backend.connectionString, limits.producer, this.schema, this.backend.linkTimeoutSeconds);
      return { prefix, connection: this.producerPool };
    }
    const pool = new QueuePool(this.backend.connectionString, limits.worker, this.schema, this.backend.linkTimeoutSeconds);
    this.workerPools.push(pool);
    return { prefix, connection: pool };
  }

  queue(name: QueueName): Queue {
    let queue = this.queues.get(name);
    if (!queue) {
      const options = { ...this.baseOptions('producer'), defaultJobOptions: DEFAULT_JOB_OPTIONS };
      // The two constructor forms differ only in the backend factory argument.
      queue =
        this.backend.kind === 'postgres'
          ? (new Queue(name, options as never, createPostgresBackend as never) as unknown as Queue)
          : new Queue(name, options as never);
      queue.on('error', (error) => this.logger.warn({ err: error, queue: name }, 'queue connection error'));
      this.queues.set(name, queue);
    }
    return queue;
  }

  allQueues(): Queue[] {
    return QUEUE_NAMES.map((name) => this.queue(name));
  }

  createWorker<D = unknown, R = unknown>(name: QueueName, processor: Processor<D, R>, options: WorkerOptions = {}): Worker<D, R> {
    // A name of this worker's own on every job it takes (the dashboard shows it): with
    // `returnLostJobs`, a job with that name that the worker does not hold was lost by it.
    const workerName = `${name}@${this.workerTag}`;
    const workerOptions = {
      ...this.baseOptions('worker'),
      name: workerName,
      concurrency: options.concurrency ?? 1,
      lockDuration: options.lockDurationMs ?? this.lockDurationMs,
      stalledInterval: options.lockDurationMs ?? this.lockDurationMs,
      // After a backend error (Postgres restarted, Redis back) the worker fetches again after this
      // long; BullMQ's 15 s left every queue idle that long after the database was back.
      runRetryDelay: 1000,
      autorun: true,
    };
    const worker =
      this.backend.kind === 'postgres'
        ? (new Worker(name, processor as never, workerOptions as never, createPostgresBackend as never) as unknown as Worker<D, R>)
        : new Worker<D, R>(name, processor, workerOptions as never);
    worker.on('error', (error) => {
      this.logger.warn({ err: error, queue: name }, 'worker error');
      this.orphanedJobs.suspect();
    });
    // A dropped connection's failed calls are retried without an 'error' (BullMQ's "connection
    // closed"), and one of them may have taken a job unseen.
    worker.on('ioredis:close', () => this.orphanedJobs.suspect());
    worker.on('failed', (job: Job<D, R> | undefined, error: Error) =>
      this.logger.warn({ err: error, queue: name, jobId: job?.id }, 'job failed'),
    );
    if (options.returnLostJobs) {
      this.orphanedJobs.watch({ queue: name, name: workerName, held: holdJobs(worker as unknown as Worker), jobs: () => this.queue(name) });
    }
    this.workers.push(worker as unknown as Worker);
    return worker;
  }

  /** Adds a job under a deterministic id unless one with that id is still pending. */
  async ensureJob(name: QueueName, jobId: string, data: object, options: { delayMs?: number } = {}): Promise<'added' | 'present'> {
    const queue = this.queue(name);
    const existing = await queue.getJob(jobId);
    if (existing) {
      const state = await existing.getState();
      if (PENDING_STATES.has(state)) return 'present';
      await existing.remove().catch(() => undefined);
    }
    await queue.add(name, data, { jobId, delay: options.delayMs && options.delayMs > 0 ? Math.ceil(options.delayMs) : undefined });
    return 'added';
  }

  /**
   * Puts a job scheduler in place unless it is there and its next job will still run. Present is
   * not enough: a Redis that lost some of a queue's keys (evicted, or deleted while the scheduler
   * was writing them) can keep the scheduler's entry and lose its next job, and such a scheduler
   * never fires again. Upserting it adds the next job again (and keeps a live one's slot).
   */
  async ensureJobScheduler(name: QueueName, schedulerId: string, everyMs: number, jobName: string): Promise<'present' | 'scheduled'> {
    const queue = this.queue(name);
    if (await schedulerIsLive(queue, schedulerId)) return 'present';
    await queue.upsertJobScheduler(schedulerId, { every: everyMs }, { name: jobName, data: {} });
    return 'scheduled';
  }

  /**
   * Adds jobs without checking first: the common path right after a commit. A `priority` (1 first,
   * up to BullMQ's 2^21 - 1) orders the job among the prioritized ones, which both backends hand
   * out after every job without one (decision 0062).
   */
  async addJob(name: QueueName, jobId: string, data: object, options: { delayMs?: number; priority?: number } = {}): Promise<void> {
    await this.queue(name).add(name, data, {
      jobId,
      delay: options.delayMs && options.delayMs > 0 ? Math.ceil(options.delayMs) : undefined,
      priority: options.priority,
    });
  }

  /** Whether the queue backend answers within `timeoutMs`, and if not, why. */
  async probe(timeoutMs: number): Promise<Probe> {
    return withDeadline(timeoutMs, `no answer from the queue backend within ${timeoutMs} ms`, () => this.queue('maintenance').getJobCounts('waiting'));
  }

  async waitUntilReady(): Promise<void> {
    await Promise.all(this.allQueues().map((queue) => queue.waitUntilReady()));
  }

  async closeWorkers(): Promise<void> {
    this.orphanedJobs.forgetWorkers();
    await Promise.all(this.workers.map((worker) => worker.close()));
    this.workers.length = 0;
    await Promise.all(this.workerPools.splice(0).map((pool) => pool.end()));
  }

  async close(): Promise<void> {
    await this.closeWorkers();
    await Promise.all([...this.queues.values()].map((queue) => queue.close()));
    this.queues.clear();
    const pool = this.producerPool;
    this.producerPool = undefined;
    await pool?.end();
  }
}

/**
 * Whether a scheduler's next job is there and will still run. The scheduler moves on to a new job
 * when a worker takes the current one, so a missing job is only believed when the scheduler still
 * names it afterwards.
 */
async function schedulerIsLive(queue: Queue, schedulerId: string): Promise<boolean> {
  for (let look = 0; look < 3; look += 1) {
    const scheduler = await queue.getJobScheduler(schedulerId);
    if (!scheduler || scheduler.next == null) return false;
    const job = await queue.getJob(`repeat:${schedulerId}:${scheduler.next}`);
    if (job && PENDING_STATES.has(await job.getState())) return true;
    if ((await queue.getJobScheduler(schedulerId))?.next === scheduler.next) return false;
  }
  return false;
}
