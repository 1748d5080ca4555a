import { describe, expect, it } from 'vitest';
import { BACKEND } from './support/installation.js';
import { startLoad } from './support/load.js';
import { expectClean, expectedEcho, finishScenario, pendingRuns, runsClaimedBy, SCENARIO_TIMEOUT_MS, until } from './support/scenario.js';
import { sleep } from './support/services.js';
import { useFaultSuite } from './support/suite.js';

// Fault scenario: the single `keel start` process (role all) on the embedded default (its own
// Postgres in its data directory; on the Redis backend, queues on the suite's private Redis) is
// SIGKILLed under a load of 240 tasks, and started again on the same data directory and port. The
// killed process leaves its embedded Postgres running; the new one stops that orphan and starts its
// own. Clients get connection errors meanwhile and send again.

const suite = useFaultSuite({ postgres: 'embedded', receiver: () => ({ kind: 'ok', delayMs: 10 + Math.random() * 40 }) });

describe(`SIGKILL of the single all process on the ${BACKEND} queue backend`, () => {
  it(
    'the all process killed under load and restarted on the same data: nothing lost',
    async () => {
      const { receiver } = suite;
      const installation = await suite.install();
      const keel = await installation.addNode('all');
      const faults: Record<string, unknown> = {};

      const startedAt = Date.now();
      const load = startLoad({ apis: () => installation.apiUrls(), token: installation.token, count: 240, ratePerSecond: 20, maxInFlight: 60, pushUrl: receiver.url, expected: expectedEcho });

      const pool = await installation.pool();
      expect(await until(async () => load.accepted() >= 80 && (await runsClaimedBy(pool, keel)) >= 3, 60_000), 'runs in flight').toBe(true);
      await keel.kill();
      const killedAt = Date.now();
      faults.runsHeldAtKill = await runsClaimedBy(pool, keel);
      faults.openRunsAtKill = await pendingRuns(pool);
      faults.acceptedAtKill = load.accepted();
      await sleep(1000);
      await keel.start();
      await installation.afterEmbeddedStart();
      faults.downMs = Date.now() - killedAt;

      const counts = await finishScenario({ scenario: 'all-process-kill', installation, load, startedAt, receiver, faults });
      expectClean(counts, installation);
    },
    SCENARIO_TIMEOUT_MS,
  );
});
