import { existsSync, readFileSync, writeFileSync } from 'node:fs';
import { hostname } from 'node:os';
import { join } from 'node:path';
import { SendMessageRequest, Task } from '@a2a-js/sdk';
import { sql } from 'slonik';
import { afterAll, describe, expect, it } from 'vitest';
import { z } from 'zod';
import { createClient } from '../../../src/auth/client-repository.js';
import { listRunEvents, type RunEventRow } from '../../../src/runs/run-event-repository.js';
import { getRun } from '../../../src/runs/run-repository.js';
import { readJournal } from '../../../src/tasks/journal.js';
import { encodeMasterKey, generateMasterKey } from '../../../src/sealing/master-key.js';
import { sdkClient } from '../../support/a2a-client.js';
import { cleanEnv, spawnKeel, type KeelProcess } from '../../support/keel-process.js';
import { createTestDatabase, type TestDatabase } from '../../support/test-database.js';
import { startTestKeel, TEST_POOL_ENV, tempDir, type TestKeel } from '../../support/test-keel.js';
import { deleteQueueKeys, TEST_REDIS_URL, testQueueKind, testQueuePrefix } from '../../support/test-queues.js';
import { waitFor, waitForRunStatus } from '../../support/wait-for.js';

// A statechart agent's worker SIGKILLed between two steps (issue 16, "Durable, transition by
// transition" and "Effects are steps"): a real `keel start` child runs the order machine and dies
// while its second step is in flight, after the first step's transition committed. Another Keel on
// the same database and queues resumes the run from the committed snapshot: the committed step is
// not run again, the idempotent step in flight is, under the same step key; a non-idempotent step
// in flight dead-letters the run instead of running twice.

const QUEUE = testQueueKind();
const MACHINE = new URL('../../fixtures/statecharts/order.machine.ts', import.meta.url).pathname;
const LEASE_SECONDS = 2;
const REQUEUE_BASE_SECONDS = 0.5;
// The child holds the pay/charge step this long: far longer than the test needs to kill it.
const CHILD_HOLD_MS = 60_000;

const redisUrl = QUEUE === 'redis' ? TEST_REDIS_URL : null;
const prefixes: string[] = [];
const children: KeelProcess[] = [];
const keels: TestKeel[] = [];
const databases: TestDatabase[] = [];

afterAll(async () => {
  for (const child of children) {
    if (child.child.exitCode === null && child.child.signalCode === null) {
      child.child.kill('SIGKILL');
      await child.exited;
    }
  }
  for (const keel of keels) await keel.dispose().catch(() => undefined);
  for (const database of databases) await database.drop().catch(() => undefined);
  delete process.env.KEEL_TEST_STEP_LOG;
  if (redisUrl && prefixes.length > 0) {
    await deleteQueueKeys(prefixes, redisUrl);
  }
});

type Json = Record<string, any>; // eslint-disable-line @typescript-eslint/no-explicit-any
type Scenario = { db: TestDatabase; env: Record<string, string>; stepLog: string; token: string };

/** A database, master key, queue prefix and step log of its own, shared by the child and its replacement. */
async function newScenario(): Promise<Scenario> {
  const db = await createTestDatabase();
  databases.push(db);
  const queuePrefix = testQueuePrefix();
  prefixes.push(queuePrefix);
  const stepLog = join(tempDir('keel-statechart-kill-'), 'steps.log');
  writeFileSync(stepLog, '');
  const env: Record<string, string> = {
    KEEL_DATABASE_URL: db.url,
    KEEL_MASTER_KEY: encodeMasterKey(generateMasterKey()),
    KEEL_SERVER_PORT: '0',
    KEEL_DATA_DIR: tempDir('keel-statechart-kill-data-'),
    KEEL_QUEUE_PREFIX: queuePrefix,
    ...(redisUrl ? { KEEL_QUEUE_REDIS_URL: redisUrl } : {}),
    KEEL_RUNS_LEASE_SECONDS: String(LEASE_SECONDS),
    KEEL_RUNS_HEARTBEAT_SECONDS: '0.5',
    KEEL_RUNS_REQUEUE_BASE_SECONDS: String(REQUEUE_BASE_SECONDS),
    KEEL_MAINTENANCE_SWEEP_SECONDS: '0.5',
    KEEL_AGENTS: JSON.stringify([{ id: 'order', name: 'Order', machine: MACHINE, privacy: { answerLevel: 'full' } }]),
  };
  const client = await createClient(db.pool, `statechart-kill-${Math.random().toString(36).slice(2, 10)}`);
  if (!client.ok) throw new Error('cannot create the client');
  return { db, env, stepLog, token: client.token };
}

