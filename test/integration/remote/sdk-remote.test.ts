import { afterAll, beforeAll, describe, expect, it, vi } from 'vitest';
import { startTestKeel, type TestKeel } from '../../support/test-keel.js';
import { waitFor } from '../../support/wait-for.js';
import {
  artifactText,
  callbackBodies,
  callbacksOfDependency,
  delegatedText,
  delegatingOverrides,
  dependenciesOf,
  newToken,
  occurrences,
  registrationsOf,
  runEventKinds,
  runSummary,
  sdkResultFor,
  sendLocal,
  sha256Hex,
  startSdkRemote,
  waitForLocalTask,
  type SdkRemote,
} from './remote-support.js';

// A Keel agent delegates to a remote built on the official @a2a-js/sdk server (DefaultRequestHandler,
// its in-memory push store and default push sender, on 127.0.0.1): the remote pushes to Keel's
// inbox, Keel reconciles by GetTask and the local task completes with the remote's artifact. Both
// registration orders, and a remote whose card says it takes no push (polled).

const SDK_CREDENTIAL = 'sdk-remote-credential-for-keel';
let keel: TestKeel;
let token = '';
let embedded: SdkRemote;
let separate: SdkRemote;
let polled: SdkRemote;

beforeAll(async () => {
  // The SDK's push sender logs every push on console.info.
  vi.spyOn(console, 'info').mockImplementation(() => undefined);
  [embedded, separate, polled] = await Promise.all([startSdkRemote({ push: true }), startSdkRemote({ push: true }), startSdkRemote({ push: false })]);
  keel = await startTestKeel({
    env: { SDK_REMOTE_TOKEN: SDK_CREDENTIAL },
    overrides: delegatingOverrides([
      { id: 'sdk-embedded', cardUrl: embedded.cardUrl, credentialEnv: 'SDK_REMOTE_TOKEN', registration: 'embedded' },
      { id: 'sdk-separate', cardUrl: separate.cardUrl, credentialEnv: 'SDK_REMOTE_TOKEN', registration: 'separate' },
      { id: 'sdk-polled', cardUrl: polled.cardUrl, credentialEnv: 'SDK_REMOTE_TOKEN' },
    ]),
  });
  token = await newToken(keel.context.pool, 'sdk-remote-test');
});
afterAll(async () => {
  await keel?.dispose();
  await Promise.all([embedded, separate, polled].map((remote) => remote?.close()));
});

const pool = () => keel.context.pool;
const inboxPrefix = () => `${keel.config.server.publicUrl}/a2a/inbox/`;

/** Delegates through A2A and checks what every order shares: the answer, the dependency, the run. */
async function delegateAndComplete(remoteId: string, remote: SdkRemote) {
  const { taskId, runId } = await sendLocal(keel, token, `to-${remoteId}`, `ask ${remoteId}`);
  const task = await waitForLocalTask(keel, token, `to-${remoteId}`, taskId);
  expect(task.status?.state, 'the local task completed').toBe(3);

  // The remote ran exactly one task, with the delegated message, and finished it.
  expect([...remote.tasks.values()]).toEqual([{ text: delegatedText(remoteId), completed: true }]);
  const remoteTaskId = [...remote.tasks.keys()][0]!;
  const expectedResult = JSON.stringify({ state: 'completed', result: sdkResultFor(delegatedText(remoteId)) });

  // The local answer carries the remote's artifact, once.
  const answer = artifactText(task);
  expect(answer).toBe(`remote said: ${expectedResult}`);
  expect(occurrences(answer, sdkResultFor(delegatedText(remoteId)))).toBe(1);

  // One dependency, resolved once with the remote task's id.
  const dependencies = await dependenciesOf(pool(), runId);
  expect(dependencies).toHaveLength(1);
  const dependency = dependencies[0]!;
  expect(dependency).toMatchObject({ remote_agent: remoteId, state: 'resolved', outcome: 'completed', remote_task_id: remoteTaskId, tool_call_id: 'call_0_0' });
  expect(dependency.resolved_at).not.toBeNull();

  // The run waited, resumed once and counted one tool call.
  expect(await runSummary(pool(), runId)).toMatchObject({ status: 'completed', tool_calls: 1, iterations: 2 });
  const kinds = await runEventKinds(pool(), runId);
  expect(kinds.filter((kind) => kind === 'resumed')).toHaveLength(1);
  expect(kinds).toContain('suspended');

  // Every request to the remote carried the remote agent's credential (credentialEnv); GetTask reached it.
  expect(remote.authorizations.length).toBeGreaterThan(0);
  expect(new Set(remote.authorizations)).toEqual(new Set([`Bearer ${SDK_CREDENTIAL}`]));
  expect(remote.calls.sendMessage).toBe(1);
  expect(remote.calls.getTask).toBeGreaterThanOrEqual(1);
  return { taskId, runId, dependency, remoteTaskId };
}

