import { Task } from '@a2a-js/sdk';
import { afterAll, describe, expect, it } from 'vitest';
import { createClient } from '../../src/auth/client-repository.js';
import { sdkClient, textMessage } from '../support/a2a-client.js';
import { callA2A, expectA2AResult } from '../support/a2a-wire.js';
import { cleanEnv, spawnKeel, type KeelProcess } from '../support/keel-process.js';
import { startOtlpReceiver, type OtlpReceiver, type ReceivedSpan } from '../support/otlp-receiver.js';
import { createTestDatabase, type TestDatabase } from '../support/test-database.js';
import { TEST_POOL_ENV, tempDir } from '../support/test-keel.js';
import { deleteQueueKeys, TEST_REDIS_URL, testQueueKind, testQueuePrefix } from '../support/test-queues.js';
import { encodeMasterKey, generateMasterKey } from '../../src/sealing/master-key.js';

// End to end over OTLP/HTTP: a `keel start` process configured by the standard OTEL_* variables
// exports the spans of one task, sent by the official @a2a-js/sdk client, to a receiver on
// loopback (an address Keel's outbound guard refuses: the exporter does not go through it). The
// batch processor's delay is a minute, so the spans arrive only through the flush of Keel's
// graceful shutdown.

const redisUrl = testQueueKind() === 'redis' ? TEST_REDIS_URL : null;
const queuePrefix = testQueuePrefix();
const databases: TestDatabase[] = [];
const receivers: OtlpReceiver[] = [];
const children: KeelProcess[] = [];

afterAll(async () => {
  for (const child of children) {
    if (child.child.exitCode === null && child.child.signalCode === null) {
      child.child.kill('SIGKILL');
      await child.exited;
    }
  }
  for (const receiver of receivers) await receiver.close();
  for (const database of databases) await database.drop();
  if (redisUrl) await deleteQueueKeys([queuePrefix], redisUrl);
});

const ofTask = (taskId: string) => (span: ReceivedSpan) => span.attributes['keel.task.id'] === taskId;

/** A `keel start` process exporting to a receiver of its own over OTLP/HTTP JSON, configured by `otel` besides. */
async function startTracedKeel(otel: Record<string, string> = {}) {
  const database = await createTestDatabase();
  databases.push(database);
  const receiver = await startOtlpReceiver();
  receivers.push(receiver);
  const created = await createClient(database.pool, 'otlp-test');
  if (!created.ok) throw new Error(created.reason);
  const child = spawnKeel(['start'], {
    cwd: tempDir('keel-otlp-cwd-'),
    env: cleanEnv({
      ...TEST_POOL_ENV,
      KEEL_DATABASE_URL: database.url,
      KEEL_MASTER_KEY: encodeMasterKey(generateMasterKey()),
      KEEL_SERVER_PORT: '0',
      KEEL_DATA_DIR: tempDir('keel-otlp-data-'),
      KEEL_QUEUE_PREFIX: queuePrefix,
      ...(redisUrl ? { KEEL_QUEUE_REDIS_URL: redisUrl } : {}),
      OTEL_EXPORTER_OTLP_ENDPOINT: receiver.url,
      OTEL_EXPORTER_OTLP_TRACES_PROTOCOL: 'http/json',
      OTEL_BSP_SCHEDULE_DELAY: '60000',
      ...otel,
    }),
  });
  children.push(child);
  return { receiver, client: created, child };
}