/** `keel start` as a child process, holding the pay/charge step (the fixture reads KEEL_TEST_STEP_HOLD_MS). */
async function spawnWorker(scenario: Scenario): Promise<{ child: KeelProcess; url: string }> {
  const child = spawnKeel(['start'], {
    cwd: tempDir('keel-statechart-kill-cwd-'),
    env: cleanEnv({ ...TEST_POOL_ENV, ...scenario.env, KEEL_TEST_STEP_LOG: scenario.stepLog, KEEL_TEST_STEP_HOLD_MS: String(CHILD_HOLD_MS) }),
  });
  children.push(child);
  const ready = await child.waitForLog('keel is ready', 60_000);
  return { child, url: String(ready.url) };
}

/** A replacement Keel in this process on the same database, master key and queues; its steps are not held. */
async function startReplacement(scenario: Scenario): Promise<TestKeel> {
  process.env.KEEL_TEST_STEP_LOG = scenario.stepLog;
  delete process.env.KEEL_TEST_STEP_HOLD_MS;
  const keel = await startTestKeel({ databaseUrl: scenario.db.url, env: scenario.env });
  keels.push(keel);
  return keel;
}

async function killHard(child: KeelProcess): Promise<void> {
  child.child.kill('SIGKILL');
  const exit = await child.exited;
  expect(exit.signal).toBe('SIGKILL');
}

const asJson = (result: unknown) => Task.toJSON(result as Task) as Json;
const stepLines = (path: string) => (existsSync(path) ? readFileSync(path, 'utf8').split('\n').filter(Boolean) : []);
const linesOf = (path: string, step: string) => stepLines(path).filter((line) => line.startsWith(`${step} `));
const eventsOf = (events: readonly RunEventRow[], kind: string) => events.filter((event) => event.kind === kind);
const toolOf = (event: RunEventRow) => (event.payload as { tool?: unknown }).tool;
const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));

async function sendOrder(url: string, token: string, data: Record<string, unknown>): Promise<Json> {
  const client = await sdkClient(url, 'order', token);
  const request = SendMessageRequest.fromJSON({
    message: { messageId: `kill-${Math.random().toString(36).slice(2)}`, role: 'ROLE_USER', parts: [{ text: 'refund please' }, { data }] },
    configuration: { returnImmediately: true },
  });
  return asJson(await client.sendMessage(request));
}

async function pathOf(pool: TestDatabase['pool'], runId: string): Promise<{ state: string; event: string; hash: string }[]> {
  const rows = await pool.any(sql.type(z.object({ state: z.unknown(), event: z.string(), machine_hash: z.string() }))`
    SELECT state, event, machine_hash FROM run_machine_steps WHERE run_id = ${runId} ORDER BY sequence`);
  return rows.map((row) => ({ state: JSON.stringify(row.state), event: row.event, hash: row.machine_hash }));
}

/** The run's machine state as stored (JSON text, '"paying"'), and its non-idempotent mark. */
async function machineStateOf(pool: TestDatabase['pool'], runId: string) {
  return pool.maybeOne(sql.type(z.object({ machine_state: z.string().nullable(), machine_hash: z.string().nullable(), inside: z.string().nullable() }))`
    SELECT machine_state::text AS machine_state, machine_hash, inside_non_idempotent_call AS inside FROM runs WHERE id = ${runId}`);
}

/** Rethrows a failed wait with the run row, its audit kinds, the step log and the child's last log lines. */
async function explained<T>(scenario: Scenario, runId: string, child: KeelProcess, wait: Promise<T>): Promise<T> {
  try {
    return await wait;
  } catch (error) {
    const row = await getRun(scenario.db.pool, runId).catch(() => null);
    const events = await listRunEvents(scenario.db.pool, runId).catch(() => []);
    const detail = [
      `run: ${JSON.stringify(row && { ...row, queued_request: undefined, suspended_state: undefined })}`,
      `events: ${events.map((event) => event.kind).join(', ')}`,
      `steps: ${stepLines(scenario.stepLog).join(' | ')}`,
      `child log:\n${child.lines.slice(-40).join('\n')}`,
    ];
    throw new Error(`${(error as Error).message}\n${detail.join('\n')}`);
  }
}

