import { ListTasksRequest, SendMessageRequest, SubscribeToTaskRequest } from '@a2a-js/sdk';
import { A2AService as A2AServiceDefinition } from '@a2a-js/sdk/server/grpc';
import { BinaryReader } from '@bufbuild/protobuf/wire';
import { decodeStatus } from '@a2a-js/sdk/errors/grpc';
import type { Client as GrpcClient, ClientReadableStream, Metadata, ServiceError } from '@grpc/grpc-js';
import { sql } from 'slonik';
import { z } from 'zod';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createClient } from '../../../src/auth/client-repository.js';
import { sdkClient, textMessage } from '../../support/a2a-client.js';
import { decodeServiceError, grpcMetadata, rawGrpcClient, rawUnary, sdkFailure, type DecodedGrpcError } from '../../support/grpc-client.js';
import { startTestKeel, type TestKeel } from '../../support/test-keel.js';
import { waitFor } from '../../support/wait-for.js';

// Per-client limits (docs/reliability.md, "Per-client limits"; issue 40) on all three bindings,
// with the exact wire shape of each refusal: HTTP 429 with Retry-After and the A2A error (JSON-RPC
// error -32029 / HTTP+JSON google.rpc.Status, ErrorInfo and RetryInfo), gRPC RESOURCE_EXHAUSTED
// with `retry-after` metadata and the same details. Each limit has a client of its own (its
// override by name); `other` has the defaults and is never touched by another client's limit.

type Json = Record<string, any>; // eslint-disable-line @typescript-eslint/no-explicit-any

const DOMAIN = 'a2a-protocol.org';
const ERROR_INFO = 'type.googleapis.com/google.rpc.ErrorInfo';
const RETRY_INFO = 'type.googleapis.com/google.rpc.RetryInfo';
const RESOURCE_EXHAUSTED = 8;
const SLOW_MS = 5_000;

const LIMITS = {
  rate: { requestsPerSecond: 0.25, burst: 2 },
  inflight: { concurrentRequests: 1 },
  streams: { openStreams: 1 },
  runs: { concurrentRuns: 1 },
  sdk: { requestsPerSecond: 0.2, burst: 1 },
};

const overrides = {
  KEEL_GRPC_PORT: '0',
  KEEL_PRIVACY_LEVEL: 'full',
  KEEL_RUNS_PROVIDER_ATTEMPTS: '1',
  // The cancelled hold runs sleep on: the shutdown does not wait for them.
  KEEL_RUNS_SHUTDOWN_GRACE_SECONDS: '1',
  KEEL_LIMITS_CLIENTS: LIMITS,
  KEEL_PROVIDERS: {
    echo: { type: 'echo' },
    slow: { type: 'scripted', steps: [{ delayMs: SLOW_MS, reply: 'late' }] },
    hold: { type: 'scripted', steps: [{ delayMs: 60_000, reply: 'never' }] },
  },
  KEEL_AGENTS: [
    { id: 'echo', name: 'Echo', provider: 'echo' },
    { id: 'slow', name: 'Slow', provider: 'slow' },
    { id: 'hold', name: 'Hold', provider: 'hold' },
  ],
};

let keel: TestKeel;
let raw: GrpcClient;
const tokens: Record<string, string> = {};
const ids: Record<string, string> = {};

beforeAll(async () => {
  keel = await startTestKeel({ overrides });
  for (const name of [...Object.keys(LIMITS), 'other']) {
    const created = await createClient(keel.context.pool, name);
    if (!created.ok) throw new Error(`client ${name}`);
    tokens[name] = created.token;
    ids[name] = created.client.id;
  }
  raw = rawGrpcClient(keel.grpcAddress!);
});
afterAll(async () => {
  raw?.close();
  await keel?.dispose();
});

const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));
const headers = (client: string, extra: Record<string, string> = {}) => ({
  authorization: `Bearer ${tokens[client]}`,
  'a2a-version': '1.0',
  'content-type': 'application/json',
  ...extra,
});