describe('traces over OTLP/HTTP', () => {
  it('exports the spans of a task, one trace, flushed at the graceful shutdown', async () => {
    const { receiver, client: created, child } = await startTracedKeel({
      OTEL_EXPORTER_OTLP_HEADERS: 'x-collector-key=test-key',
      OTEL_RESOURCE_ATTRIBUTES: 'deployment.environment.name=test',
    });
    const exporting = await child.waitForLog('exporting traces over OTLP/HTTP', 45_000);
    expect(exporting).toMatchObject({ tracesUrl: `${receiver.url}/v1/traces`, protocol: 'http/json', serviceName: 'keel' });
    const ready = await child.waitForLog('keel is ready', 45_000);

    const client = await sdkClient(String(ready.url), 'echo', created.token);
    const answer = Task.toJSON((await client.sendMessage(textMessage('trace me'))) as Task) as { id: string; status: { state: string } };
    expect(answer.status.state).toBe('TASK_STATE_COMPLETED');
    const taskId = answer.id;
    expect(receiver.spans).toHaveLength(0);

    child.child.kill('SIGTERM');
    expect(await child.exited).toEqual({ code: 0, signal: null });
    const spans = await receiver.waitFor((received) => received.some((span) => span.name === 'A2A SendMessage' && ofTask(taskId)(span)), 5_000);
    expect(receiver.requests.every((request) => request.headers['x-collector-key'] === 'test-key')).toBe(true);

    const server = spans.find((span) => span.name === 'A2A SendMessage' && ofTask(taskId)(span))!;
    expect(server.kind).toBe(2);
    expect(server.scope).toBe('keel');
    expect(server.attributes).toMatchObject({
      'rpc.system': 'a2a',
      'rpc.method': 'SendMessage',
      'gen_ai.agent.id': 'echo',
      'keel.client.id': created.client.id,
      'keel.task.id': taskId,
    });
    expect(String(server.attributes['keel.a2a.binding'])).toMatch(/json.?rpc/i);
    expect(server.resource).toMatchObject({ 'service.name': 'keel', 'keel.process.role': 'all', 'deployment.environment.name': 'test' });
    expect(String(server.resource['service.instance.id'])).toMatch(/:\d+:[0-9a-f]{8}$/);

    // The run is in the request's trace: its invoke_agent span, and every span naming the task.
    const run = spans.find((span) => span.name === 'invoke_agent echo' && span.traceId === server.traceId);
    expect(run).toBeDefined();
    expect(spans.filter(ofTask(taskId)).every((span) => span.traceId === server.traceId)).toBe(true);
    // No span leaves the trace's tree: each parent is a span of the trace (or the request, its root).
    const ids = new Set(spans.filter((span) => span.traceId === server.traceId).map((span) => span.spanId));
    for (const span of spans.filter((span) => span.traceId === server.traceId && span !== server)) {
      expect(span.parentSpanId === null || ids.has(span.parentSpanId), `${span.name}'s parent is in the trace`).toBe(true);
    }
  });

  it("under a ratio sampler keeps a sampled caller's task whole, the batch that wrote it included, and nothing of a task not sampled", async () => {
    // Ratio 0: no new trace is kept; a caller's traceparent with the sampled flag keeps its task's.
    const { receiver, client, child } = await startTracedKeel({ OTEL_TRACES_SAMPLER: 'parentbased_traceidratio', OTEL_TRACES_SAMPLER_ARG: '0' });
    const ready = await child.waitForLog('keel is ready', 45_000);
    const kept = { traceId: '0af7651916cd43dd8448eb211c80319c', parentId: 'b7ad6b7169203331' };
    const send = async (text: string, traceparent?: string): Promise<string> => {
      const message = { messageId: crypto.randomUUID(), role: 'ROLE_USER', parts: [{ text }] };
      const answer = expectA2AResult('JSONRPC', await callA2A(String(ready.url).replace(/\/$/, ''), 'echo', 'JSONRPC', 'SendMessage', { message }, { token: client.token, headers: traceparent ? { traceparent } : {} }));
      expect(answer.task.status.state).toBe('TASK_STATE_COMPLETED');
      return answer.task.id as string;
    };
    // One after the other: each task's writes go in batches of their own.
    const keptTask = await send('keep me', `00-${kept.traceId}-${kept.parentId}-01`);
    const droppedTask = await send('not me', `00-1bf7651916cd43dd8448eb211c80319d-c7ad6b7169203332-00`);
    const unsampledTask = await send('nor me');

    child.child.kill('SIGTERM');
    expect(await child.exited).toEqual({ code: 0, signal: null });
    const spans = await receiver.waitFor((received) => received.some((span) => span.name === 'invoke_agent echo'), 5_000);

    const server = spans.find((span) => span.name === 'A2A SendMessage')!;
    expect(server).toMatchObject({ traceId: kept.traceId, parentSpanId: kept.parentId });
    expect(server.attributes['keel.task.id']).toBe(keptTask);
    expect(spans.filter((span) => span.traceId === kept.traceId).map((span) => span.name)).toEqual(expect.arrayContaining(['A2A SendMessage', 'keel.run.stretch', 'invoke_agent echo']));
    // The batches that wrote the kept task: roots of their own traces, linked to it, and kept.
    const batches = spans.filter((span) => span.name === 'keel.write_batch');
    expect(batches.length).toBeGreaterThan(0);
    for (const batch of batches) {
      expect(batch.parentSpanId).toBeNull();
      expect(batch.links.some((link) => link.traceId === kept.traceId), 'a kept batch links to the kept task').toBe(true);
    }
    // Nothing else: every span is in the kept trace or a batch linked to it.
    expect(spans.filter((span) => span.traceId !== kept.traceId && span.name !== 'keel.write_batch')).toEqual([]);
    expect(spans.filter((span) => [droppedTask, unsampledTask].includes(String(span.attributes['keel.task.id'])))).toEqual([]);
  });
});
