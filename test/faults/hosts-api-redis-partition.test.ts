import { describe, expect, it } from 'vitest';
import { BACKEND } from './support/installation.js';
import { finishHostScenario, HOST_SCENARIO_TIMEOUT_MS, hostProblems, startHostLoad, startHostScenario } from './support/host-scenario.js';
import { HOSTS_UNAVAILABLE, useHostSuite } from './support/host-suite.js';
import { expectClean, until } from './support/scenario.js';
import { sleep } from './support/services.js';

// Across test hosts, on the Redis queue backend: an API host partitioned from the Redis host (it
// still reaches Postgres) for 15 s under load (the 30 s shortened: what is asserted, the
// API saying it is not ready and why, the clients going to the other API, nothing it accepted
// lost, shows within seconds of the cut). The clients do what a load balancer in front of the two
// API hosts does: they send only to an API whose /readyz answered 200 at its last probe (every
// 500 ms), and a request that fails is sent again to the other one.

const PARTITION_MS = 15_000;

const suite = useHostSuite({ receiver: () => ({ kind: 'ok', delayMs: 10 + Math.random() * 40 }), skip: BACKEND !== 'redis' });

type Probe = { at: number; status: number; body: { reasons?: Record<string, string> } | null };

async function probe(url: string): Promise<Probe> {
  try {
    const response = await fetch(`${url}/readyz`, { signal: AbortSignal.timeout(3000) });
    return { at: Date.now(), status: response.status, body: (await response.json()) as Probe['body'] };
  } catch {
    return { at: Date.now(), status: 0, body: null };
  }
}

describe.skipIf(HOSTS_UNAVAILABLE !== null || BACKEND !== 'redis')('an API host partitioned from Redis on the redis queue backend', () => {
  it(
    `API host cut off from the Redis host for ${PARTITION_MS / 1000} s under load: not ready with the reason, clients fail over, nothing it accepted lost`,
    async () => {
      const state = await startHostScenario(suite);
      const { cluster } = state;
      const [api1, api2] = cluster.apis;
      const faults: Record<string, unknown> = { partitionMs: PARTITION_MS };

      // The load balancer's view: the APIs that answered ready at their last probe.
      const ready = new Map<string, boolean>(cluster.installation.apiUrls().map((url) => [url, true]));
      const probes: Array<Probe & { url: string }> = [];
      let probing = true;
      const prober = (async () => {
        while (probing) {
          await Promise.all(
            [...ready.keys()].map(async (url) => {
              const result = await probe(url);
              probes.push({ ...result, url });
              ready.set(url, result.status === 200);
            }),
          );
          await sleep(500);
        }
      })();
      const readyApis = () => {
        const list = [...ready.entries()].filter(([, up]) => up).map(([url]) => url);
        return list.length > 0 ? list : [...ready.keys()];
      };

      const startedAt = Date.now();
      const load = startHostLoad(suite, state, { count: 300, rate: 15, apis: readyApis });
      expect(await until(() => load.accepted() >= 60, 30_000), 'tasks accepted before the cut').toBe(true);
      const acceptedByApi1BeforeCut = load.records.filter((record) => record.acceptedBy === api1.url).length;
      const heal = suite.network.partition(suite.hosts.api1, suite.hosts.redis);
      const cutAt = Date.now();
      await sleep(PARTITION_MS);
      heal();
      const healedAt = Date.now();
      expect(await until(async () => (await probe(api1.url)).status === 200, 60_000), 'the API ready again after the heal').toBe(true);
      faults.readyAgainAfterHealMs = Date.now() - healedAt;
      probing = false;
      await prober;

      const during = probes.filter((entry) => entry.url === api1.url && entry.at > cutAt && entry.at <= healedAt);
      const firstNotReady = during.find((entry) => entry.status === 503);
      faults.notReadyAfterCutMs = firstNotReady ? firstNotReady.at - cutAt : null;
      faults.notReadyReason = firstNotReady?.body?.reasons ?? null;
      faults.api1ProbesDuringCut = during.length;
      faults.api1NotReadyProbes = during.filter((entry) => entry.status === 503).length;
      faults.acceptedByApi1BeforeCut = acceptedByApi1BeforeCut;
      faults.acceptedByApi2 = load.records.filter((record) => record.acceptedBy === api2.url).length;

      const counts = await finishHostScenario({ scenario: 'hosts-api-redis-partition', suite, state, load, startedAt, healedAt, faults });
      expect(firstNotReady, 'the partitioned API answered /readyz 503').toBeDefined();
      expect(firstNotReady!.body?.reasons?.queue, 'with the queue as the reason').toBeTruthy();
      expect(firstNotReady!.body?.reasons?.database, 'its database still reachable').toBeUndefined();
      expectClean(counts, cluster.installation);
      expect(hostProblems(counts)).toEqual([]);
    },
    HOST_SCENARIO_TIMEOUT_MS,
  );
});