/** The remote's own pushes, stored in the inbox: waits for its COMPLETED status update, all processed. */
async function expectPushedCompletion(dependencyId: string, remoteTaskId: string) {
  const callbacks = await waitFor(
    async () => {
      const rows = await callbacksOfDependency(pool(), dependencyId);
      const bodies = await callbackBodies(keel, dependencyId);
      const done = bodies.some((body) => body.statusUpdate?.status?.state === 'TASK_STATE_COMPLETED');
      return done && rows.every((row) => row.processed_at !== null) ? rows : null;
    },
    'the remote to push its completion and the inbox to process it',
  );
  const bodies = await callbackBodies(keel, dependencyId);
  // Whatever the remote pushed is about its task; the bodies are kept for the record only.
  for (const body of bodies) {
    const about = body.task?.id ?? body.statusUpdate?.taskId ?? body.artifactUpdate?.taskId;
    expect(about).toBe(remoteTaskId);
  }
  expect(callbacks.map((row) => row.kind)).toContain('statusUpdate');
  return callbacks;
}

describe('against the official SDK server', () => {
  it('registration embedded: the message carries the push config; the remote pushes; Keel reconciles by GetTask', async () => {
    const { dependency, remoteTaskId } = await delegateAndComplete('sdk-embedded', embedded);

    // The pending registration was written first: the message itself carried its callback config.
    const registrations = await registrationsOf(pool(), dependency.id);
    expect(registrations).toHaveLength(1);
    const registration = registrations[0]!;
    expect(registration.remote_config_id).toBeNull();
    expect(registration.created_at).toBeLessThanOrEqual(dependency.updated_at);
    expect(embedded.calls.createPushConfig).toBe(0);
    expect(embedded.sentPushConfigs).toHaveLength(1);
    const sent = embedded.sentPushConfigs[0]!;
    expect(sent.url).toBe(`${inboxPrefix()}${registration.id}`);
    expect(sent.authentication?.scheme).toBe('Bearer');
    // The callback credential is random, per registration, and only its hash is stored.
    expect(sent.authentication?.credentials).toMatch(/^[A-Za-z0-9_-]{43}$/);
    expect(sha256Hex(sent.authentication!.credentials)).toBe(registration.credential_hash_hex);

    const callbacks = await expectPushedCompletion(dependency.id, remoteTaskId);
    // The SDK pushed every event of the task (the message's config existed from the start).
    await waitFor(async () => (await callbacksOfDependency(pool(), dependency.id)).length === embedded.pushEvents(), 'every push to be stored');
    expect(callbacks.every((row) => row.registration_id === registration.id)).toBe(true);
    const bodies = await callbackBodies(keel, dependency.id);
    expect(bodies.map((body) => Object.keys(body)[0])).toEqual(['task', 'statusUpdate', 'artifactUpdate', 'statusUpdate']);
    expect(bodies.at(-1).statusUpdate.status.state).toBe('TASK_STATE_COMPLETED');
    // GetTask decided: at least the reconcile after the completion push asked the remote.
    expect(embedded.calls.getTask).toBeGreaterThanOrEqual(1);
  });

  it('registration separate: send, store the task id, register, create the remote config, GetTask once', async () => {
    const { dependency, remoteTaskId } = await delegateAndComplete('sdk-separate', separate);

    // The message carried no push config; the config was created afterwards, for the acknowledged task.
    expect(separate.sentPushConfigs).toEqual([null]);
    expect(separate.calls.createPushConfig).toBe(1);
    const registrations = await registrationsOf(pool(), dependency.id);
    expect(registrations).toHaveLength(1);
    const registration = registrations[0]!;
    expect(separate.pushConfigs).toHaveLength(1);
    const created = separate.pushConfigs[0]!;
    expect(created.taskId).toBe(remoteTaskId);
    expect(created.url).toBe(`${inboxPrefix()}${registration.id}`);
    expect(registration.remote_config_id).toBe(created.id);
    expect(sha256Hex(created.authentication!.credentials)).toBe(registration.credential_hash_hex);
    // The dependency existed (acknowledged, with the remote task id) before its registration.
    expect(dependency.created_at).toBeLessThanOrEqual(registration.created_at);

    await expectPushedCompletion(dependency.id, remoteTaskId);
    // The closing GetTask right after the config, and the reconcile of the pushed completion.
    expect(separate.calls.getTask).toBeGreaterThanOrEqual(2);
  });

  it('a remote whose card says no push is polled: no registration, no callbacks, resolved by GetTask', async () => {
    const { dependency } = await delegateAndComplete('sdk-polled', polled);
    expect(polled.sentPushConfigs).toEqual([null]);
    expect(polled.calls.createPushConfig).toBe(0);
    expect(polled.pushConfigs).toEqual([]);
    expect(await registrationsOf(pool(), dependency.id)).toEqual([]);
    expect(await callbacksOfDependency(pool(), dependency.id)).toEqual([]);
    // Asked at the suspension (still WORKING), then by the poller once it was done.
    expect(polled.calls.getTask).toBeGreaterThanOrEqual(2);
    expect(dependency.polls).toBeGreaterThanOrEqual(1);
  });
});
