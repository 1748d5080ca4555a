import { describe, expect, it } from 'vitest';
import { BACKEND } from './support/installation.js';
import { startLoad } from './support/load.js';
import { expectClean, expectedEcho, finishScenario, pendingRuns, runsClaimedBy, SCENARIO_TIMEOUT_MS, until } from './support/scenario.js';
import { sleep, type CrashMode } from './support/services.js';
import { useFaultSuite } from './support/suite.js';

// Fault scenario: Postgres crashes under load. Unlike a fast shutdown, a crash (`pg_ctl stop -m
// immediate`, or SIGKILL of the postmaster) drops every connection while queries are in flight and
// leaves a server that must replay its WAL when it starts again: for a moment it answers "the
// database system is not yet accepting connections". One API and one worker process serve 240
// nonblocking tasks, each with a push config. Keel must answer again within seconds of the
// server's return, by itself, and lose nothing; while the database is down /readyz answers within
// its own timeout and says why it is not ready.

/** How long Keel may take to answer again once Postgres accepts connections: seconds, not minutes. */
const ANSWER_AGAIN_BOUND_MS = 15_000;
/** /readyz probes with a 2 s deadline; the margin is for a loaded two-core machine. */
const READYZ_ANSWER_BOUND_MS = 4_000;

const suite = useFaultSuite({ receiver: () => ({ kind: 'ok', delayMs: 10 + Math.random() * 40 }) });

type Readyz = { status: number; elapsedMs: number; body: { status?: string; reasons?: { database?: string } } | null };

async function readyz(baseUrl: string): Promise<Readyz> {
  const started = Date.now();
  try {
    const response = await fetch(`${baseUrl}/readyz`, { signal: AbortSignal.timeout(30_000) });
    return { status: response.status, elapsedMs: Date.now() - started, body: (await response.json()) as Readyz['body'] };
  } catch {
    return { status: 0, elapsedMs: Date.now() - started, body: null };
  }
}

/** One A2A call that needs the database: GetTask of a task that does not exist (TaskNotFound, -32001). */
async function answersA2A(baseUrl: string, token: string): Promise<boolean> {
  const response = await fetch(`${baseUrl}/a2a/model`, {
    method: 'POST',
    headers: { authorization: `Bearer ${token}`, 'a2a-version': '1.0', 'content-type': 'application/json' },
    body: JSON.stringify({ jsonrpc: '2.0', id: 1, method: 'GetTask', params: { id: '00000000-0000-4000-8000-000000000000' } }),
    signal: AbortSignal.timeout(3000),
  });
  const body = (await response.json()) as { error?: { code?: number } };
  return body.error?.code === -32001;
}

describe(`Postgres crashed under load on the ${BACKEND} queue backend`, () => {
  it.each<[CrashMode, string]>([
    ['immediate', 'an immediate stop (pg_ctl stop -m immediate)'],
    ['kill', 'SIGKILL of the postmaster'],
  ])(
    '%s: after %s and crash recovery Keel answers again within seconds, nothing lost',
    async (mode) => {
      const { postgres, receiver } = suite;
      const installation = await suite.install();
      const api = await installation.addNode('api');
      const worker = await installation.addNode('worker');
      const pool = await installation.pool();
      const faults: Record<string, unknown> = { mode };
      const startedAt = Date.now();
      const load = startLoad({
        apis: () => installation.apiUrls(),
        token: installation.token,
        count: 240,
        ratePerSecond: 20,
        maxInFlight: 16,
        blocking: () => false,
        pushUrl: receiver.url,
        pushFor: () => true,
        expected: expectedEcho,
      });
      expect(await until(async () => load.accepted() >= 100 && (await runsClaimedBy(pool, worker)) >= 3, 60_000), 'runs in flight').toBe(true);
      faults.runsHeldAtCrash = await runsClaimedBy(pool, worker);
      faults.openRunsAtCrash = await pendingRuns(pool);

      const crashedAt = Date.now();
      const crash = postgres.crash(mode, 3000);
      // While the server is down, /readyz answers within its own timeout and names the database.
      await sleep(1000);
      const whileDown = await Promise.all([readyz(api.url), readyz(worker.url)]);
      const report = await crash;
      const backAt = Date.now();
      faults.downMs = backAt - crashedAt;
      faults.crashRecovery = report.recovered;
      faults.readyzWhileDown = whileDown.map((probe) => ({ status: probe.status, elapsedMs: probe.elapsedMs, reason: probe.body?.reasons?.database }));
      for (const probe of whileDown) {
        expect(probe.elapsedMs, 'readyz answered within its timeout').toBeLessThan(READYZ_ANSWER_BOUND_MS);
        expect(probe.status).toBe(503);
        expect(probe.body?.status).toBe('not_ready');
        expect(probe.body?.reasons?.database, 'readyz says why').toMatch(/\S/);
      }
      // The server went through crash recovery, not a clean start.
      expect(report.recovered, 'Postgres replayed its WAL').toBe(true);

      // Keel answers again: both processes ready, and an A2A call that reads the database.
      let lastSeen: unknown = null;
      const answering = await until(
        async () => {
          const probes = await Promise.all([readyz(api.url), readyz(worker.url)]);
          const a2a = await answersA2A(api.url, installation.token).catch((error: Error) => error.message);
          lastSeen = { readyz: probes.map((probe) => [probe.status, probe.elapsedMs, probe.body]), a2a };
          return probes.every((probe) => probe.status === 200) && a2a === true;
        },
        ANSWER_AGAIN_BOUND_MS,
        100,
      );
      faults.answeringAgainMs = Date.now() - backAt;
      expect(answering, `Keel answers again within ${ANSWER_AGAIN_BOUND_MS} ms of Postgres's return; last seen ${JSON.stringify(lastSeen)}`).toBe(true);

      const counts = await finishScenario({ scenario: `postgres-crash-${mode}`, installation, load, startedAt, receiver, faults });
      // Both processes lived through it: nobody restarted them.
      expect(api.generations).toHaveLength(1);
      expect(worker.generations).toHaveLength(1);
      expect(api.alive && worker.alive).toBe(true);
      expectClean(counts, installation);
    },
    SCENARIO_TIMEOUT_MS,
  );

  it('a frozen Postgres (every process stopped, connections open): /readyz still answers within its timeout and says why', async () => {
    const { postgres } = suite;
    const installation = await suite.install();
    const api = await installation.addNode('api');
    await postgres.freeze();
    let whileFrozen: Readyz;
    try {
      whileFrozen = await readyz(api.url);
    } finally {
      await postgres.thaw();
    }
    expect(whileFrozen.elapsedMs, 'readyz answered within its timeout').toBeLessThan(READYZ_ANSWER_BOUND_MS);
    expect(whileFrozen.status).toBe(503);
    expect(whileFrozen.body?.reasons?.database).toBe('no answer from the database within 2000 ms');
    expect(await until(async () => (await readyz(api.url)).status === 200, ANSWER_AGAIN_BOUND_MS, 100), 'ready again once thawed').toBe(true);
  });
});
