import { cpus } from 'node:os';
import pg from 'pg';
import { Pool } from 'undici';
import { fmt, percentile } from './support.js';
import {
  A2A_HEADERS,
  countError,
  dropRedisKeys,
  interrupted,
  judgeSend,
  machineLine,
  newInstallation,
  openKeelBench,
  postgresVersion,
  rpcBody,
  runBench,
  scrapeMetrics,
  sendMessageParams,
  sleep,
  startKeelProcess,
  stopKeelProcess,
  throwIfInterrupted,
  withTrackedDatabase,
  writeBenchJson,
  type KeelChild,
} from './keel-harness.js';

// bench:lag — projector lag under load: the time from the commit of a run's completion (the
// transaction that settles the run and its task) to the commit of the task's terminal journal row
// (a2a_events), with the load's throughput in the same run. Prints figures; asserts nothing.
//
// Keel's own timestamps cannot answer this honestly: runs.settled_at, runs.status_changed_at,
// a2a_tasks.status_timestamp and a2a_events.created_at are all now(), the *start* of their
// transaction, and track_commit_timestamp is off by default. So the bench instruments its own fresh
// database after Keel migrated it (nothing in sql/ or src/ changes): on each table a pair of
// triggers writes a mark into an unlogged bench table,
//   - an ordinary AFTER ROW trigger: clock_timestamp() when the row is written (statement time),
//   - a DEFERRABLE INITIALLY DEFERRED constraint trigger: clock_timestamp() when the transaction
//     commits — deferred triggers fire during COMMIT, after the last statement and just before the
//     commit record is written,
// on runs when the status becomes terminal (the completion transaction), and on a2a_events when the
// inserted row announces a terminal state (the projection transaction). The reported lag is
// pre-commit mark to pre-commit mark. What it leaves out: the commit processing itself of each
// transaction (writing the commit record; the completion also waits for its WAL flush,
// synchronous_commit on, before others see it; the projection commits asynchronously). When the
// server has track_commit_timestamp = on, the commit times Postgres records for both transactions
// (pg_xact_commit_timestamp of the recorded xids, taken as the commit record is written) are
// reported as well: in validation on such a server the two figures agreed within ~1.5 ms (mean).
// The instrumentation costs four small inserts per task (two per transaction).
//
// /metrics has no lag in time: keel_projector_lag_tasks and keel_projector_lag_revisions are
// backlogs (open tasks whose run has unprojected revisions, and those revisions), sampled here
// during the window; with the throughput they give a mean backlog time by Little's law.
//
// Environment:
//   BENCH_SECONDS             measured seconds (20)
//   BENCH_WARMUP_SECONDS      load before the window, not measured (2)
//   BENCH_CONCURRENCY         concurrent clients (32)
//   BENCH_LAG_MODE            blocking | nonblocking (blocking): SendMessage waits for the task's end,
//                             or returns at once (configuration.returnImmediately)
//   BENCH_LAG_RATE            nonblocking only: tasks/s offered over all clients (0 = as fast as
//                             the clients go, which floods the queue and makes the drain long)
//   BENCH_KEEL_PROCESSES      Keel processes (role all) sharing database and queue (1); clients are
//                             spread over them
//   BENCH_METRICS_INTERVAL_MS /metrics scrape interval during the window (1000; 0 = no scraping)
//   BENCH_DRAIN_SECONDS       after the window, how long to wait for the last runs to be projected (120)
// and the knobs every Keel bench reads (bench/keel-harness.ts): BENCH_KEEL_QUEUE (redis | postgres),
// BENCH_REDIS_URL, BENCH_KEEL_LOG_LEVEL, BENCH_JSON, KEEL_BENCH_ADMIN_URL.

