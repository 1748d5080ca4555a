import { createServer } from 'node:net';
import type { AddressInfo } from 'node:net';
import { GetTaskRequest, StreamResponse, SubscribeToTaskRequest } from '@a2a-js/sdk';
import { status as GrpcStatus } from '@grpc/grpc-js';
import { afterAll, describe, expect, it } from 'vitest';
import { createClient } from '../../../src/auth/client-repository.js';
import { EVENT_ID_KEY } from '../../../src/a2a/grpc-binding.js';
import { readJournal } from '../../../src/tasks/journal.js';
import { sdkClient, textMessage } from '../../support/a2a-client.js';
import { grpcMetadata, rawGrpcClient, rawUnary } from '../../support/grpc-client.js';
import { TEST_TOOLS_MODULE } from '../../support/run-helpers.js';
import { createEmptyDatabase } from '../../support/test-database.js';
import { startTestKeel, type TestKeel } from '../../support/test-keel.js';
import { testQueuePrefix } from '../../support/test-queues.js';

// The gRPC server in Keel's runtime: off unless configured (no GRPC interface on the cards then),
// refused start-up when its port is taken, and a graceful shutdown that ends the open streams with
// what is committed, after which the client resumes on another API process with `last-event-id`.

type Json = Record<string, any>; // eslint-disable-line @typescript-eslint/no-explicit-any

const started: TestKeel[] = [];
const drops: Array<() => Promise<void>> = [];
afterAll(async () => {
  for (const keel of started.reverse()) await keel.dispose().catch(() => undefined);
  for (const drop of drops) await drop();
});

const card = async (keel: TestKeel, agent = 'echo') => (await (await fetch(`${keel.url}/a2a/${agent}/.well-known/agent-card.json`)).json()) as Json;

describe('configuration', () => {
  it('is off by default: no gRPC listener and no GRPC interface on the public or the extended card', async () => {
    const keel = await startTestKeel();
    started.push(keel);
    expect(keel.config.grpc).toEqual({});
    expect(keel.grpcAddress).toBeNull();
    expect((await card(keel)).supportedInterfaces.map((entry: Json) => entry.protocolBinding)).toEqual(['JSONRPC', 'HTTP+JSON']);
    const client = await createClient(keel.context.pool, 'card-reader');
    if (!client.ok) throw new Error('client');
    const extended = await (await sdkClient(keel.url, 'echo', client.token)).getAgentCard();
    expect(extended.supportedInterfaces.map((entry) => entry.protocolBinding)).toEqual(['JSONRPC', 'HTTP+JSON']);
  });

  it('refuses to start when the gRPC port is taken, naming the stage and the address', async () => {
    const blocker = createServer();
    await new Promise<void>((resolve) => blocker.listen(0, '127.0.0.1', resolve));
    const port = (blocker.address() as AddressInfo).port;
    try {
      await expect(startTestKeel({ overrides: { KEEL_GRPC_PORT: String(port) } })).rejects.toThrow(`keel did not start (grpc): cannot listen for gRPC on 127.0.0.1:${port}`);
    } finally {
      await new Promise((resolve) => blocker.close(resolve));
    }
  });
});

describe('graceful shutdown', () => {
  it('ends an open stream with what is committed; the client resumes on another API process after its last event id', async () => {
    const database = await createEmptyDatabase();
    drops.push(() => database.drop());
    const masterKey = Buffer.alloc(32, 7).toString('base64');
    // One queue for both processes: A only serves the API, B runs the worker (and serves the API too).
    const env = { KEEL_MASTER_KEY: masterKey, KEEL_QUEUE_PREFIX: testQueuePrefix() };
    const overrides = {
      KEEL_GRPC_PORT: '0',
      KEEL_PRIVACY_LEVEL: 'full',
      KEEL_TOOL_MODULES: JSON.stringify([TEST_TOOLS_MODULE]),
      KEEL_PROVIDERS: {
        steps: {
          type: 'scripted',
          steps: [
            { artifact: { artifactId: 'draft', name: 'draft', text: 'one ' }, toolCalls: [{ name: 'lookup', arguments: {} }], delayMs: 500 },
            { artifact: { artifactId: 'draft', text: 'two', append: true, lastChunk: true }, toolCalls: [{ name: 'lookup', arguments: {} }], delayMs: 1500 },
            { reply: 'finished', delayMs: 500 },
          ],
        },
      },
      KEEL_AGENTS: [{ id: 'steps', name: 'Steps', provider: 'steps', tools: ['lookup'] }],
    };
    const worker = await startTestKeel({ databaseUrl: database.url, env, overrides });
    started.push(worker);
    const api = await startTestKeel({ databaseUrl: database.url, env, overrides, start: { role: 'api' } });
    started.push(api);
    const client = await createClient(api.context.pool, 'resumer');
    if (!client.ok) throw new Error('client');

    const onApi = await sdkClient(api.url, 'steps', client.token, 'GRPC');
    const firstPart: Json[] = [];
    let stopping: Promise<void> | null = null;
    for await (const event of onApi.sendMessageStream(textMessage('work'))) {
      firstPart.push(StreamResponse.toJSON(event) as Json);
      // After the first artifact, the API process is told to stop while the stream is open.
      if (firstPart[firstPart.length - 1]!.artifactUpdate && !stopping) stopping = api.stop();
    }
    await stopping;
    // The stream ended without an error, with what was committed: not the end of the task.
    const taskId = firstPart[0]!.task.id as string;
    const last = firstPart[firstPart.length - 1]!;
    expect(last.statusUpdate?.status.state).not.toBe('TASK_STATE_COMPLETED');
    const lastSeen = (last.statusUpdate ?? last.artifactUpdate).metadata[EVENT_ID_KEY] as number;

    // The stopped process takes no call any more.
    const raw = rawGrpcClient(api.grpcAddress!);
    const refused = await rawUnary(raw, 'getTask', GetTaskRequest.fromJSON({ tenant: 'steps', id: taskId }), grpcMetadata({ authorization: `Bearer ${client.token}`, 'a2a-version': '1.0' }));
    raw.close();
    expect(refused.error?.code).toBe(GrpcStatus.UNAVAILABLE);

    const onWorker = await sdkClient(worker.url, 'steps', client.token, 'GRPC');
    const rest: Json[] = [];
    for await (const event of onWorker.resubscribeTask(SubscribeToTaskRequest.fromJSON({ id: taskId }), { serviceParameters: { 'last-event-id': String(lastSeen) } })) {
      rest.push(StreamResponse.toJSON(event) as Json);
    }
    expect(rest[rest.length - 1]!.statusUpdate.status.state).toBe('TASK_STATE_COMPLETED');
    const ids = [...firstPart.slice(1), ...rest].map((event) => (event.statusUpdate ?? event.artifactUpdate).metadata[EVENT_ID_KEY]);
    const journal = await readJournal(worker.context.pool, worker.context.sealer, taskId, 0);
    expect(ids).toEqual(journal.map((event) => event.sequence));
  });
});
