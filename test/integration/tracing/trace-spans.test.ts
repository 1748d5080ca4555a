import { randomUUID } from 'node:crypto';
import { GetTaskRequest, SendMessageRequest } from '@a2a-js/sdk';
import { SpanKind, SpanStatusCode } from '@opentelemetry/api';
import type { ReadableSpan } from '@opentelemetry/sdk-trace-base';
import { sql } from 'slonik';
import { z } from 'zod';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createClient } from '../../../src/auth/client-repository.js';
import { rawRest, rawRpc } from '../../support/a2a-wire.js';
import { grpcMetadata, rawGrpcClient, rawUnary } from '../../support/grpc-client.js';
import { startInMemoryTracing, type InMemoryTracing } from '../../support/in-memory-tracing.js';
import { createTestDatabase, type TestDatabase } from '../../support/test-database.js';
import { startTestKeel, type TestKeel } from '../../support/test-keel.js';
import { waitFor } from '../../support/wait-for.js';
import { TEST_TOOLS_MODULE } from '../../support/run-helpers.js';
import { PUSH_TEST_OVERRIDES, PUSH_TEST_TIMINGS, startReceiver, type Receiver } from '../push/push-support.js';

// Keel's spans read back from an in-memory exporter (docs/observability.md, "Trace spans"): the
// tree of a blocking SendMessage down to its webhook, an incoming traceparent on each binding, a
// run picked up by another process after the first stopped, and no content or credential in any
// attribute. The spans of two Keels calling each other: remote-trace.test.ts.

const ASSISTANT = new URL('../../fixtures/statecharts/assistant.machine.ts', import.meta.url).pathname;
const SECRET = `secret-marker-${randomUUID()}`;
const PUSH_TOKEN = `push-token-${randomUUID()}`;
const PUSH_CREDENTIAL = `push-credential-${randomUUID()}`;

const overrides = (level: string) => ({
  ...PUSH_TEST_OVERRIDES,
  KEEL_PRIVACY_LEVEL: level,
  KEEL_GRPC_PORT: '0',
  KEEL_PROVIDERS: { steps: { type: 'scripted', steps: [{ reply: 'the answer' }] }, slow: { type: 'scripted', steps: [{ delayMs: 300, reply: 'slow answer' }] } },
  KEEL_AGENTS: [
    { id: 'steps', name: 'Steps', provider: 'steps' },
    { id: 'slow', name: 'Slow', provider: 'slow' },
  ],
});

let tracing: InMemoryTracing;
beforeAll(() => {
  tracing = startInMemoryTracing();
});
afterAll(async () => {
  await tracing.stop();
});

const traceparentOf = (traceId: string, spanId: string) => `00-${traceId}-${spanId}-01`;
const hex = (bytes: number) => randomUUID().replace(/-/g, '').repeat(2).slice(0, bytes * 2);

function message(text: string, extra: Record<string, unknown> = {}) {
  return { message: { role: 'ROLE_USER', messageId: randomUUID(), parts: [{ text }] }, ...extra };
}

const named = (spans: ReadableSpan[], name: string) => spans.filter((span) => span.name === name);
function one(spans: ReadableSpan[], name: string): ReadableSpan {
  const found = named(spans, name);
  expect(found.map((span) => span.name), `one span ${name}`).toEqual([name]);
  return found[0]!;
}
const parentOf = (span: ReadableSpan) => span.parentSpanContext?.spanId;

/** Every string an exported span carries in its attributes, its links' attributes and its events'. */
function carriedStrings(spans: ReadableSpan[]): string[] {
  const values: string[] = [];
  const add = (attributes: Record<string, unknown> | undefined) => {
    for (const value of Object.values(attributes ?? {})) values.push(...(Array.isArray(value) ? value.map(String) : [String(value)]));
  };
  for (const span of spans) {
    values.push(span.name, span.status.message ?? '');
    add(span.attributes);
    for (const link of span.links) add(link.attributes);
    for (const event of span.events) add(event.attributes);
  }
  return values;
}

const runTraceRow = z.object({ trace_context: z.string().nullable(), trace_parent_span: z.string().nullable(), trace_state: z.string().nullable() });

