import { GetTaskRequest } from '@a2a-js/sdk';
import { Redis } from 'ioredis';
import { sql } from 'slonik';
import { afterAll, beforeAll, describe, expect, it, vi } from 'vitest';
import { z } from 'zod';
import { encodeMasterKey, generateMasterKey } from '../../../src/sealing/master-key.js';
import { sdkClient, textMessage } from '../../support/a2a-client.js';
import { cleanEnv, spawnKeel, type KeelProcess } from '../../support/keel-process.js';
import { createTestDatabase, type TestDatabase } from '../../support/test-database.js';
import { startTestKeel, TEST_POOL_ENV, tempDir, type TestKeel } from '../../support/test-keel.js';
import { TEST_REDIS_URL, testQueueKind, testQueuePrefix } from '../../support/test-queues.js';
import { waitFor } from '../../support/wait-for.js';
import {
  artifactText,
  callbacksOfDependency,
  completedCallback,
  delegatedText,
  delegatingOverrides,
  dependenciesOf,
  dependencyById,
  fakeResultFor,
  freePort,
  newToken,
  postCallback,
  registrationIdOf,
  registrationsOf,
  runSummary,
  startFakeRemote,
  waitForLocalTask,
  workingCallback,
  type DependencyView,
  type FakeRemote,
  type FakeSend,
} from './remote-support.js';

// The sender died after its message went out and before it stored the remote task id (embedded
// push config: the pending dependency and its registration were written before the send). A real
// `keel start` child is SIGKILLed while the remote holds its SendMessage; a second Keel on the same
// database and queues takes the run over after the lease, and the retried tool call waits on the
// pending dependency. Callbacks then reach its registration with the valid callback credential.
// The body decides nothing: a task id it names is only a candidate, adopted when GetTask, asked as
// the agent's own client, answers a task whose history holds the messageId Keel recorded before
// sending. Another client's task on the remote, or a made-up id, is never bound or resolved from.

const QUEUE = testQueueKind();
const REMOTE_ID = 'held';
const redisUrl = QUEUE === 'redis' ? TEST_REDIS_URL : null;

let remote: FakeRemote;
let database: TestDatabase;
let child: KeelProcess | null = null;
let keel: TestKeel | null = null;
let queuePrefix = '';
/** The SendMessage Keel sent (carrying the callback config); the remote never answers it. */
let delegated: Omit<FakeSend, 'answeredAt'> | null = null;
let releaseHeld: () => void = () => undefined;
const held = new Promise<void>((resolve) => (releaseHeld = resolve));

type Orphan = { taskId: string; runId: string; dependency: DependencyView; registrationId: string; credential: string; messageId: string };
let orphan: Orphan;
let token = '';

