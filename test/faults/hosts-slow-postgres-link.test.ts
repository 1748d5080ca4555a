import { sql } from 'slonik';
import { describe, expect, it } from 'vitest';
import { z } from 'zod';
import { BACKEND } from './support/installation.js';
import { finishHostScenario, HOST_SCENARIO_TIMEOUT_MS, hostProblems, startHostLoad, startHostScenario } from './support/host-scenario.js';
import { HOSTS_UNAVAILABLE, useHostSuite } from './support/host-suite.js';
import { expectClean } from './support/scenario.js';
import { sleep } from './support/services.js';

// Across test hosts: every packet from either worker host to the Postgres host delayed 100 ms
// ± 50 ms (uniform, per packet: the jitter reorders them) and 2 % of them dropped, as `tc netem
// delay 100ms 50ms loss 2%` on the workers' links toward Postgres would, for 30 s under load (the
// issue's minute halved: the load, 240 tasks at 8 a second, runs inside the 30 s, and every
// statement a worker makes during it pays the delay and the retransmissions). The lease is 6 s,
// the heartbeat 2 s: a heartbeat that is slow, not lost, must not cost a worker its runs.

const IMPAIRED_MS = 30_000;

const suite = useHostSuite({ receiver: () => ({ kind: 'ok', delayMs: 10 + Math.random() * 40 }) });

const n = z.object({ n: z.number() });

describe.skipIf(HOSTS_UNAVAILABLE !== null)(`a slow, lossy link between the workers and Postgres on the ${BACKEND} queue backend`, () => {
  it(
    `100 ms ± 50 ms and 2 % loss from the worker hosts to the Postgres host for ${IMPAIRED_MS / 1000} s under load: nothing lost, nothing done twice`,
    async () => {
      const state = await startHostScenario(suite);
      const { cluster, pool } = state;
      const { hosts, network } = suite;
      const faults: Record<string, unknown> = { impairedMs: IMPAIRED_MS, delayMs: 100, jitterMs: 50, lossPercent: 2 };

      const heal = await network.impair([hosts.worker1, hosts.worker2], hosts.postgres, { delayMs: 100, jitterMs: 50, lossPercent: 2 });
      const startedAt = Date.now();
      const load = startHostLoad(suite, state, { count: 240, rate: 8 });
      await sleep(IMPAIRED_MS);
      faults.completedDuringImpairment = await pool.oneFirst(sql.type(n)`SELECT count(*)::int AS n FROM runs WHERE status = 'completed'`);
      faults.openAtHeal = await pool.oneFirst(sql.type(n)`SELECT count(*)::int AS n FROM runs WHERE status IN ('queued', 'running')`);
      faults.requeuedDuringImpairment = await pool.oneFirst(sql.type(n)`SELECT count(*)::int AS n FROM runs WHERE requeue_count > 0`);
      heal();
      const healedAt = Date.now();

      const counts = await finishHostScenario({ scenario: 'hosts-slow-postgres-link', suite, state, load, startedAt, healedAt, faults });
      expectClean(counts, cluster.installation);
      expect(hostProblems(counts)).toEqual([]);
    },
    HOST_SCENARIO_TIMEOUT_MS,
  );
});
