import { describe, expect, it } from 'vitest';
import { BACKEND, type Installation } from './support/installation.js';
import { startLoad } from './support/load.js';
import { expectClean, expectedEcho, finishScenario, pendingRuns, SCENARIO_TIMEOUT_MS, until } from './support/scenario.js';
import type { PrivateRedis } from './support/services.js';
import { useFaultSuite } from './support/suite.js';

// Fault scenarios of the queue's Redis (the suite's private redis-server, never the shared one):
// FLUSHALL under load, and Redis stopped for 10 s and started again (empty: no persistence). Every
// job is only a wake-up; the debts are rows in Postgres and the sweeper gives them their jobs back
// (its own schedule included). One API process and one worker process, 240 tasks each.
//
// On the Postgres queue backend there is no Redis at all: these scenarios do not apply and are
// skipped (KEEL_TEST_QUEUE=redis runs them).

// Each scenario has a Redis of its own (flushed or stopped by it), not one for the file.
const suite = useFaultSuite({ skip: BACKEND !== 'redis', redis: 'none', receiver: () => ({ kind: 'ok', delayMs: 10 + Math.random() * 40 }) });

async function setUp(): Promise<{ installation: Installation; redis: PrivateRedis }> {
  const redis = await suite.startRedis();
  const installation = await suite.install({ redis });
  await installation.addNode('api');
  await installation.addNode('worker');
  return { installation, redis };
}

describe.skipIf(BACKEND !== 'redis')('the queue Redis flushed or stopped (Redis queue backend)', () => {
  it(
    'FLUSHALL under load: the sweeper restores every job, nothing lost',
    async () => {
      const { installation, redis } = await setUp();
      const { receiver } = suite;
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
      const { receiver } = suite;
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
