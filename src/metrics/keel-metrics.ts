import { createHash, timingSafeEqual } from 'node:crypto';
import type { FastifyInstance } from 'fastify';
import { collectDefaultMetrics, Gauge, Histogram, Registry } from 'prom-client';
import { sql, type DatabaseConnection, type DatabasePool } from 'slonik';
import { z } from 'zod';
import { REASONS_BY_TERMINAL_STATUS, RUN_STATUSES, TERMINAL_RUN_STATUSES } from '../../machines/run.machine.js';
import { DELIVERY_STATES } from '../../machines/delivery.machine.js';
import { PUSH_CONFIG_STATES } from '../../machines/push-config.machine.js';
import { TASK_STATES, TERMINAL_TASK_STATES } from '../protocol/wire.js';
import type { KeelLogger } from '../log/logger.js';
import type { KeelQueues } from '../queue/keel-queues.js';
import { QUEUE_NAMES } from '../queue/queue-names.js';
import { waitingByClient } from '../tasks/waiting-tasks.js';

// /metrics in the Prometheus text format (prom-client). What Postgres holds is read at scrape
// time, in one snapshot, so every process reports the installation's truth (not its own share)
// and a restart loses nothing: runs by status and reason, tasks by state, the push outbox
// (configs, deliveries, attempts by outcome class, the delay from an event's commit to its
// delivery as a histogram), projector lag, unprocessed inbox callbacks. Queue depth and age come
// from BullMQ. HTTP request durations are observed in-process by an onResponse hook, labelled by
// the registered route pattern (never the raw URL, so ids do not make new series).

export type MetricsDeps = {
  pool: DatabasePool;
  queues: KeelQueues;
  logger: KeelLogger;
  token?: string | undefined;
  /** Metrics the process counts as it runs (src/metrics/hot-path-metrics.ts), rendered with the rest. */
  inProcess?: readonly Registry[];
};

/** Outcome classes of delivery attempts (push_attempts.outcome), docs/push.md "Outcome classes". */
export const ATTEMPT_OUTCOMES = ['delivered', 'retry', 'paused', 'stopped', 'dead'] as const;
export const DELAY_BUCKETS = [0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900, 3600];
const HTTP_BUCKETS = [0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30];
// A paused queue's jobs: on Redis BullMQ 6 keeps them 'waiting'; the Postgres backend counts them as 'paused'.
const COUNTED_JOB_STATES = ['waiting', 'paused', 'prioritized', 'delayed', 'active', 'waiting-children', 'failed'] as const;
const WAITING_STATES = ['waiting', 'paused', 'prioritized'] as const;

const digest = (value: string) => createHash('sha256').update(value, 'utf8').digest();

export class KeelMetrics {
  readonly registry = new Registry();
  private readonly deps: MetricsDeps;
  private readonly runs: Gauge<'status' | 'termination_reason'>;
  private readonly tasks: Gauge<'state'>;
  private readonly configs: Gauge<'state'>;
  private readonly deliveries: Gauge<'state'>;
  private readonly attempts: Gauge<'outcome'>;
  private readonly queueDepth: Gauge<'queue'>;
  private readonly queueJobs: Gauge<'queue' | 'state'>;
  private readonly queueAge: Gauge<'queue'>;
  private readonly lagRevisions: Gauge;
  private readonly lagTasks: Gauge;
  private readonly inboxPending: Gauge;
  private readonly clientsWaiting: Gauge;
  private readonly mostWaiting: Gauge;
  private readonly http: Histogram<'method' | 'route' | 'status_code'>;
  private delay = { buckets: DELAY_BUCKETS.map(() => 0), count: 0, sum: 0 };

