import { describe, expect, it } from 'vitest';
import { BACKEND } from './support/installation.js';
import { startLoad } from './support/load.js';
import { expectClean, expectedEcho, finishScenario, pendingRuns, runsClaimedBy, SCENARIO_TIMEOUT_MS, until } from './support/scenario.js';
import { useFaultSuite } from './support/suite.js';

// Fault scenario: the database restarted under load. The suite's private embedded Postgres is shut
// down fast (every connection dropped), stays down 3 s and comes back on the same port, while one
// API process and one worker process serve 240 tasks. Keel must reconnect without operator action:
// the slonik pool, the journal listener (LISTEN), and on the Postgres queue backend BullMQ itself.

const suite = useFaultSuite({ receiver: () => ({ kind: 'ok', delayMs: 10 + Math.random() * 40 }) });

describe(`Postgres restarted under load on the ${BACKEND} queue backend`, () => {
  it(
    'a fast shutdown and restart of Postgres: Keel reconnects by itself, nothing lost',
    async () => {
      const { postgres, receiver } = suite;
      const installation = await suite.install();
      const api = await installation.addNode('api');
      const worker = await installation.addNode('worker');
      const pool = await installation.pool();
      const faults: Record<string, unknown> = {};
      const startedAt = Date.now();
      const load = startLoad({
        apis: () => installation.apiUrls(),
        token: installation.token,
        count: 240,
        ratePerSecond: 20,
        maxInFlight: 60,
        pushUrl: receiver.url,
        pushFor: (index) => index % 3 === 0,
        expected: expectedEcho,
      });
      expect(await until(async () => load.accepted() >= 80 && (await runsClaimedBy(pool, worker)) >= 3, 60_000), 'runs in flight').toBe(true);
      faults.runsHeldAtRestart = await runsClaimedBy(pool, worker);
      faults.openRunsAtRestart = await pendingRuns(pool);
      const stoppedAt = Date.now();
      await postgres.restart(3000);
      faults.downMs = Date.now() - stoppedAt;
      const counts = await finishScenario({ scenario: 'postgres-restart', installation, load, startedAt, receiver, faults });
      // Both processes lived through it: nobody restarted them.
      expect(api.generations).toHaveLength(1);
      expect(worker.generations).toHaveLength(1);
      expect(api.alive && worker.alive).toBe(true);
      expectClean(counts, installation);
    },
    SCENARIO_TIMEOUT_MS,
  );
});
