import { sql, type DatabasePool } from 'slonik';
import { z } from 'zod';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createTestDatabase, type TestDatabase } from '../../support/test-database.js';
import { startTestKeel, type TestKeel } from '../../support/test-keel.js';
import { waitFor } from '../../support/wait-for.js';
import {
  LOOPBACK,
  artifactText,
  callbackBodies,
  callbacksOfDependency,
  delegatingOverrides,
  dependenciesOf,
  freePort,
  newToken,
  occurrences,
  registrationsOf,
  runEventKinds,
  runSummary,
  sendLocal,
  waitForLocalTask,
} from './remote-support.js';

// A second Keel instance as the remote, in both directions of push: Keel A delegates to Keel B's
// `worker` (registration embedded; B pushes to A's inbox) and Keel B delegates to Keel A's `worker`
// (registration separate; A pushes to B's inbox). Each side authenticates to the other with a
// client token the other issued (credentialEnv). Both Keels run in this process, on loopback.
//
// KEEL_PRINT_SEQUENCE=1 prints, for each delegation, the rows both sides wrote in time order
// (docs/client-role.md was taken from that output).

/** peerClient: the name of the client the other Keel issued to this one (its tasks there are owned by it). */
type Side = { name: 'A' | 'B'; keel: TestKeel; database: TestDatabase; url: string; testToken: string; peerClient: string };
let a: Side;
let b: Side;

const workerReply = (side: 'A' | 'B') => `work done by keel-${side.toLowerCase()}`;

beforeAll(async () => {
  const [databaseA, databaseB] = await Promise.all([createTestDatabase(), createTestDatabase()]);
  // Each side's credential for the other is a client token the other issued, before either starts.
  const tokenForB = await newToken(databaseB.pool, 'keel-a');
  const tokenForA = await newToken(databaseA.pool, 'keel-b');
  const [portA, portB] = [await freePort(), await freePort()];
  const urlA = `http://${LOOPBACK}:${portA}`;
  const urlB = `http://${LOOPBACK}:${portB}`;
  const worker = (side: 'A' | 'B') => ({
    providers: { worker: { type: 'scripted', steps: [{ delayMs: 600, reply: workerReply(side) }] } },
    agents: [{ id: 'worker', name: `Worker of keel-${side.toLowerCase()}`, provider: 'worker' }],
  });
  const [keelA, keelB] = await Promise.all([
    startTestKeel({
      databaseUrl: databaseA.url,
      env: { KEEL_B_TOKEN: tokenForB },
      overrides: {
        ...delegatingOverrides([{ id: 'keel-b', cardUrl: `${urlB}/a2a/worker/.well-known/agent-card.json`, credentialEnv: 'KEEL_B_TOKEN', registration: 'embedded' }], worker('A')),
        KEEL_SERVER_PORT: String(portA),
      },
    }),
    startTestKeel({
      databaseUrl: databaseB.url,
      env: { KEEL_A_TOKEN: tokenForA },
      overrides: {
        ...delegatingOverrides([{ id: 'keel-a', cardUrl: `${urlA}/a2a/worker/.well-known/agent-card.json`, credentialEnv: 'KEEL_A_TOKEN', registration: 'separate' }], worker('B')),
        KEEL_SERVER_PORT: String(portB),
      },
    }),
  ]);
  a = { name: 'A', keel: keelA, database: databaseA, url: urlA, testToken: await newToken(databaseA.pool, 'tester'), peerClient: 'keel-a' };
  b = { name: 'B', keel: keelB, database: databaseB, url: urlB, testToken: await newToken(databaseB.pool, 'tester'), peerClient: 'keel-b' };
});
afterAll(async () => {
  await Promise.all([a?.keel.dispose(), b?.keel.dispose()]);
  await Promise.all([a?.database.drop(), b?.database.drop()]);
});

const remoteTaskRow = z.object({ id: z.string(), agent: z.string(), state: z.string(), owner_name: z.string(), run_id: z.string() });
const pushConfigRow = z.object({ id: z.string(), url: z.string(), auth_scheme: z.string().nullable(), state: z.string(), created_at: z.number() });
const deliveryRow = z.object({ id: z.string(), event_sequence: z.number(), state: z.string(), attempts: z.number(), event_kind: z.string(), event_state: z.string().nullable() });