const BENCH = 'bench:lag';
const { knobs, queue } = openKeelBench(BENCH);
const seconds = knobs.positive('BENCH_SECONDS', 20);
const warmupSeconds = knobs.nonNegative('BENCH_WARMUP_SECONDS', 2);
const concurrency = knobs.positiveInt('BENCH_CONCURRENCY', 32);
const mode = knobs.choice('BENCH_LAG_MODE', 'blocking', ['blocking', 'nonblocking'] as const);
const rate = knobs.nonNegative('BENCH_LAG_RATE', 0);
const processes = knobs.positiveInt('BENCH_KEEL_PROCESSES', 1);
const metricsIntervalMs = knobs.nonNegative('BENCH_METRICS_INTERVAL_MS', 1000);
const drainSeconds = knobs.nonNegative('BENCH_DRAIN_SECONDS', 120);

const TERMINAL_RUN = `('completed', 'failed', 'cancelled')`;
const TERMINAL_TASK = `('TASK_STATE_COMPLETED', 'TASK_STATE_FAILED', 'TASK_STATE_CANCELED', 'TASK_STATE_REJECTED')`;

/** The bench's instrumentation, on its own database, after Keel's migrations. */
const INSTRUMENTATION = `
CREATE UNLOGGED TABLE bench_lag_marks (
  kind text NOT NULL,          -- settle (runs) | journal (a2a_events)
  phase text NOT NULL,         -- write (statement time) | commit (deferred: during COMMIT)
  run_id uuid NOT NULL,
  at timestamptz NOT NULL,     -- clock_timestamp()
  xact_start timestamptz NOT NULL,
  xid xid8 NOT NULL
);
CREATE FUNCTION bench_settle_mark() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  INSERT INTO bench_lag_marks VALUES ('settle', TG_ARGV[0], NEW.id, clock_timestamp(), now(), pg_current_xact_id());
  RETURN NULL;
END $$;
CREATE FUNCTION bench_journal_mark() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  INSERT INTO bench_lag_marks VALUES ('journal', TG_ARGV[0], NEW.run_id, clock_timestamp(), now(), pg_current_xact_id());
  RETURN NULL;
END $$;
CREATE TRIGGER bench_settle_write AFTER UPDATE OF status ON runs FOR EACH ROW
  WHEN (NEW.status IN ${TERMINAL_RUN} AND OLD.status IS DISTINCT FROM NEW.status)
  EXECUTE FUNCTION bench_settle_mark('write');
CREATE CONSTRAINT TRIGGER bench_settle_commit AFTER UPDATE OF status ON runs DEFERRABLE INITIALLY DEFERRED FOR EACH ROW
  WHEN (NEW.status IN ${TERMINAL_RUN} AND OLD.status IS DISTINCT FROM NEW.status)
  EXECUTE FUNCTION bench_settle_mark('commit');
CREATE TRIGGER bench_journal_write AFTER INSERT ON a2a_events FOR EACH ROW
  WHEN (NEW.state IN ${TERMINAL_TASK})
  EXECUTE FUNCTION bench_journal_mark('write');
CREATE CONSTRAINT TRIGGER bench_journal_commit AFTER INSERT ON a2a_events DEFERRABLE INITIALLY DEFERRED FOR EACH ROW
  WHEN (NEW.state IN ${TERMINAL_TASK})
  EXECUTE FUNCTION bench_journal_mark('commit');
`;

// ---------------------------------------------------------------------------------------------
// The load.

type Load = {
  sent: number;
  successes: number;
  latencies: number[];
  errors: number;
  errorKinds: Record<string, number>;
  windowStart: number;
  windowEnd: number;
};

let requestSequence = 0;