  constructor(deps: MetricsDeps) {
    this.deps = deps;
    const registers = [this.registry];
    this.runs = new Gauge({ name: 'keel_runs', help: 'Runs by status and termination reason (empty while not terminal)', labelNames: ['status', 'termination_reason'], registers });
    this.tasks = new Gauge({ name: 'keel_tasks', help: 'A2A tasks by state', labelNames: ['state'], registers });
    this.configs = new Gauge({ name: 'keel_push_configs', help: 'Push configs that are not deleted, by state', labelNames: ['state'], registers });
    this.deliveries = new Gauge({ name: 'keel_push_deliveries', help: 'Push deliveries by state', labelNames: ['state'], registers });
    this.attempts = new Gauge({
      name: 'keel_push_delivery_attempts',
      help: 'Delivery attempts recorded (retained rows), by outcome class: delivered (2xx), retry (timeout, 429, 502-504, redirect, network), paused (401/403), stopped (404/410, guard), dead (other status, attempts exhausted)',
      labelNames: ['outcome'],
      registers,
    });
    this.queueDepth = new Gauge({ name: 'keel_queue_depth', help: 'Jobs not yet being processed (waiting, paused, prioritized, delayed) per queue', labelNames: ['queue'], registers });
    this.queueJobs = new Gauge({ name: 'keel_queue_jobs', help: 'Jobs per queue and BullMQ state', labelNames: ['queue', 'state'], registers });
    this.queueAge = new Gauge({ name: 'keel_queue_oldest_waiting_seconds', help: 'Age of the oldest job waiting to be processed per queue (0 when none)', labelNames: ['queue'], registers });
    this.lagRevisions = new Gauge({
      name: 'keel_projector_lag_revisions',
      help: 'Run revisions committed but not yet projected: sum over open tasks of runs.revision minus a2a_tasks.projected_revision',
      registers,
    });
    this.lagTasks = new Gauge({ name: 'keel_projector_lag_tasks', help: 'Open tasks whose run has revisions not yet projected', registers });
    this.clientsWaiting = new Gauge({ name: 'keel_run_clients_waiting', help: 'Clients with tasks waiting for a run slot (SUBMITTED); the queue serves them in turn (docs/reliability.md, "Fair run slots")', registers });
    this.mostWaiting = new Gauge({ name: 'keel_runs_waiting_most_per_client', help: 'Tasks waiting for a run slot of the client with the most of them', registers });
    this.inboxPending = new Gauge({ name: 'keel_inbox_pending', help: 'Inbox callbacks stored but not processed yet (0 while the inbox table is absent)', registers });
    this.http = new Histogram({
      name: 'keel_http_request_duration_seconds',
      help: 'HTTP request durations by method, route pattern and status code',
      labelNames: ['method', 'route', 'status_code'],
      buckets: HTTP_BUCKETS,
      registers,
    });
    const delayName = 'keel_push_delivery_delay_seconds';
    const delayHelp = 'Delay from the commit of a journal event to its delivery (2xx), over retained delivered deliveries';
    this.registry.registerMetric({
      name: delayName,
      help: delayHelp,
      type: 'histogram',
      aggregator: 'sum',
      reset: () => undefined,
      get: async () => {
        const snapshot = this.delay;
        return {
          name: delayName,
          help: delayHelp,
          type: 'histogram',
          aggregator: 'sum',
          values: [
            ...DELAY_BUCKETS.map((bound, index) => ({ labels: { le: bound }, value: snapshot.buckets[index]!, metricName: `${delayName}_bucket` })),
            { labels: { le: '+Inf' }, value: snapshot.count, metricName: `${delayName}_bucket` },
            { labels: {}, value: snapshot.sum, metricName: `${delayName}_sum` },
            { labels: {}, value: snapshot.count, metricName: `${delayName}_count` },
          ],
        };
      },
    } as never);
    collectDefaultMetrics({ register: this.registry, prefix: 'keel_process_' });
  }

  observeHttp(method: string, route: string, statusCode: number, seconds: number): void {
    this.http.observe({ method, route, status_code: String(statusCode) }, seconds);
  }

