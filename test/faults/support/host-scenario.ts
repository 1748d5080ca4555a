import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { sql, type DatabasePool } from 'slonik';
import { z } from 'zod';
import { TEST_TOOLS_MODULE } from '../../support/run-helpers.js';
import { countScenario, waitForQuiet, type ScenarioCounts } from './counts.js';
import { progress } from './scenario.js';
import { BACKEND } from './installation.js';
import { settleClients, startLoad, type Load, type LoadOptions } from './load.js';
import type { Cluster, HostSuite } from './host-suite.js';
import { openTempDir } from './services.js';

// What the scenarios across test hosts share: the agents (the fake model's echo, and `charge`,
// whose one step is a non-idempotent tool that appends the run's id to a file every host can
// write, so a step run twice shows as a run id twice), the timings (a lease of 6 s instead of the
// production 60 s, the heartbeat a third of it as in production: see TAKEOVER_MS), a log of every
// run's completions (a trigger of the scenario's own
// database), the load, and the end: every accepted task terminal with its result or reason,
// counted as the rest of the fault suite counts, and how long the cluster took to drain its
// backlog after the fault was healed.

export const HOST_LEASE_SECONDS = 6;

/**
 * A host scenario's bound: six Keel processes started one after another (a minute and more on a
 * loaded two-core machine), the fault, and the drain (up to 180 s for the clients to read every
 * task terminal, 240 s more for the last deliveries: on a loaded machine a few a second).
 */
export const HOST_SCENARIO_TIMEOUT_MS = 600_000;

/**
 * The longest a run held by a worker cut off from Postgres should stay its own (the issue's bound:
 * 90 s with the production lease of 60 s, 18 s with 6 s). The reaper takes it over: the run's lease
 * expires at most one lease after the cut, the server has ended the cut-off worker's sessions (and
 * freed the rows they locked) within database.linkTimeoutSeconds of the cut (half the lease here,
 * a third in production), and the next reap (maintenance.sweepSeconds: 0.5 s here, 15 s in
 * production) requeues it, or dead-letters it inside a non-idempotent step (decisions 0092, 0093).
 * On the Postgres queue backend its queue job goes back to the queue too: its lock (the lease, at
 * most 30 s) expires within one lock and the stalled-job check takes two passes.
 */
export const TAKEOVER_MS = 3 * Math.min(HOST_LEASE_SECONDS, 30) * 1000;

/**
 * How long a link to Postgres may stay silent before the server ends the session
 * (`database.linkTimeoutSeconds`, decision 0092): half the lease here (a third in production, 20 s
 * of 60), so that a cut-off worker's transactions have ended and their row locks are free by the
 * time its runs' leases expire.
 */
export const HOST_LINK_TIMEOUT_SECONDS = HOST_LEASE_SECONDS / 2;

export const HOST_TIMINGS: Record<string, string> = {
  KEEL_RUNS_LEASE_SECONDS: String(HOST_LEASE_SECONDS),
  KEEL_RUNS_HEARTBEAT_SECONDS: String(HOST_LEASE_SECONDS / 3),
  KEEL_DATABASE_LINK_TIMEOUT_SECONDS: String(HOST_LINK_TIMEOUT_SECONDS),
};

export type HostScenario = {
  cluster: Cluster;
  pool: DatabasePool;
  /** The file the `charge` tool appends `charged:<run id>` to. */
  chargeLog: string;
};

/** The agents: `model` (the fake model's echo) and `charge` (a non-idempotent step of `chargeMs`, then a reply). */
function agentsEnv(suite: HostSuite, chargeLog: string, chargeMs: number): Record<string, string> {
  const charge = {
    type: 'scripted',
    steps: [{ toolCalls: [{ name: 'charge_card', arguments: { logFile: chargeLog, delayMs: chargeMs } }] }, { reply: 'charged once' }],
  };
  return {
    KEEL_TOOL_MODULES: JSON.stringify([TEST_TOOLS_MODULE]),
    KEEL_PROVIDERS: JSON.stringify({ fake: { type: 'openai', baseUrl: suite.model.baseUrl, model: 'fake', timeoutSeconds: 10 }, charge }),
    KEEL_AGENTS: JSON.stringify([
      { id: 'model', name: 'Model', provider: 'fake', privacy: { answerLevel: 'full' } },
      { id: 'charge', name: 'Charge', provider: 'charge', tools: ['charge_card'], privacy: { answerLevel: 'full' } },
    ]),
  };
}

