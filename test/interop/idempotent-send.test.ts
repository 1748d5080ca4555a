import { randomUUID } from 'node:crypto';
import { SendMessageRequest, Task } from '@a2a-js/sdk';
import { isJsonRpcError } from '@a2a-js/sdk/errors';
import { status as GrpcStatus, type Client as GrpcClient } from '@grpc/grpc-js';
import { sql } from 'slonik';
import { z } from 'zod';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createClient } from '../../src/auth/client-repository.js';
import { purgeExpiredRuns } from '../../src/tasks/retention.js';
import { sdkClient, textMessage } from '../support/a2a-client.js';
import { callA2A, rawRest, type WireResponse } from '../support/a2a-wire.js';
import { decodeServiceError, grpcMetadata, rawGrpcClient, rawUnary } from '../support/grpc-client.js';
import { readSse, type SseEvent } from '../support/sse.js';
import { cliEnvFor, startTestKeel, type TestKeel } from '../support/test-keel.js';
import { waitForRunStatus } from '../support/wait-for.js';

// Idempotent SendMessage (docs/decisions/0064-idempotent-messages-decided-at-insert.md): a message
// is named by its owning client and its messageId (or the Idempotency-Key it came with). A repeat
// returns the original task and runs nothing, however many arrive at once, after completion and
// after a restart, on all three bindings; a repeat with another body is refused; another client's
// same id is its own message. Rows are counted in the database: one task, one run per message.

const AGENT = 'conformance';

let keel: TestKeel;
let raw: GrpcClient;
let token = '';
let otherToken = '';

type Json = Record<string, any>; // eslint-disable-line @typescript-eslint/no-explicit-any
type WireBinding = 'JSONRPC' | 'HTTP+JSON' | 'GRPC';
const BINDINGS: readonly WireBinding[] = ['JSONRPC', 'HTTP+JSON', 'GRPC'];

const unique = (prefix: string) => `${prefix}-${randomUUID()}`;

beforeAll(async () => {
  keel = await startTestKeel({
    overrides: {
      KEEL_GRPC_PORT: '0',
      KEEL_PRIVACY_LEVEL: 'full',
      KEEL_PROVIDERS: { conformance: { type: 'conformance', streamTimeoutSeconds: 1 } },
      KEEL_AGENTS: [{ id: AGENT, name: 'Conformance', provider: 'conformance', limits: { maxIterations: 10 } }],
    },
  });
  const mine = await createClient(keel.context.pool, 'idempotent-a');
  const theirs = await createClient(keel.context.pool, 'idempotent-b');
  if (!mine.ok || !theirs.ok) throw new Error('clients');
  token = mine.token;
  otherToken = theirs.token;
  raw = rawGrpcClient(keel.grpcAddress!);
});
afterAll(async () => {
  raw?.close();
  await keel?.dispose();
});

function messageParams(messageId: string, text: string, extra: { taskId?: string; returnImmediately?: boolean } = {}): Json {
  return {
    message: { messageId, role: 'ROLE_USER', parts: [{ text }], ...(extra.taskId ? { taskId: extra.taskId } : {}) },
    ...(extra.returnImmediately ? { configuration: { returnImmediately: true } } : {}),
  };
}

type Sent = { taskId: string | null; state: string | null; error: { rpcCode?: number; httpStatus: number; grpcCode?: number; reason?: string; metadata?: Json; message?: string } | null };

function errorInfo(details: Json[] | undefined): Json | undefined {
  return details?.find((detail) => detail['@type'] === 'type.googleapis.com/google.rpc.ErrorInfo');
}

