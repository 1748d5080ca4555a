import { existsSync, readFileSync } from 'node:fs';
import { hostname } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { pino } from 'pino';
import { sql } from 'slonik';
import { afterAll, describe, expect, it } from 'vitest';
import { z } from 'zod';
import { buildAgentRegistry } from '../../../src/agents/agent-registry.js';
import type { KeelLogger } from '../../../src/log/logger.js';
import { silentLogger } from '../../../src/log/logger.js';
import { createGuardedFetch } from '../../../src/net/guarded-fetch.js';
import { runJobId } from '../../../src/queue/job-ids.js';
import { KeelQueues, type QueueBackend } from '../../../src/queue/keel-queues.js';
import { createAgentRun, enqueueRun } from '../../../src/runs/create-agent-run.js';
import { listRunEvents, type RunEventRow } from '../../../src/runs/run-event-repository.js';
import { listRunOutputs } from '../../../src/runs/run-output-repository.js';
import { createRun, getRun } from '../../../src/runs/run-repository.js';
import { userRequest } from '../../../src/runs/run-request.js';
import type { RunRow } from '../../../src/runs/run-row.js';
import { encodeMasterKey, generateMasterKey, MasterKeyRing } from '../../../src/sealing/master-key.js';
import { createSealer, type Sealer } from '../../../src/sealing/sealer.js';
import { reapExpiredLeases, type ReaperPolicy } from '../../../workers/maintenance.js';
import { cleanEnv, spawnKeel, type KeelProcess } from '../../support/keel-process.js';
import { createTestDatabase, type TestDatabase } from '../../support/test-database.js';
import { startTestKeel, TEST_POOL_ENV, tempDir, testConfig, type TestKeel } from '../../support/test-keel.js';
import { deleteQueueKeys, TEST_REDIS_URL, testQueueKind, testQueuePrefix } from '../../support/test-queues.js';
import { waitFor, waitForRunStatus } from '../../support/wait-for.js';

// Crash recovery of the run executor (issue 3, items 3 and 8; docs/architecture.md, "The process
// model"): a real `keel start` child process is SIGKILLed while it holds a run, and another Keel on
// the same database and queue backend must recover it through the lease, the reaper and the
// requeue, or dead-letter it when it died inside a non-idempotent tool call.

const QUEUE = testQueueKind();
const TOOL_MODULE = fileURLToPath(new URL('../../fixtures/test-tools.ts', import.meta.url));
const LEASE_SECONDS = 2;
const REQUEUE_BASE_SECONDS = 0.5;
const SLOW_STEP_MS = 2000;

const workDir = tempDir('keel-crash-');
const chargeLog = join(workDir, 'charges.log');

const providers = {
  slow: { type: 'scripted', steps: [{ toolCalls: [{ name: 'lookup', arguments: { key: 'k' } }], delayMs: SLOW_STEP_MS }, { reply: 'done' }] },
  charger: { type: 'scripted', steps: [{ toolCalls: [{ name: 'charge_card', arguments: { logFile: chargeLog, delayMs: 10_000 } }] }, { reply: 'charged' }] },
};
const agents = [
  { id: 'slow', name: 'Slow', provider: 'slow', tools: ['lookup'] },
  { id: 'charger', name: 'Charger', provider: 'charger', tools: ['charge_card'] },
];

// Each scenario has its own database and queue prefix (KEEL_QUEUE_PREFIX), shared by the child and
// the Keel that replaces it, as two processes of one installation would. On Postgres the queues
// live in the scenario's database; on Redis the prefix's keys are deleted at the end.
const redisUrl = QUEUE === 'redis' ? TEST_REDIS_URL : null;
const prefixes: string[] = [];

const children: KeelProcess[] = [];
const keels: TestKeel[] = [];
const databases: TestDatabase[] = [];
const queueSets: KeelQueues[] = [];
const closers: Array<() => Promise<void>> = [];

afterAll(async () => {
  for (const child of children) {
    if (child.child.exitCode === null && child.child.signalCode === null) {
      child.child.kill('SIGKILL');
      await child.exited;
    }
  }
  for (const keel of keels) await keel.dispose().catch(() => undefined);
  for (const queues of queueSets) await queues.close().catch(() => undefined);
  for (const close of closers) await close().catch(() => undefined);
  for (const database of databases) await database.drop().catch(() => undefined);
  if (redisUrl && prefixes.length > 0) {
    await deleteQueueKeys(prefixes, redisUrl);
  }
});