describe(`a statechart agent's worker SIGKILLed mid-run on the ${QUEUE} queue backend`, () => {
  it('resumes from the committed snapshot: the committed step is not repeated, the idempotent step in flight runs again under its key', { timeout: 120_000 }, async () => {
    const scenario = await newScenario();
    const { pool } = scenario.db;
    const { child, url } = await spawnWorker(scenario);
    const sent = await sendOrder(url, scenario.token, { amount: 40 });
    const runId = String(sent.id);

    // `check` committed its transition (the run stands in `paying`) and `pay` has started and is held.
    await explained(
      scenario,
      runId,
      child,
      waitFor(
        async () => {
          const row = await machineStateOf(pool, runId);
          return row?.machine_state === '"paying"' && linesOf(scenario.stepLog, 'pay-start').length === 1 ? row : null;
        },
        'the child to commit `paying` and start the pay step',
        30_000,
      ),
    );
    await killHard(child);

    const orphaned = (await getRun(pool, runId))!;
    expect(orphaned).toMatchObject({ status: 'running', requeue_count: 0, inside_non_idempotent_call: null });
    expect(orphaned.claimed_by?.startsWith(`${hostname()}:${child.child.pid}:`)).toBe(true);
    expect(linesOf(scenario.stepLog, 'check')).toHaveLength(1);
    expect(linesOf(scenario.stepLog, 'pay-start')).toHaveLength(1);
    expect(linesOf(scenario.stepLog, 'pay')).toHaveLength(0);
    const childHash = (await machineStateOf(pool, runId))!.machine_hash;

    const keel = await startReplacement(scenario);
    const settled = await explained(scenario, runId, child, waitForRunStatus(pool, runId, ['completed', 'failed', 'cancelled'], 30_000));
    expect(settled).toMatchObject({ status: 'completed', termination_reason: 'completed', requeue_count: 1, claimed_by: null, inside_non_idempotent_call: null });
    expect(settled.machine_hash).toBe(keel.registry.get('order')!.statechart!.hash);
    expect(settled.machine_hash).toBe(childHash);
    expect(settled.machine_state).toBe('done');

    // check ran once (in the child); pay started twice under the same durable key and finished once.
    const checks = linesOf(scenario.stepLog, 'check');
    expect(checks).toHaveLength(1);
    const payStarts = linesOf(scenario.stepLog, 'pay-start');
    expect(payStarts).toHaveLength(2);
    expect(payStarts[1]).toBe(payStarts[0]);
    const pays = linesOf(scenario.stepLog, 'pay');
    expect(pays).toEqual([payStarts[0]!.replace('pay-start', 'pay')]);

    // The path: one row per committed transition, none repeated by the resume.
    expect((await pathOf(pool, runId)).map((step) => step.state)).toEqual(['"checking"', '"paying"', '"done"']);

    // The audit trail: the child's claim and the replacement's; check's call once, pay's twice (one per attempt), pay's result once.
    const events = await listRunEvents(pool, runId);
    expect(eventsOf(events, 'claimed').map((event) => event.payload)).toMatchObject([{ requeues: 0 }]);
    expect(eventsOf(events, 'resumed').map((event) => event.payload)).toMatchObject([{ worker: keel.context.workerId, requeues: 1 }]);
    expect(eventsOf(events, 'tool_call').map(toolOf)).toEqual(['step:check', 'step:pay', 'step:pay']);
    expect(eventsOf(events, 'tool_result').map(toolOf)).toEqual(['step:check', 'step:pay']);

    // The journal: what the child committed (the status messages) is shown once, nothing twice.
    const journal = await readJournal(pool, keel.context.sealer, runId, 0, 100);
    const shown = journal.map((event) => {
      const response = event.response as Json;
      if (response.statusUpdate) return `${response.statusUpdate.status.state}${response.statusUpdate.status.message ? `: ${response.statusUpdate.status.message.parts[0].text}` : ''}`;
      if (response.artifactUpdate) return `artifact ${response.artifactUpdate.artifact.name}`;
      return 'message';
    });
    // The requeue after the kill is a committed transition (queued, then claimed again): the
    // projector shows it as SUBMITTED then WORKING when it projects the queued revision before the
    // replacement's claim, and passes over it when the claim came first. Either way once.
    const requeued = shown.indexOf('TASK_STATE_SUBMITTED');
    if (requeued !== -1) expect(shown.slice(requeued, requeued + 2)).toEqual(['TASK_STATE_SUBMITTED', 'TASK_STATE_WORKING']);
    expect(requeued === -1 ? shown : [...shown.slice(0, requeued), ...shown.slice(requeued + 2)]).toEqual([
      'TASK_STATE_WORKING',
      'TASK_STATE_WORKING: Checking the order',
      'TASK_STATE_WORKING: Paying',
      'artifact receipt',
      'artifact result',
      'artifact answer',
      'TASK_STATE_COMPLETED',
    ]);

    // What the client sees.
    const client = await sdkClient(keel.url, 'order', scenario.token);
    const task = asJson(await client.getTask({ id: runId } as never));
    expect(task.status.state).toBe('TASK_STATE_COMPLETED');
    const artifacts = task.artifacts as Json[];
    expect(artifacts.find((artifact) => artifact.name === 'answer')!.parts[0].text).toBe('paid 40');
    expect(artifacts.find((artifact) => artifact.name === 'result')!.parts[0].data).toEqual({ amount: 40, receipt: 'r-40' });
    expect(artifacts.filter((artifact) => artifact.name === 'receipt')).toHaveLength(1);
  });

  it('a non-idempotent step in flight at the kill dead-letters the run; the step is not run again', { timeout: 120_000 }, async () => {
    const scenario = await newScenario();
    const { pool } = scenario.db;
    const { child, url } = await spawnWorker(scenario);
    const sent = await sendOrder(url, scenario.token, { amount: 40, nonIdempotent: true });
    const runId = String(sent.id);

    // charge has started (and is held): the run is stamped as inside it.
    const inside = await explained(
      scenario,
      runId,
      child,
      waitFor(
        async () => {
          const row = await machineStateOf(pool, runId);
          return row?.machine_state === '"charging"' && row.inside !== null && linesOf(scenario.stepLog, 'charge-start').length === 1 ? row : null;
        },
        'the child to commit `charging` and start the charge step',
        30_000,
      ),
    );
    await killHard(child);
    expect(linesOf(scenario.stepLog, 'check')).toHaveLength(1);
    expect(linesOf(scenario.stepLog, 'charge')).toHaveLength(0);
    // The mark names the step's durable key, the one the log shows.
    expect(linesOf(scenario.stepLog, 'charge-start')[0]).toBe(`charge-start ${inside.inside} 40`);

    const keel = await startReplacement(scenario);
    const settled = await explained(scenario, runId, child, waitForRunStatus(pool, runId, ['queued', 'completed', 'failed', 'cancelled'], 30_000));
    expect(settled).toMatchObject({
      status: 'failed',
      termination_reason: 'retries_exhausted',
      requeue_count: 0,
      claimed_by: null,
      lease_expires_at: null,
    });
    expect(settled.failure_detail).toEqual({ requeues: 0, insideNonIdempotentCall: true });

    // Several lease periods and sweeps later: never claimed again, charge started once and never again.
    await sleep(3 * LEASE_SECONDS * 1000);
    const later = (await getRun(pool, runId))!;
    expect(later).toMatchObject({ status: 'failed', revision: settled.revision });
    expect(linesOf(scenario.stepLog, 'charge-start')).toHaveLength(1);
    expect(linesOf(scenario.stepLog, 'charge')).toHaveLength(0);
    expect(linesOf(scenario.stepLog, 'check')).toHaveLength(1);
    const events = await listRunEvents(pool, runId);
    expect(eventsOf(events, 'claimed')).toHaveLength(1);
    expect(eventsOf(events, 'resumed')).toHaveLength(0);
    expect(eventsOf(events, 'tool_call').map(toolOf)).toEqual(['step:check', 'step:charge']);
    expect((await pathOf(pool, runId)).map((step) => step.state)).toEqual(['"checking"', '"charging"']);

    const client = await sdkClient(keel.url, 'order', scenario.token);
    const task = await waitFor(async () => {
      const read = asJson(await client.getTask({ id: runId } as never));
      return read.status.state === 'TASK_STATE_FAILED' ? read : null;
    }, 'the task to show FAILED');
    expect(task.status.message.parts[0].text).toBe('the run was interrupted too often and was stopped');
  });
});