beforeAll(async () => {
  vi.spyOn(console, 'info').mockImplementation(() => undefined);
  remote = await startFakeRemote({
    push: true,
    // Keel's message (the one with a callback config) is held unanswered: its sender dies waiting.
    beforeAnswer: async (send) => {
      if (!send.pushConfig) return;
      delegated = send;
      await held;
    },
  });
  database = await createTestDatabase();
  queuePrefix = testQueuePrefix();
  const port = await freePort();
  const settings = delegatingOverrides([{ id: REMOTE_ID, cardUrl: remote.cardUrl }]);
  const env: Record<string, string> = {
    ...Object.fromEntries(Object.entries(settings).map(([key, value]) => [key, typeof value === 'string' ? value : JSON.stringify(value)])),
    KEEL_DATABASE_URL: database.url,
    KEEL_MASTER_KEY: encodeMasterKey(generateMasterKey()),
    KEEL_SERVER_PORT: String(port),
    KEEL_DATA_DIR: tempDir('keel-sender-crash-data-'),
    KEEL_QUEUE_PREFIX: queuePrefix,
    ...(redisUrl ? { KEEL_QUEUE_REDIS_URL: redisUrl } : {}),
    KEEL_RUNS_LEASE_SECONDS: '2',
    KEEL_RUNS_HEARTBEAT_SECONDS: '0.5',
    KEEL_RUNS_REQUEUE_BASE_SECONDS: '0.5',
  };

  // The sender: a `keel start` child, killed once its message is out.
  child = spawnKeel(['start'], { cwd: tempDir('keel-sender-crash-cwd-'), env: cleanEnv({ ...TEST_POOL_ENV, ...env }) });
  await child.waitForLog('keel is ready', 45_000);
  token = await newToken(database.pool);
  const client = await sdkClient(`http://127.0.0.1:${port}`, `to-${REMOTE_ID}`, token);
  const task = (await client.sendMessage(textMessage('delegate, then die', { returnImmediately: true }))) as { id: string };
  const runId = await database.pool.oneFirst(sql.type(z.object({ run_id: z.string() }))`SELECT run_id FROM a2a_tasks WHERE id = ${task.id}`);
  await waitFor(async () => delegated, 'the remote to receive the delegated message', 45_000).catch((error: Error) => {
    throw new Error(`${error.message}\nchild log:\n${child!.lines.slice(-40).join('\n')}`);
  });
  child.child.kill('SIGKILL');
  expect((await child.exited).signal).toBe('SIGKILL');

  // What the sender left: a pending dependency without a remote task id, its registration.
  const [pending] = await dependenciesOf(database.pool, runId);
  expect(pending).toMatchObject({ state: 'pending', remote_task_id: null });
  const [registration] = await registrationsOf(database.pool, pending!.id);
  expect(registrationIdOf(delegated!.pushConfig!.url)).toBe(registration!.id);

  // The replacement takes the run over after the lease; the retried tool call waits on the dependency.
  keel = await startTestKeel({ databaseUrl: database.url, env: { ...env, KEEL_SERVER_PORT: '0' } });
  await waitFor(async () => (await runSummary(database.pool, runId)).status === 'waiting_for_dependency', 'the replacement to suspend the run on its dependency', 30_000);
  orphan = {
    taskId: task.id,
    runId,
    dependency: await dependencyById(database.pool, pending!.id),
    registrationId: registration!.id,
    credential: delegated!.pushConfig!.authentication!.credentials,
    messageId: String((delegated!.body as { message: { messageId: string } }).message.messageId),
  };
}, 120_000);

afterAll(async () => {
  releaseHeld();
  if (child && child.child.exitCode === null && child.child.signalCode === null) {
    child.child.kill('SIGKILL');
    await child.exited;
  }
  await keel?.dispose().catch(() => undefined);
  await remote?.close();
  await database?.drop().catch(() => undefined);
  if (redisUrl) {
    const redis = new Redis(redisUrl, { maxRetriesPerRequest: 1 });
    for (let cursor = '0'; ; ) {
      const [next, keys] = await redis.scan(cursor, 'MATCH', `${queuePrefix}:*`, 'COUNT', 500);
      if (keys.length > 0) await redis.del(...keys);
      cursor = next;
      if (cursor === '0') break;
    }
    await redis.quit();
  }
});

const pool = () => database.pool;
const inboxUrl = () => `${keel!.url}/a2a/inbox/${orphan.registrationId}`;

/** Another client's task on the same remote (SendMessage without a callback config), COMPLETED. */
async function anotherClientsTask(): Promise<{ id: string; contextId: string }> {
  const response = await fetch(`${remote.url}/`, {
    method: 'POST',
    headers: { 'content-type': 'application/json', 'a2a-version': '1.0' },
    body: JSON.stringify({ jsonrpc: '2.0', id: 1, method: 'SendMessage', params: { message: { messageId: 'someone-else', role: 'ROLE_USER', parts: [{ text: 'mine, not yours' }] } } }),
  });
  const answer = (await response.json()) as { result: { task: { id: string; contextId: string } } };
  remote.setState(answer.result.task.id, 'TASK_STATE_COMPLETED');
  return answer.result.task;
}