/** The KEEL_* environment of every Keel in a scenario: child process and in-process alike. */
function keelEnv(databaseUrl: string, masterKey: string, queuePrefix: string): Record<string, string> {
  return {
    KEEL_DATABASE_URL: databaseUrl,
    KEEL_MASTER_KEY: masterKey,
    KEEL_SERVER_PORT: '0',
    KEEL_DATA_DIR: tempDir('keel-crash-data-'),
    KEEL_QUEUE_PREFIX: queuePrefix,
    ...(redisUrl ? { KEEL_QUEUE_REDIS_URL: redisUrl } : {}),
    KEEL_RUNS_LEASE_SECONDS: String(LEASE_SECONDS),
    KEEL_RUNS_HEARTBEAT_SECONDS: '0.5',
    KEEL_RUNS_REQUEUE_BASE_SECONDS: String(REQUEUE_BASE_SECONDS),
    KEEL_MAINTENANCE_SWEEP_SECONDS: '0.5',
    KEEL_TOOL_MODULES: TOOL_MODULE,
    KEEL_PROVIDERS: JSON.stringify(providers),
    KEEL_AGENTS: JSON.stringify(agents),
  };
}

function queueBackend(databaseUrl: string, prefix: string): QueueBackend {
  return redisUrl ? { kind: 'redis', url: redisUrl, prefix } : { kind: 'postgres', connectionString: databaseUrl, prefix };
}

type Scenario = { db: TestDatabase; sealer: Sealer; queuePrefix: string; env: Record<string, string> };

async function newScenario(): Promise<Scenario> {
  const db = await createTestDatabase();
  databases.push(db);
  const key = generateMasterKey();
  const queuePrefix = testQueuePrefix();
  prefixes.push(queuePrefix);
  return { db, sealer: createSealer(new MasterKeyRing([key])), queuePrefix, env: keelEnv(db.url, encodeMasterKey(key), queuePrefix) };
}

async function spawnWorker(scenario: Scenario): Promise<KeelProcess> {
  const child = spawnKeel(['start'], { cwd: tempDir('keel-crash-cwd-'), env: cleanEnv({ ...TEST_POOL_ENV, ...scenario.env }) });
  children.push(child);
  await child.waitForLog('keel is ready', 45_000);
  return child;
}

/** Creates the run as the A2A layer would (ceilings of the primary provider) and enqueues its job on the child's queues. */
async function createAndEnqueue(scenario: Scenario, agentId: string): Promise<RunRow> {
  const config = testConfig(scenario.db.url, {}, scenario.env);
  const fetch = createGuardedFetch(config.security.addressGuard);
  closers.push(() => fetch.close());
  const built = await buildAgentRegistry(config, { fetch });
  if (!built.ok) throw new Error(built.problems.join('\n'));
  const created = await createAgentRun(scenario.db.pool, scenario.sealer, built.registry, agentId, userRequest('hi'));
  if (!created.ok) throw new Error(created.reason);
  const queues = new KeelQueues(queueBackend(scenario.db.url, scenario.queuePrefix), silentLogger());
  queueSets.push(queues);
  await enqueueRun(queues, created.run.id);
  return created.run;
}

async function killHard(child: KeelProcess): Promise<void> {
  child.child.kill('SIGKILL');
  const exit = await child.exited;
  expect(exit.signal).toBe('SIGKILL');
}

type LogLine = { msg?: string; runId?: string; [key: string]: unknown };

function capturingLogger(): { logger: KeelLogger; lines: LogLine[] } {
  const lines: LogLine[] = [];
  const logger = pino<'notice'>(
    { level: 'info', customLevels: { notice: 35 } },
    { write: (line: string) => void lines.push(JSON.parse(line) as LogLine) },
  );
  return { logger, lines };
}

/** A second Keel, in this process, on the same database, master key and queues (prefix included). */
async function startReplacement(scenario: Scenario): Promise<{ keel: TestKeel; lines: LogLine[] }> {
  const { logger, lines } = capturingLogger();
  const keel = await startTestKeel({ databaseUrl: scenario.db.url, env: scenario.env, logger });
  keels.push(keel);
  return { keel, lines };
}

const childWorkerPrefix = (child: KeelProcess) => `${hostname()}:${child.child.pid}:`;
const eventsOf = (events: readonly RunEventRow[], kind: string) => events.filter((event) => event.kind === kind);
const payloadOf = (event: RunEventRow) => event.payload as Record<string, unknown>;
const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));
const logLines = (path: string) => (existsSync(path) ? readFileSync(path, 'utf8').split('\n').filter(Boolean) : []);

/** Stops a replacement Keel at the end of its test (afterAll stops any left by a failure). */
async function retire(keel: TestKeel): Promise<void> {
  keels.splice(keels.indexOf(keel), 1);
  await keel.dispose();
}

