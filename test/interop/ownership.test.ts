import { sql } from 'slonik';
import { z } from 'zod';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import {
  CancelTaskRequest,
  DeleteTaskPushNotificationConfigRequest,
  GetTaskPushNotificationConfigRequest,
  GetTaskRequest,
  ListTaskPushNotificationConfigsRequest,
  ListTasksRequest,
  SubscribeToTaskRequest,
  TaskPushNotificationConfig,
  TaskState,
  type SendMessageResult,
  type Task,
} from '@a2a-js/sdk';
import type { Client } from '@a2a-js/sdk/client';
import { isJsonRpcError, isRestError, TaskNotFoundError } from '@a2a-js/sdk/errors';
import { createClient } from '../../src/auth/client-repository.js';
import { sdkClient, textMessage } from '../support/a2a-client.js';
import { BINDINGS, expectRestError, expectRpcError, halfWrittenRows, rawRest, rawRpc, rowCounts, type Binding } from '../support/a2a-wire.js';
import { startTestKeel, type TestKeel } from '../support/test-keel.js';

// Ownership (docs/architecture.md, "A2A server"): each task and context belongs to the client that
// created it; another client gets TaskNotFoundError for every method on it, exactly as for a task
// that never existed, sees none of it in ListTasks, and a contextId of someone else's names a
// context of its own. Driven with the official @a2a-js/sdk client over HTTP on both bindings.

// A's first message is long so its presence in a later transcript shows in the run's token count
// (the echo provider estimates input tokens as the characters of every transcript message / 4).
const A_SECRET = `alpha-private ${'confidential-history '.repeat(40)}`;
const PUSH_URL = 'https://93.184.215.14/keel-hook';

let keel: TestKeel;
let tokenA: string;
let tokenB: string;

async function newToken(name: string): Promise<string> {
  const created = await createClient(keel.context.pool, name);
  if (!created.ok) throw new Error(`cannot create client ${name}: ${created.reason}`);
  return created.token;
}

function asTask(result: SendMessageResult): Task {
  if (!('status' in result) || !('id' in result)) throw new Error(`expected a Task, got ${JSON.stringify(result)}`);
  return result;
}

/** The SDK's typed TaskNotFoundError, carrying -32001 (JSON-RPC) or 404 (REST) from the wire. */
async function expectTaskNotFound(binding: Binding, call: Promise<unknown>): Promise<void> {
  const error = await call.then(
    (value) => {
      throw new Error(`expected TaskNotFoundError, got ${JSON.stringify(value)}`);
    },
    (caught: unknown) => caught,
  );
  expect(error, String(error)).toBeInstanceOf(TaskNotFoundError);
  expect((error as TaskNotFoundError).reason).toBe('TASK_NOT_FOUND');
  if (binding === 'JSONRPC') {
    expect(isJsonRpcError(error) && error.envelopeCode).toBe(-32001);
  } else {
    expect(isRestError(error) && error.statusCode).toBe(404);
  }
}

/** The first event of a stream, or the error the stream raises before any. */
async function firstEvent<T>(stream: AsyncGenerator<T>): Promise<T | undefined> {
  try {
    const next = await stream.next();
    return next.done ? undefined : next.value;
  } finally {
    await stream.return(undefined);
  }
}

async function runTokens(runId: string): Promise<number> {
  return keel.context.pool.oneFirst(sql.type(z.object({ input_tokens: z.number() }))`SELECT input_tokens::int FROM runs WHERE id = ${runId}`);
}

beforeAll(async () => {
  keel = await startTestKeel({
    overrides: {
      // A cancelled run is noticed at the next heartbeat; a short one lets the slow runs stop quickly.
      KEEL_RUNS_HEARTBEAT_SECONDS: '0.5',
      KEEL_PROVIDERS: { echo: { type: 'echo' }, slow: { type: 'scripted', steps: [{ delayMs: 30_000, reply: 'late' }] } },
      KEEL_AGENTS: [
        { id: 'echo', name: 'Echo', provider: 'echo', privacy: { answerLevel: 'full' } },
        { id: 'slow', name: 'Slow', provider: 'slow', privacy: { answerLevel: 'full' } },
      ],
    },
  });
  tokenA = await newToken('client-a');
  tokenB = await newToken('client-b');
});
afterAll(async () => keel?.dispose());

