import { sql } from 'slonik';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { z } from 'zod';
import { reapExpiredLeases } from '../../workers/maintenance.js';
import { callA2A, expectA2AResult } from '../support/a2a-wire.js';
import { startTestKeel, type TestKeel } from '../support/test-keel.js';
import { waitFor } from '../support/wait-for.js';
import { createClient } from '../../src/auth/client-repository.js';
import { PUSH_TEST_OVERRIDES } from '../integration/push/push-support.js';

// Fair run slots (docs/reliability.md, "Fair run slots"; decision 0062). A heavy client floods
// Keel with 1,000 tasks while a light client sends blocking SendMessage calls one at a time: the
// light client's p99 latency under the flood stays within 2x its unloaded p99 (issue 40). Its
// tasks are not served after the heavy client's backlog: the queue is ordered by each client's
// rank in its own backlog, and a client seen lately with no run in flight finds a slot kept free.
// The heavy client's tasks all complete, and a run requeued after a lease expiry still runs. The
// suite runs it with the machine to itself (test/support/fault-files.ts, decision 0103): the bound
// is a ratio of two second-worst samples, and a neighbour's moment moves either.

/** The light client's runs wait this long in their provider step: long against Keel's own per-run cost on a loaded 2-core machine. */
const RUN_MS = 100;
/**
 * The heavy client's runs hold their slots longer, so its 1,000 tasks are a backlog of 15 s
 * (1,000 × 120 ms / 8 slots; about 55 tasks/s measured): once the flood is accepted about 800
 * wait, and the light client's 100 samples take 11-12 s here. Not longer, so the file does not
 * wait out a backlog nobody measures (250 ms made it 31 s, half of it after the samples).
 */
const HEAVY_RUN_MS = 120;
/** Few slots, so 1,000 tasks are a backlog of many rounds (and the flood costs little CPU). */
const SLOTS = 8;
const HEAVY_TASKS = 1000;
/** 100 samples: the p99 is the second worst, so the one task a client sends after a pause (below) does not decide it alone. */
const SAMPLES = 100;
/** Under the flood, at least this many samples while the heavy backlog lasts. */
const MIN_LOADED_SAMPLES = 60;
/**
 * The unloaded p99 the bound is taken from is at least this: on a shared machine a quiet moment
 * can make the unloaded p99 barely above RUN_MS, and 2x of it would then judge noise. Only
 * RUN_MS + 20 ms (an unloaded blocking send costs ~10-20 ms besides its provider step here).
 */
const UNLOADED_P99_FLOOR_MS = RUN_MS + 20;

const providers = {
  paced: { type: 'scripted', steps: [{ reply: 'paced done', delayMs: RUN_MS }] },
  heavy: { type: 'scripted', steps: [{ reply: 'heavy done', delayMs: HEAVY_RUN_MS }] },
};
const agents = [
  { id: 'paced', name: 'Paced', provider: 'paced' },
  { id: 'heavy', name: 'Heavy', provider: 'heavy' },
];

let keel: TestKeel;
type Client = { id: string; token: string };
let heavy: Client;
let light: Client;
let counter = 0;

const send = async (token: string, agent: string, configuration: Record<string, unknown> = {}) => {
  counter += 1;
  const message = { messageId: `fair-${counter}-${Date.now()}`, role: 'ROLE_USER', parts: [{ text: `task ${counter}` }] };
  return expectA2AResult('JSONRPC', await callA2A(keel.url, agent, 'JSONRPC', 'SendMessage', { message, configuration }, { token }));
};

/** One blocking send of the light client, timed; it must have completed. */
async function timedLightSend(): Promise<number> {
  const started = performance.now();
  const answer = await send(light.token, 'paced');
  const elapsed = performance.now() - started;
  expect(answer.task.status.state).toBe('TASK_STATE_COMPLETED');
  return elapsed;
}

const p99 = (samples: readonly number[]) => {
  const sorted = [...samples].sort((a, b) => a - b);
  return sorted[Math.min(sorted.length - 1, Math.ceil(sorted.length * 0.99) - 1)]!;
};
const median = (samples: readonly number[]) => [...samples].sort((a, b) => a - b)[Math.floor(samples.length / 2)]!;

const ownerCounts = z.object({ state: z.string(), n: z.number() });
async function tasksOf(client: Client): Promise<Record<string, number>> {
  const owner = client.id;
  const rows = await keel.context.pool.any(sql.type(ownerCounts)`SELECT state, count(*)::int AS n FROM a2a_tasks WHERE owner = ${owner} GROUP BY 1`);
  return Object.fromEntries(rows.map((row) => [row.state, row.n]));
}

async function metric(series: string): Promise<number> {
  const text = await (await fetch(`${keel.url}/metrics`)).text();
  const line = text.split('\n').find((candidate) => candidate.startsWith(`${series} `));
  return line ? Number(line.slice(series.length + 1)) : Number.NaN;
}

beforeAll(async () => {
  keel = await startTestKeel({
    overrides: { ...PUSH_TEST_OVERRIDES, KEEL_PROVIDERS: providers, KEEL_AGENTS: agents, KEEL_RUNS_CONCURRENCY: String(SLOTS), KEEL_MAINTENANCE_SWEEP_SECONDS: '600' },
  });
  const clientOf = async (name: string): Promise<Client> => {
    const created = await createClient(keel.context.pool, name);
    if (!created.ok) throw new Error(`cannot create client ${name}`);
    return { id: created.client.id, token: created.token };
  };
  heavy = await clientOf('heavy');
  light = await clientOf('light');
});
afterAll(async () => keel?.dispose());