async function deliveriesOf(pool: DatabasePool, taskId: string) {
  return pool.any(sql.type(deliveryRow)`
    SELECT d.id, d.event_sequence, d.state, d.attempts, e.kind AS event_kind, e.state AS event_state
    FROM push_deliveries d JOIN a2a_events e ON e.task_id = d.task_id AND e.sequence = d.event_sequence
    WHERE d.task_id = ${taskId} ORDER BY d.event_sequence`);
}

/**
 * `local` delegates to `remote`'s worker through its `to-keel-x` agent; checks the answer, the rows
 * on both sides and that every push the remote delivered is a callback in the local inbox.
 */
async function delegate(local: Side, remote: Side, registration: 'embedded' | 'separate') {
  const remoteId = `keel-${remote.name.toLowerCase()}`;
  const agent = `to-${remoteId}`;
  const { taskId, runId } = await sendLocal(local.keel, local.testToken, agent, `delegate to ${remoteId}`);
  const task = await waitForLocalTask(local.keel, local.testToken, agent, taskId);
  expect(task.status?.state, 'the local task completed').toBe(3);
  const expected = JSON.stringify({ state: 'completed', result: workerReply(remote.name) });
  const answer = artifactText(task);
  expect(answer).toBe(`remote said: ${expected}`);
  expect(occurrences(answer, workerReply(remote.name))).toBe(1);

  // Local rows: one dependency resolved with the remote task id; the run resumed once.
  const [dependency, ...others] = await dependenciesOf(local.keel.context.pool, runId);
  expect(others).toEqual([]);
  expect(dependency).toMatchObject({ remote_agent: remoteId, state: 'resolved', outcome: 'completed' });
  expect(await runSummary(local.keel.context.pool, runId)).toMatchObject({ status: 'completed', tool_calls: 1, iterations: 2 });
  expect((await runEventKinds(local.keel.context.pool, runId)).filter((kind) => kind === 'resumed')).toHaveLength(1);
  const [reg, ...moreRegs] = await registrationsOf(local.keel.context.pool, dependency!.id);
  expect(moreRegs).toEqual([]);

  // Remote rows: the task, owned by the client the remote issued to the local Keel, ran the delegated message.
  const remoteTask = await remote.keel.context.pool.one(sql.type(remoteTaskRow)`
    SELECT t.id, t.agent, t.state, c.name AS owner_name, t.run_id FROM a2a_tasks t JOIN clients c ON c.id = t.owner WHERE t.id = ${dependency!.remote_task_id}`);
  expect(remoteTask).toMatchObject({ agent: 'worker', state: 'TASK_STATE_COMPLETED', owner_name: local.peerClient });
  // The push config the remote holds points at the local registration, with a Bearer credential.
  const configs = await remote.keel.context.pool.any(sql.type(pushConfigRow)`
    SELECT id, url, auth_scheme, state, created_at FROM push_configs WHERE task_id = ${remoteTask.id}`);
  expect(configs).toHaveLength(1);
  expect(configs[0]).toMatchObject({ url: `${local.keel.config.server.publicUrl}/a2a/inbox/${reg!.id}`, auth_scheme: 'Bearer', state: 'active' });
  if (registration === 'separate') expect(reg!.remote_config_id).toBe(configs[0]!.id);
  else expect(reg!.remote_config_id).toBeNull();

  // Every delivery of the remote's outbox ended delivered, and each is one callback in the local inbox.
  const deliveries = await waitFor(
    async () => {
      const rows = await deliveriesOf(remote.keel.context.pool, remoteTask.id);
      return rows.length > 0 && rows.every((row) => row.state === 'delivered') && rows.some((row) => row.event_state === 'TASK_STATE_COMPLETED') ? rows : null;
    },
    `${remote.name}'s deliveries to ${local.name}'s inbox`,
  );
  const callbacks = await waitFor(
    async () => {
      const rows = await callbacksOfDependency(local.keel.context.pool, dependency!.id);
      return rows.length === deliveries.length && rows.every((row) => row.processed_at !== null) ? rows : null;
    },
    `${local.name}'s inbox to hold and process every delivered push`,
  );
  expect(callbacks.every((row) => row.registration_id === reg!.id)).toBe(true);
  const bodies = await callbackBodies(local.keel, dependency!.id);
  expect(bodies.at(-1)?.statusUpdate?.status?.state).toBe('TASK_STATE_COMPLETED');
  for (const body of bodies) expect(body.statusUpdate?.taskId ?? body.artifactUpdate?.taskId ?? body.task?.id).toBe(remoteTask.id);
  if (process.env.KEEL_PRINT_SEQUENCE) await printSequence(registration, local, remote, runId, taskId, dependency!.id, remoteTask.id, remoteTask.run_id);
  return { dependency: dependency!, deliveries, callbacks };
}