async function runLoad(keels: KeelChild[]): Promise<Load> {
  const pools = keels.map(
    (keel) =>
      new Pool(keel.origin, {
        connections: Math.ceil(concurrency / keels.length),
        pipelining: 1,
        keepAliveTimeout: 30_000,
        headersTimeout: 120_000,
        bodyTimeout: 120_000,
      }),
  );
  const begin = Date.now();
  const windowStart = begin + warmupSeconds * 1000;
  const windowEnd = windowStart + seconds * 1000;
  const load: Load = { sent: 0, successes: 0, latencies: [], errors: 0, errorKinds: {}, windowStart, windowEnd };
  const expect = mode === 'blocking' ? ['TASK_STATE_COMPLETED'] : ['TASK_STATE_SUBMITTED', 'TASK_STATE_WORKING', 'TASK_STATE_COMPLETED'];
  let ticket = 0;
  const client = async (index: number) => {
    const pool = pools[index % pools.length]!;
    while (!interrupted.signal.aborted && Date.now() < windowEnd) {
      if (mode === 'nonblocking' && rate > 0) {
        // Open loop, paced over all clients: request k is due at begin + k / rate.
        const due = begin + (ticket++ * 1000) / rate;
        if (due >= windowEnd) break;
        if (due > Date.now()) await sleep(due - Date.now());
      }
      const id = ++requestSequence;
      const text = `lag ${id}`;
      const body = rpcBody(id, 'SendMessage', sendMessageParams(text, mode === 'nonblocking' ? { returnImmediately: true } : undefined));
      const started = performance.now();
      let error: string | null = null;
      try {
        const response = await pool.request({ path: '/a2a/echo', method: 'POST', headers: A2A_HEADERS, body, signal: interrupted.signal });
        const judged = judgeSend(response.statusCode, await response.body.text(), text, expect);
        if ('error' in judged) error = judged.error;
      } catch (failure) {
        if (interrupted.signal.aborted) break;
        error = `request failed: ${(failure as { code?: string }).code ?? (failure as Error).message}`;
      }
      load.sent += 1;
      const finished = Date.now();
      // A request counts in the window it completes in.
      if (finished < windowStart || finished > windowEnd) continue;
      if (error === null) {
        load.successes += 1;
        load.latencies.push(performance.now() - started);
      } else {
        load.errors += 1;
        countError(load.errorKinds, error);
      }
    }
  };
  try {
    await Promise.all(Array.from({ length: concurrency }, (_, index) => client(index)));
  } finally {
    await Promise.all(pools.map((pool) => pool.close().catch(() => undefined)));
  }
  throwIfInterrupted();
  load.latencies.sort((a, b) => a - b);
  return load;
}

type MetricsSamples = { tasks: number[]; revisions: number[]; failed: number };

/** Scrapes /metrics of the first process (the gauges are the installation's, read from Postgres) until `until`. */
async function sampleMetrics(origin: string, from: number, until: number): Promise<MetricsSamples> {
  const samples: MetricsSamples = { tasks: [], revisions: [], failed: 0 };
  if (metricsIntervalMs === 0) return samples;
  if (from > Date.now()) await sleep(from - Date.now());
  while (!interrupted.signal.aborted && Date.now() < until) {
    const next = Date.now() + metricsIntervalMs;
    const series = await scrapeMetrics(origin);
    const tasks = series?.get('keel_projector_lag_tasks');
    const revisions = series?.get('keel_projector_lag_revisions');
    if (tasks === undefined || revisions === undefined) samples.failed += 1;
    else {
      samples.tasks.push(tasks);
      samples.revisions.push(revisions);
    }
    if (next > Date.now()) await sleep(Math.min(next, until) - Date.now()).catch(() => undefined);
  }
  return samples;
}

// ---------------------------------------------------------------------------------------------
// Reading the marks.

type Lags = {
  settledInWindow: number;
  measured: number;
  missing: number;
  commitToCommit: number[];
  writeToWrite: number[];
  keelColumns: number[];
  exactCommits: number[] | null;
  completionTail: number[];
  projectionTail: number[];
  beforeProjection: number[];
  projectionSpan: number[];
};