describe.each(BINDINGS)('ownership over %s (official SDK client)', (binding) => {
  let echoA: Client;
  let slowA: Client;
  let echoB: Client;
  let slowB: Client;
  let completed: Task;
  let running: Task;
  let configId: string;

  beforeAll(async () => {
    [echoA, slowA, echoB, slowB] = await Promise.all([
      sdkClient(keel.url, 'echo', tokenA, binding),
      sdkClient(keel.url, 'slow', tokenA, binding),
      sdkClient(keel.url, 'echo', tokenB, binding),
      sdkClient(keel.url, 'slow', tokenB, binding),
    ]);
    completed = asTask(await echoA.sendMessage(textMessage(A_SECRET, { messageId: `a-first-${binding}` })));
    expect(completed.status?.state).toBe(TaskState.TASK_STATE_COMPLETED);
    running = asTask(await slowA.sendMessage(textMessage('slow work of A', { returnImmediately: true, messageId: `a-slow-${binding}` })));
    expect([TaskState.TASK_STATE_SUBMITTED, TaskState.TASK_STATE_WORKING]).toContain(running.status?.state);
    configId = `cfg-a-${binding}`;
    const created = await slowA.createTaskPushNotificationConfig(TaskPushNotificationConfig.fromJSON({ taskId: running.id, id: configId, url: PUSH_URL }));
    expect(created).toMatchObject({ id: configId, taskId: running.id, url: PUSH_URL });
  });
  // The slow task would otherwise hold the executor (and the shutdown) for its whole delay.
  afterAll(async () => {
    const canceled = await slowA.cancelTask(CancelTaskRequest.fromJSON({ id: running.id }));
    expect(canceled.status?.state).toBe(TaskState.TASK_STATE_CANCELED);
  });

  it('A itself can read both of its tasks (the control)', async () => {
    expect((await echoA.getTask(GetTaskRequest.fromJSON({ id: completed.id }))).id).toBe(completed.id);
    expect((await slowA.getTask(GetTaskRequest.fromJSON({ id: running.id }))).id).toBe(running.id);
  });

  it('B gets TaskNotFoundError from GetTask on a completed and on a running task of A', async () => {
    await expectTaskNotFound(binding, echoB.getTask(GetTaskRequest.fromJSON({ id: completed.id })));
    await expectTaskNotFound(binding, slowB.getTask(GetTaskRequest.fromJSON({ id: running.id })));
  });

  it('B gets TaskNotFoundError from CancelTask, and A\'s task keeps running', async () => {
    await expectTaskNotFound(binding, slowB.cancelTask(CancelTaskRequest.fromJSON({ id: running.id })));
    // On the completed task too: not TaskNotCancelableError, which would reveal that it exists.
    await expectTaskNotFound(binding, echoB.cancelTask(CancelTaskRequest.fromJSON({ id: completed.id })));
    const still = await slowA.getTask(GetTaskRequest.fromJSON({ id: running.id }));
    expect([TaskState.TASK_STATE_SUBMITTED, TaskState.TASK_STATE_WORKING]).toContain(still.status?.state);
  });

  it('B gets TaskNotFoundError from SubscribeToTask (resubscribeTask), running or terminal', async () => {
    await expectTaskNotFound(binding, firstEvent(slowB.resubscribeTask(SubscribeToTaskRequest.fromJSON({ id: running.id }))));
    // A would get UnsupportedOperationError (-32004) here; B must not learn the task is terminal.
    await expectTaskNotFound(binding, firstEvent(echoB.resubscribeTask(SubscribeToTaskRequest.fromJSON({ id: completed.id }))));
  });

  it('B gets TaskNotFoundError from all four push-config methods, and A\'s config is untouched', async () => {
    const before = await rowCounts(keel.context.pool);
    await expectTaskNotFound(binding, slowB.createTaskPushNotificationConfig(TaskPushNotificationConfig.fromJSON({ taskId: running.id, id: 'cfg-b', url: PUSH_URL })));
    await expectTaskNotFound(binding, slowB.getTaskPushNotificationConfig(GetTaskPushNotificationConfigRequest.fromJSON({ taskId: running.id, id: configId })));
    await expectTaskNotFound(binding, slowB.listTaskPushNotificationConfig(ListTaskPushNotificationConfigsRequest.fromJSON({ taskId: running.id })));
    await expectTaskNotFound(binding, slowB.deleteTaskPushNotificationConfig(DeleteTaskPushNotificationConfigRequest.fromJSON({ taskId: running.id, id: configId })));
    expect(await rowCounts(keel.context.pool)).toEqual(before);
    const mine = await slowA.listTaskPushNotificationConfig(ListTaskPushNotificationConfigsRequest.fromJSON({ taskId: running.id }));
    expect(mine.configs.map((config) => config.id)).toEqual([configId]);
    expect(await slowA.getTaskPushNotificationConfig(GetTaskPushNotificationConfigRequest.fromJSON({ taskId: running.id, id: configId }))).toMatchObject({ id: configId, url: PUSH_URL });
  });

  it('B sending a message with A\'s taskId gets TaskNotFoundError (-32001), running or terminal, and nothing is written', async () => {
    const before = await rowCounts(keel.context.pool);
    await expectTaskNotFound(binding, slowB.sendMessage(textMessage('hijack', { taskId: running.id })));
    // Not UnsupportedOperationError, which is what A gets for its terminal task.
    await expectTaskNotFound(binding, echoB.sendMessage(textMessage('hijack', { taskId: completed.id })));
    await expectTaskNotFound(binding, echoB.sendMessage(textMessage('hijack', { taskId: completed.id, contextId: completed.contextId })));
    expect(await rowCounts(keel.context.pool)).toEqual(before);
  });

  it('B\'s ListTasks never contains A\'s tasks and its totalSize counts only B\'s', async () => {
    const own = asTask(await echoB.sendMessage(textMessage(`B's own ${binding}`)));
    const ownIds = (await keel.context.pool.anyFirst(sql.type(z.object({ id: z.string() }))`
      SELECT t.id FROM a2a_tasks t JOIN clients c ON c.id = t.owner WHERE c.name = 'client-b' AND t.agent = 'echo'`)) as readonly string[];
    expect(ownIds).toContain(own.id);
    const aIds = new Set(
      (await keel.context.pool.anyFirst(sql.type(z.object({ id: z.string() }))`
        SELECT t.id FROM a2a_tasks t JOIN clients c ON c.id = t.owner WHERE c.name = 'client-a'`)) as readonly string[],
    );
    expect(aIds.has(completed.id) && aIds.has(running.id)).toBe(true);

    const listed = await echoB.listTasks(ListTasksRequest.fromJSON({ pageSize: 100 }));
    expect(listed.tasks.map((task) => task.id).sort()).toEqual([...ownIds].sort());
    expect(listed.tasks.some((task) => aIds.has(task.id))).toBe(false);
    expect(listed.totalSize).toBe(ownIds.length);

    // Filtering by A's context, by a state only A's tasks are in, or paging: still nothing of A's.
    const byContext = await echoB.listTasks(ListTasksRequest.fromJSON({ contextId: running.contextId }));
    expect(byContext.tasks.filter((task) => aIds.has(task.id))).toEqual([]);
    const working = await slowB.listTasks(ListTasksRequest.fromJSON({ status: 'TASK_STATE_WORKING' }));
    expect(working.tasks.filter((task) => aIds.has(task.id))).toEqual([]);
    let pageToken = '';
    const seen: string[] = [];
    do {
      const page = await echoB.listTasks(ListTasksRequest.fromJSON({ pageSize: 1, pageToken }));
      expect(page.totalSize).toBe(ownIds.length);
      seen.push(...page.tasks.map((task) => task.id));
      pageToken = page.nextPageToken;
    } while (pageToken);
    expect(seen.sort()).toEqual([...ownIds].sort());

    // A's lists (one per agent endpoint) have its own tasks of that agent and none of B's.
    const listedA = await echoA.listTasks(ListTasksRequest.fromJSON({ pageSize: 100 }));
    expect(listedA.tasks.map((task) => task.id)).toContain(completed.id);
    expect(listedA.tasks.map((task) => task.id)).not.toContain(running.id);
    expect(listedA.tasks.map((task) => task.id)).not.toContain(own.id);
    const slowListedA = await slowA.listTasks(ListTasksRequest.fromJSON({ pageSize: 100 }));
    expect(slowListedA.tasks.map((task) => task.id)).toContain(running.id);
    expect(listedA.totalSize + slowListedA.totalSize).toBe(aIds.size);
  });

  it('B using A\'s contextId gets a context of its own: A\'s history is neither shown nor given to the agent', async () => {
    const contextId = completed.contextId;
    const bText = `B in a borrowed context ${binding}`;
    const bTask = asTask(await echoB.sendMessage(textMessage(bText, { contextId, messageId: `b-borrowed-${binding}` })));
    expect(bTask.contextId).toBe(contextId);
    expect(bTask.status?.state).toBe(TaskState.TASK_STATE_COMPLETED);
    const full = await echoB.getTask(GetTaskRequest.fromJSON({ id: bTask.id, historyLength: 100 }));
    expect(full.history.map((message) => message.messageId)).toEqual([`b-borrowed-${binding}`]);
    expect(JSON.stringify(full)).not.toContain('alpha-private');
    // The transcript B's run was given holds only B's message: A's long text would weigh 200+ tokens.
    expect(await runTokens(bTask.id)).toBeLessThan(50);
    // Control: A's second turn in that context does read A's history.
    const aSecond = asTask(await echoA.sendMessage(textMessage('second turn of A', { contextId })));
    expect(await runTokens(aSecond.id)).toBeGreaterThan(200);
    const aSecondView = await echoA.getTask(GetTaskRequest.fromJSON({ id: aSecond.id, historyLength: 100 }));
    expect(JSON.stringify(aSecondView)).not.toContain(bText);

    // Two context rows of that id, one per owner; B's listing of the context shows B's task only.
    const owners = await keel.context.pool.anyFirst(sql.type(z.object({ name: z.string() }))`
      SELECT c.name FROM contexts x JOIN clients c ON c.id = x.owner WHERE x.id = ${contextId} ORDER BY c.name`);
    expect(owners).toEqual(['client-a', 'client-b']);
    const inContext = await echoB.listTasks(ListTasksRequest.fromJSON({ contextId }));
    expect(inContext.tasks.map((task) => task.id)).toEqual([bTask.id]);
    expect(inContext.totalSize).toBe(1);
  });
});

