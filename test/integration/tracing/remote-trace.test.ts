import { randomUUID } from 'node:crypto';
import { SpanKind } from '@opentelemetry/api';
import type { ReadableSpan } from '@opentelemetry/sdk-trace-base';
import { afterAll, beforeAll, expect, it } from 'vitest';
import { rawRpc } from '../../support/a2a-wire.js';
import { startInMemoryTracing, type InMemoryTracing } from '../../support/in-memory-tracing.js';
import { createTestDatabase, type TestDatabase } from '../../support/test-database.js';
import { startTestKeel, type TestKeel } from '../../support/test-keel.js';
import { waitFor } from '../../support/wait-for.js';
import { LOOPBACK, delegatingOverrides, freePort, newToken, waitForLocalTask } from '../remote/remote-support.js';

// Two Keels calling each other are one trace (docs/observability.md, "Trace spans"): Keel A's
// agent delegates to Keel B's worker through remote_agent; B pushes the remote task's events to
// A's inbox. Both Keels run in this process and export to one in-memory exporter.

let tracing: InMemoryTracing;
let databases: TestDatabase[] = [];
let keelA: TestKeel;
let keelB: TestKeel;
let token: string;

beforeAll(async () => {
  tracing = startInMemoryTracing();
  databases = await Promise.all([createTestDatabase(), createTestDatabase()]);
  const [databaseA, databaseB] = databases as [TestDatabase, TestDatabase];
  const tokenForB = await newToken(databaseB.pool, 'keel-a');
  const [portA, portB] = [await freePort(), await freePort()];
  const urlB = `http://${LOOPBACK}:${portB}`;
  [keelA, keelB] = await Promise.all([
    startTestKeel({
      databaseUrl: databaseA.url,
      env: { KEEL_B_TOKEN: tokenForB },
      overrides: { ...delegatingOverrides([{ id: 'keel-b', cardUrl: `${urlB}/a2a/worker/.well-known/agent-card.json`, credentialEnv: 'KEEL_B_TOKEN', registration: 'embedded' }]), KEEL_SERVER_PORT: String(portA) },
    }),
    startTestKeel({
      databaseUrl: databaseB.url,
      overrides: {
        ...delegatingOverrides([], {
          providers: { worker: { type: 'scripted', steps: [{ delayMs: 200, reply: 'work done by keel-b' }] } },
          agents: [{ id: 'worker', name: 'Worker of keel-b', provider: 'worker' }],
        }),
        KEEL_SERVER_PORT: String(portB),
      },
    }),
  ]);
  token = await newToken(databaseA.pool, 'tester');
});
afterAll(async () => {
  await Promise.all([keelA?.dispose(), keelB?.dispose()]);
  await Promise.all(databases.map((database) => database.drop()));
  await tracing?.stop();
});

const parentOf = (span: ReadableSpan) => span.parentSpanContext?.spanId;

it('a remote call between two Keels is one trace, the client and server spans parented correctly', async () => {
  const traceId = randomUUID().replace(/-/g, '');
  const sent = await rawRpc(
    keelA.url,
    'to-keel-b',
    { jsonrpc: '2.0', id: 1, method: 'SendMessage', params: { message: { role: 'ROLE_USER', messageId: randomUUID(), parts: [{ text: 'delegate' }] }, configuration: { returnImmediately: true } } },
    { token, headers: { traceparent: `00-${traceId}-${'1'.repeat(16)}-01` } },
  );
  const taskId = sent.body.result.task.id as string;
  const task = await waitForLocalTask(keelA, token, 'to-keel-b', taskId);
  expect(task.status?.state).toBe(3);
  const spans = await waitFor(async () => {
    const found = tracing.spansOf(traceId);
    // A delivery's span ends after the callback it carried was answered: each callback's parent, exported too.
    const deliveries = new Set(found.filter((span) => span.name === 'push.deliver').map((span) => span.spanContext().spanId));
    const callbacks = found.filter((span) => span.name === 'keel.inbox.callback');
    const ended = found.some((span) => span.name === 'invoke_agent to-keel-b');
    return ended && callbacks.length > 0 && callbacks.every((callback) => deliveries.has(parentOf(callback)!)) ? found : null;
  }, 'both Keels spans in one trace');

  // Keel A: its request, the tool call, and the CLIENT span of the call to Keel B under the tool.
  const servers = spans.filter((span) => span.name === 'A2A SendMessage' && span.kind === SpanKind.SERVER);
  const requestA = servers.find((span) => span.attributes['gen_ai.agent.id'] === 'to-keel-b')!;
  expect(parentOf(requestA)).toBe('1'.repeat(16));
  const tool = spans.find((span) => span.name === 'execute_tool remote_agent')!;
  expect(tool.attributes).toMatchObject({ 'gen_ai.tool.name': 'remote_agent', 'gen_ai.tool.call.id': expect.any(String) });
  const clientCall = spans.find((span) => span.name === 'A2A SendMessage' && span.kind === SpanKind.CLIENT)!;
  expect(parentOf(clientCall)).toBe(tool.spanContext().spanId);
  expect(clientCall.attributes).toMatchObject({ 'rpc.system': 'a2a', 'rpc.method': 'SendMessage', 'server.address': LOOPBACK, 'keel.remote.agent': 'keel-b' });

  // Keel B: its SERVER span continues A's CLIENT span; its run belongs to the same trace.
  const requestB = servers.find((span) => span.attributes['gen_ai.agent.id'] === 'worker')!;
  expect(parentOf(requestB)).toBe(clientCall.spanContext().spanId);
  const runB = spans.find((span) => span.name === 'invoke_agent worker')!;
  expect(parentOf(runB)).toBe(requestB.spanContext().spanId);

  // B's push of the remote task's events reaches A's inbox as a SERVER span under B's delivery span.
  const deliveries = new Set(spans.filter((span) => span.name === 'push.deliver').map((span) => span.spanContext().spanId));
  const callbacks = spans.filter((span) => span.name === 'keel.inbox.callback');
  expect(callbacks.length).toBeGreaterThan(0);
  for (const callback of callbacks) {
    expect(callback.kind).toBe(SpanKind.SERVER);
    expect(deliveries.has(parentOf(callback)!)).toBe(true);
    expect(callback.attributes['http.response.status_code']).toBe(200);
  }
  // Keel A's run: one span for the whole run across its two stretches (before and after the remote answered).
  const runA = spans.find((span) => span.name === 'invoke_agent to-keel-b')!;
  const stretchesA = spans.filter((span) => span.name === 'keel.run.stretch' && span.attributes['keel.run.id'] === taskId);
  expect(stretchesA.length).toBe(2);
  for (const stretch of stretchesA) expect(parentOf(stretch)).toBe(runA.spanContext().spanId);
  // Keel A's reconcile of the dependency asks B for the remote task (GetTask) in the run's trace,
  // under its run span: not as a trace of its own.
  const reconciles = tracing.spans().filter((span) => span.kind === SpanKind.CLIENT && span.name === 'A2A GetTask' && span.attributes['keel.remote.agent'] === 'keel-b');
  expect(reconciles.length).toBeGreaterThan(0);
  for (const call of reconciles) {
    expect(call.spanContext().traceId).toBe(traceId);
    expect(parentOf(call)).toBe(runA.spanContext().spanId);
  }
});