  /** Reads everything the gauges show, then renders the registry. */
  async render(): Promise<string> {
    await Promise.all([this.readDatabase(), this.readQueues()]);
    const inProcess = this.deps.inProcess ?? [];
    return inProcess.length === 0 ? this.registry.metrics() : Registry.merge([this.registry, ...inProcess]).metrics();
  }

  private async readDatabase(): Promise<void> {
    // One connection per scrape, statements in turn: a scrape never takes the pool from requests.
    await this.deps.pool.connect((connection) => this.readWith(connection));
  }

  private async readWith(db: DatabaseConnection): Promise<void> {
    const byState = z.object({ state: z.string(), n: z.number() });
    const runs = await db.any(sql.type(z.object({ status: z.string(), reason: z.string(), n: z.number() }))`
      SELECT status, coalesce(termination_reason, '') AS reason, count(*)::int AS n FROM runs GROUP BY 1, 2`);
    const tasks = await db.any(sql.type(byState)`SELECT state, count(*)::int AS n FROM a2a_tasks GROUP BY 1`);
    const configs = await db.any(sql.type(byState)`SELECT state, count(*)::int AS n FROM push_configs WHERE deleted_at IS NULL GROUP BY 1`);
    const deliveries = await db.any(sql.type(byState)`SELECT state, count(*)::int AS n FROM push_deliveries GROUP BY 1`);
    const attempts = await db.any(sql.type(z.object({ outcome: z.string(), n: z.number() }))`SELECT outcome, count(*)::int AS n FROM push_attempts GROUP BY 1`);
    const lag = await db.one(sql.type(z.object({ revisions: z.number(), tasks: z.number() }))`
        SELECT coalesce(sum(greatest(r.revision - t.projected_revision, 0)), 0)::bigint AS revisions, count(*) FILTER (WHERE r.revision > t.projected_revision)::int AS tasks
        FROM a2a_tasks t JOIN runs r ON r.id = t.run_id
        WHERE t.projected_state <> ALL(${sql.array([...TERMINAL_TASK_STATES], 'text')})`);
    const inbox = await this.readInboxPending(db);
    const waiting = await waitingByClient(db);
    const delay = await db.one(sql.type(z.object({ buckets: z.array(z.number()), n: z.number(), total: z.number() }))`
        SELECT ARRAY[${sql.join(
          DELAY_BUCKETS.map((bound) => sql.fragment`count(*) FILTER (WHERE delay <= ${bound})::int`),
          sql.fragment`, `,
        )}]::int[] AS buckets, count(*)::int AS n, coalesce(sum(delay), 0)::float8 AS total
        FROM (
          SELECT greatest(extract(epoch FROM d.ended_at - e.created_at), 0)::float8 AS delay
          FROM push_deliveries d JOIN a2a_events e ON e.task_id = d.task_id AND e.sequence = d.event_sequence
          WHERE d.state = 'delivered' AND d.ended_at IS NOT NULL
        ) delivered`);

    this.runs.reset();
    for (const status of RUN_STATUSES) {
      if ((TERMINAL_RUN_STATUSES as readonly string[]).includes(status)) {
        for (const reason of REASONS_BY_TERMINAL_STATUS[status as keyof typeof REASONS_BY_TERMINAL_STATUS]) this.runs.set({ status, termination_reason: reason }, 0);
      } else this.runs.set({ status, termination_reason: '' }, 0);
    }
    for (const row of runs) this.runs.set({ status: row.status, termination_reason: row.reason }, row.n);
    this.setByState(this.tasks, TASK_STATES, tasks);
    this.setByState(this.configs, PUSH_CONFIG_STATES, configs);
    this.setByState(this.deliveries, DELIVERY_STATES, deliveries);
    this.attempts.reset();
    for (const outcome of ATTEMPT_OUTCOMES) this.attempts.set({ outcome }, 0);
    for (const row of attempts) this.attempts.inc({ outcome: (ATTEMPT_OUTCOMES as readonly string[]).includes(row.outcome) ? row.outcome : 'other' }, row.n);
    this.lagRevisions.set(lag.revisions);
    this.lagTasks.set(lag.tasks);
    this.inboxPending.set(inbox);
    this.clientsWaiting.set(waiting.clients);
    this.mostWaiting.set(waiting.most);
    this.delay = { buckets: delay.buckets, count: delay.n, sum: delay.total };
  }