describe('without a valid token', () => {
  const message = { message: { messageId: 'anon-1', role: 'ROLE_USER', parts: [{ text: 'hello' }] } };

  it.each(BINDINGS)('%s answers 401 with WWW-Authenticate and writes nothing', async (binding) => {
    const before = await rowCounts(keel.context.pool);
    for (const token of [null, 'keel_not-a-real-token-at-all-aaaaaaaaaaaaaaaaaaaa', 'garbage']) {
      const response =
        binding === 'JSONRPC'
          ? await rawRpc(keel.url, 'echo', { jsonrpc: '2.0', id: 1, method: 'SendMessage', params: message }, { token })
          : await rawRest(keel.url, 'echo', 'POST', '/message:send', message, { token });
      expect(response.headers.get('www-authenticate') ?? '').toMatch(/^Bearer\b/);
      if (binding === 'JSONRPC') expectRpcError(response, { code: -32600, reason: 'UNAUTHENTICATED', rpcHttpStatus: 401 }, 1);
      else expectRestError(response, { httpStatus: 401, reason: 'UNAUTHENTICATED', status: 'UNAUTHENTICATED' });
    }
    // Reads too: no task id, real or not, is confirmed to a caller without a token.
    const get = binding === 'JSONRPC'
      ? await rawRpc(keel.url, 'echo', { jsonrpc: '2.0', id: 1, method: 'ListTasks', params: {} }, { token: null })
      : await rawRest(keel.url, 'echo', 'GET', '/tasks', undefined, { token: null });
    expect(get.status).toBe(401);
    expect(get.headers.get('www-authenticate') ?? '').toMatch(/^Bearer\b/);
    expect(await rowCounts(keel.context.pool)).toEqual(before);
  });

  it.each(BINDINGS)('the official client without a token is refused on %s and nothing is written', async (binding) => {
    const before = await rowCounts(keel.context.pool);
    const anonymous = await sdkClient(keel.url, 'echo', null, binding);
    await expect(anonymous.sendMessage(textMessage('hello'))).rejects.toThrow();
    await expect(anonymous.listTasks(ListTasksRequest.fromJSON({}))).rejects.toThrow();
    expect(await rowCounts(keel.context.pool)).toEqual(before);
  });

  it('leaves no half-written row behind', async () => {
    expect(await halfWrittenRows(keel.context.pool)).toEqual([]);
  });
});