export const hostExpected: LoadOptions['expected'] = (agent, text) => (agent === 'charge' ? 'charged once' : `echo: ${text}`);

export async function startHostScenario(suite: HostSuite, options: { env?: Record<string, string>; chargeMs?: number } = {}): Promise<HostScenario> {
  const chargeLog = join(openTempDir('keel-faults-charge-'), 'charges.log');
  const cluster = await suite.install({ ...HOST_TIMINGS, ...agentsEnv(suite, chargeLog, options.chargeMs ?? 1500), ...options.env });
  const pool = await cluster.installation.pool();
  await pool.query(sql.unsafe`CREATE TABLE faults_completion_log (run_id uuid NOT NULL, at timestamptz NOT NULL DEFAULT clock_timestamp())`);
  await pool.query(sql.unsafe`
    CREATE FUNCTION faults_log_completion() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
      INSERT INTO faults_completion_log (run_id) VALUES (NEW.id);
      RETURN NEW;
    END $$`);
  await pool.query(sql.unsafe`
    CREATE TRIGGER faults_completion_log AFTER UPDATE OF status ON runs FOR EACH ROW
    WHEN (NEW.status = 'completed') EXECUTE FUNCTION faults_log_completion()`);
  return { cluster, pool, chargeLog };
}

/**
 * The clients: `count` tasks at `rate`/s over both API hosts (or those `apis` names at the time),
 * every sixth to `charge` (index 5 mod 6), every sixth with a push config (index 0 mod 6).
 */
export function startHostLoad(suite: HostSuite, scenario: HostScenario, options: { count?: number; rate?: number; apis?: () => string[] } = {}): Load {
  const { installation } = scenario.cluster;
  const { count = 240, rate = 20 } = options;
  return startLoad({
    apis: options.apis ?? (() => installation.apiUrls()),
    token: installation.token,
    count,
    ratePerSecond: rate,
    maxInFlight: 60,
    agentOf: (index) => (index % 6 === 5 ? 'charge' : 'model'),
    pushUrl: suite.receiver.url,
    pushFor: (index) => index % 6 === 0,
    expected: hostExpected,
  });
}

const n = z.object({ n: z.number() });

/** Runs settled `completed` more than once (the trigger's log), and non-idempotent steps run more than once (the charge log). */
async function twice(pool: DatabasePool, chargeLog: string): Promise<{ runsCompletedTwice: number; chargedTwice: number; charges: number }> {
  const runsCompletedTwice = await pool.oneFirst(sql.type(n)`
    SELECT count(*)::int AS n FROM (SELECT run_id FROM faults_completion_log GROUP BY run_id HAVING count(*) > 1) twice`);
  let lines: string[] = [];
  try {
    lines = readFileSync(chargeLog, 'utf8').split('\n').filter(Boolean);
  } catch {
    // no charge ran
  }
  const perRun = new Map<string, number>();
  for (const line of lines) perRun.set(line, (perRun.get(line) ?? 0) + 1);
  return { runsCompletedTwice, chargedTwice: [...perRun.values()].filter((times) => times > 1).length, charges: lines.length };
}

const jobRow = z.object({ queue: z.string(), state: z.string(), n: z.number() });

const sessionRow = z.object({
  pid: z.number(),
  app: z.string(),
  client: z.string().nullable(),
  state: z.string().nullable(),
  wait: z.string().nullable(),
  xact_s: z.number().nullable(),
  blocked_by: z.string(),
  query: z.string(),
});

/**
 * KEEL_FAULTS_VERBOSE=1: every 2 s, the database's sessions that are not idle (in a transaction,
 * running, or waiting on a lock, and which sessions block them), to see what a silent link leaves
 * holding locks on the server. Returns the stop.
 */
