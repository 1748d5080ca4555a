import { sql } from 'slonik';
import { afterAll, beforeAll, describe, expect, it, vi } from 'vitest';
import { silentLogger } from '../../../src/log/logger.js';
import { reconcileDependency } from '../../../src/remote/reconcile.js';
import { RemoteAgents } from '../../../src/remote/remote-agents.js';
import { pollDependencies } from '../../../workers/maintenance.js';
import { startTestKeel, type TestKeel } from '../../support/test-keel.js';
import { waitFor } from '../../support/wait-for.js';
import {
  artifactText,
  callbacksOfDependency,
  completedCallback,
  delegatedText,
  delegatingOverrides,
  dependenciesOf,
  dependencyById,
  newToken,
  occurrences,
  postCallback,
  runEventKinds,
  runSummary,
  sdkResultFor,
  sendLocal,
  startSdkRemote,
  waitForDependency,
  waitForLocalTask,
  type DependencyView,
  type LocalTask,
  type SdkRemote,
} from './remote-support.js';

// A dependency resolves once and its run resumes once, however many times the remote's completion
// arrives and whoever reconciles it: the same callback delivered 5 times, and a callback racing the
// poller and two more reconcilers. The remote is the official SDK server holding its task WORKING
// until the test releases it, with a push sender that sends nothing: the test is the remote's push
// sender, with the credential read from the push config the SDK stored.

let keel: TestKeel;
let remote: SdkRemote;
let token = '';
let reconcilers: RemoteAgents;

beforeAll(async () => {
  vi.spyOn(console, 'info').mockImplementation(() => undefined);
  remote = await startSdkRemote({ push: true, sender: 'drop', hold: true });
  keel = await startTestKeel({ overrides: delegatingOverrides([{ id: 'held', cardUrl: remote.cardUrl }]) });
  token = await newToken(keel.context.pool);
  // Another worker's view of the remote agents: reconciles that race the in-process ones.
  reconcilers = new RemoteAgents(keel.config.remoteAgents, { fetch: keel.fetch, pool: keel.context.pool, sealer: keel.context.sealer, logger: silentLogger() });
});
afterAll(async () => {
  await keel?.dispose();
  await remote?.close();
});

const pool = () => keel.context.pool;
const RESULT = sdkResultFor(delegatedText('held'));

type Held = LocalTask & { dependency: DependencyView; url: string; credential: string; body: unknown };

/** A delegation whose remote task is held WORKING; the run waits on it. */
async function heldDelegation(): Promise<Held> {
  const local = await sendLocal(keel, token, 'to-held', 'delegate and wait');
  await waitFor(async () => (await runSummary(pool(), local.runId)).status === 'waiting_for_dependency', 'the run to wait for its dependency');
  const dependency = await waitForDependency(pool(), local.runId, (row) => row.remote_task_id !== null);
  expect(dependency.state).toBe('waiting');
  const config = remote.pushConfigs.find((candidate) => candidate.taskId === dependency.remote_task_id);
  if (!config?.authentication) throw new Error('the SDK stored no push config for the task');
  return { ...local, dependency, url: config.url, credential: config.authentication.credentials, body: completedCallback(dependency.remote_task_id!, dependency.remote_context_id!) };
}

/** Lets the remote finish the held task (its store says COMPLETED; nobody is told). */
async function finishRemote(held: Held) {
  remote.release();
  await waitFor(async () => remote.tasks.get(held.dependency.remote_task_id!)?.completed === true, 'the remote task to complete');
}