/** One SendMessage on a binding, as the wire shows it: the task it names, or the error. */
async function send(binding: WireBinding, params: Json, options: { as?: string; idempotencyKey?: string } = {}): Promise<Sent> {
  const as = options.as ?? token;
  if (binding === 'GRPC') {
    const outcome = await rawUnary(
      raw,
      'sendMessage',
      SendMessageRequest.fromJSON(params),
      grpcMetadata({ authorization: `Bearer ${as}`, 'a2a-version': '1.0', 'idempotency-key': options.idempotencyKey ?? null }),
    );
    if (outcome.error) {
      const decoded = decodeServiceError(outcome.error);
      return { taskId: null, state: null, error: { httpStatus: 0, grpcCode: decoded.code, reason: decoded.reason!, metadata: decoded.errorMetadata, message: decoded.message } };
    }
    const payload = (outcome.response as { payload: { $case?: string; value: Json } }).payload;
    const task = Task.toJSON(payload.value as Task) as Json;
    return { taskId: task.id, state: task.status.state, error: null };
  }
  const response: WireResponse = await callA2A(keel.url, AGENT, binding, 'SendMessage', params, {
    token: as,
    ...(options.idempotencyKey !== undefined ? { headers: { 'idempotency-key': options.idempotencyKey } } : {}),
  });
  if (binding === 'JSONRPC') {
    if (response.body.error) {
      const info = errorInfo(response.body.error.data);
      return { taskId: null, state: null, error: { rpcCode: response.body.error.code, httpStatus: response.status, reason: info?.reason, metadata: info?.metadata, message: response.body.error.message } };
    }
    const task = response.body.result.task;
    return { taskId: task.id, state: task.status.state, error: null };
  }
  if (response.status !== 200) {
    const info = errorInfo(response.body.error.details);
    return { taskId: null, state: null, error: { httpStatus: response.status, reason: info?.reason, metadata: info?.metadata, message: response.body.error.message } };
  }
  return { taskId: response.body.task.id, state: response.body.task.status.state, error: null };
}

const counted = z.object({ tasks: z.number(), runs: z.number() });

/** The task rows with this key for any owner, and their runs. */
async function rowsOfKey(key: string) {
  return keel.context.pool.one(sql.type(counted)`
    SELECT count(*)::int AS tasks, (SELECT count(*)::int FROM runs r WHERE r.task_id IN (SELECT id FROM a2a_tasks WHERE message_key = ${key})) AS runs
    FROM a2a_tasks WHERE message_key = ${key}`);
}

