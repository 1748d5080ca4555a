import { sql } from 'slonik';
import { describe, expect, it } from 'vitest';
import { z } from 'zod';
import { BACKEND } from './support/installation.js';
import { finishHostScenario, watchSessions, HOST_LEASE_SECONDS, HOST_SCENARIO_TIMEOUT_MS, hostProblems, startHostLoad, startHostScenario } from './support/host-scenario.js';
import { HOSTS_UNAVAILABLE, useHostSuite } from './support/host-suite.js';
import { expectClean, until } from './support/scenario.js';
import { sleep } from './support/services.js';

// Across test hosts: the Postgres host cut off from everything (its link down: no packet in or
// out, no connection refused or reset, every open connection silent) for 20 s under load, then
// healed, as the issue has it. With the lease of 6 s every run held at the cut has lost its lease
// when Postgres answers again (its job's lock too), and each worker must find its own runs
// taken over by whichever worker reaches them first (requeued, or dead-lettered inside the
// non-idempotent step) and have what it writes late refused. The APIs answer what they can
// meanwhile; the clients send again what was not accepted.

const CUT_MS = 20_000;

const suite = useHostSuite({ receiver: () => ({ kind: 'ok', delayMs: 10 + Math.random() * 40 }) });

const n = z.object({ n: z.number() });

describe.skipIf(HOSTS_UNAVAILABLE !== null)(`the Postgres host cut off on the ${BACKEND} queue backend`, () => {
  it(
    `Postgres host cut off from everything for ${CUT_MS / 1000} s under load, then healed: nothing lost, nothing done twice`,
    async () => {
      const state = await startHostScenario(suite, { chargeMs: 3000 });
      const { cluster, pool } = state;
      const faults: Record<string, unknown> = { cutMs: CUT_MS, leaseSeconds: HOST_LEASE_SECONDS };

      const startedAt = Date.now();
      const load = startHostLoad(suite, state);
      const stopWatching = watchSessions(pool, startedAt);
      const running = () => pool.oneFirst(sql.type(n)`SELECT count(*)::int AS n FROM runs WHERE status = 'running'`);
      expect(await until(async () => load.accepted() >= 80 && (await running()) >= 4, 30_000), 'runs held before the cut').toBe(true);
      faults.runsHeldAtCut = await running();
      faults.insideChargeAtCut = await pool.oneFirst(sql.type(n)`SELECT count(*)::int AS n FROM runs WHERE status = 'running' AND inside_non_idempotent_call IS NOT NULL`);
      faults.acceptedAtCut = load.accepted();
      const heal = suite.network.cut(suite.hosts.postgres);
      await sleep(CUT_MS);
      faults.acceptedDuringCut = load.accepted() - (faults.acceptedAtCut as number);
      heal();
      const healedAt = Date.now();

      const counts = await finishHostScenario({ scenario: 'hosts-postgres-cutoff', suite, state, load, startedAt, healedAt, faults });
      stopWatching();
      expectClean(counts, cluster.installation);
      expect(hostProblems(counts)).toEqual([]);
    },
    HOST_SCENARIO_TIMEOUT_MS,
  );
});
