import { GetTaskRequest, SubscribeToTaskRequest } from '@a2a-js/sdk';
import { sql } from 'slonik';
import { z } from 'zod';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createClient } from '../../src/auth/client-repository.js';
import { claimQueuedRun } from '../../src/runs/run-repository.js';
import { completeRun } from '../../src/writes/complete-run.js';
import { decideApproval, readSuspendedRun } from '../../src/runs/resume-run.js';
import { silentLogger } from '../../src/log/logger.js';
import { projectRun } from '../../src/tasks/task-projector.js';
import { pruneContextHistory, purgeExpiredRuns } from '../../src/tasks/retention.js';
import { readJournal } from '../../src/tasks/journal.js';
import { sdkClient, textMessage } from '../support/a2a-client.js';
import { TEST_TOOLS_MODULE, testClaim, testHolder } from '../support/run-helpers.js';
import { readSse } from '../support/sse.js';
import { createEmptyDatabase } from '../support/test-database.js';
import { startTestKeel, type TestKeel } from '../support/test-keel.js';
import { waitFor, waitForRunStatus } from '../support/wait-for.js';

// Tasks over the wire with the official client: results survive later turns, pruning, approvals
// and restarts; every reader of the journal sees the same events; a crash between completion and
// projection loses nothing; privacy failures keep nothing; purge leaves nothing.

const overrides = {
  KEEL_PRIVACY_LEVEL: 'full',
  KEEL_MAINTENANCE_SWEEP_SECONDS: '0.5',
  KEEL_RUNS_PROVIDER_ATTEMPTS: '1',
  KEEL_TOOL_MODULES: JSON.stringify([TEST_TOOLS_MODULE]),
  KEEL_PROVIDERS: {
    echo: { type: 'echo' },
    mailer: { type: 'scripted', steps: [{ toolCalls: [{ name: 'send_email', arguments: { to: 'ops@example.com' } }] }, { reply: 'mail handled' }] },
    steps: {
      type: 'scripted',
      steps: [
        { artifact: { artifactId: 'draft', name: 'draft', text: 'part one ' }, toolCalls: [{ name: 'lookup', arguments: {} }], delayMs: 150 },
        { artifact: { artifactId: 'draft', text: 'part two', append: true, lastChunk: true }, toolCalls: [{ name: 'lookup', arguments: {} }], delayMs: 150 },
        { reply: 'all steps done', delayMs: 150 },
      ],
    },
    'leaky-primary': { type: 'scripted', steps: [{ artifact: { artifactId: 'secret', text: 'confidential draft alice@example.com' }, toolCalls: [{ name: 'lookup', arguments: {} }] }, { fail: 'server_error' }] },
    'metadata-fallback': { type: 'scripted', steps: [{ reply: 'x' }, { reply: 'the final secret answer' }], privacy: { answerLevel: 'metadata' } },
  },
  KEEL_AGENTS: [
    { id: 'echo', name: 'Echo', provider: 'echo' },
    { id: 'mailer', name: 'Mailer', provider: 'mailer', tools: ['send_email'] },
    { id: 'steps', name: 'Steps', provider: 'steps', tools: ['lookup'] },
    { id: 'tightens', name: 'Tightens', provider: 'leaky-primary', fallbacks: ['metadata-fallback'], tools: ['lookup'] },
  ],
};

let database: Awaited<ReturnType<typeof createEmptyDatabase>>;
let keel: TestKeel;
let token = '';
const masterKey = Buffer.alloc(32, 9).toString('base64');

const start = () => startTestKeel({ databaseUrl: database.url, env: { KEEL_MASTER_KEY: masterKey }, overrides });

beforeAll(async () => {
  database = await createEmptyDatabase();
  keel = await start();
  const client = await createClient(keel.context.pool, 'interop');
  if (!client.ok) throw new Error('client');
  token = client.token;
});
afterAll(async () => {
  await keel?.dispose();
  await database?.drop();
});