  private setByState(gauge: Gauge<'state'>, states: readonly string[], rows: readonly { state: string; n: number }[]): void {
    gauge.reset();
    for (const state of states) gauge.set({ state }, 0);
    for (const row of rows) gauge.set({ state: row.state }, row.n);
  }

  private async readInboxPending(db: DatabaseConnection): Promise<number> {
    const present = await db.oneFirst(sql.type(z.object({ present: z.boolean() }))`SELECT to_regclass('inbox_callbacks') IS NOT NULL AS present`);
    if (!present) return 0;
    return db.oneFirst(sql.type(z.object({ n: z.number() }))`SELECT count(*)::int AS n FROM inbox_callbacks WHERE processed_at IS NULL`);
  }

  private async readQueues(): Promise<void> {
    const { queues, logger } = this.deps;
    const now = Date.now();
    const results = await Promise.all(
      QUEUE_NAMES.map(async (name) => {
        try {
          const queue = queues.queue(name);
          const counts = await queue.getJobCounts(...(COUNTED_JOB_STATES as unknown as never[]));
          // The oldest job due now: BullMQ lists waiting jobs newest first unless asked ascending.
          const oldest = await queue.getJobs([...WAITING_STATES] as never, 0, 0, true);
          const stamps = oldest.filter((job) => job).map((job) => job.timestamp + (job.delay ?? 0));
          return { name, counts, age: stamps.length > 0 ? Math.max(0, (now - Math.min(...stamps)) / 1000) : 0 };
        } catch (error) {
          logger.warn({ err: error, queue: name }, 'queue counts unavailable for /metrics');
          return null;
        }
      }),
    );
    this.queueDepth.reset();
    this.queueJobs.reset();
    this.queueAge.reset();
    for (const result of results) {
      if (!result) continue;
      const count = (state: string) => Number((result.counts as Record<string, number>)[state] ?? 0);
      this.queueDepth.set({ queue: result.name }, count('waiting') + count('paused') + count('prioritized') + count('delayed'));
      for (const state of COUNTED_JOB_STATES) this.queueJobs.set({ queue: result.name, state }, count(state));
      this.queueAge.set({ queue: result.name }, result.age);
    }
  }

  /** Whether a request may read /metrics: open without a token, else `Authorization: Bearer <token>`. */
  authorized(header: string | undefined): boolean {
    const token = this.deps.token;
    if (!token) return true;
    const match = typeof header === 'string' ? /^Bearer\s+(\S+)\s*$/i.exec(header) : null;
    return match !== null && timingSafeEqual(digest(match[1]!), digest(token));
  }
}

/** GET /metrics and the onResponse hook that times every request, on the root instance. */
export function registerMetrics(app: FastifyInstance, deps: MetricsDeps): KeelMetrics {
  const metrics = new KeelMetrics(deps);
  app.addHook('onResponse', async (request, reply) => {
    metrics.observeHttp(request.method, request.routeOptions.url ?? 'unmatched', reply.statusCode, reply.elapsedTime / 1000);
  });
  app.get('/metrics', async (request, reply) => {
    if (!metrics.authorized(request.headers.authorization)) {
      return reply.code(401).header('www-authenticate', 'Bearer realm="keel-metrics"').type('text/plain').send('a metrics token is required\n');
    }
    try {
      const body = await metrics.render();
      return reply.header('cache-control', 'no-store').type(metrics.registry.contentType).send(body);
    } catch (error) {
      deps.logger.error({ err: error }, 'metrics could not be collected');
      return reply.code(503).type('text/plain').send('metrics unavailable\n');
    }
  });
  return metrics;
}