/** The local task completed with the remote's result once; one dependency, resolved; one resume. */
async function expectResolvedOnce(held: Held) {
  const task = await waitForLocalTask(keel, token, 'to-held', held.taskId);
  expect(task.status?.state).toBe(3);
  const answer = artifactText(task);
  expect(answer).toBe(`remote said: ${JSON.stringify({ state: 'completed', result: RESULT })}`);
  expect(occurrences(answer, RESULT)).toBe(1);

  const dependencies = await dependenciesOf(pool(), held.runId);
  expect(dependencies).toHaveLength(1);
  expect(dependencies[0]).toMatchObject({ state: 'resolved', outcome: 'completed' });
  expect(await runSummary(pool(), held.runId)).toMatchObject({ status: 'completed', tool_calls: 1, iterations: 2 });
  const kinds = await runEventKinds(pool(), held.runId);
  const count = (kind: string) => kinds.filter((candidate) => candidate === kind).length;
  expect({ tool_call: count('tool_call'), suspended: count('suspended'), resumed: count('resumed'), completed: count('completed') }).toEqual({
    tool_call: 1,
    suspended: 1,
    resumed: 1,
    completed: 1,
  });
  // Every callback was reconciled; none is left pending against the inbox bounds.
  await waitFor(async () => (await callbacksOfDependency(pool(), held.dependency.id)).every((row) => row.processed_at !== null), 'every callback to be processed');
  return dependencies[0]!;
}

describe('exactly once', () => {
  it('the same completion callback delivered 5 times at once: resolved once, resumed once', async () => {
    const held = await heldDelegation();
    const askedBefore = remote.calls.getTaskDone;
    await finishRemote(held);
    const responses = await Promise.all(Array.from({ length: 5 }, () => postCallback(held.url, held.body, { bearer: held.credential })));
    expect(responses.map((response) => response.status)).toEqual([200, 200, 200, 200, 200]);
    // Each delivery is stored (2xx means received) ...
    expect(await callbacksOfDependency(pool(), held.dependency.id)).toHaveLength(5);
    // ... and the dependency still resolves once, by asking the remote.
    const resolved = await expectResolvedOnce(held);
    expect(remote.calls.getTaskDone).toBeGreaterThan(askedBefore);

    // Late duplicates after the run completed are stored, processed, and change nothing.
    const eventsBefore = await runEventKinds(pool(), held.runId);
    for (let index = 0; index < 5; index += 1) expect((await postCallback(held.url, held.body, { bearer: held.credential })).status).toBe(200);
    await waitFor(async () => {
      const rows = await callbacksOfDependency(pool(), held.dependency.id);
      return rows.length === 10 && rows.every((row) => row.processed_at !== null);
    }, 'the late duplicates to be processed');
    expect(await dependencyById(pool(), held.dependency.id)).toMatchObject({ state: 'resolved', resolved_at: resolved.resolved_at });
    expect(await runEventKinds(pool(), held.runId)).toEqual(eventsBefore);
    expect(await runSummary(pool(), held.runId)).toMatchObject({ status: 'completed', tool_calls: 1 });
  });

  it('a callback racing the poller and two more reconcilers: resolved once, resumed once (3 rounds)', async () => {
    for (let round = 0; round < 3; round += 1) {
      const held = await heldDelegation();
      const askedBefore = remote.calls.getTaskDone;
      await finishRemote(held);
      // Due for the poller right now, while callbacks arrive and two more workers reconcile.
      await pool().query(sql.unsafe`UPDATE dependencies SET next_poll_at = now() WHERE id = ${held.dependency.id}`);
      const [outcomes, responses] = await Promise.all([
        Promise.all([reconcileDependency(keel.context, reconcilers, held.dependency.id), reconcileDependency(keel.context, reconcilers, held.dependency.id)]),
        Promise.all(Array.from({ length: 3 }, () => postCallback(held.url, held.body, { bearer: held.credential }))),
        pollDependencies(keel.context),
      ]);
      expect(responses.map((response) => response.status)).toEqual([200, 200, 200]);
      // At most one of the racing reconcilers resolved it (or an in-process worker did).
      expect(outcomes.filter((outcome) => outcome === 'resolved').length, `round ${round}: ${outcomes.join(', ')}`).toBeLessThanOrEqual(1);
      expect(outcomes.every((outcome) => outcome === 'resolved' || outcome === 'already_done'), outcomes.join(', ')).toBe(true);
      await expectResolvedOnce(held);
      // The body decided nothing: the remote was asked once its task was done.
      expect(remote.calls.getTaskDone).toBeGreaterThan(askedBefore);
    }
  });
});