const count = async (table: string, where = sql.fragment`true`) =>
  keel.context.pool.oneFirst(sql.type(z.object({ n: z.number() }))`SELECT count(*)::int AS n FROM ${sql.identifier([table])} WHERE ${where}`);

describe('a completed task keeps its result', () => {
  it('with its audit trail written by the completion (ASCII and non-ASCII answers alike)', async () => {
    const client = await sdkClient(keel.url, 'echo', token);
    for (const text of ['audit me', 'audité 😀']) {
      const task = (await client.sendMessage(textMessage(text))) as { id: string };
      const kinds = await keel.context.pool.anyFirst(sql.type(z.object({ kind: z.string() }))`
        SELECT kind FROM run_events WHERE run_id = ${task.id} ORDER BY sequence`);
      expect(kinds).toEqual(['claimed', 'model_reply', 'completed']);
    }
  });

  it('through a later turn, a history prune and a restart', async () => {
    const client = await sdkClient(keel.url, 'echo', token);
    const first = (await client.sendMessage(textMessage('first'))) as { id: string; contextId: string; artifacts: Array<{ parts: unknown[] }> };
    const firstParts = JSON.stringify(first.artifacts.map((artifact) => artifact.parts));
    expect(firstParts).toContain('echo: first');
    const second = (await client.sendMessage(textMessage('second', { contextId: first.contextId }))) as { id: string; contextId: string; history: unknown[] };
    expect(second.contextId).toBe(first.contextId);
    expect(second.id).not.toBe(first.id);

    const pruned = await pruneContextHistory(keel.context.pool, keel.context.sealer, (await ownerOf(first.id))!, first.contextId, 1);
    expect(pruned).toMatchObject({ ok: true, tasks: 2, kept: 1 });

    await keel.stop();
    keel = await start();
    const again = await sdkClient(keel.url, 'echo', token);
    const reread = (await again.getTask(GetTaskRequest.fromJSON({ id: first.id }))) as { status: { state: number }; artifacts: Array<{ parts: unknown[] }>; history: unknown[] };
    expect(JSON.stringify(reread.artifacts.map((artifact) => artifact.parts))).toBe(firstParts);
    expect(reread.history).toEqual([]);
  });

  it('after a run that went through an approval', async () => {
    const client = await sdkClient(keel.url, 'mailer', token);
    const task = (await client.sendMessage(textMessage('tell ops', { returnImmediately: true }))) as { id: string };
    await waitForRunStatus(keel.context.pool, task.id, ['waiting_for_approval']);
    const read = await readSuspendedRun(keel.context.pool, keel.context.sealer, task.id, 'waiting_for_approval');
    if (!read.ok) throw new Error(read.reason);
    expect((await decideApproval(keel.context, task.id, read.view.state.pendingApproval!.digest, true)).ok).toBe(true);
    await waitForRunStatus(keel.context.pool, task.id, ['completed']);
    const done = (await client.getTask(GetTaskRequest.fromJSON({ id: task.id }))) as { artifacts: Array<{ parts: unknown[] }> };
    const parts = JSON.stringify(done.artifacts.map((artifact) => artifact.parts));
    expect(parts).toContain('mail handled');
    await keel.stop();
    keel = await start();
    const after = (await (await sdkClient(keel.url, 'mailer', token)).getTask(GetTaskRequest.fromJSON({ id: task.id }))) as { artifacts: Array<{ parts: unknown[] }> };
    expect(JSON.stringify(after.artifacts.map((artifact) => artifact.parts))).toBe(parts);
  });
});

async function ownerOf(taskId: string) {
  return keel.context.pool.maybeOneFirst(sql.type(z.object({ owner: z.string() }))`SELECT owner FROM a2a_tasks WHERE id = ${taskId}`);
}