type Answer = { status: number; retryAfter: string | null; body: Json };

async function rpc(client: string, method: string, params: Json, agent = 'echo', id: string | number = 1): Promise<Answer> {
  const response = await fetch(`${keel.url}/a2a/${agent}`, { method: 'POST', headers: headers(client), body: JSON.stringify({ jsonrpc: '2.0', id, method, params }) });
  return { status: response.status, retryAfter: response.headers.get('retry-after'), body: (await response.json()) as Json };
}

async function rest(client: string, method: string, path: string, body?: Json, agent = 'echo'): Promise<Answer> {
  const response = await fetch(`${keel.url}/a2a/${agent}${path}`, { method, headers: headers(client), ...(body ? { body: JSON.stringify(body) } : {}) });
  return { status: response.status, retryAfter: response.headers.get('retry-after'), body: (await response.json()) as Json };
}

const message = (text: string) => ({ messageId: `m-${Math.random().toString(36).slice(2)}`, role: 'ROLE_USER', parts: [{ text }] });
const sendParams = (text: string, returnImmediately = false) => ({ message: message(text), ...(returnImmediately ? { configuration: { returnImmediately: true } } : {}) });
const grpcAuth = (client: string) => grpcMetadata({ authorization: `Bearer ${tokens[client]}`, 'a2a-version': '1.0' });

const tasksOf = (client: string) =>
  keel.context.pool.oneFirst(sql.type(z.object({ n: z.number() }))`SELECT count(*)::int AS n FROM a2a_tasks WHERE owner = ${ids[client]!}`);

/** The limit's message, ErrorInfo metadata and wait, as every binding carries them. */
function expected(kind: keyof typeof MESSAGES, limitValue: string, wait: number, extra: Record<string, string> = {}) {
  const metadata = { limit: kind, limitValue, ...extra, retryAfterSeconds: String(wait) };
  return {
    message: `client limit ${kind} reached: ${MESSAGES[kind](limitValue)}; retry after ${wait} s`,
    metadata,
    details: [
      { '@type': ERROR_INFO, reason: 'CLIENT_LIMIT_EXCEEDED', domain: DOMAIN, metadata },
      { '@type': RETRY_INFO, retryDelay: `${wait}s` },
    ],
  };
}
const MESSAGES = {
  requestsPerSecond: (value: string) => `at most ${value} requests per second (burst 2)`,
  concurrentRequests: (value: string) => `at most ${value} requests in flight at once`,
  openStreams: (value: string) => `at most ${value} open streams at once`,
  concurrentRuns: (value: string) => `at most ${value} tasks not yet in a terminal state`,
};

function expectRpcRefusal(answer: Answer, id: string | number, shape: ReturnType<typeof expected>, wait: number) {
  expect(answer.status).toBe(429);
  expect(answer.retryAfter).toBe(String(wait));
  expect(answer.body).toEqual({ jsonrpc: '2.0', id, error: { code: -32029, message: shape.message, data: shape.details } });
}

function expectRestRefusal(answer: Answer, shape: ReturnType<typeof expected>, wait: number) {
  expect(answer.status).toBe(429);
  expect(answer.retryAfter).toBe(String(wait));
  expect(answer.body).toEqual({ error: { code: 429, status: 'RESOURCE_EXHAUSTED', message: shape.message, details: shape.details } });
}

/** google.rpc.RetryInfo's retry_delay seconds. */
function retryDelaySeconds(value: Uint8Array): number {
  const reader = new BinaryReader(value);
  let seconds = -1;
  while (reader.pos < reader.len) {
    const tag = reader.uint32();
    if (tag >>> 3 !== 1) {
      reader.skip(tag & 7);
      continue;
    }
    const duration = new BinaryReader(reader.bytes());
    while (duration.pos < duration.len) {
      const inner = duration.uint32();
      if (inner >>> 3 === 1) seconds = Number(duration.int64());
      else duration.skip(inner & 7);
    }
  }
  return seconds;
}