async function waitForDrain(client: pg.Client): Promise<{ drained: boolean; waitedMs: number; open: number; unprojected: number }> {
  const started = Date.now();
  const deadline = started + drainSeconds * 1000;
  for (;;) {
    const { rows } = await client.query<{ open: number; unprojected: number }>(`
      SELECT (SELECT count(*)::int FROM runs WHERE status NOT IN ${TERMINAL_RUN}) AS open,
             (SELECT count(*)::int FROM bench_lag_marks s WHERE s.kind = 'settle' AND s.phase = 'commit'
                AND NOT EXISTS (SELECT 1 FROM bench_lag_marks j WHERE j.kind = 'journal' AND j.phase = 'commit' AND j.run_id = s.run_id)) AS unprojected`);
    const { open, unprojected } = rows[0]!;
    if ((open === 0 && unprojected === 0) || Date.now() >= deadline) return { drained: open === 0 && unprojected === 0, waitedMs: Date.now() - started, open, unprojected };
    await sleep(250);
  }
}

async function readLags(client: pg.Client, windowStart: number, windowEnd: number, commitTimestamps: boolean): Promise<Lags> {
  const exact = commitTimestamps
    ? `extract(epoch FROM pg_xact_commit_timestamp((j.xid::text::numeric % 4294967296)::text::xid)
        - pg_xact_commit_timestamp((s.xid::text::numeric % 4294967296)::text::xid)) * 1000`
    : 'NULL::float8';
  const { rows } = await client.query<{
    commit_lag: number | null;
    write_lag: number | null;
    column_lag: number | null;
    exact_lag: number | null;
    completion_tail: number;
    projection_tail: number | null;
    before_projection: number | null;
    projection_span: number | null;
  }>(
    `WITH s AS (
       SELECT run_id, max(at) FILTER (WHERE phase = 'commit') AS committed, max(at) FILTER (WHERE phase = 'write') AS written, max(xid) AS xid
       FROM bench_lag_marks WHERE kind = 'settle' GROUP BY run_id),
     j AS (
       SELECT run_id, max(at) FILTER (WHERE phase = 'commit') AS committed, max(at) FILTER (WHERE phase = 'write') AS written, max(xid) AS xid,
         max(xact_start) AS started
       FROM bench_lag_marks WHERE kind = 'journal' GROUP BY run_id)
     SELECT extract(epoch FROM j.committed - s.committed)::float8 * 1000 AS commit_lag,
            extract(epoch FROM j.written - s.written)::float8 * 1000 AS write_lag,
            extract(epoch FROM e.created_at - r.settled_at)::float8 * 1000 AS column_lag,
            ${exact}::float8 AS exact_lag,
            extract(epoch FROM s.committed - s.written)::float8 * 1000 AS completion_tail,
            extract(epoch FROM j.committed - j.written)::float8 * 1000 AS projection_tail,
            extract(epoch FROM j.started - s.committed)::float8 * 1000 AS before_projection,
            extract(epoch FROM j.committed - j.started)::float8 * 1000 AS projection_span
     FROM s
     JOIN runs r ON r.id = s.run_id
     LEFT JOIN j ON j.run_id = s.run_id
     LEFT JOIN LATERAL (
       SELECT created_at FROM a2a_events e WHERE e.run_id = s.run_id AND e.state IN ${TERMINAL_TASK} ORDER BY sequence LIMIT 1
     ) e ON true
     WHERE s.committed BETWEEN to_timestamp($1::float8 / 1000) AND to_timestamp($2::float8 / 1000)`,
    [windowStart, windowEnd],
  );
  const sorted = (values: (number | null)[]) => values.filter((value): value is number => value !== null && Number.isFinite(value)).sort((a, b) => a - b);
  const measured = rows.filter((row) => row.commit_lag !== null);
  return {
    settledInWindow: rows.length,
    measured: measured.length,
    missing: rows.length - measured.length,
    commitToCommit: sorted(measured.map((row) => row.commit_lag)),
    writeToWrite: sorted(measured.map((row) => row.write_lag)),
    keelColumns: sorted(measured.map((row) => row.column_lag)),
    exactCommits: commitTimestamps ? sorted(measured.map((row) => row.exact_lag)) : null,
    completionTail: sorted(rows.map((row) => row.completion_tail)),
    projectionTail: sorted(measured.map((row) => row.projection_tail)),
    beforeProjection: sorted(measured.map((row) => row.before_projection)),
    projectionSpan: sorted(measured.map((row) => row.projection_span)),
  };
}