describe('a second Keel instance as the remote', () => {
  it('A delegates to B (embedded registration): B pushes to A’s inbox, A reconciles by GetTask and completes', async () => {
    const { deliveries } = await delegate(a, b, 'embedded');
    // With the config in the message, B's outbox had every event of the task: WORKING, the artifact, COMPLETED.
    expect(deliveries.map((row) => row.event_state ?? row.event_kind)).toEqual(['TASK_STATE_WORKING', 'artifact', 'TASK_STATE_COMPLETED']);
  });

  it('B delegates to A (separate registration): A pushes to B’s inbox, B reconciles by GetTask and completes', async () => {
    await delegate(b, a, 'separate');
  });

  it('both directions at once', async () => {
    await Promise.all([delegate(a, b, 'embedded'), delegate(b, a, 'separate')]);
  });
});

// ---------------------------------------------------------------------------------------------
// The sequence of one delegation, as rows (KEEL_PRINT_SEQUENCE=1)
// ---------------------------------------------------------------------------------------------

type Entry = { at: number; side: string; row: string };

async function printSequence(registration: 'embedded' | 'separate', local: Side, remote: Side, runId: string, taskId: string, dependencyId: string, remoteTaskId: string, remoteRunId: string) {
  const entries: Entry[] = [];
  const rows = async (side: Side, query: Parameters<DatabasePool['any']>[0], format: (row: Record<string, unknown>) => Entry[]) => {
    for (const row of await side.keel.context.pool.any(query)) entries.push(...format(row as Record<string, unknown>).map((entry) => ({ ...entry, side: side.name })));
  };
  const t = z.object({}).passthrough();
  const at = (value: unknown) => Number(value);
  const L = local;
  const R = remote;
  await rows(L, sql.type(t)`SELECT created_at, id, state FROM a2a_tasks WHERE id = ${taskId}`, (r) => [{ at: at(r.created_at), side: '', row: `a2a_tasks + runs INSERT: local task ${short(r.id)} SUBMITTED, run ${short(runId)} queued` }]);
  await rows(L, sql.type(t)`SELECT created_at, sequence, kind, payload FROM run_events WHERE run_id = ${runId} ORDER BY sequence`, (r) => [{ at: at(r.created_at), side: '', row: `run_events #${String(r.sequence)} ${String(r.kind)} ${JSON.stringify(pick(r.payload))}` }]);
  await rows(L, sql.type(t)`SELECT updated_at, remote_agent, error FROM remote_cards`, (r) => [{ at: at(r.updated_at), side: '', row: `remote_cards UPSERT: ${String(r.remote_agent)} card cached (error ${String(r.error)})` }]);
  await rows(L, sql.type(t)`SELECT * FROM dependencies WHERE id = ${dependencyId}`, (r) => [
    {
      at: at(r.created_at),
      side: '',
      row:
        registration === 'separate'
          ? `dependencies INSERT: ${short(r.id)} state waiting, remote_task_id ${short(r.remote_task_id)} (acknowledged), tool_call ${String(r.tool_call_id)}`
          : `dependencies INSERT: ${short(r.id)} state pending, no remote_task_id, tool_call ${String(r.tool_call_id)} (then UPDATE waiting + remote_task_id ${short(r.remote_task_id)} once SendMessage answers)`,
    },
    { at: at(r.resolved_at), side: '', row: `dependencies UPDATE: state ${String(r.state)} outcome ${String(r.outcome)} remote_task_id ${short(r.remote_task_id)} polls ${String(r.polls)}` },
  ]);
  await rows(L, sql.type(t)`SELECT id, created_at, remote_config_id FROM inbox_registrations WHERE dependency_id = ${dependencyId}`, (r) => [{ at: at(r.created_at), side: '', row: `inbox_registrations INSERT: ${short(r.id)} (credential hash) remote_config_id ${String(r.remote_config_id)}` }]);
  await rows(L, sql.type(t)`SELECT c.id, c.kind, c.received_at, c.processed_at FROM inbox_callbacks c JOIN inbox_registrations g ON g.id = c.registration_id WHERE g.dependency_id = ${dependencyId}`, (r) => [
    { at: at(r.received_at), side: '', row: `inbox_callbacks INSERT: ${short(r.id)} kind ${String(r.kind)}` },
    { at: at(r.processed_at), side: '', row: `inbox_callbacks UPDATE: ${short(r.id)} processed` },
  ]);
  await rows(L, sql.type(t)`SELECT created_at, sequence, kind, state FROM a2a_events WHERE task_id = ${taskId} ORDER BY sequence`, (r) => [{ at: at(r.created_at), side: '', row: `a2a_events #${String(r.sequence)} ${String(r.kind)} ${String(r.state ?? '')}` }]);
  await rows(R, sql.type(t)`SELECT created_at, id FROM a2a_tasks WHERE id = ${remoteTaskId}`, (r) => [{ at: at(r.created_at), side: '', row: `a2a_tasks + runs INSERT: remote task ${short(r.id)} SUBMITTED (owner ${local.peerClient}), run ${short(remoteRunId)} queued` }]);
  await rows(R, sql.type(t)`SELECT created_at, id, url FROM push_configs WHERE task_id = ${remoteTaskId}`, (r) => [{ at: at(r.created_at), side: '', row: `push_configs INSERT: ${String(r.id)} -> ${String(r.url).replace(/^.*\/a2a\/inbox\//, '<local>/a2a/inbox/')}` }]);
  await rows(R, sql.type(t)`SELECT created_at, sequence, kind, payload FROM run_events WHERE run_id = ${remoteRunId} ORDER BY sequence`, (r) => [{ at: at(r.created_at), side: '', row: `run_events #${String(r.sequence)} ${String(r.kind)} ${JSON.stringify(pick(r.payload))}` }]);
  await rows(R, sql.type(t)`SELECT created_at, sequence, kind, state FROM a2a_events WHERE task_id = ${remoteTaskId} ORDER BY sequence`, (r) => [{ at: at(r.created_at), side: '', row: `a2a_events #${String(r.sequence)} ${String(r.kind)} ${String(r.state ?? '')}` }]);
  await rows(R, sql.type(t)`SELECT d.created_at, d.ended_at, d.event_sequence, d.state, d.attempts FROM push_deliveries d WHERE d.task_id = ${remoteTaskId}`, (r) => [
    { at: at(r.created_at), side: '', row: `push_deliveries INSERT: event #${String(r.event_sequence)} pending` },
    { at: at(r.ended_at), side: '', row: `push_deliveries UPDATE: event #${String(r.event_sequence)} ${String(r.state)} after ${String(r.attempts)} attempt(s)` },
  ]);
  await rows(R, sql.type(t)`SELECT a.started_at, a.status_code, a.outcome, d.event_sequence FROM push_attempts a JOIN push_deliveries d ON d.id = a.delivery_id WHERE d.task_id = ${remoteTaskId}`, (r) => [
    { at: at(r.started_at), side: '', row: `push_attempts INSERT: event #${String(r.event_sequence)} -> HTTP ${String(r.status_code)} ${String(r.outcome)}` },
  ]);
  const start = Math.min(...entries.filter((entry) => Number.isFinite(entry.at) && entry.at > 0).map((entry) => entry.at));
  const lines = entries
    .filter((entry) => Number.isFinite(entry.at) && entry.at > 0)
    .sort((x, y) => x.at - y.at)
    .map((entry) => `${String(entry.at - start).padStart(5)} ms  ${entry.side}  ${entry.row}`);
  console.log(`\n${local.name} delegates to ${remote.name}:\n${lines.join('\n')}\n`);
}

function short(value: unknown): string {
  return typeof value === 'string' ? value.slice(0, 8) : String(value);
}

function pick(payload: unknown): Record<string, unknown> {
  const { worker: _worker, content: _content, revision: _revision, requeues: _requeues, durationMs: _duration, ...rest } = (payload ?? {}) as Record<string, unknown>;
  return rest;
}