const kindOf = (response: Record<string, unknown>) => {
  const [kind, value] = Object.entries(response)[0] as [string, Record<string, unknown>];
  if (kind === 'statusUpdate') return `status:${(value.status as { state: string }).state}`;
  if (kind === 'artifactUpdate') return `artifact:${(value.artifact as { artifactId: string }).artifactId}:${JSON.stringify((value.artifact as { parts: unknown }).parts)}`;
  if (kind === 'task') return `task:${(value.status as { state: string }).state}`;
  return kind;
};

describe('one journal for polling and streams', () => {
  it('the stream, a concurrent subscription, a reconnect with Last-Event-ID and polling agree', async () => {
    const headers = { 'content-type': 'application/json', 'a2a-version': '1.0', authorization: `Bearer ${token}` };
    const streamResponse = await fetch(`${keel.url}/a2a/steps/message:stream`, {
      method: 'POST',
      headers,
      body: JSON.stringify({ message: { messageId: 'stream-1', role: 'ROLE_USER', parts: [{ text: 'go' }] } }),
    });
    expect(streamResponse.headers.get('content-type')).toContain('text/event-stream');
    const streaming = readSse(streamResponse);

    const taskId = await waitFor(async () => keel.context.pool.maybeOneFirst(sql.type(z.object({ id: z.string() }))`
      SELECT t.id FROM a2a_tasks t WHERE t.agent = 'steps' ORDER BY created_at DESC LIMIT 1`), 'the streamed task');
    // Polling while it runs: every state seen is one the run really had.
    const polled = new Set<string>();
    const polling = (async () => {
      const client = await sdkClient(keel.url, 'steps', token, 'HTTP+JSON');
      for (;;) {
        const task = (await client.getTask(GetTaskRequest.fromJSON({ id: taskId }))) as { status: { state: number } };
        polled.add(String(task.status.state));
        if (task.status.state === 3) return;
        await new Promise((resolve) => setTimeout(resolve, 40));
      }
    })();
    const subscription = (async () => {
      const client = await sdkClient(keel.url, 'steps', token);
      const events: unknown[] = [];
      for await (const event of client.resubscribeTask(SubscribeToTaskRequest.fromJSON({ id: taskId }))) events.push(event);
      return events.length;
    })();

    const streamed = await streaming;
    await polling;
    expect(await subscription).toBeGreaterThan(0);
    const streamedIds = streamed.map((event) => event.id);
    const streamedKinds = streamed.map((event) => kindOf(event.data as Record<string, unknown>));
    expect(streamedKinds[0]).toBe('task:TASK_STATE_SUBMITTED');
    expect(streamedKinds.slice(1)).toEqual([
      'status:TASK_STATE_WORKING',
      'artifact:draft:[{"text":"part one "}]',
      'artifact:draft:[{"text":"part two"}]',
      expect.stringMatching(/^artifact:.*-answer:\[\{"text":"all steps done"\}\]$/),
      'status:TASK_STATE_COMPLETED',
    ]);
    // The journal in the database holds exactly what was streamed, in the same order.
    const journal = await readJournal(keel.context.pool, keel.context.sealer, taskId, 0);
    expect(journal.map((event) => event.sequence)).toEqual(streamedIds.slice(1));
    expect(journal.map((event) => kindOf(event.response as Record<string, unknown>))).toEqual(streamedKinds.slice(1));
    // Polling saw only committed states: SUBMITTED(1)/WORKING(2)/COMPLETED(3), never one out of order.
    expect([...polled].every((state) => ['1', '2', '3'].includes(state))).toBe(true);

    // A reconnect with Last-Event-ID replays from there; a second stream sees the same.
    const replay = await readSse(
      await fetch(`${keel.url}/a2a/steps`, {
        method: 'POST',
        headers: { ...headers, 'last-event-id': String(streamedIds[2]) },
        body: JSON.stringify({ jsonrpc: '2.0', id: 7, method: 'SubscribeToTask', params: { id: taskId } }),
      }),
    ).catch(() => []);
    // The task is terminal now, so SubscribeToTask answers -32004 instead of a stream; replay
    // with Last-Event-ID is checked on a live task below.
    void replay;
  });

  it('reconnecting with Last-Event-ID resumes after that event, on both bindings', async () => {
    const headers = { 'content-type': 'application/json', 'a2a-version': '1.0', authorization: `Bearer ${token}` };
    const client = await sdkClient(keel.url, 'steps', token);
    const task = (await client.sendMessage(textMessage('again', { returnImmediately: true }))) as { id: string };
    const firstTwo = await readSse(await fetch(`${keel.url}/a2a/steps/tasks/${task.id}:subscribe`, { method: 'POST', headers }), { stopAfter: 2 });
    const lastSeen = firstTwo[firstTwo.length - 1]!.id!;
    const rest = await readSse(
      await fetch(`${keel.url}/a2a/steps`, {
        method: 'POST',
        headers: { ...headers, 'last-event-id': String(lastSeen) },
        body: JSON.stringify({ jsonrpc: '2.0', id: 9, method: 'SubscribeToTask', params: { id: task.id } }),
      }),
    );
    const resumedIds = rest.map((event) => event.id);
    expect(resumedIds[0]).toBe(lastSeen + 1);
    await waitForRunStatus(keel.context.pool, task.id, ['completed']);
    const journal = await readJournal(keel.context.pool, keel.context.sealer, task.id, 0);
    expect(resumedIds).toEqual(journal.map((event) => event.sequence).filter((sequence) => sequence > lastSeen));
    expect(rest.every((event) => (event.data as { jsonrpc: string; id: number }).id === 9)).toBe(true);
  });
});