describe.each(BINDINGS)('over %s', (binding) => {
  it('twenty concurrent sends with one messageId make one task and one run, and all twenty answers name it; so do twenty more after its end', async () => {
    const messageId = unique('tck-complete-task');
    const answers = await Promise.all(Array.from({ length: 20 }, () => send(binding, messageParams(messageId, 'once'))));
    expect(answers.map((answer) => answer.error)).toEqual(answers.map(() => null));
    const taskId = answers[0]!.taskId!;
    expect(new Set(answers.map((answer) => answer.taskId))).toEqual(new Set([taskId]));
    // A blocking repeat waits as the original does: every answer shows the end.
    expect(new Set(answers.map((answer) => answer.state))).toEqual(new Set(['TASK_STATE_COMPLETED']));
    expect(await rowsOfKey(messageId)).toEqual({ tasks: 1, runs: 1 });

    const later = await Promise.all(Array.from({ length: 20 }, () => send(binding, messageParams(messageId, 'once'))));
    expect(new Set(later.map((answer) => answer.taskId))).toEqual(new Set([taskId]));
    expect(await rowsOfKey(messageId)).toEqual({ tasks: 1, runs: 1 });
  });

  it('refuses a repeat with another body, naming the id (422 on HTTP+JSON, invalid params on JSON-RPC and gRPC), and writes nothing', async () => {
    const messageId = unique('tck-complete-task');
    const first = await send(binding, messageParams(messageId, 'the first body'));
    expect(first.error).toBeNull();
    const other = await send(binding, messageParams(messageId, 'another body'));
    expect(other.taskId).toBeNull();
    expect(other.error).toMatchObject({ reason: 'MESSAGE_KEY_REUSED', metadata: { messageId, taskId: first.taskId } });
    expect(other.error!.message).toContain(messageId);
    if (binding === 'JSONRPC') expect(other.error).toMatchObject({ rpcCode: -32602, httpStatus: 200 });
    if (binding === 'HTTP+JSON') expect(other.error!.httpStatus).toBe(422);
    if (binding === 'GRPC') expect(other.error!.grpcCode).toBe(GrpcStatus.INVALID_ARGUMENT);
    expect(await rowsOfKey(messageId)).toEqual({ tasks: 1, runs: 1 });
  });

  it("gives a second client's same messageId a task of its own", async () => {
    const messageId = unique('tck-complete-task');
    const mine = await send(binding, messageParams(messageId, 'same words'));
    const theirs = await send(binding, messageParams(messageId, 'same words'), { as: otherToken });
    expect(mine.error).toBeNull();
    expect(theirs.error).toBeNull();
    expect(theirs.taskId).not.toBe(mine.taskId);
    expect(await rowsOfKey(messageId)).toEqual({ tasks: 2, runs: 2 });
    // Each client's repeat finds its own.
    expect((await send(binding, messageParams(messageId, 'same words'), { as: otherToken })).taskId).toBe(theirs.taskId);
    expect((await send(binding, messageParams(messageId, 'same words'))).taskId).toBe(mine.taskId);
  });

  it('takes the Idempotency-Key (a header, or gRPC metadata) as the key in place of the messageId', async () => {
    const key = unique('key');
    const first = await send(binding, messageParams(unique('tck-complete-task'), 'keyed'), { idempotencyKey: key });
    // A retry that made a new messageId for the same request is still the same message.
    const again = await send(binding, messageParams(unique('tck-complete-task'), 'keyed'), { idempotencyKey: key });
    expect(first.error).toBeNull();
    expect(again.taskId).toBe(first.taskId);
    expect(await rowsOfKey(key)).toEqual({ tasks: 1, runs: 1 });
    const other = await send(binding, messageParams(unique('tck-complete-task'), 'another request'), { idempotencyKey: key });
    expect(other.error).toMatchObject({ reason: 'MESSAGE_KEY_REUSED', metadata: { idempotencyKey: key } });
    expect(other.error!.message).toContain(`Idempotency-Key ${key}`);
    const tooLong = await send(binding, messageParams(unique('tck-complete-task'), 'keyed'), { idempotencyKey: 'k'.repeat(1025) });
    expect(tooLong.error?.reason).toBe('INVALID_ARGUMENT');
    expect(tooLong.error?.message).toContain('Idempotency-Key');
  });

  it('a follow-up sent ten times at once provides the input once; its repeats, then and after the end, answer with the task', async () => {
    const created = await send(binding, messageParams(unique('tck-input-required'), 'start'));
    expect(created.state).toBe('TASK_STATE_INPUT_REQUIRED');
    const taskId = created.taskId!;
    const followUp = unique('tck-complete-task');
    const answers = await Promise.all(Array.from({ length: 10 }, () => send(binding, messageParams(followUp, 'my reply', { taskId }))));
    expect(answers.map((answer) => answer.error)).toEqual(answers.map(() => null));
    expect(new Set(answers.map((answer) => answer.taskId))).toEqual(new Set([taskId]));
    await waitForRunStatus(keel.context.pool, taskId, ['completed']);
    const after = await send(binding, messageParams(followUp, 'my reply', { taskId }));
    expect(after).toMatchObject({ taskId, state: 'TASK_STATE_COMPLETED', error: null });
    const task = await callA2A(keel.url, AGENT, 'JSONRPC', 'GetTask', { id: taskId, historyLength: 50 }, { token });
    const replies = (task.body.result.history as Json[]).filter((message) => message.role === 'ROLE_USER' && message.parts[0]?.text === 'my reply');
    expect(replies, 'the reply is in the history once').toHaveLength(1);
    const keys = await keel.context.pool.oneFirst(sql.type(z.object({ n: z.number() }))`SELECT count(*)::int AS n FROM a2a_follow_up_keys WHERE task_id = ${taskId}`);
    expect(keys).toBe(1);
    const other = await send(binding, messageParams(followUp, 'another reply', { taskId }));
    expect(other.error?.reason).toBe('MESSAGE_KEY_REUSED');
  });
});