/** Rethrows a failed wait with the run row, its events and the processes' last log lines. */
async function explained<T>(pool: TestDatabase['pool'], runId: string, logs: { child?: KeelProcess; lines?: LogLine[] }, wait: Promise<T>): Promise<T> {
  try {
    return await wait;
  } catch (error) {
    const row = await getRun(pool, runId).catch(() => null);
    const events = await listRunEvents(pool, runId).catch(() => []);
    const detail = [
      `run: ${JSON.stringify(row && { ...row, queued_request: undefined, suspended_state: undefined })}`,
      `events: ${events.map((event) => event.kind).join(', ')}`,
      `child log:\n${(logs.child?.lines ?? []).slice(-40).join('\n')}`,
      `replacement log:\n${(logs.lines ?? []).slice(-40).map((line) => JSON.stringify(line)).join('\n')}`,
    ];
    throw new Error(`${(error as Error).message}\n${detail.join('\n')}`);
  }
}

describe(`executor crash recovery on the ${QUEUE} queue backend`, () => {
  it('a worker process SIGKILLed mid-run: the lease expires, the reaper requeues it, a new worker completes it', async () => {
    const scenario = await newScenario();
    const { pool } = scenario.db;
    const child = await spawnWorker(scenario);
    const run = await createAndEnqueue(scenario, 'slow');

    // The child claimed the run and is inside the slow first model step.
    const claimed = await explained(
      pool,
      run.id,
      { child },
      waitFor(
        async () => {
          const row = await getRun(pool, run.id);
          if (row?.status !== 'running' || !row.claimed_by?.startsWith(childWorkerPrefix(child))) return null;
          return eventsOf(await listRunEvents(pool, run.id), 'claimed').length === 1 ? row : null;
        },
        'the child to claim the run',
        20_000,
      ),
    );
    await killHard(child);

    // Nobody settles or renews for a dead worker: the row still names it until the lease runs out.
    const orphaned = (await getRun(pool, run.id))!;
    expect(orphaned).toMatchObject({ status: 'running', claimed_by: claimed.claimed_by, requeue_count: 0, termination_reason: null });
    const leaseExpiresAt = orphaned.lease_expires_at!;
    expect(leaseExpiresAt).toBeGreaterThan(Date.now() - 1000);

    const { keel, lines } = await startReplacement(scenario);
    const settled = await explained(pool, run.id, { child, lines }, waitForRunStatus(pool, run.id, ['completed', 'failed', 'cancelled'], 25_000));
    expect(settled).toMatchObject({
      status: 'completed',
      termination_reason: 'completed',
      truncated: false,
      requeue_count: 1,
      claimed_by: null,
      lease_expires_at: null,
      inside_non_idempotent_call: null,
      iterations: 2,
      tool_calls: 1,
    });
    // Requeued only after the lease had expired, with the base delay (n = 0).
    expect(settled.available_at).toBeGreaterThanOrEqual(leaseExpiresAt + REQUEUE_BASE_SECONDS * 1000);

    const requeued = lines.filter((line) => line.msg === 'run requeued after its lease expired' && line.runId === run.id);
    expect(requeued).toHaveLength(1);
    expect(requeued[0]).toMatchObject({ delayMs: REQUEUE_BASE_SECONDS * 1000, requeues: 1 });

    // Two claims in the audit trail: the dead child's and the replacement's, after the requeue.
    const events = await listRunEvents(pool, run.id);
    const claims = eventsOf(events, 'claimed');
    expect(claims).toHaveLength(2);
    expect(payloadOf(claims[0]!)).toMatchObject({ worker: claimed.claimed_by, requeues: 0 });
    expect(payloadOf(claims[1]!)).toMatchObject({ worker: keel.context.workerId, requeues: 1 });
    expect(claims[1]!.created_at).toBeGreaterThanOrEqual(settled.available_at);
    expect(eventsOf(events, 'completed')).toHaveLength(1);

    const outputs = await listRunOutputs(pool, scenario.sealer, run.id);
    expect(outputs.filter((output) => output.kind === 'answer').map((output) => output.content)).toEqual([
      { artifactId: 'answer', name: 'answer', parts: [{ text: 'done' }] },
    ]);

    // The same live reaper dead-letters a run whose lease keeps expiring once requeues are used up.
    const ghost = await createRun(pool, scenario.sealer, { agent: 'slow', auditLevel: 'metadata', answerLevel: 'full', provider: 'slow', request: userRequest('hi') });
    await pool.query(sql.unsafe`
      UPDATE runs SET status = 'running', claimed_by = 'ghost', lease_expires_at = now() - interval '1 second', requeue_count = ${keel.config.runs.maxRequeues}
      WHERE id = ${ghost.id}`);
    const deadLettered = await explained(pool, ghost.id, { lines }, waitForRunStatus(pool, ghost.id, ['queued', 'completed', 'failed', 'cancelled'], 10_000));
    expect(deadLettered).toMatchObject({ status: 'failed', termination_reason: 'retries_exhausted', requeue_count: 3, claimed_by: null });
    expect(deadLettered.failure_detail).toEqual({ requeues: 3, insideNonIdempotentCall: false });
    expect(eventsOf(await listRunEvents(pool, ghost.id), 'claimed')).toHaveLength(0);
    await retire(keel);
  });

  it('a run killed inside a non-idempotent tool is dead-lettered, never claimed again, and the tool ran once', async () => {
    const scenario = await newScenario();
    const { pool } = scenario.db;
    const child = await spawnWorker(scenario);
    const run = await createAndEnqueue(scenario, 'charger');

    // charge_card has written its line and now waits 10 s: the row is stamped as inside the call.
    await explained(
      pool,
      run.id,
      { child },
      waitFor(
        async () => {
          if (logLines(chargeLog).length === 0) return null;
          const row = await getRun(pool, run.id);
          return row?.inside_non_idempotent_call ? row : null;
        },
        'charge_card to start',
        20_000,
      ),
    );
    await killHard(child);

    const orphaned = (await getRun(pool, run.id))!;
    expect(orphaned).toMatchObject({ status: 'running', inside_non_idempotent_call: 'call_0_0', requeue_count: 0 });
    expect(orphaned.claimed_by?.startsWith(childWorkerPrefix(child))).toBe(true);
    expect(logLines(chargeLog)).toEqual([`charged:${run.id}`]);

    const { keel, lines } = await startReplacement(scenario);
    const settled = await explained(pool, run.id, { child, lines }, waitForRunStatus(pool, run.id, ['queued', 'completed', 'failed', 'cancelled'], 15_000));
    expect(settled).toMatchObject({
      status: 'failed',
      termination_reason: 'retries_exhausted',
      requeue_count: 0,
      claimed_by: null,
      lease_expires_at: null,
      queued_request: null,
    });
    expect(settled.failure_detail).toEqual({ requeues: 0, insideNonIdempotentCall: true });
    const deadLetterLog = lines.filter((line) => line.msg === 'run dead-lettered after its lease expired' && line.runId === run.id);
    expect(deadLetterLog, `the replacement's log lines: ${JSON.stringify(lines.slice(-20))}`).toHaveLength(1);
    expect(deadLetterLog[0]).toMatchObject({ insideNonIdempotentCall: true, requeues: 0 });
    expect(lines.filter((line) => line.msg === 'run requeued after its lease expired')).toHaveLength(0);

    // Several more lease periods and sweeps later: still settled once, never claimed again, charged once.
    await sleep(3 * LEASE_SECONDS * 1000);
    const later = (await getRun(pool, run.id))!;
    expect(later).toMatchObject({ status: 'failed', termination_reason: 'retries_exhausted', revision: settled.revision });
    const events = await listRunEvents(pool, run.id);
    expect(eventsOf(events, 'claimed')).toHaveLength(1);
    expect(eventsOf(events, 'resumed')).toHaveLength(0);
    expect(eventsOf(events, 'tool_call').map((event) => payloadOf(event).tool)).toEqual(['charge_card']);
    expect(eventsOf(events, 'tool_result')).toHaveLength(0);
    expect(logLines(chargeLog)).toEqual([`charged:${run.id}`]);
    await retire(keel);
  });

  it('the reaper requeues with min(base × 2^n, max) up to maxRequeues, then dead-letters', async () => {
    const db = await createTestDatabase();
    databases.push(db);
    const sealer = createSealer(new MasterKeyRing([generateMasterKey()]));
    const queuePrefix = testQueuePrefix();
    prefixes.push(queuePrefix);
    const queues = new KeelQueues(queueBackend(db.url, queuePrefix), silentLogger());
    queueSets.push(queues);
    const context = { pool: db.pool, queues, logger: silentLogger() };
    // The shipped defaults (docs/decisions/0006): at most 3 requeues, delay min(30 s × 2^n, 600 s).
    const { runs } = testConfig(db.url);
    const policy: ReaperPolicy = { maxRequeues: runs.maxRequeues, requeueBaseMs: runs.requeueBaseSeconds * 1000, requeueMaxMs: runs.requeueMaxSeconds * 1000 };
    expect(policy).toEqual({ maxRequeues: 3, requeueBaseMs: 30_000, requeueMaxMs: 600_000 });

    const ghostRun = async (requeues: number, options: { leaseSql?: ReturnType<typeof sql.fragment>; insideCall?: string } = {}) => {
      const run = await createRun(db.pool, sealer, { agent: 'slow', auditLevel: 'metadata', answerLevel: 'full', request: userRequest('hi') });
      await db.pool.query(sql.unsafe`
        UPDATE runs SET status = 'running', claimed_by = 'ghost', started_at = now(),
          lease_expires_at = ${options.leaseSql ?? sql.fragment`now() - interval '1 second'`},
          requeue_count = ${requeues}, inside_non_idempotent_call = ${options.insideCall ?? null}
        WHERE id = ${run.id}`);
      return run.id;
    };
    /** The delay the requeue wrote: available_at and updated_at come from the same statement's now(). */
    const requeueDelay = (id: string) =>
      db.pool.oneFirst(sql.type(z.object({ ms: z.number() }))`
        SELECT (extract(epoch FROM available_at - updated_at) * 1000)::float8 AS ms FROM runs WHERE id = ${id}`);

    const fresh = await ghostRun(0);
    const second = await ghostRun(2);
    const exhausted = await ghostRun(3);
    const insideCall = await ghostRun(0, { insideCall: 'call_0_0' });
    const alive = await ghostRun(0, { leaseSql: sql.fragment`now() + interval '1 minute'` });

    expect(await reapExpiredLeases(context, policy)).toEqual({ requeued: 2, deadLettered: 2 });

    expect(await getRun(db.pool, fresh)).toMatchObject({ status: 'queued', requeue_count: 1, claimed_by: null, lease_expires_at: null, termination_reason: null });
    expect(await requeueDelay(fresh)).toBe(30_000);
    expect(await getRun(db.pool, second)).toMatchObject({ status: 'queued', requeue_count: 3 });
    expect(await requeueDelay(second)).toBe(120_000);
    const freshAvailableIn = await db.pool.oneFirst(sql.type(z.object({ ms: z.number() }))`
      SELECT (extract(epoch FROM available_at - now()) * 1000)::float8 AS ms FROM runs WHERE id = ${fresh}`);
    expect(freshAvailableIn).toBeGreaterThan(25_000);
    expect(freshAvailableIn).toBeLessThanOrEqual(30_000);

    // Each requeued run has its (delayed) wake-up job, under an id of its own per requeue: the job
    // of the crashed worker may still be 'active' under the run's first id.
    for (const [id, requeues, delay] of [
      [fresh, 1, 30_000],
      [second, 3, 120_000],
    ] as const) {
      const job = await queues.queue('runs').getJob(runJobId(id, requeues));
      expect(job?.data).toEqual({ runId: id });
      expect(await job!.getState()).toBe('delayed');
      expect(job!.opts.delay).toBe(delay);
    }

    const exhaustedRow = (await getRun(db.pool, exhausted))!;
    expect(exhaustedRow).toMatchObject({ status: 'failed', termination_reason: 'retries_exhausted', requeue_count: 3, claimed_by: null, lease_expires_at: null });
    expect(exhaustedRow.failure_detail).toEqual({ requeues: 3, insideNonIdempotentCall: false });
    const insideRow = (await getRun(db.pool, insideCall))!;
    expect(insideRow).toMatchObject({ status: 'failed', termination_reason: 'retries_exhausted', requeue_count: 0 });
    expect(insideRow.failure_detail).toEqual({ requeues: 0, insideNonIdempotentCall: true });
    for (const id of [exhausted, insideCall]) {
      for (const requeues of [0, 1, 3, 4]) expect(await queues.queue('runs').getJob(runJobId(id, requeues))).toBeFalsy();
    }

    // A lease that has not expired is left alone.
    expect(await getRun(db.pool, alive)).toMatchObject({ status: 'running', claimed_by: 'ghost', requeue_count: 0 });

    // Nothing left to reap; the delay is capped at the maximum.
    expect(await reapExpiredLeases(context, policy)).toEqual({ requeued: 0, deadLettered: 0 });
    const capped = await ghostRun(5);
    expect(await reapExpiredLeases(context, { ...policy, maxRequeues: 10 })).toEqual({ requeued: 1, deadLettered: 0 });
    expect(await getRun(db.pool, capped)).toMatchObject({ status: 'queued', requeue_count: 6 });
    expect(await requeueDelay(capped)).toBe(600_000);
  });
});