describe.each(['full', 'metadata'])('at privacy level %s', (level) => {
  let database: TestDatabase;
  let keel: TestKeel;
  let token: string;
  let receiver: Receiver;

  beforeAll(async () => {
    database = await createTestDatabase();
    keel = await startTestKeel({ databaseUrl: database.url, overrides: overrides(level), pushTestTimings: PUSH_TEST_TIMINGS });
    const client = await createClient(keel.context.pool, 'tracer');
    if (!client.ok) throw new Error(`client not created: ${client.reason}`);
    token = client.token;
    receiver = await startReceiver();
  });
  afterAll(async () => {
    await receiver?.close();
    await keel?.dispose();
    await database?.drop();
  });

  it('a blocking SendMessage is one trace: request, run, stretch, model call, completion batch link, push delivery', async () => {
    tracing.reset();
    const incomingTrace = hex(16);
    const incomingSpan = hex(8);
    const answer = await rawRpc(
      keel.url,
      'steps',
      {
        jsonrpc: '2.0',
        id: 1,
        method: 'SendMessage',
        params: message(`please keep ${SECRET}`, { configuration: { taskPushNotificationConfig: { url: receiver.url, token: PUSH_TOKEN, authentication: { scheme: 'Bearer', credentials: PUSH_CREDENTIAL } } } }),
      },
      { token, headers: { traceparent: traceparentOf(incomingTrace, incomingSpan), tracestate: 'vendor=value' } },
    );
    expect(answer.status).toBe(200);
    const taskId = answer.body.result.task.id as string;
    expect(answer.body.result.task.status.state).toBe('TASK_STATE_COMPLETED');
    // The webhook of the final event, and every span of the trace, are in.
    await waitFor(async () => receiver.requests.some((request) => request.body?.statusUpdate?.status?.state === 'TASK_STATE_COMPLETED'), 'the completed event delivered');
    const spans = await waitFor(async () => {
      const found = tracing.spansOf(incomingTrace);
      const sent = receiver.requests.filter((received) => received.headers['traceparent']?.includes(incomingTrace)).length;
      return named(found, 'invoke_agent steps').length === 1 && named(found, 'push.deliver').length === sent ? found : null;
    }, 'the trace of the task');

    // The request: a SERVER span continuing the caller's trace.
    const request = one(spans, 'A2A SendMessage');
    expect(request.kind).toBe(SpanKind.SERVER);
    expect(parentOf(request)).toBe(incomingSpan);
    expect(request.attributes).toMatchObject({ 'rpc.system': 'a2a', 'rpc.method': 'SendMessage', 'keel.a2a.binding': 'jsonrpc', 'gen_ai.agent.id': 'steps', 'keel.task.id': taskId });
    expect(request.attributes['keel.client.id']).toEqual(expect.any(String));

    // The run: its span id is the one stored on its row, a child of the request.
    const stored = await database.pool.one(sql.type(runTraceRow)`SELECT trace_context, trace_parent_span, trace_state FROM runs WHERE id = ${taskId}`);
    const run = one(spans, 'invoke_agent steps');
    expect(stored.trace_context).toBe(traceparentOf(incomingTrace, run.spanContext().spanId));
    expect(stored.trace_parent_span).toBe(request.spanContext().spanId);
    expect(stored.trace_state).toBe('vendor=value');
    expect(parentOf(run)).toBe(request.spanContext().spanId);
    expect(run.attributes).toMatchObject({ 'gen_ai.operation.name': 'invoke_agent', 'gen_ai.agent.id': 'steps', 'keel.run.id': taskId, 'keel.task.id': taskId });

    // One stretch (fast path or queue), a child of the run; the model call a child of the stretch.
    const stretch = one(spans, 'keel.run.stretch');
    expect(parentOf(stretch)).toBe(run.spanContext().spanId);
    expect(stretch.attributes).toMatchObject({ 'keel.run.id': taskId, 'keel.worker.id': keel.context.workerId, 'keel.run.stretch': expect.any(Number) });
    const chat = one(spans, 'chat steps');
    expect(parentOf(chat)).toBe(stretch.spanContext().spanId);
    expect(chat.attributes).toMatchObject({ 'gen_ai.operation.name': 'chat', 'gen_ai.request.model': 'steps', 'gen_ai.provider.name': 'scripted', 'gen_ai.usage.input_tokens': expect.any(Number), 'gen_ai.usage.output_tokens': expect.any(Number) });

    // The batch that wrote its completion: a root span of its own, linked to this task's trace.
    const batches = tracing.spans().filter((span) => (span.name === 'keel.completion_batch' || span.name === 'keel.write_batch') && span.links.some((link) => link.context.traceId === incomingTrace));
    expect(batches.length).toBeGreaterThan(0);
    expect(batches.flatMap((batch) => batch.links.filter((link) => link.context.traceId === incomingTrace).map((link) => link.context.spanId))).toContain(stretch.spanContext().spanId);

    // Each delivery attempt: a CLIENT span under the run, its traceparent sent with the webhook.
    const deliveries = named(spans, 'push.deliver');
    for (const delivery of deliveries) {
      expect(delivery.kind).toBe(SpanKind.CLIENT);
      expect(parentOf(delivery)).toBe(run.spanContext().spanId);
      expect(delivery.attributes).toMatchObject({ 'server.address': '127.0.0.1', 'keel.push.outcome': 'delivered', 'http.response.status_code': 200, 'keel.task.id': taskId });
    }
    const sentParents = receiver.requests.filter((received) => received.headers['traceparent']?.includes(incomingTrace)).map((received) => received.headers['traceparent']);
    expect(sentParents.sort()).toEqual(deliveries.map((delivery) => traceparentOf(incomingTrace, delivery.spanContext().spanId)).sort());

    // No attribute carries the message, the push token or credential, or the client's token.
    const carried = carriedStrings(tracing.spans()).join('\n');
    for (const secret of [SECRET, PUSH_TOKEN, PUSH_CREDENTIAL, token, receiver.url]) expect(carried).not.toContain(secret);
  });

  it('honours a traceparent on HTTP+JSON and gRPC, and ignores a malformed one without error', async () => {
    tracing.reset();
    const restTrace = hex(16);
    const restParent = hex(8);
    const rest = await rawRest(keel.url, 'steps', 'POST', '/message:send', message('over rest'), { token, headers: { traceparent: traceparentOf(restTrace, restParent) } });
    expect(rest.status).toBe(200);
    const restSpan = await waitFor(async () => tracing.spansOf(restTrace).find((span) => span.name === 'A2A SendMessage'), 'the HTTP+JSON request span');
    expect(parentOf(restSpan)).toBe(restParent);
    expect(restSpan.attributes).toMatchObject({ 'keel.a2a.binding': 'rest', 'keel.task.id': rest.body.task.id });

    const grpcTrace = hex(16);
    const grpcParent = hex(8);
    const client = rawGrpcClient(keel.grpcAddress!);
    try {
      const sent = await rawUnary(
        client,
        'sendMessage',
        SendMessageRequest.fromJSON({ tenant: 'steps', ...message('over grpc') }),
        grpcMetadata({ authorization: `Bearer ${token}`, 'a2a-version': '1.0', traceparent: traceparentOf(grpcTrace, grpcParent) }),
      );
      expect(sent.error).toBeNull();
    } finally {
      client.close();
    }
    const grpcSpan = await waitFor(async () => tracing.spansOf(grpcTrace).find((span) => span.name === 'A2A SendMessage'), 'the gRPC request span');
    expect(parentOf(grpcSpan)).toBe(grpcParent);
    expect(grpcSpan.attributes).toMatchObject({ 'keel.a2a.binding': 'grpc', 'rpc.method': 'SendMessage', 'gen_ai.agent.id': 'steps' });
    await waitFor(async () => tracing.spansOf(grpcTrace).some((span) => span.name === 'invoke_agent steps'), 'the gRPC task run in the same trace');

    // Malformed: wrong length, all-zero trace id, version ff, uppercase hex. Each is a new trace.
    for (const malformed of [`00-${hex(15)}-${hex(8)}-01`, `00-${'0'.repeat(32)}-${hex(8)}-01`, `ff-${hex(16)}-${hex(8)}-01`, `00-${hex(16).toUpperCase()}-${hex(8)}-01`, 'garbage']) {
      tracing.reset();
      const answered = await rawRpc(keel.url, 'steps', { jsonrpc: '2.0', id: 2, method: 'SendMessage', params: message('malformed parent') }, { token, headers: { traceparent: malformed } });
      expect(answered.status, malformed).toBe(200);
      expect(answered.body.result.task.status.state).toBe('TASK_STATE_COMPLETED');
      const span = await waitFor(async () => tracing.spans().find((found) => found.name === 'A2A SendMessage'), 'the request span');
      expect(span.parentSpanContext, malformed).toBeUndefined();
      expect(malformed).not.toContain(span.spanContext().traceId);
    }
  });

  it('marks a request answered with an A2A error on its span, on each binding: the reason, the code and the status, never the message', async () => {
    const missing = '00000000-0000-4000-8000-00000000dead';
    const expected = { 'error.type': 'TASK_NOT_FOUND', 'rpc.jsonrpc.error_code': -32001, 'http.response.status_code': 404 };
    const spanOf = async (traceId: string) => waitFor(async () => tracing.spansOf(traceId).find((span) => span.name === 'A2A GetTask'), 'the GetTask span');

    const rpcTrace = hex(16);
    const rpc = await rawRpc(keel.url, 'steps', { jsonrpc: '2.0', id: 3, method: 'GetTask', params: { id: missing } }, { token, headers: { traceparent: traceparentOf(rpcTrace, hex(8)) } });
    expect(rpc.body.error.code).toBe(-32001);
    const restTrace = hex(16);
    const rest = await rawRest(keel.url, 'steps', 'GET', `/tasks/${missing}`, undefined, { token, headers: { traceparent: traceparentOf(restTrace, hex(8)) } });
    expect(rest.status).toBe(404);
    const grpcTrace = hex(16);
    const client = rawGrpcClient(keel.grpcAddress!);
    try {
      const got = await rawUnary(client, 'getTask', GetTaskRequest.fromJSON({ tenant: 'steps', id: missing }), grpcMetadata({ authorization: `Bearer ${token}`, 'a2a-version': '1.0', traceparent: traceparentOf(grpcTrace, hex(8)) }));
      expect(got.error).not.toBeNull();
    } finally {
      client.close();
    }
    for (const traceId of [rpcTrace, restTrace, grpcTrace]) {
      const span = await spanOf(traceId);
      expect(span.attributes).toMatchObject(expected);
      // A refused request is the client's error, not the server's: the status stays unset (OpenTelemetry's server-span rule).
      expect(span.status.code).toBe(SpanStatusCode.UNSET);
      expect(carriedStrings([span]).join('\n')).not.toMatch(/not found/i);
    }
  });
});