describe('a crash between the completion commit and projection', () => {
  it('is repaired after restart: the events are projected once and GetTask shows the result', async () => {
    await keel.stop();
    // What a crash leaves behind: the task, its claim (never projected) and its completion
    // committed by a process that is gone; the completion journaled its end itself (decision 0022).
    const offline = await startTestKeel({ databaseUrl: database.url, env: { KEEL_MASTER_KEY: masterKey }, overrides, start: { role: 'api' } });
    const client = await sdkClient(offline.url, 'echo', token);
    const task = (await client.sendMessage(textMessage('crash me', { returnImmediately: true }))) as { id: string };
    const claimed = await claimQueuedRun(offline.context.pool, task.id, testClaim('crashed-worker'));
    expect(claimed).not.toBeNull();
    const settled = await completeRun(offline.context.pool, offline.context.sealer, silentLogger(), {
      runId: task.id,
      holder: testHolder('crashed-worker'),
      reason: 'completed',
      answer: 'survived the crash',
      taskId: task.id,
      hasOutputs: false,
      totals: { iterations: 1, toolCalls: 0, inputTokens: 0, outputTokens: 0 },
    });
    expect(settled.settled).toBe(true);
    await offline.stop();

    keel = await start();
    await waitFor(async () => (await count('a2a_events', sql.fragment`task_id = ${task.id} AND state = 'TASK_STATE_COMPLETED'`)) === 1, 'the completion in the journal');
    const journal = await readJournal(keel.context.pool, keel.context.sealer, task.id, 0);
    expect(journal.map((event) => kindOf(event.response as Record<string, unknown>))).toEqual([
      'status:TASK_STATE_WORKING',
      expect.stringMatching(/^artifact:.*-answer:\[\{"text":"survived the crash"\}\]$/),
      'status:TASK_STATE_COMPLETED',
    ]);
    // Projecting again (a duplicate job) adds nothing.
    expect((await projectRun(keel.context.pool, keel.context.sealer, task.id)).events).toBe(0);
    expect(await count('a2a_events', sql.fragment`task_id = ${task.id}`)).toBe(3);
    const after = (await (await sdkClient(keel.url, 'echo', token)).getTask(GetTaskRequest.fromJSON({ id: task.id }))) as { status: { state: number }; artifacts: Array<{ parts: unknown[] }> };
    expect(after.status.state).toBe(3);
    expect(JSON.stringify(after.artifacts)).toContain('survived the crash');
  });
});