describe('what a repeat returns', () => {
  it('a non-blocking repeat returns the task as it is now, and runs nothing', async () => {
    // The conformance agent waits 2 s (twice its stream timeout) for this prefix before answering.
    const messageId = unique('test-resubscribe-message-id');
    const first = await send('JSONRPC', messageParams(messageId, 'slow', { returnImmediately: true }));
    const repeat = await send('HTTP+JSON', messageParams(messageId, 'slow', { returnImmediately: true }));
    expect(repeat.taskId).toBe(first.taskId);
    expect(['TASK_STATE_SUBMITTED', 'TASK_STATE_WORKING']).toContain(repeat.state);
    // A blocking repeat waits for the end as the original would.
    const blocking = await send('GRPC', messageParams(messageId, 'slow'));
    expect(blocking).toMatchObject({ taskId: first.taskId, state: 'TASK_STATE_COMPLETED' });
    expect(await rowsOfKey(messageId)).toEqual({ tasks: 1, runs: 1 });
  });

  const restStream = async (params: Json) => {
    const response = await fetch(`${keel.url}/a2a/${AGENT}/message:stream`, {
      method: 'POST',
      headers: { authorization: `Bearer ${token}`, 'content-type': 'application/a2a+json', 'a2a-version': '1.0' },
      body: JSON.stringify(params),
    });
    expect(response.status).toBe(200);
    return readSse(response);
  };
  const shape = (events: SseEvent[]) =>
    events.map((event) => {
      const data = event.data as Json;
      return { id: event.id, kind: Object.keys(data)[0], state: data.task?.status.state ?? data.statusUpdate?.status.state ?? null, artifact: data.artifactUpdate?.artifact.parts ?? null };
    });

  it('a streaming repeat gets the stream from the beginning, event for event', async () => {
    const messageId = unique('tck-stream-003');
    const stream = () => restStream(messageParams(messageId, 'stream me'));
    const first = await stream();
    const repeat = await stream();
    expect(shape(first).at(-1)?.state).toBe('TASK_STATE_COMPLETED');
    expect(shape(first)[0]).toMatchObject({ kind: 'task', state: 'TASK_STATE_SUBMITTED' });
    expect(shape(repeat)).toEqual(shape(first));
    expect(await rowsOfKey(messageId)).toEqual({ tasks: 1, runs: 1 });
    // And over JSON-RPC, framed its way: the same task.
    const rpc = await fetch(`${keel.url}/a2a/${AGENT}`, {
      method: 'POST',
      headers: { authorization: `Bearer ${token}`, 'content-type': 'application/json', 'a2a-version': '1.0' },
      body: JSON.stringify({ jsonrpc: '2.0', id: 7, method: 'SendStreamingMessage', params: messageParams(messageId, 'stream me') }),
    });
    const events = await readSse(rpc);
    expect((events[0]!.data as Json).result.task.id).toBe((first[0]!.data as Json).task.id);
  });

  it("a streaming follow-up's repeat gets the follow-up's stream from where it began", async () => {
    const created = await send('JSONRPC', messageParams(unique('tck-input-required'), 'start'));
    expect(created.state).toBe('TASK_STATE_INPUT_REQUIRED');
    const followUp = messageParams(unique('tck-stream-003'), 'go on', { taskId: created.taskId! });
    const first = await restStream(followUp);
    const repeat = await restStream(followUp);
    expect(shape(first).at(-1)?.state).toBe('TASK_STATE_COMPLETED');
    expect(shape(first)[0]!.state, 'it begins after the input request').not.toBe('TASK_STATE_INPUT_REQUIRED');
    expect(shape(repeat)).toEqual(shape(first));
  });

  it('the official client (@a2a-js/sdk) gets the same task for a repeat and a typed invalid-params error for another body', async () => {
    const client = await sdkClient(keel.url, AGENT, token, 'JSONRPC');
    const grpc = await sdkClient(keel.url, AGENT, token, 'GRPC');
    const messageId = unique('tck-complete-task');
    const first = (await client.sendMessage(textMessage('sdk words', { messageId }))) as Task;
    const again = (await grpc.sendMessage(textMessage('sdk words', { messageId }))) as Task;
    expect(again.id).toBe(first.id);
    const refused = await client.sendMessage(textMessage('other words', { messageId })).then(
      () => null,
      (error: unknown) => error,
    );
    expect(isJsonRpcError(refused) && refused.envelopeCode).toBe(-32602);
    expect(String(refused)).toContain(messageId);
  });

  it('after a purge the key is gone with its task: a repeat makes a new task', async () => {
    const messageId = unique('tck-complete-task');
    const first = await send('JSONRPC', messageParams(messageId, 'kept for a while'));
    await waitForRunStatus(keel.context.pool, first.taskId!, ['completed']);
    await keel.context.pool.query(sql.unsafe`UPDATE runs SET settled_at = now() - interval '2 days' WHERE task_id = ${first.taskId}`);
    const purged = await purgeExpiredRuns(keel.context.pool, 1);
    expect(purged.runs).toBeGreaterThanOrEqual(1);
    const after = await send('JSONRPC', messageParams(messageId, 'kept for a while'));
    expect(after.error).toBeNull();
    expect(after.taskId).not.toBe(first.taskId);
    expect(await rowsOfKey(messageId)).toEqual({ tasks: 1, runs: 1 });
  });
});