function expectGrpcRefusal(error: ServiceError | null, shape: ReturnType<typeof expected>, wait: number) {
  const decoded: DecodedGrpcError = decodeServiceError(error);
  expect(decoded).toMatchObject({ code: RESOURCE_EXHAUSTED, message: shape.message, reason: 'CLIENT_LIMIT_EXCEEDED', domain: DOMAIN, errorMetadata: shape.metadata });
  expect(decoded.detailTypes).toEqual([ERROR_INFO, RETRY_INFO]);
  expect(error!.details).toBe(shape.message);
  expect(error!.metadata.get('retry-after')).toEqual([String(wait)]);
  const status = decodeStatus(error!.metadata.get('grpc-status-details-bin')[0] as Buffer);
  expect(retryDelaySeconds(status.details.find((detail) => detail.typeUrl === RETRY_INFO)!.value)).toBe(wait);
}

const listTasks = (client: string) => rawUnary(raw, 'listTasks', ListTasksRequest.fromJSON({ tenant: 'echo' }), grpcAuth(client));

/** A gRPC server stream; resolves with the call once its first message or its error came. */
async function grpcStream(method: 'subscribeToTask' | 'sendStreamingMessage', request: unknown, client: string): Promise<{ call: ClientReadableStream<unknown>; error: ServiceError | null }> {
  const definition = A2AServiceDefinition[method] as unknown as { path: string; requestSerialize: (value: unknown) => Buffer; responseDeserialize: (value: Buffer) => unknown };
  const call = raw.makeServerStreamRequest(definition.path, definition.requestSerialize, definition.responseDeserialize, request, grpcAuth(client) as Metadata);
  return new Promise((resolve) => {
    call.once('data', () => resolve({ call, error: null }));
    call.once('error', (error: ServiceError) => resolve({ call, error }));
  });
}

/** An SSE stream over fetch; resolves once the first event arrived (or with the refusal's answer). */
async function sse(client: string, path: string, init: { method: string; body?: Json }, agent = 'echo') {
  const abort = new AbortController();
  const response = await fetch(`${keel.url}/a2a/${agent}${path}`, {
    method: init.method,
    headers: headers(client, { accept: 'text/event-stream' }),
    ...(init.body ? { body: JSON.stringify(init.body) } : {}),
    signal: abort.signal,
  });
  if (!response.headers.get('content-type')?.startsWith('text/event-stream')) {
    return { open: false as const, answer: { status: response.status, retryAfter: response.headers.get('retry-after'), body: (await response.json()) as Json } };
  }
  const reader = response.body!.getReader();
  let text = '';
  while (!text.includes('\n\n')) {
    const chunk = await reader.read();
    if (chunk.done) break;
    text += Buffer.from(chunk.value).toString('utf8');
  }
  /** Reads to the end of the stream (the server closed it): every event's text. */
  const rest = async () => {
    for (;;) {
      const chunk = await reader.read();
      if (chunk.done) return text;
      text += Buffer.from(chunk.value).toString('utf8');
    }
  };
  return { open: true as const, first: text, close: () => abort.abort(), rest };
}

const subscribeRpc = (taskId: string) => ({ method: 'POST', body: { jsonrpc: '2.0', id: 's', method: 'SubscribeToTask', params: { id: taskId } } });

async function holdTask(client: string): Promise<string> {
  const sent = await rpc(client, 'SendMessage', sendParams('hold', true), 'hold');
  expect(sent.status).toBe(200);
  return sent.body.result.task.id as string;
}