describe('a run that ends where no worker holds it', () => {
  it('records its invoke_agent span where it ended: a queued run cancelled over the API has its span under the request that created it', async () => {
    tracing.reset();
    const database = await createTestDatabase();
    // An API-only Keel: the run stays queued, and the cancel ends it where no worker holds it.
    const api = await startTestKeel({ databaseUrl: database.url, overrides: overrides('full'), start: { role: 'api' } });
    try {
      const client = await createClient(api.context.pool, 'canceller');
      if (!client.ok) throw new Error(`client not created: ${client.reason}`);
      const incomingTrace = hex(16);
      const headers = { traceparent: traceparentOf(incomingTrace, hex(8)) };
      const sent = await rawRpc(api.url, 'slow', { jsonrpc: '2.0', id: 1, method: 'SendMessage', params: message('never run', { configuration: { returnImmediately: true } }) }, { token: client.token, headers });
      const taskId = sent.body.result.task.id as string;
      const cancelled = await rawRpc(api.url, 'slow', { jsonrpc: '2.0', id: 2, method: 'CancelTask', params: { id: taskId } }, { token: client.token, headers });
      expect(cancelled.body.result.status.state).toBe('TASK_STATE_CANCELED');
      const stored = await database.pool.one(sql.type(runTraceRow)`SELECT trace_context, trace_parent_span, trace_state FROM runs WHERE id = ${taskId}`);
      const run = await waitFor(async () => tracing.spansOf(incomingTrace).find((span) => span.name === 'invoke_agent slow'), 'the run span');
      expect(run.spanContext().spanId).toBe(stored.trace_context!.split('-')[2]);
      expect(parentOf(run)).toBe(stored.trace_parent_span);
      const request = tracing.spansOf(incomingTrace).find((span) => span.name === 'A2A SendMessage' && span.spanContext().spanId === stored.trace_parent_span);
      expect(request, 'the SendMessage span is its parent').toBeDefined();
      expect(run.attributes).toMatchObject({ 'keel.run.id': taskId, 'keel.run.status': 'cancelled' });
      expect(run.status.code).toBe(SpanStatusCode.UNSET);
      expect(tracing.spansOf(incomingTrace).filter((span) => span.name === 'keel.run.stretch')).toEqual([]);
    } finally {
      await api.dispose();
      await database.drop();
    }
  });
});

