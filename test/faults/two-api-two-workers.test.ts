import { sql, type DatabasePool } from 'slonik';
import { describe, expect, it } from 'vitest';
import { z } from 'zod';
import { createClient } from '../../src/auth/client-repository.js';
import { suspendedStateContext } from '../../src/runs/run-repository.js';
import { BACKEND, type Installation } from './support/installation.js';
import { startLoad } from './support/load.js';
import { expectClean, finishScenario, pendingRuns, runsClaimedBy, SCENARIO_TIMEOUT_MS, until } from './support/scenario.js';
import { freePort } from './support/services.js';
import { useFaultSuite } from './support/suite.js';

// Fault scenario: two API processes and two worker processes of one installation; the clients
// spread 240 tasks over both APIs (a third with a push config). Every sixth task goes to the
// `delegate` agent, which calls the installation's own `model` agent as a remote A2A agent through
// the `remote_agent` tool: its run waits on a dependency that the remote's push callback (to the
// first API's inbox) or the poller resolves. Halfway through, one worker is SIGKILLed and not
// restarted: the other worker takes over its runs, deliveries and dependencies.
//
// Dependencies resolved twice are counted by triggers the test adds to this scenario's own
// database: every resolution of a dependency and every run leaving waiting_for_dependency is logged.

const suite = useFaultSuite({ receiver: () => ({ kind: 'ok', delayMs: 10 + Math.random() * 40 }) });

const DELEGATE = {
  providers: { script: { type: 'scripted', steps: [{ toolCalls: [{ name: 'remote_agent', arguments: { agent: 'peer', message: 'ping' } }] }, { reply: 'delegated: {{tool_result}}' }] } },
  agent: { id: 'delegate', name: 'Delegate', provider: 'script', tools: ['remote_agent'], privacy: { answerLevel: 'full' } },
};

async function logResolutions(pool: DatabasePool): Promise<void> {
  await pool.query(sql.unsafe`CREATE TABLE faults_dependency_log (dependency_id uuid NOT NULL, state text NOT NULL, at timestamptz NOT NULL DEFAULT clock_timestamp())`);
  await pool.query(sql.unsafe`CREATE TABLE faults_resume_log (run_id uuid NOT NULL, status text NOT NULL, at timestamptz NOT NULL DEFAULT clock_timestamp())`);
  await pool.query(sql.unsafe`
    CREATE FUNCTION faults_log_dependency() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
      INSERT INTO faults_dependency_log (dependency_id, state) VALUES (NEW.id, NEW.state);
      RETURN NEW;
    END $$`);
  await pool.query(sql.unsafe`
    CREATE TRIGGER faults_dependency_log AFTER UPDATE OF state ON dependencies FOR EACH ROW
    WHEN (OLD.state IS DISTINCT FROM NEW.state AND NEW.state IN ('resolved', 'failed'))
    EXECUTE FUNCTION faults_log_dependency()`);
  await pool.query(sql.unsafe`
    CREATE FUNCTION faults_log_resume() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
      INSERT INTO faults_resume_log (run_id, status) VALUES (NEW.id, NEW.status);
      RETURN NEW;
    END $$`);
  await pool.query(sql.unsafe`
    CREATE TRIGGER faults_resume_log AFTER UPDATE OF status ON runs FOR EACH ROW
    WHEN (OLD.status = 'waiting_for_dependency' AND NEW.status IS DISTINCT FROM OLD.status)
    EXECUTE FUNCTION faults_log_resume()`);
}

const n = z.object({ n: z.number() });

/** A delegation answers with the remote's result, or says that the remote never acknowledged the message. */
const expected = (agent: string, text: string) => (agent === 'delegate' ? ['echo: ping', 'never acknowledged the message'] : `echo: ${text}`);

async function dependencyCounts(pool: DatabasePool): Promise<{ count: number; resolvedTwice: number }> {
  const count = await pool.oneFirst(sql.type(n)`SELECT count(*)::int AS n FROM dependencies`);
  const resolvedTwice = await pool.oneFirst(sql.type(n)`
    SELECT count(*)::int AS n FROM (SELECT dependency_id FROM faults_dependency_log GROUP BY dependency_id HAVING count(*) > 1) twice`);
  const resumedTwice = await pool.oneFirst(sql.type(n)`
    SELECT count(*)::int AS n FROM (
      SELECT l.run_id FROM faults_resume_log l GROUP BY l.run_id
      HAVING count(*) > (SELECT count(*) FROM dependencies d WHERE d.run_id = l.run_id)) twice`);
  return { count, resolvedTwice: resolvedTwice + resumedTwice };
}