export function watchSessions(pool: DatabasePool, startedAt: number): () => void {
  if (!process.env.KEEL_FAULTS_VERBOSE) return () => undefined;
  const timer = setInterval(() => {
    void pool
      .any(sql.type(sessionRow)`
        SELECT pid, application_name AS app, host(client_addr) AS client, state, wait_event_type || ':' || wait_event AS wait,
               extract(epoch FROM now() - xact_start)::float8 AS xact_s, pg_blocking_pids(pid)::text AS blocked_by, left(regexp_replace(query, '[[:space:]]+', ' ', 'g'), 80) AS query
        FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid() AND state IS DISTINCT FROM 'idle'`)
      .then(async (rows) => {
        // On the Postgres queue backend, the queues' jobs by state too.
        const jobs =
          BACKEND === 'postgres'
            ? await pool.any(sql.type(jobRow)`SELECT queue, state, count(*)::int AS n FROM bullmq.job GROUP BY 1, 2 ORDER BY 1, 2`).catch(() => [])
            : [];
        const at = `[faults +${Math.round((Date.now() - startedAt) / 1000)}s ${new Date().toISOString().slice(11, 23)}] sessions`;
        console.info(`${at}: ${rows.length} not idle; jobs ${jobs.map((row) => `${row.queue}/${row.state}:${row.n}`).join(' ')}\n${rows.map((row) => `  ${row.pid} ${row.app} ${row.client} ${row.state} ${row.wait ?? '-'} xact ${row.xact_s?.toFixed(1) ?? '-'} s blocked by ${row.blocked_by} | ${row.query}`).join('\n')}`);
      })
      .catch(() => undefined);
  }, 2000);
  return () => clearInterval(timer);
}

export type HostCounts = ScenarioCounts & { runsCompletedTwice: number; chargedTwice: number; drainAfterHealMs: number };

/**
 * The end of a scenario: the clients' load done and every accepted task read back until terminal,
 * the database quiet (nothing owed: every task terminal and projected, no pending delivery), then
 * the counts. `healedAt`: when the fault was healed; the drain is from then until quiet.
 */
export async function finishHostScenario(input: {
  scenario: string;
  suite: HostSuite;
  state: HostScenario;
  load: Load;
  startedAt: number;
  healedAt: number;
  faults: Record<string, unknown>;
}): Promise<HostCounts> {
  const { installation } = input.state.cluster;
  const verbose = process.env.KEEL_FAULTS_VERBOSE ? setInterval(() => void progress(input.state.pool, input.startedAt).catch(() => undefined), 2000) : null;
  await input.load.done;
  await settleClients(input.load, () => installation.apiUrls(), installation.token, hostExpected, 180_000);
  const quiet = await waitForQuiet(input.state.pool, 240_000);
  const drainAfterHealMs = Date.now() - input.healedAt;
  // A backlog that outlasted the clients' reading: what they read once the database is quiet.
  await settleClients(input.load, () => installation.apiUrls(), installation.token, hostExpected, 30_000);
  if (verbose) clearInterval(verbose);
  if (!quiet) console.info(`[faults] ${input.scenario} (${BACKEND}) not quiet ${Math.round(drainAfterHealMs / 1000)} s after the heal:\n${installation.logs(60)}`);
  const again = await twice(input.state.pool, input.state.chargeLog);
  const counts = await countScenario({
    scenario: input.scenario,
    backend: BACKEND,
    load: input.load,
    pool: input.state.pool,
    sealer: installation.sealer,
    expected: hostExpected,
    receiver: input.suite.receiver,
    startedAt: input.startedAt,
    faults: { ...input.faults, ...again, quietAtEnd: quiet, drainAfterHealMs },
  });
  console.info(`[faults] ${input.scenario} (${BACKEND}): the cluster drained its backlog ${(drainAfterHealMs / 1000).toFixed(1)} s after the heal`);
  return { ...counts, ...again, drainAfterHealMs };
}

/** The suite's problems, and a run completed twice or a non-idempotent step run twice. */
export function hostProblems(counts: HostCounts): string[] {
  const problems: string[] = [];
  if (counts.runsCompletedTwice !== 0) problems.push(`runs completed twice: ${counts.runsCompletedTwice}`);
  if (counts.chargedTwice !== 0) problems.push(`non-idempotent steps run twice: ${counts.chargedTwice}`);
  return problems;
}

