import { Task } from '@a2a-js/sdk';
import { afterAll, describe, expect, it } from 'vitest';
import { createClient } from '../../src/auth/client-repository.js';
import { sdkClient, textMessage } from '../support/a2a-client.js';
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
let database: TestDatabase | null = null;
let receiver: OtlpReceiver | null = null;
let child: KeelProcess | null = null;

afterAll(async () => {
  if (child && child.child.exitCode === null && child.child.signalCode === null) {
    child.child.kill('SIGKILL');
    await child.exited;
  }
  await receiver?.close();
  await database?.drop();
  if (redisUrl) await deleteQueueKeys([queuePrefix], redisUrl);
});

const ofTask = (taskId: string) => (span: ReceivedSpan) => span.attributes['keel.task.id'] === taskId;

describe('traces over OTLP/HTTP', () => {
  it('exports the spans of a task, one trace, flushed at the graceful shutdown', async () => {
    database = await createTestDatabase();
    receiver = await startOtlpReceiver();
    const created = await createClient(database.pool, 'otlp-test');
    if (!created.ok) throw new Error(created.reason);
    child = spawnKeel(['start'], {
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
        OTEL_EXPORTER_OTLP_HEADERS: 'x-collector-key=test-key',
        OTEL_RESOURCE_ATTRIBUTES: 'deployment.environment.name=test',
        OTEL_BSP_SCHEDULE_DELAY: '60000',
      }),
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
});