/** What a run left waiting on a dependency is waiting for (printed when a scenario leaves one). */
async function explainStuck(installation: Installation): Promise<string> {
  const pool = await installation.pool();
  const runs = await pool.any(sql.type(z.object({ id: z.string(), status: z.string(), requeue_count: z.number(), revision: z.number(), suspended_state: z.instanceof(Buffer).nullable() }))`
    SELECT id, status, requeue_count, revision, suspended_state FROM runs WHERE status NOT IN ('completed', 'failed', 'cancelled')`);
  const lines: string[] = [];
  for (const run of runs) {
    const opened = run.suspended_state ? installation.sealer.openJson<{ pendingDependency?: unknown }>(suspendedStateContext(run.id), run.suspended_state) : null;
    lines.push(`run ${run.id} ${run.status} requeues ${run.requeue_count} revision ${run.revision} waits on ${JSON.stringify(opened?.ok ? opened.value.pendingDependency : null)}`);
    const deps = await pool.any(sql.unsafe`SELECT id, state, tool_call_id, remote_task_id, outcome, polls, next_poll_at, created_at, resolved_at FROM dependencies WHERE run_id = ${run.id}`);
    lines.push(`  dependencies ${JSON.stringify(deps)}`);
    const events = await pool.anyFirst(sql.unsafe`SELECT kind || ':' || coalesce(payload->>'worker', '') FROM run_events WHERE run_id = ${run.id} ORDER BY sequence`);
    lines.push(`  events ${JSON.stringify(events)}`);
  }
  return lines.join('\n');
}

describe(`two API and two worker processes on the ${BACKEND} queue backend`, () => {
  it(
    'clients across both APIs, one worker killed halfway: nothing lost, no dependency resolved twice',
    async () => {
      const apiPort = await freePort();
      const api1 = `http://127.0.0.1:${apiPort}`;
      const { model, receiver } = suite;
      const installation = await suite.install({
        env: {
          KEEL_PROVIDERS: JSON.stringify({ fake: { type: 'openai', baseUrl: model.baseUrl, model: 'fake', timeoutSeconds: 10 }, ...DELEGATE.providers }),
          KEEL_AGENTS: JSON.stringify([{ id: 'model', name: 'Model', provider: 'fake', privacy: { answerLevel: 'full' } }, DELEGATE.agent]),
          KEEL_REMOTE_AGENTS: JSON.stringify([{ id: 'peer', cardUrl: `${api1}/a2a/model/.well-known/agent-card.json`, credentialEnv: 'FAULTS_PEER_TOKEN' }]),
          // A delegation whose worker was killed while its message was on the way, before the remote
          // took it, is never acknowledged: it fails (and its run answers so) after this, not 10 min.
          KEEL_INBOX_UNACKNOWLEDGED_GIVE_UP_SECONDS: '15',
        },
      });
      const pool = await installation.pool();
      await logResolutions(pool);
      const peer = await createClient(pool, 'peer');
      if (!peer.ok) throw new Error('cannot create the peer client');
      installation.env.FAULTS_PEER_TOKEN = peer.token;

      await installation.addNode('api', {}, apiPort);
      await installation.addNode('api');
      // Remote agents push their callbacks to the first API's inbox.
      const workerA = await installation.addNode('worker', { KEEL_SERVER_PUBLIC_URL: api1 });
      const workerB = await installation.addNode('worker', { KEEL_SERVER_PUBLIC_URL: api1 });
      const faults: Record<string, unknown> = {};

      const startedAt = Date.now();
      const load = startLoad({
        apis: () => installation.apiUrls(),
        token: installation.token,
        count: 240,
        ratePerSecond: 20,
        maxInFlight: 60,
        agentOf: (index) => (index % 6 === 5 ? 'delegate' : 'model'),
        pushUrl: receiver.url,
        pushFor: (index) => index % 3 === 0,
        expected,
      });

      expect(await until(async () => load.accepted() >= 120 && (await runsClaimedBy(pool, workerA)) >= 2, 60_000), 'worker A to hold runs halfway').toBe(true);
      faults.killedWorkerRunsHeld = await runsClaimedBy(pool, workerA);
      faults.otherWorkerRunsHeld = await runsClaimedBy(pool, workerB);
      faults.openRunsAtKill = await pendingRuns(pool);
      faults.waitingOnDependenciesAtKill = await pool.oneFirst(sql.type(n)`SELECT count(*)::int AS n FROM runs WHERE status = 'waiting_for_dependency'`);
      await workerA.kill();

      const counts = await finishScenario({
        scenario: 'two-api-two-workers',
        installation,
        load,
        startedAt,
        receiver,
        faults: async () => ({
          ...faults,
          delegationsNotAcknowledged: await pool.oneFirst(sql.type(n)`SELECT count(*)::int AS n FROM dependencies WHERE outcome = 'not_acknowledged'`),
        }),
        expected,
        dependencies: dependencyCounts,
      });
      if (counts.database.unfinished > 0) console.info(await explainStuck(installation));
      // Both APIs took their share of the tasks.
      for (const url of installation.apiUrls()) expect(load.records.filter((record) => record.acceptedBy === url).length).toBeGreaterThan(60);
      expect(counts.dependencies).toBeGreaterThanOrEqual(40);
      expectClean(counts, installation);
    },
    SCENARIO_TIMEOUT_MS,
  );
});
