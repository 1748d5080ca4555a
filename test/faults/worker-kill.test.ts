import { describe, expect, it } from 'vitest';
import { BACKEND } from './support/installation.js';
import { startLoad } from './support/load.js';
import { deliveriesInFlight, expectClean, finishScenario, projectionDebt, runsClaimedBy, SCENARIO_TIMEOUT_MS, until } from './support/scenario.js';
import { useFaultSuite } from './support/suite.js';

// Fault scenario: one API process and one worker process (`keel start --role api|worker`); under
// a load of 300 tasks (half blocking, each with a push config to a slowish loopback receiver) the
// worker is SIGKILLed three times and restarted each time: while it holds runs, while projections
// are owed, and while push deliveries are in flight. Leases expire, the reaper requeues, the
// sweeper restores projection and delivery debts; nothing may be lost, duplicated or undelivered.

const suite = useFaultSuite({ receiver: () => ({ kind: 'ok', delayMs: 20 + Math.random() * 100 }) });

describe(`worker SIGKILL on the ${BACKEND} queue backend`, () => {
  it(
    'a worker killed during runs, during projection and during push delivery, restarted each time: nothing lost',
    async () => {
      const { receiver } = suite;
      const installation = await suite.install();
      await installation.addNode('api');
      const worker = await installation.addNode('worker');
      const pool = await installation.pool();
      const faults: Record<string, unknown> = {};

      const startedAt = Date.now();
      const load = startLoad({ apis: () => installation.apiUrls(), token: installation.token, count: 300, ratePerSecond: 20, maxInFlight: 60, pushUrl: receiver.url, expected: (_a, text) => `echo: ${text}` });

      // 1. During runs: the worker holds several runs (inside their model calls).
      expect(await until(async () => (await runsClaimedBy(pool, worker)) >= 3, 30_000), 'the worker to hold runs').toBe(true);
      await worker.kill();
      faults.kill1RunsHeld = await runsClaimedBy(pool, worker);
      await worker.start();

      // 2. During projection: committed revisions owed to the journal, projected in the worker.
      expect(await until(async () => (await projectionDebt(pool)) >= 3 && (await runsClaimedBy(pool, worker)) >= 1, 30_000), 'projection debt').toBe(true);
      await worker.kill();
      faults.kill2ProjectionDebt = await projectionDebt(pool);
      faults.kill2RunsHeld = await runsClaimedBy(pool, worker);
      await worker.start();

      // 3. During push delivery: requests of the worker are in flight at the receiver.
      expect(await until(() => receiver.inFlight() >= 1, 30_000, 5), 'deliveries in flight').toBe(true);
      faults.kill3ReceiverInFlight = receiver.inFlight();
      await worker.kill();
      faults.kill3DeliveriesLeased = await deliveriesInFlight(pool);
      faults.kill3RunsHeld = await runsClaimedBy(pool, worker);
      await worker.start();

      const counts = await finishScenario({ scenario: 'worker-kill', installation, load, startedAt, receiver, faults });
      expectClean(counts, installation);
    },
    SCENARIO_TIMEOUT_MS,
  );
});