// ---------------------------------------------------------------------------------------------

type Stats = { count: number; p50: number; p99: number; max: number; mean: number };

function stats(sorted: number[]): Stats {
  return {
    count: sorted.length,
    p50: percentile(sorted, 50),
    p99: percentile(sorted, 99),
    max: sorted.length ? sorted[sorted.length - 1]! : Number.NaN,
    mean: sorted.length ? sorted.reduce((sum, value) => sum + value, 0) / sorted.length : Number.NaN,
  };
}

const ms = (value: number, digits = 1) => (Number.isNaN(value) ? '-' : fmt(value, digits));

async function main(): Promise<number> {
  const postgres = await postgresVersion();
  console.error(
    `${BENCH}: ${mode} SendMessage, concurrency ${concurrency}${mode === 'nonblocking' && rate > 0 ? `, ${rate} tasks/s offered` : ''}, ` +
      `${warmupSeconds} s warm-up + ${seconds} s; ${processes} Keel process${processes > 1 ? 'es' : ''}, queue ${queue}`,
  );
  return withTrackedDatabase(async (databaseUrl) => {
    const installation = newInstallation();
    const keels: KeelChild[] = [];
    const db = new pg.Client({ connectionString: databaseUrl, application_name: 'bench-lag' });
    try {
      // One at a time: the first migrates the fresh database.
      for (let index = 0; index < processes; index += 1) {
        keels.push(await startKeelProcess({ name: `Keel ${index + 1}`, databaseUrl, queue, ...installation }));
      }
      await db.connect();
      await db.query(INSTRUMENTATION);
      const commitTimestamps = (await db.query<{ on: boolean }>(`SELECT current_setting('track_commit_timestamp') = 'on' AS on`)).rows[0]!.on;

      // A probe through the whole path (instrumentation included), then a quiet moment.
      const probe = await fetch(`${keels[0]!.origin}/a2a/echo`, { method: 'POST', headers: A2A_HEADERS, body: rpcBody(0, 'SendMessage', sendMessageParams('probe')) });
      const probeJudged = judgeSend(probe.status, await probe.text(), 'probe', ['TASK_STATE_COMPLETED']);
      if ('error' in probeJudged) throw new Error(`the probe request failed (${probeJudged.error}); Keel's last output:\n${keels[0]!.child.tail()}`);
      const marks = (await db.query<{ n: number }>(`SELECT count(*)::int AS n FROM bench_lag_marks`)).rows[0]!.n;
      if (marks !== 4) throw new Error(`the probe left ${marks} marks, expected 4 (settle and journal, write and commit)`);
      await sleep(1000);

      process.stderr.write(`  load: ${warmupSeconds} s warm-up + ${seconds} s ...`);
      const loadStarted = Date.now();
      const windowStart = loadStarted + warmupSeconds * 1000;
      const [load, samples] = await Promise.all([runLoad(keels), sampleMetrics(keels[0]!.origin, windowStart, windowStart + seconds * 1000)]);
      process.stderr.write(` ${load.successes} ${mode === 'blocking' ? 'completed' : 'accepted'} in the window, ${load.errors} errors\n`);

      process.stderr.write(`  drain: waiting for the last runs to settle and be projected (up to ${drainSeconds} s) ...`);
      const drain = await waitForDrain(db);
      process.stderr.write(` ${drain.drained ? 'done' : `not done (${drain.open} runs open, ${drain.unprojected} settled runs unprojected)`} after ${fmt(drain.waitedMs / 1000)} s\n`);
      const lags = await readLags(db, load.windowStart, load.windowEnd, commitTimestamps);
      const windowSeconds = (load.windowEnd - load.windowStart) / 1000;

      const figures = {
        commitToCommit: stats(lags.commitToCommit),
        writeToWrite: stats(lags.writeToWrite),
        keelColumns: stats(lags.keelColumns),
        exactCommits: lags.exactCommits ? stats(lags.exactCommits) : null,
        completionTail: stats(lags.completionTail),
        projectionTail: stats(lags.projectionTail),
        beforeProjection: stats(lags.beforeProjection),
        projectionSpan: stats(lags.projectionSpan),
      };
      const startedEarly = lags.beforeProjection.filter((value) => value < 0).length;
      const throughput = {
        settledPerSecond: lags.settledInWindow / windowSeconds,
        clientPerSecond: load.successes / windowSeconds,
        clientLatencyP50: percentile(load.latencies, 50),
        clientLatencyP99: percentile(load.latencies, 99),
        errors: load.errors,
        errorKinds: load.errorKinds,
      };
      const metricStats = { tasks: stats([...samples.tasks].sort((a, b) => a - b)), revisions: stats([...samples.revisions].sort((a, b) => a - b)), failedScrapes: samples.failed };
      const littleMs = throughput.settledPerSecond > 0 ? (metricStats.tasks.mean / throughput.settledPerSecond) * 1000 : Number.NaN;

      const lines: string[] = [''];
      lines.push('bench:lag — projector lag: commit of a run’s completion → commit of its terminal journal row (a2a_events)');
      lines.push(machineLine(postgres));
      lines.push(
        `load: ${mode} SendMessage to the echo agent over JSON-RPC, concurrency ${concurrency}${mode === 'nonblocking' ? (rate > 0 ? `, ${rate} tasks/s offered` : ', unpaced') : ''}, ` +
          `${warmupSeconds} s warm-up + ${seconds} s measured; ${processes} Keel process${processes > 1 ? 'es' : ''} (role all), queue ${queue}; ` +
          `load generator, Keel, Postgres${queue === 'redis' ? ' and Redis' : ''} share the machine`,
      );
      lines.push(
        `throughput: ${fmt(throughput.settledPerSecond)} runs settled/s in the window (database)` +
          `; client: ${fmt(throughput.clientPerSecond)} ${mode === 'blocking' ? 'completed' : 'accepted'}/s, latency p50 ${ms(throughput.clientLatencyP50)} ms, p99 ${ms(throughput.clientLatencyP99)} ms, ${load.errors} errors`,
      );
      lines.push('');
      lines.push(`lag, runs settled in the window (ms)                              ${'count'.padStart(7)} ${'p50'.padStart(8)} ${'p99'.padStart(8)} ${'max'.padStart(8)} ${'mean'.padStart(8)}`);
      const row = (label: string, value: Stats | null, note = '') => {
        if (!value) return lines.push(`  ${label.padEnd(64)} ${'not available'.padStart(7)}${note}`);
        return lines.push(
          `  ${label.padEnd(64)} ${String(value.count).padStart(7)} ${ms(value.p50, 2).padStart(8)} ${ms(value.p99, 2).padStart(8)} ${ms(value.max, 2).padStart(8)} ${ms(value.mean, 2).padStart(8)}${note}`,
        );
      };
      row('commit → commit (deferred triggers, during each COMMIT)  [primary]', figures.commitToCommit);
      row('exact commit timestamps (track_commit_timestamp)', figures.exactCommits, figures.exactCommits ? '' : ' (server has track_commit_timestamp = off)');
      row('row write → row write (statement-time triggers)', figures.writeToWrite);
      row("Keel's columns: runs.settled_at → a2a_events.created_at (now())", figures.keelColumns);
      lines.push('');
      lines.push('where the primary figure goes (ms): it is the sum of the two rows below');
      row('completion COMMIT → BEGIN of the projection that wrote the row', figures.beforeProjection, startedEarly ? ` (${startedEarly} negative: that transaction had begun before the completion committed)` : '');
      row('that projection transaction: BEGIN → COMMIT', figures.projectionSpan);
      lines.push('transaction tails (ms): row written → COMMIT reached, same transaction');
      row('completion: runs status update → its COMMIT', figures.completionTail);
      row('projection: terminal a2a_events insert → its COMMIT', figures.projectionTail);
      lines.push('');
      if (metricsIntervalMs > 0) {
        lines.push(`/metrics during the window (${metricStats.tasks.count} scrapes every ${metricsIntervalMs} ms${samples.failed ? `, ${samples.failed} failed` : ''}; backlogs, not times):`);
        lines.push(`  keel_projector_lag_tasks      p50 ${ms(metricStats.tasks.p50, 0)}  max ${ms(metricStats.tasks.max, 0)}  mean ${ms(metricStats.tasks.mean, 2)}`);
        lines.push(`  keel_projector_lag_revisions  p50 ${ms(metricStats.revisions.p50, 0)}  max ${ms(metricStats.revisions.max, 0)}  mean ${ms(metricStats.revisions.mean, 2)}`);
        lines.push(
          `  Little's law: mean lag_tasks ÷ settled/s = ${ms(littleMs)} ms (an upper bound of the mean terminal lag: the gauge also counts tasks whose claim, RUNNING, is not projected yet)`,
        );
      } else lines.push('/metrics: not scraped (BENCH_METRICS_INTERVAL_MS=0)');
      lines.push(
        `runs settled in the window: ${lags.settledInWindow}; with a terminal journal row: ${lags.measured}; without one after the drain: ${lags.missing}` +
          `${drain.drained ? '' : ` (drain incomplete after ${drainSeconds} s: ${drain.open} runs still open)`}`,
      );
      if (load.errors > 0) {
        lines.push('errors:');
        for (const [kind, count] of Object.entries(load.errorKinds).sort((a, b) => b[1] - a[1]).slice(0, 8)) lines.push(`  ${String(count).padStart(7)} × ${kind}`);
      }
      lines.push(
        'method: marks written by triggers the bench adds to its own database (a deferred constraint trigger fires during COMMIT); the primary figure leaves out the commit processing itself ' +
          '(commit record, the completion’s synchronous WAL flush); track_commit_timestamp = on on the server adds the exact figure.',
      );
      console.log(lines.join('\n'));

      const document = {
        bench: 'lag',
        date: new Date().toISOString(),
        machine: { cores: cpus().length, cpu: cpus()[0]?.model.trim(), node: process.version, postgres },
        load: { mode, concurrency, rate: mode === 'nonblocking' ? rate : null, warmupSeconds, seconds, processes, queue },
        throughput,
        lagMs: { ...figures },
        runs: { settledInWindow: lags.settledInWindow, measured: lags.measured, missing: lags.missing, drained: drain.drained },
        metrics: metricsIntervalMs > 0 ? { intervalMs: metricsIntervalMs, lagTasks: metricStats.tasks, lagRevisions: metricStats.revisions, failedScrapes: samples.failed, littleMs } : null,
      };
      const { errorKinds: _kinds, ...compactThroughput } = throughput;
      console.log(
        JSON.stringify({
          bench: 'lag',
          queue,
          mode,
          concurrency,
          processes,
          seconds,
          throughput: compactThroughput,
          lagMs: figures.commitToCommit,
          exactLagMs: figures.exactCommits,
          runs: document.runs,
          metrics: document.metrics && { lagTasksMean: metricStats.tasks.mean, lagTasksMax: metricStats.tasks.max, lagRevisionsMax: metricStats.revisions.max },
        }),
      );
      writeBenchJson(document);
      return 0;
    } finally {
      await db.end().catch(() => undefined);
      for (const keel of keels.reverse()) await stopKeelProcess(keel);
      if (queue === 'redis') await dropRedisKeys(installation.queuePrefix);
    }
  });
}

runBench(BENCH, main);