describe('fair run slots', () => {
  it("a light client's p99 while a heavy client floods Keel with 1,000 tasks stays within 2x its unloaded p99; the heavy client's tasks all complete", async () => {
    for (let warm = 0; warm < 10; warm += 1) await timedLightSend();
    const unloaded: number[] = [];
    for (let sample = 0; sample < SAMPLES; sample += 1) unloaded.push(await timedLightSend());

    // The flood: 1,000 tasks sent as fast as 16 connections allow, each answered at once.
    const floodStarted = performance.now();
    let floodSentMs = 0;
    const flooding = (async () => {
      let next = 0;
      await Promise.all(
        Array.from({ length: 16 }, async () => {
          while (next < HEAVY_TASKS) {
            next += 1;
            await send(heavy.token, 'heavy', { returnImmediately: true });
          }
        }),
      );
      floodSentMs = performance.now() - floodStarted;
    })();
    // Measured while the backlog drains, once the flood is accepted: while the heavy client still
    // sends at full speed its requests compete with the light one's for the CPU and the write path,
    // which the per-client request limits bound (docs/reliability.md, "Flow control per client").
    await flooding;
    const backlogBefore = (await tasksOf(heavy)).TASK_STATE_SUBMITTED ?? 0;

    // While the backlog lasts: the light client's blocking sends, one at a time.
    const loaded: number[] = [];
    let clientsWaiting = Number.NaN;
    let mostWaiting = Number.NaN;
    while (loaded.length < SAMPLES) {
      loaded.push(await timedLightSend());
      if (loaded.length === 5) {
        clientsWaiting = await metric('keel_run_clients_waiting');
        mostWaiting = await metric('keel_runs_waiting_most_per_client');
      }
      if (((await tasksOf(heavy)).TASK_STATE_SUBMITTED ?? 0) < 2 * SLOTS) break;
    }
    const backlogAfter = (await tasksOf(heavy)).TASK_STATE_SUBMITTED ?? 0;

    const unloadedP99 = p99(unloaded);
    const loadedP99 = p99(loaded);
    const figures = `unloaded p50 ${median(unloaded).toFixed(0)} ms, p99 ${unloadedP99.toFixed(0)} ms; under the flood p50 ${median(loaded).toFixed(0)} ms, p99 ${loadedP99.toFixed(0)} ms; heavy backlog ${backlogBefore} when measuring began, ${backlogAfter} after ${loaded.length} samples`;
    console.info(`fair run slots (${process.env.KEEL_TEST_QUEUE ?? 'postgres'} queue): ${figures}`);
    if (process.env.FAIR_DEBUG) console.info(`flood sent in ${floodSentMs.toFixed(0)} ms; samples: ${loaded.map((ms) => ms.toFixed(0)).join(' ')}`);
    expect(backlogAfter, `the light samples were all taken under the flood (${figures})`).toBeGreaterThan(0);
    expect(loaded.length, figures).toBeGreaterThanOrEqual(MIN_LOADED_SAMPLES);
    expect(loadedP99, figures).toBeLessThanOrEqual(2 * Math.max(unloadedP99, UNLOADED_P99_FLOOR_MS));
    // Operators see the backlog by client: the heavy client waited with hundreds of runs.
    expect(clientsWaiting).toBeGreaterThanOrEqual(1);
    expect(mostWaiting).toBeGreaterThan(2 * SLOTS);

    // No starvation the other way: every heavy task completes.
    await waitFor(async () => ((await tasksOf(heavy)).TASK_STATE_COMPLETED ?? 0) === HEAVY_TASKS, 'all heavy tasks completed', 180_000, 500);
    expect(await tasksOf(heavy)).toEqual({ TASK_STATE_COMPLETED: HEAVY_TASKS });
    expect(await metric('keel_run_clients_waiting')).toBe(0);
  }, 400_000);

  it('a run requeued after its lease expired still runs while a backlog waits, ahead of it', async () => {
    const backlog = Array.from({ length: 200 }, () => send(heavy.token, 'heavy', { returnImmediately: true }));
    const ids = (await Promise.all(backlog)).map((answer) => answer.task.id as string);
    // The backlog's last waiting run, as a crashed worker would leave it: RUNNING under a lease that ran out.
    const crashed = await keel.context.pool.maybeOneFirst(sql.type(z.object({ id: z.string() }))`
      UPDATE runs SET status = 'running', claimed_by = 'gone-worker', lease_expires_at = now() - interval '1 second', started_at = now()
      WHERE id = (SELECT r.id FROM runs r JOIN a2a_tasks t ON t.run_id = r.id
                  WHERE t.id = ANY(${sql.array(ids, 'uuid')}) AND r.status = 'queued' ORDER BY r.created_at DESC LIMIT 1)
        AND status = 'queued'
      RETURNING id`);
    expect(crashed, 'a task of the backlog was still waiting').not.toBeNull();
    const report = await reapExpiredLeases(keel.context, { maxRequeues: 3, requeueBaseMs: 0, requeueMaxMs: 0 });
    expect(report.requeued).toBe(1);
    const ran = await waitFor(
      async () => {
        const row = await keel.context.pool.one(sql.type(z.object({ status: z.string(), requeue_count: z.number() }))`SELECT status, requeue_count FROM runs WHERE id = ${crashed!}`);
        return row.status === 'completed' ? row : null;
      },
      'the requeued run completed',
      60_000,
    );
    expect(ran.requeue_count).toBe(1);
    const stillWaiting = (await tasksOf(heavy)).TASK_STATE_SUBMITTED ?? 0;
    expect(stillWaiting, 'a requeued run goes ahead of the backlog it had already waited through').toBeGreaterThan(0);
    await waitFor(async () => ((await tasksOf(heavy)).TASK_STATE_SUBMITTED ?? 0) + ((await tasksOf(heavy)).TASK_STATE_WORKING ?? 0) === 0, 'the backlog drained', 120_000, 500);
  }, 200_000);
});