describe('per-client limits', () => {
  it('requestsPerSecond: past the burst, 429 / RESOURCE_EXHAUSTED with an honest wait on every binding; another client is untouched', async () => {
    // An unauthenticated request keeps its 401 (limits are per authenticated client).
    const anonymous = await fetch(`${keel.url}/a2a/echo`, { method: 'POST', headers: { 'a2a-version': '1.0', 'content-type': 'application/json' }, body: '{}' });
    expect(anonymous.status).toBe(401);

    for (let index = 0; index < 2; index += 1) expect((await rpc('rate', 'ListTasks', {})).status).toBe(200);
    const refused = await rpc('rate', 'ListTasks', {}, 'echo', 'r-3');
    const refusedAt = Date.now();
    const wait = Number(refused.retryAfter);
    // Two tokens taken within moments at 0.25/s: the next one is up to 4 s away.
    expect([1, 2, 3, 4]).toContain(wait);
    const shape = (seconds: number) => expected('requestsPerSecond', '0.25', seconds, { burst: '2' });
    expectRpcRefusal(refused, 'r-3', shape(wait), wait);

    // The other bindings: the same refusal (a refusal takes no token, so the wait only shrinks).
    const restRefused = await rest('rate', 'GET', '/tasks');
    expectRestRefusal(restRefused, shape(Number(restRefused.retryAfter)), Number(restRefused.retryAfter));
    const grpcRefused = await listTasks('rate');
    const grpcWait = Number(grpcRefused.error?.metadata.get('retry-after')[0]);
    expectGrpcRefusal(grpcRefused.error, shape(grpcWait), grpcWait);

    // Another client at the same moment, on every binding.
    expect((await rpc('other', 'ListTasks', {})).status).toBe(200);
    expect((await rest('other', 'GET', '/tasks')).status).toBe(200);
    expect((await listTasks('other')).error).toBeNull();

    // Honest: once the first refusal's wait has passed, the request goes through.
    await sleep(Math.max(0, refusedAt + wait * 1000 - Date.now()));
    expect((await rpc('rate', 'ListTasks', {})).status).toBe(200);
    expect((await rpc('rate', 'ListTasks', {})).status).toBe(429);
  }, 30_000);

  it('concurrentRequests: a request past the client’s requests in flight is refused on every binding until one ends', async () => {
    const held = rpc('inflight', 'SendMessage', sendParams('in flight'), 'slow');
    // In flight once its task exists (the gate admitted it before the task was written).
    await waitFor(async () => (await tasksOf('inflight')) === 1 || null, 'the held request in flight', 10_000);
    const shape = expected('concurrentRequests', '1', 1);
    expectRpcRefusal(await rpc('inflight', 'GetTask', { id: 'x' }, 'echo', 7), 7, shape, 1);
    expectRestRefusal(await rest('inflight', 'GET', '/tasks'), shape, 1);
    expectGrpcRefusal((await listTasks('inflight')).error, shape, 1);
    expect((await rpc('other', 'ListTasks', {})).status).toBe(200);

    const answer = await held;
    expect(answer.status).toBe(200);
    expect(answer.body.result.task.status.state).toBe('TASK_STATE_COMPLETED');
    // The slot came back when the answer was sent: one request after another passes on every binding.
    expect((await rpc('inflight', 'ListTasks', {})).status).toBe(200);
    expect((await rest('inflight', 'GET', '/tasks')).status).toBe(200);
    expect((await listTasks('inflight')).error).toBeNull();
  }, 30_000);

  it('openStreams: a stream past the limit is refused on every binding before anything is written; slots come back when a stream ends or its client goes', async () => {
    const taskId = await holdTask('streams');
    const first = await sse('streams', '', subscribeRpc(taskId), 'hold');
    expect(first.open).toBe(true);

    const shape = expected('openStreams', '1', 1);
    const refusedRpc = await sse('streams', '', subscribeRpc(taskId), 'hold');
    expect(refusedRpc.open).toBe(false);
    if (!refusedRpc.open) expectRpcRefusal(refusedRpc.answer, 's', shape, 1);
    const before = await tasksOf('streams');
    const refusedSend = await sse('streams', '/message:stream', { method: 'POST', body: sendParams('no room') });
    expect(refusedSend.open).toBe(false);
    if (!refusedSend.open) expectRestRefusal(refusedSend.answer, shape, 1);
    expect(await tasksOf('streams')).toBe(before);
    const refusedRest = await sse('streams', `/tasks/${taskId}:subscribe`, { method: 'GET' }, 'hold');
    expect(refusedRest.open).toBe(false);
    if (!refusedRest.open) expectRestRefusal(refusedRest.answer, shape, 1);
    const refusedGrpc = await grpcStream('subscribeToTask', SubscribeToTaskRequest.fromJSON({ tenant: 'hold', id: taskId }), 'streams');
    expectGrpcRefusal(refusedGrpc.error, shape, 1);
    // Unary requests and another client's streams are not held back.
    expect((await rpc('streams', 'GetTask', { id: taskId }, 'hold')).status).toBe(200);
    const others = await sse('other', '', subscribeRpc(taskId), 'hold');
    expect(others.open).toBe(false); // another client's task is not found, but not for a limit
    if (!others.open) expect(others.answer.status).toBe(200);

    // The client goes away: its slot is free again.
    if (first.open) first.close();
    const second = await waitFor(async () => {
      const attempt = await sse('streams', `/tasks/${taskId}:subscribe`, { method: 'POST' }, 'hold');
      return attempt.open ? attempt : null;
    }, 'a stream after the first client went away', 10_000);

    // The stream ends (the task is cancelled): its slot is free again.
    expect((await rest('streams', 'POST', `/tasks/${taskId}:cancel`, {}, 'hold')).status).toBe(200);
    expect(await second.rest()).toContain('TASK_STATE_CANCELED');
    const third = await waitFor(async () => {
      const attempt = await sse('streams', '/message:stream', { method: 'POST', body: sendParams('room again') });
      return attempt.open ? attempt : null;
    }, 'a stream after the last one ended', 10_000);
    expect(await third.rest()).toContain('TASK_STATE_COMPLETED');

    // A gRPC stream holds the slot too, and gives it back when its call is cancelled.
    const heldTask = await holdTask('streams');
    const grpcOpen = await grpcStream('subscribeToTask', SubscribeToTaskRequest.fromJSON({ tenant: 'hold', id: heldTask }), 'streams');
    expect(grpcOpen.error).toBeNull();
    const whileGrpc = await sse('streams', `/tasks/${heldTask}:subscribe`, { method: 'GET' }, 'hold');
    expect(whileGrpc.open).toBe(false);
    grpcOpen.call.on('error', () => undefined);
    grpcOpen.call.cancel();
    const afterGrpc = await waitFor(async () => {
      const attempt = await sse('streams', `/tasks/${heldTask}:subscribe`, { method: 'GET' }, 'hold');
      return attempt.open ? attempt : null;
    }, 'a stream after the gRPC call was cancelled', 10_000);
    afterGrpc.close();
    expect((await rpc('streams', 'CancelTask', { id: heldTask }, 'hold')).status).toBe(200);
  }, 60_000);

  it('concurrentRuns: a new task past the limit is refused on every binding, nothing written; the run comes back when it ends', async () => {
    const first = await holdTask('runs');
    const shape = expected('concurrentRuns', '1', 1);
    expectRpcRefusal(await rpc('runs', 'SendMessage', sendParams('one more'), 'echo', 'n'), 'n', shape, 1);
    expectRestRefusal(await rest('runs', 'POST', '/message:send', sendParams('one more')), shape, 1);
    expectGrpcRefusal((await rawUnary(raw, 'sendMessage', SendMessageRequest.fromJSON({ tenant: 'echo', ...sendParams('one more') }), grpcAuth('runs'))).error, shape, 1);
    const streamed = await sse('runs', '/message:stream', { method: 'POST', body: sendParams('one more') });
    expect(streamed.open).toBe(false);
    if (!streamed.open) expectRestRefusal(streamed.answer, shape, 1);
    expect(await tasksOf('runs')).toBe(1);
    // What starts no run passes; so does another client's new task.
    expect((await rpc('runs', 'GetTask', { id: first }, 'hold')).status).toBe(200);
    expect((await rpc('other', 'SendMessage', sendParams('mine'))).body.result.task.status.state).toBe('TASK_STATE_COMPLETED');

    // The run ends (cancelled): after the wait the refusal named, a new task passes.
    expect((await rpc('runs', 'CancelTask', { id: first }, 'hold')).status).toBe(200);
    let answer = await rpc('runs', 'SendMessage', sendParams('after the cancel'));
    if (answer.status === 429) {
      await sleep(Number(answer.retryAfter) * 1000);
      answer = await rpc('runs', 'SendMessage', sendParams('after the cancel'));
    }
    expect(answer.status).toBe(200);
    expect(answer.body.result.task.status.state).toBe('TASK_STATE_COMPLETED');
    // A blocking task's end frees its run at once: one after another, none refused.
    for (let index = 0; index < 5; index += 1) {
      expect((await rest('runs', 'POST', '/message:send', sendParams(`next ${index}`))).status).toBe(200);
    }
  }, 30_000);

  it('the official SDK client sees the JSON-RPC error with its code and data, and RESOURCE_EXHAUSTED over gRPC', async () => {
    const jsonRpc = await sdkClient(keel.url, 'echo', tokens.sdk!, 'JSONRPC');
    await jsonRpc.sendMessage(textMessage('first'));
    const error = (await jsonRpc.sendMessage(textMessage('second')).then(
      () => null,
      (thrown: unknown) => thrown,
    )) as { name: string; envelopeCode: number; message: string; data: Json[] } | null;
    expect(error).not.toBeNull();
    const wait = Number(error!.data[0]!.metadata.retryAfterSeconds);
    expect([1, 2, 3, 4, 5]).toContain(wait);
    expect({ name: error!.name, code: error!.envelopeCode, message: error!.message, data: error!.data }).toEqual({
      name: 'JsonRpcTransportError',
      code: -32029,
      message: `client limit requestsPerSecond reached: at most 0.2 requests per second (burst 1); retry after ${wait} s`,
      data: [
        { '@type': ERROR_INFO, reason: 'CLIENT_LIMIT_EXCEEDED', domain: DOMAIN, metadata: { limit: 'requestsPerSecond', limitValue: '0.2', burst: '1', retryAfterSeconds: String(wait) } },
        { '@type': RETRY_INFO, retryDelay: `${wait}s` },
      ],
    });
    const grpc = await sdkClient(keel.url, 'echo', tokens.sdk!, 'GRPC');
    const decoded = await sdkFailure(grpc.sendMessage(textMessage('third')));
    expect(decoded).toMatchObject({ code: RESOURCE_EXHAUSTED, reason: 'CLIENT_LIMIT_EXCEEDED', domain: DOMAIN, errorMetadata: { limit: 'requestsPerSecond' } });
  }, 30_000);

  it('counts refusals in /metrics by limit', async () => {
    const text = await (await fetch(`${keel.url}/metrics`)).text();
    for (const limit of ['requestsPerSecond', 'concurrentRequests', 'openStreams', 'concurrentRuns']) {
      const line = text.split('\n').find((candidate) => candidate.startsWith(`keel_client_limit_refusals_total{limit="${limit}"}`));
      expect(Number(line?.split(' ').at(-1)), limit).toBeGreaterThan(0);
    }
  });
});

describe('under auth.mode none', () => {
  it('every caller is the one client `anonymous`, limited by its own entry', async () => {
    const open = await startTestKeel({ overrides: { KEEL_AUTH_MODE: 'none', KEEL_LIMITS_CLIENTS: { anonymous: { requestsPerSecond: 0.1, burst: 1 } } } });
    try {
      const call = () =>
        fetch(`${open.url}/a2a/echo`, { method: 'POST', headers: { 'a2a-version': '1.0', 'content-type': 'application/json' }, body: JSON.stringify({ jsonrpc: '2.0', id: 1, method: 'ListTasks', params: {} }) });
      expect((await call()).status).toBe(200);
      const refused = await call();
      expect(refused.status).toBe(429);
      expect(((await refused.json()) as Json).error.data[0].metadata).toMatchObject({ limit: 'requestsPerSecond', limitValue: '0.1', burst: '1' });
    } finally {
      await open.dispose();
    }
  }, 30_000);
});