describe(`a sender that died before storing the remote task id (${QUEUE} queue backend)`, () => {
  it('the pending dependency records the messageId it sent, and the message went out once', async () => {
    expect(orphan.dependency).toMatchObject({ state: 'pending', remote_task_id: null, remote_context_id: null, outcome: null });
    const recorded = await pool().oneFirst(sql.type(z.object({ message_id: z.string().nullable() }))`SELECT message_id FROM dependencies WHERE id = ${orphan.dependency.id}`);
    expect(recorded).toBe(orphan.messageId);
    expect(remote.count('SendMessage')).toBe(1);
  });

  it('callbacks with the valid credential naming another client’s task or a made-up id are not adopted', async () => {
    const theirs = await anotherClientsTask();
    const askedBefore = remote.getTaskParams.length;
    const forged = [completedCallback(theirs.id, theirs.contextId), completedCallback('fake-task-made-up', 'fake-context-made-up')];
    for (const body of forged) expect((await postCallback(inboxUrl(), body, { bearer: orphan.credential })).status).toBe(200);

    // Both were reconciled (asked about, answered, refused), or the dependency moved on.
    await waitFor(async () => {
      const rows = await callbacksOfDependency(pool(), orphan.dependency.id);
      const dependency = await dependencyById(pool(), orphan.dependency.id);
      return (rows.length === 2 && rows.every((row) => row.processed_at !== null)) || dependency.state !== 'pending';
    }, 'the forged callbacks to be reconciled');

    // Not bound, not resolved: the dependency is still pending without a remote task id, the run waits.
    expect(await dependencyById(pool(), orphan.dependency.id)).toMatchObject({ state: 'pending', remote_task_id: null, remote_context_id: null, outcome: null, resolved_at: null });
    expect(await runSummary(pool(), orphan.runId)).toMatchObject({ status: 'waiting_for_dependency', tool_calls: 1 });
    const client = await sdkClient(keel!.url, `to-${REMOTE_ID}`, token);
    const local = (await client.getTask(GetTaskRequest.fromJSON({ id: orphan.taskId, historyLength: 0 }))) as { status?: { state: number }; artifacts?: unknown[] };
    expect(local.status?.state).toBe(2);
    expect(local.artifacts ?? []).toEqual([]);
    // Each candidate was asked about, as the agent's client, with the history that proves ownership.
    const asked = remote.getTaskParams.slice(askedBefore);
    expect([...new Set(asked.map((params: { id: string }) => params.id))].sort()).toEqual(['fake-task-made-up', theirs.id].sort());
    expect(asked.every((params: { historyLength?: number }) => params.historyLength === undefined)).toBe(true);
  });

  it('a callback naming the task our message created is adopted through GetTask, and the run completes with its result', async () => {
    const ours = delegated!;
    // The body's contextId is wrong on purpose: the ids stored come from GetTask's answer.
    expect((await postCallback(inboxUrl(), workingCallback(ours.taskId, 'forged-context'), { bearer: orphan.credential })).status).toBe(200);
    const adopted = await waitFor(async () => {
      const dependency = await dependencyById(pool(), orphan.dependency.id);
      return dependency.state === 'pending' ? null : dependency;
    }, 'the dependency to adopt the remote task');
    expect(adopted).toMatchObject({ state: 'waiting', remote_task_id: ours.taskId, remote_context_id: ours.contextId, outcome: null });

    remote.setState(ours.taskId, 'TASK_STATE_COMPLETED');
    expect((await postCallback(inboxUrl(), completedCallback(ours.taskId, ours.contextId), { bearer: orphan.credential })).status).toBe(200);
    const task = await waitForLocalTask(keel!, token, `to-${REMOTE_ID}`, orphan.taskId);
    expect(task.status?.state).toBe(3);
    expect(artifactText(task)).toBe(`remote said: ${JSON.stringify({ state: 'completed', result: fakeResultFor(ours.taskId) })}`);
    expect(await dependencyById(pool(), orphan.dependency.id)).toMatchObject({ state: 'resolved', outcome: 'completed', remote_task_id: ours.taskId });
    expect(await runSummary(pool(), orphan.runId)).toMatchObject({ status: 'completed', tool_calls: 1, iterations: 2 });
    // Never sent twice.
    expect(remote.count('SendMessage')).toBe(2);
    expect((ours.body as { message: { parts: Array<{ text: string }> } }).message.parts[0]!.text).toBe(delegatedText(REMOTE_ID));
  });
});