describe('after a restart', () => {
  it('a repeat sent to a new Keel on the same database answers with the task, concurrently, on every binding', async () => {
    const messageId = unique('tck-complete-task');
    const first = await send('HTTP+JSON', messageParams(messageId, 'before the restart'));
    expect(first.error).toBeNull();
    const restarted = await startTestKeel({
      databaseUrl: keel.databaseUrl,
      env: cliEnvFor(keel),
      overrides: {
        KEEL_GRPC_PORT: '0',
        KEEL_PRIVACY_LEVEL: 'full',
        KEEL_PROVIDERS: { conformance: { type: 'conformance', streamTimeoutSeconds: 1 } },
        KEEL_AGENTS: [{ id: AGENT, name: 'Conformance', provider: 'conformance', limits: { maxIterations: 10 } }],
      },
    });
    await keel.stop();
    const previous = { keel, raw };
    keel = restarted;
    raw = rawGrpcClient(restarted.grpcAddress!);
    previous.raw.close();
    try {
      const answers = await Promise.all(BINDINGS.flatMap((binding) => Array.from({ length: 7 }, () => send(binding, messageParams(messageId, 'before the restart')))));
      expect(answers.map((answer) => answer.error)).toEqual(answers.map(() => null));
      expect(new Set(answers.map((answer) => answer.taskId))).toEqual(new Set([first.taskId]));
      expect(await rowsOfKey(messageId)).toEqual({ tasks: 1, runs: 1 });
      const refused = await rawRest(restarted.url, AGENT, 'POST', '/message:send', messageParams(messageId, 'changed'), { token });
      expect(refused.status).toBe(422);
      expect(refused.body.error).toMatchObject({ code: 422, status: 'INVALID_ARGUMENT' });
    } finally {
      // The database belongs to the first Keel (its dispose drops it); the second only stops.
      keel = previous.keel;
      await restarted.stop();
    }
  });
});

describe('with a2a.messageIdIsKey off', () => {
  it('a messageId sent again is a new message on every binding (a client that reuses ids, like the conformance kit); an Idempotency-Key still names one', async () => {
    const unkeyed = await startTestKeel({
      databaseUrl: keel.databaseUrl,
      env: cliEnvFor(keel),
      overrides: {
        KEEL_GRPC_PORT: '0',
        KEEL_PRIVACY_LEVEL: 'full',
        KEEL_A2A_MESSAGE_ID_IS_KEY: 'false',
        KEEL_PROVIDERS: { conformance: { type: 'conformance', streamTimeoutSeconds: 1 } },
        KEEL_AGENTS: [{ id: AGENT, name: 'Conformance', provider: 'conformance', limits: { maxIterations: 10 } }],
      },
    });
    const previous = { keel, raw };
    keel = unkeyed;
    raw = rawGrpcClient(unkeyed.grpcAddress!);
    try {
      const messageId = unique('tck-complete-task');
      const sent = [];
      for (const binding of BINDINGS) {
        sent.push(await send(binding, messageParams(messageId, 'the same text')));
        sent.push(await send(binding, messageParams(messageId, `another text over ${binding}`)));
      }
      expect(sent.map((answer) => answer.error)).toEqual(sent.map(() => null));
      expect(new Set(sent.map((answer) => answer.taskId)).size).toBe(sent.length);
      const tasks = await keel.context.pool.oneFirst(sql.type(z.object({ n: z.number() }))`
        SELECT count(*)::int AS n FROM a2a_tasks WHERE id = ANY(${sql.array(sent.map((answer) => answer.taskId!), 'uuid')}) AND message_key LIKE 'unkeyed:%'`);
      expect(tasks).toBe(sent.length);

      const key = unique('key');
      const first = await send('HTTP+JSON', messageParams(unique('tck-complete-task'), 'keyed'), { idempotencyKey: key });
      const again = await send('JSONRPC', messageParams(unique('tck-complete-task'), 'keyed'), { idempotencyKey: key });
      expect(again.taskId).toBe(first.taskId);
      expect(await rowsOfKey(key)).toEqual({ tasks: 1, runs: 1 });
    } finally {
      raw.close();
      keel = previous.keel;
      raw = previous.raw;
      await unkeyed.stop();
    }
  });
});
