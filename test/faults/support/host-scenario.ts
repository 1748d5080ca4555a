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
 * The longest a run held by a worker cut off from Postgres stays its own: its queue job's lock
 * (the lease, at most 30 s) expires at most one lock after the cut (it is renewed every half
 * lock), the stalled-job check (every lock) takes two passes to move the job back to the queue,
 * and the other worker then claims the run once its lease expired. With the production lease of
 * 60 s that is 90 s, the partition; with 6 s it is 18 s.
 */
export const TAKEOVER_MS = 3 * Math.min(HOST_LEASE_SECONDS, 30) * 1000;

export const HOST_TIMINGS: Record<string, string> = {
  KEEL_RUNS_LEASE_SECONDS: String(HOST_LEASE_SECONDS),
  KEEL_RUNS_HEARTBEAT_SECONDS: String(HOST_LEASE_SECONDS / 3),
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

