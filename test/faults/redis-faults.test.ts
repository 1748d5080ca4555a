import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { BACKEND, Installation } from './support/installation.js';
import { startLoad } from './support/load.js';
import { startFakeModel, startPushReceiver, type FakeModel, type PushReceiver } from './support/peers.js';
import { expectClean, expectedEcho, finishScenario, pendingRuns, SCENARIO_TIMEOUT_MS, until } from './support/scenario.js';
import { startPrivatePostgres, startPrivateRedis, type PrivatePostgres, type PrivateRedis } from './support/services.js';

// Fault scenarios of the queue's Redis (the suite's private redis-server, never the shared one):
// FLUSHALL under load, and Redis stopped for 10 s and started again (empty: no persistence). Every
// job is only a wake-up; the debts are rows in Postgres and the sweeper gives them their jobs back
// (its own schedule included). One API process and one worker process, 240 tasks each.
//
// On the Postgres queue backend there is no Redis at all: these scenarios do not apply and are
// skipped (KEEL_TEST_QUEUE=redis runs them).

let postgres: PrivatePostgres;
let model: FakeModel;
let receiver: PushReceiver;
const redises: PrivateRedis[] = [];
const installations: Installation[] = [];

beforeAll(async () => {
  if (BACKEND !== 'redis') return;
  postgres = await startPrivatePostgres();
  model = await startFakeModel({ minDelayMs: 200, maxDelayMs: 600 });
  receiver = await startPushReceiver(() => ({ kind: 'ok', delayMs: 10 + Math.random() * 40 }));
});

afterAll(async () => {
  for (const installation of installations) await installation.dispose();
  for (const redis of redises) await redis.stop();
  await receiver?.close();
  await model?.close();
  await postgres?.stop();
});

async function setUp(): Promise<{ installation: Installation; redis: PrivateRedis }> {
  const redis = await startPrivateRedis();
  redises.push(redis);
  const installation = await Installation.create({ postgres, redis, model });
  installations.push(installation);
  await installation.addNode('api');
  await installation.addNode('worker');
  return { installation, redis };
}

describe.skipIf(BACKEND !== 'redis')('the queue Redis flushed or stopped (Redis queue backend)', () => {
  it(
    'FLUSHALL under load: the sweeper restores every job, nothing lost',
    async () => {
      const { installation, redis } = await setUp();
      const pool = await installation.pool();
      const faults: Record<string, unknown> = {};
      const startedAt = Date.now();
      const load = startLoad({
        apis: () => installation.apiUrls(),
        token: installation.token,
        count: 240,
        ratePerSecond: 25,
        maxInFlight: 60,
        pushUrl: receiver.url,
        pushFor: (index) => index % 3 === 0,
        expected: expectedEcho,
      });
      expect(await until(async () => load.accepted() >= 60 && (await pendingRuns(pool)) >= 3, 60_000), 'work in flight').toBe(true);
      faults.openRunsAtFlush = await pendingRuns(pool);
      await redis.flushAll();
      faults.flushedAtMs = Date.now() - startedAt;
      const counts = await finishScenario({ scenario: 'redis-flushall', installation, load, startedAt, receiver, faults });
      expectClean(counts, installation);
    },
    SCENARIO_TIMEOUT_MS,
  );

  it(
    'Redis stopped for 10 s and started again (empty): Keel reconnects, nothing lost',
    async () => {
      const { installation, redis } = await setUp();
      const pool = await installation.pool();
      const faults: Record<string, unknown> = {};
      const startedAt = Date.now();
      const load = startLoad({
        apis: () => installation.apiUrls(),
        token: installation.token,
        count: 240,
        ratePerSecond: 12,
        maxInFlight: 80,
        pushUrl: receiver.url,
        pushFor: (index) => index % 3 === 0,
        expected: expectedEcho,
      });
      expect(await until(async () => load.accepted() >= 50 && (await pendingRuns(pool)) >= 2, 60_000), 'work in flight').toBe(true);
      faults.openRunsAtStop = await pendingRuns(pool);
      const stoppedAt = Date.now();
      await redis.bounce(10_000);
      faults.downMs = Date.now() - stoppedAt;
      faults.acceptedWhileDown = load.accepted();
      const counts = await finishScenario({ scenario: 'redis-stopped-10s', installation, load, startedAt, receiver, faults });
      expectClean(counts, installation);
    },
    SCENARIO_TIMEOUT_MS,
  );
});