describe('a run picked up by another process', () => {
  it('keeps its trace: the stored run span is the parent of the stretch that a later Keel executes', async () => {
    tracing.reset();
    const database = await createTestDatabase();
    // The first Keel serves the API only: the task's run is queued with its trace on its row.
    const api = await startTestKeel({ databaseUrl: database.url, overrides: overrides('full'), start: { role: 'api' } });
    let worker: TestKeel | null = null;
    try {
      const client = await createClient(api.context.pool, 'restarter');
      if (!client.ok) throw new Error(`client not created: ${client.reason}`);
      const incomingTrace = hex(16);
      const sent = await rawRpc(
        api.url,
        'slow',
        { jsonrpc: '2.0', id: 1, method: 'SendMessage', params: message('run me later', { configuration: { returnImmediately: true } }) },
        { token: client.token, headers: { traceparent: traceparentOf(incomingTrace, hex(8)) } },
      );
      const taskId = sent.body.result.task.id as string;
      const stored = await database.pool.one(sql.type(runTraceRow)`SELECT trace_context, trace_parent_span, trace_state FROM runs WHERE id = ${taskId}`);
      expect(stored.trace_context).toMatch(new RegExp(`^00-${incomingTrace}-[0-9a-f]{16}-01$`));
      await api.dispose();

      // A new process (the restart) picks the run up from the queue.
      worker = await startTestKeel({ databaseUrl: database.url, env: { KEEL_MASTER_KEY: api.masterKey }, overrides: overrides('full'), start: { role: 'worker', listen: false } });
      const spans = await waitFor(async () => {
        const found = tracing.spansOf(incomingTrace);
        return found.some((span) => span.name === 'invoke_agent slow') ? found : null;
      }, 'the run settled by the second process');
      const runSpanId = stored.trace_context!.split('-')[2]!;
      const stretch = one(spans, 'keel.run.stretch');
      expect(stretch.attributes['keel.worker.id']).toBe(worker.context.workerId);
      expect(parentOf(stretch)).toBe(runSpanId);
      const run = one(spans, 'invoke_agent slow');
      expect(run.spanContext().spanId).toBe(runSpanId);
      expect(parentOf(run)).toBe(stored.trace_parent_span);
      expect(one(spans, 'A2A SendMessage').spanContext().spanId).toBe(stored.trace_parent_span);
    } finally {
      await api.dispose().catch(() => undefined);
      await worker?.dispose();
      await database.drop();
    }
  });
});

