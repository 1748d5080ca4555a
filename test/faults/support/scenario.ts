import { writeFileSync } from 'node:fs';
import { sql, type DatabasePool } from 'slonik';
import { expect } from 'vitest';
import { z } from 'zod';
import { countScenario, problemsOf, waitForQuiet, type ScenarioCounts } from './counts.js';
import { BACKEND, type Installation, type KeelNode } from './installation.js';
import { settleClients, type Load, type LoadOptions } from './load.js';
import type { PushReceiver } from './peers.js';
import { sleep } from './services.js';

// What every fault scenario does at its end, and the probes scenarios use to time their faults.

export const expectedEcho: LoadOptions['expected'] = (_agent, text) => `echo: ${text}`;

/** Generous: scenarios take 20-60 s; a slow, shared machine must not turn a pass into a timeout. */
export const SCENARIO_TIMEOUT_MS = 240_000;

export async function finishScenario(input: {
  scenario: string;
  installation: Installation;
  load: Load;
  startedAt: number;
  receiver?: PushReceiver | null;
  /** What the scenario did, for the results; a function is read once the installation is quiet. */
  faults?: Record<string, unknown> | (() => Record<string, unknown> | Promise<Record<string, unknown>>);
  expected?: LoadOptions['expected'];
  dependencies?: (pool: DatabasePool) => Promise<{ count: number; resolvedTwice: number }>;
}): Promise<ScenarioCounts> {
  const { installation, load } = input;
  const expected = input.expected ?? expectedEcho;
  const pool0 = await installation.pool();
  const verbose = process.env.KEEL_FAULTS_VERBOSE ? setInterval(() => void progress(pool0, input.startedAt).catch(() => undefined), 2000) : null;
  await load.done;
  const loadDoneMs = Date.now() - input.startedAt;
  await settleClients(load, () => installation.apiUrls(), installation.token, expected);
  const clientsSettledMs = Date.now() - input.startedAt;
  const pool = await installation.pool();
  const quiet = await waitForQuiet(pool);
  const quietMs = Date.now() - input.startedAt;
  if (verbose) clearInterval(verbose);
  if (process.env.KEEL_FAULTS_LOGS) writeFileSync(process.env.KEEL_FAULTS_LOGS, installation.logs(100_000));
  return countScenario({
    scenario: input.scenario,
    backend: BACKEND,
    load,
    pool,
    sealer: installation.sealer,
    expected,
    receiver: input.receiver ?? null,
    startedAt: input.startedAt,
    faults: { ...(typeof input.faults === 'function' ? await input.faults() : input.faults), quietAtEnd: quiet, loadDoneMs, clientsSettledMs, quietMs },
    ...(input.dependencies ? { dependencies: await input.dependencies(pool) } : {}),
  });
}

export function expectClean(counts: ScenarioCounts, installation: Installation): void {
  const problems = problemsOf(counts);
  expect(problems, problems.length ? `${JSON.stringify(counts, null, 2)}\n${installation.logs(40)}` : '').toEqual([]);
}

const count = z.object({ n: z.number() });

/** RUNNING runs whose lease names this node's process. */
export async function runsClaimedBy(pool: DatabasePool, node: KeelNode): Promise<number> {
  return pool.oneFirst(sql.type(count)`SELECT count(*)::int AS n FROM runs WHERE status = 'running' AND claimed_by LIKE ${`${node.workerPrefix}%`}`);
}

/** Committed run revisions not yet in the journal. */
export async function projectionDebt(pool: DatabasePool): Promise<number> {
  return pool.oneFirst(sql.type(count)`SELECT count(*)::int AS n FROM a2a_tasks t JOIN runs r ON r.id = t.run_id WHERE r.revision > t.projected_revision`);
}

/** Deliveries whose attempt has begun and not ended (leased). */
export async function deliveriesInFlight(pool: DatabasePool): Promise<number> {
  return pool.oneFirst(sql.type(count)`SELECT count(*)::int AS n FROM push_deliveries WHERE state = 'pending' AND next_attempt_at > now()`);
}

export async function pendingRuns(pool: DatabasePool): Promise<number> {
  return pool.oneFirst(sql.type(count)`SELECT count(*)::int AS n FROM runs WHERE status IN ('queued', 'running')`);
}

/** Polls `probe` until it is truthy; gives up (returning false) after `timeoutMs`. */
export async function until(probe: () => Promise<boolean> | boolean, timeoutMs: number, everyMs = 20): Promise<boolean> {
  const deadline = Date.now() + timeoutMs;
  while (Date.now() < deadline) {
    try {
      if (await probe()) return true;
    } catch {
      // a probe may fail while a service is down
    }
    await sleep(everyMs);
  }
  return false;
}

const progressRow = z.object({ status: z.string(), requeues: z.number(), n: z.number() });

/** KEEL_FAULTS_VERBOSE=1: where the installation stands, every 2 s. */
export async function progress(pool: DatabasePool, startedAt: number): Promise<void> {
  const runs = await pool.any(sql.type(progressRow)`SELECT status, requeue_count AS requeues, count(*)::int AS n FROM runs GROUP BY 1, 2 ORDER BY 1, 2`);
  const deliveries = await pool.oneFirst(sql.type(count)`SELECT count(*)::int AS n FROM push_deliveries WHERE state = 'pending'`);
  const debt = await projectionDebt(pool);
  if (BACKEND === 'postgres') console.info(`[faults +${Math.round((Date.now() - startedAt) / 1000)}s] jobs ${await queueJobs(pool)}`);
  console.info(`[faults +${Math.round((Date.now() - startedAt) / 1000)}s] runs ${runs.map((row) => `${row.status}/${row.requeues}:${row.n}`).join(' ')} | pending deliveries ${deliveries} | projection debt ${debt}`);
}

const jobsRow = z.object({ queue: z.string(), state: z.string(), n: z.number(), long_active: z.array(z.string()).nullable() });

/**
 * The Postgres queue backend's jobs by queue and state, and the active ones taken over 10 s ago with
 * their age: a job no processor runs stays active until the stalled-job check (decision 0100).
 */
async function queueJobs(pool: DatabasePool): Promise<string> {
  const rows = await pool
    .any(
      sql.type(jobsRow)`
        SELECT queue, state::text AS state, count(*)::int AS n,
          array_agg(id || ' ' || ((extract(epoch FROM now()) * 1000)::bigint - processed_at_ms) / 1000 || ' s')
            FILTER (WHERE state = 'active' AND processed_at_ms < (extract(epoch FROM now()) * 1000)::bigint - 10000) AS long_active
        FROM bullmq.job WHERE state IN ('active', 'waiting', 'delayed') GROUP BY 1, 2 ORDER BY 1, 2`,
    )
    .catch(() => []);
  return rows.map((row) => `${row.queue}/${row.state}:${row.n}${row.long_active ? ` (active over 10 s: ${row.long_active.join(', ')})` : ''}`).join(' ');
}