describe('a ceiling tightened mid-run', () => {
  it('fails the task with RESULT_NOT_RETAINABLE and leaves no content anywhere', async () => {
    const headers = { 'content-type': 'application/json', 'a2a-version': '1.0', authorization: `Bearer ${token}` };
    const response = await fetch(`${keel.url}/a2a/tightens`, {
      method: 'POST',
      headers,
      body: JSON.stringify({ jsonrpc: '2.0', id: 1, method: 'SendMessage', params: { message: { messageId: 'tight-1', role: 'ROLE_USER', parts: [{ text: 'my private question' }] } } }),
    });
    const text = await response.text();
    const body = JSON.parse(text) as { result: { task: { id: string; status: { state: string; message: { parts: Array<{ text: string }> } }; metadata: Record<string, unknown> } } };
    const task = body.result.task;
    expect(task.status.state).toBe('TASK_STATE_FAILED');
    expect(task.status.message.parts[0]!.text).toBe("the result could not be kept under this installation's privacy policy");
    expect(task.metadata).toMatchObject({ reason: 'RESULT_NOT_RETAINABLE' });
    for (const fragment of ['confidential', 'alice', 'secret answer', 'private question']) expect(text).not.toContain(fragment);

    const run = await waitForRunStatus(keel.context.pool, task.id, ['failed']);
    expect(run.termination_reason).toBe('result_not_retainable');
    expect(await count('run_outputs', sql.fragment`run_id = ${task.id}`)).toBe(0);
    const stored = await keel.context.pool.one(sql.type(z.object({ artifacts: z.unknown(), history: z.unknown(), status_message: z.unknown() }))`
      SELECT artifacts, history, status_message FROM a2a_tasks WHERE id = ${task.id}`);
    expect(stored).toEqual({ artifacts: null, history: null, status_message: null });
    await waitFor(async () => (await count('a2a_events', sql.fragment`task_id = ${task.id} AND state = 'TASK_STATE_FAILED'`)) === 1, 'the failure in the journal');
    const journal = JSON.stringify(await readJournal(keel.context.pool, keel.context.sealer, task.id, 0));
    for (const fragment of ['confidential', 'alice', 'secret answer', 'private question']) expect(journal).not.toContain(fragment);
    expect(journal).toContain('RESULT_NOT_RETAINABLE');
  });
});

describe('retention', () => {
  it('purge removes the task and everything hanging off it; GetTask answers TaskNotFoundError', async () => {
    const client = await sdkClient(keel.url, 'echo', token);
    const task = (await client.sendMessage(textMessage('forget me'))) as { id: string };
    await waitFor(async () => (await count('a2a_events', sql.fragment`task_id = ${task.id}`)) > 0, 'events');
    await keel.context.pool.query(sql.unsafe`UPDATE runs SET settled_at = now() - interval '40 days', updated_at = now() - interval '40 days' WHERE id = ${task.id}`);
    const report = await purgeExpiredRuns(keel.context.pool, 30);
    expect(report.runs).toBeGreaterThanOrEqual(1);
    for (const [table, column] of [['runs', 'id'], ['a2a_tasks', 'id'], ['a2a_events', 'task_id'], ['run_events', 'run_id'], ['run_outputs', 'run_id'], ['push_configs', 'task_id']] as const) {
      expect(await count(table, sql.fragment`${sql.identifier([column])} = ${task.id}`)).toBe(0);
    }
    await expect(client.getTask(GetTaskRequest.fromJSON({ id: task.id }))).rejects.toThrow(/not found/i);
  });
});