describe('a statechart agent', () => {
  it('shows its states, the steps each ran and the model and tool calls of those steps', async () => {
    tracing.reset();
    const database = await createTestDatabase();
    const keel = await startTestKeel({
      databaseUrl: database.url,
      overrides: {
        KEEL_PRIVACY_LEVEL: 'full',
        KEEL_TOOL_MODULES: JSON.stringify([TEST_TOOLS_MODULE]),
        KEEL_PROVIDERS: { plans: { type: 'scripted', steps: [{ reply: JSON.stringify({ tool: 'lookup', arguments: { key: 'k1' } }) }] } },
        KEEL_AGENTS: [{ id: 'looks-up', name: 'Looks up', machine: ASSISTANT, provider: 'plans', tools: ['lookup'] }],
      },
    });
    try {
      const client = await createClient(keel.context.pool, 'statecharts');
      if (!client.ok) throw new Error(`client not created: ${client.reason}`);
      const traceId = hex(16);
      const sent = await rawRpc(keel.url, 'looks-up', { jsonrpc: '2.0', id: 1, method: 'SendMessage', params: message(`look up ${SECRET}`) }, { token: client.token, headers: { traceparent: traceparentOf(traceId, hex(8)) } });
      expect(sent.body.result.task.status.state).toBe('TASK_STATE_COMPLETED');
      const spans = await waitFor(async () => {
        const found = tracing.spansOf(traceId);
        return found.some((span) => span.name === 'invoke_agent looks-up') ? found : null;
      }, 'the statechart run settled');
      const byId = new Map(spans.map((span) => [span.spanContext().spanId, span]));
      const stretch = one(spans, 'keel.run.stretch');
      const using = one(spans, 'keel.statechart.state using');
      expect(parentOf(using)).toBe(stretch.spanContext().spanId);
      const use = one(spans, 'keel.statechart.step use');
      expect(parentOf(use)).toBe(using.spanContext().spanId);
      const plan = one(spans, 'keel.statechart.step plan');
      expect(byId.get(parentOf(plan)!)?.name).toMatch(/^keel\.statechart\.state /);
      expect(parentOf(one(spans, 'chat plans'))).toBe(plan.spanContext().spanId);
      expect(parentOf(one(spans, 'execute_tool lookup'))).toBe(use.spanContext().spanId);
      expect(carriedStrings(spans).join('\n')).not.toContain(SECRET);
    } finally {
      await keel.dispose();
      await database.drop();
    }
  });
});
