import { readFileSync } from 'node:fs';
import { Message, StreamResponse, SubscribeToTaskRequest, Task, GetTaskRequest, type SendMessageRequest } from '@a2a-js/sdk';
import type { Client } from '@a2a-js/sdk/client';
import { parse as parseYaml } from 'yaml';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createClient } from '../../src/auth/client-repository.js';
import { sdkClient, textMessage, type Binding } from '../support/a2a-client.js';
import { readSse } from '../support/sse.js';
import { startTestKeel, type TestKeel } from '../support/test-keel.js';

// The built-in conformance agent (docs/conformance.md) with the agents and provider
// of test/conformance.config.yaml, driven by the official SDK client on all three bindings (gRPC
// on, as that config has it): each messageId prefix gives the documented behaviour, through
// Keel's ordinary pipeline.

type Json = Record<string, any>; // eslint-disable-line @typescript-eslint/no-explicit-any

const conformanceConfig = parseYaml(readFileSync(new URL('../conformance.config.yaml', import.meta.url), 'utf8')) as {
  providers: Record<string, Json>;
  agents: Json[];
};
const STREAM_TIMEOUT_SECONDS = 0.3;

let keel: TestKeel;
let token = '';

beforeAll(async () => {
  keel = await startTestKeel({
    overrides: {
      KEEL_GRPC_PORT: '0',
      KEEL_PRIVACY_LEVEL: 'full',
      KEEL_PROVIDERS: { conformance: { ...conformanceConfig.providers.conformance, streamTimeoutSeconds: STREAM_TIMEOUT_SECONDS } },
      KEEL_AGENTS: conformanceConfig.agents,
    },
  });
  const client = await createClient(keel.context.pool, 'conformance-kit');
  if (!client.ok) throw new Error('client');
  token = client.token;
});
afterAll(async () => {
  await keel?.dispose();
});

const unique = (prefix: string) => `${prefix}-${Math.random().toString(36).slice(2)}`;

/** SendMessage through the SDK, as wire JSON: `{task}` or `{message}`. */
async function send(client: Client, request: SendMessageRequest): Promise<{ task?: Json; message?: Json }> {
  const result = await client.sendMessage(request);
  return 'messageId' in result ? { message: Message.toJSON(result as Message) as Json } : { task: Task.toJSON(result as Task) as Json };
}

/** Every event of a stream, as wire JSON StreamResponses. */
async function collect(events: AsyncGenerator<StreamResponse>): Promise<Json[]> {
  const out: Json[] = [];
  for await (const event of events) out.push(StreamResponse.toJSON(event) as Json);
  return out;
}

/** A readable outline of a stream: `task:<state>`, `status:<state>`, `artifact:<parts>`, `message:<text>`. */
const outline = (event: Json): string => {
  if (event.task) return `task:${event.task.status.state}`;
  if (event.statusUpdate) return `status:${event.statusUpdate.status.state}`;
  if (event.artifactUpdate) return `artifact:${JSON.stringify(event.artifactUpdate.artifact.parts)}`;
  return `message:${event.message.parts[0].text}`;
};

const FILE_PART = { raw: Buffer.from('tck').toString('base64'), filename: 'output.txt', mediaType: 'text/plain' };

describe.each<Binding>(['JSONRPC', 'HTTP+JSON', 'GRPC'])('the conformance agent over %s', (binding) => {
  let client: Client;
  beforeAll(async () => {
    client = await sdkClient(keel.url, 'conformance', token, binding);
  });

  it('tck-complete-task: completes with the status message "Hello from TCK"', async () => {
    const { task } = await send(client, textMessage('hi', { messageId: unique('tck-complete-task') }));
    expect(task!.status.state).toBe('TASK_STATE_COMPLETED');
    expect(task!.status.message).toMatchObject({ role: 'ROLE_AGENT', parts: [{ text: 'Hello from TCK' }] });
    expect(task!.artifacts ?? []).toEqual([]);
  });

  it.each([
    ['tck-artifact-text', [{ text: 'Generated text content' }]],
    ['tck-artifact-file-url', [{ url: 'https://example.com/output.txt', filename: 'output.txt', mediaType: 'text/plain' }]],
    ['tck-artifact-file', [FILE_PART]],
    ['tck-artifact-data', [{ data: { key: 'value', count: 42 } }]],
  ])('%s: one artifact with exactly these parts, then complete', async (prefix, parts) => {
    const { task } = await send(client, textMessage('make it', { messageId: unique(prefix) }));
    expect(task!.status.state).toBe('TASK_STATE_COMPLETED');
    expect(task!.artifacts).toHaveLength(1);
    expect(task!.artifacts[0].parts).toEqual(parts);
    expect(task!.artifacts[0].artifactId).toEqual(expect.any(String));
    // GetTask reads the same stored result.
    const reread = Task.toJSON((await client.getTask(GetTaskRequest.fromJSON({ id: task!.id }))) as Task) as Json;
    expect(reread.artifacts).toEqual(task!.artifacts);
  });

  it('tck-message-response: answers with a Message, no task', async () => {
    const { message, task } = await send(client, textMessage('say it', { messageId: unique('tck-message-response') }));
    expect(task).toBeUndefined();
    expect(message).toMatchObject({ role: 'ROLE_AGENT', parts: [{ text: 'Direct message response' }] });
  });

  it('tck-reject-task: the task is REJECTED', async () => {
    const { task } = await send(client, textMessage('no', { messageId: unique('tck-reject-task') }));
    expect(task!.status.state).toBe('TASK_STATE_REJECTED');
  });

  it('tck-input-required: INPUT_REQUIRED, again for a follow-up with the same prefix, then complete', async () => {
    const { task } = await send(client, textMessage('start', { messageId: unique('tck-input-required') }));
    expect(task!.status.state).toBe('TASK_STATE_INPUT_REQUIRED');
    expect(task!.status.message.parts).toEqual([{ text: 'Input required by TCK' }]);

    // The follow-up's own messageId decides: tck-input-required asks again, promptly (blocking).
    const started = Date.now();
    const again = (await send(client, textMessage('more', { taskId: task!.id, messageId: unique('tck-input-required') }))).task!;
    expect(Date.now() - started).toBeLessThan(5_000);
    expect(again.status.state).toBe('TASK_STATE_INPUT_REQUIRED');

    const done = (await send(client, textMessage('here you go', { taskId: task!.id, messageId: unique('follow-up') }))).task!;
    expect(done.id).toBe(task!.id);
    expect(done.status.state).toBe('TASK_STATE_COMPLETED');
    const userTexts = (done.history as Json[]).filter((message) => message.role === 'ROLE_USER').map((message) => message.parts[0].text);
    expect(userTexts).toEqual(['start', 'more', 'here you go']);
  });

  it('anything else completes the task', async () => {
    const { task } = await send(client, textMessage('whatever', { messageId: unique('something-else') }));
    expect(task!.status.state).toBe('TASK_STATE_COMPLETED');
  });

  it.each([
    ['tck-stream-001', 'Stream hello from TCK'],
    ['tck-stream-003', 'Stream task lifecycle'],
    ['tck-stream-ordering-001', 'Ordered output'],
    ['tck-stream-artifact-text', 'Streamed text content'],
  ])('%s streams WORKING, the text artifact, COMPLETED', async (prefix, text) => {
    const events = await collect(client.sendMessageStream(textMessage('stream', { messageId: unique(prefix) })));
    expect(events.map(outline)).toEqual([
      'task:TASK_STATE_SUBMITTED',
      'status:TASK_STATE_WORKING',
      `artifact:${JSON.stringify([{ text }])}`,
      'status:TASK_STATE_COMPLETED',
    ]);
  });

  it('tck-stream-artifact-file streams WORKING, the file artifact, COMPLETED', async () => {
    const events = await collect(client.sendMessageStream(textMessage('stream', { messageId: unique('tck-stream-artifact-file') })));
    expect(events.map(outline)).toEqual(['task:TASK_STATE_SUBMITTED', 'status:TASK_STATE_WORKING', `artifact:${JSON.stringify([FILE_PART])}`, 'status:TASK_STATE_COMPLETED']);
  });

  it('tck-stream-artifact-chunked streams two chunks of one artifact (append, lastChunk), then COMPLETED', async () => {
    const events = await collect(client.sendMessageStream(textMessage('stream', { messageId: unique('tck-stream-artifact-chunked') })));
    expect(events.map(outline)).toEqual([
      'task:TASK_STATE_SUBMITTED',
      'status:TASK_STATE_WORKING',
      'artifact:[{"text":"chunk-1 "}]',
      'artifact:[{"text":"chunk-2"}]',
      'status:TASK_STATE_COMPLETED',
    ]);
    const [first, second] = events.filter((event) => event.artifactUpdate).map((event) => event.artifactUpdate);
    expect(first.artifact.artifactId).toBe(second.artifact.artifactId);
    expect(first.append ?? false).toBe(false);
    expect(first.lastChunk ?? false).toBe(false);
    expect(second).toMatchObject({ append: true, lastChunk: true });
    // The stored artifact is the chunks joined.
    const taskId = events[0]!.task.id as string;
    const task = Task.toJSON((await client.getTask(GetTaskRequest.fromJSON({ id: taskId }))) as Task) as Json;
    expect(task.artifacts).toEqual([{ artifactId: first.artifact.artifactId, name: 'output', parts: [{ text: 'chunk-1 chunk-2' }] }]);
  });

  it('tck-stream-002 completes with no artifact', async () => {
    const events = await collect(client.sendMessageStream(textMessage('stream', { messageId: unique('tck-stream-002') })));
    const shape = events.map(outline);
    expect(shape[0]).toBe('task:TASK_STATE_SUBMITTED');
    expect(shape[shape.length - 1]).toBe('status:TASK_STATE_COMPLETED');
    expect(shape.filter((entry) => entry.startsWith('artifact:'))).toEqual([]);
  });

  it('test-resubscribe-message-id: WORKING, a wait of twice the stream timeout, COMPLETED; a resubscription sees the end', async () => {
    const started = Date.now();
    const stream = client.sendMessageStream(textMessage('long', { messageId: unique('test-resubscribe-message-id') }));
    const first = StreamResponse.toJSON((await stream.next()).value as StreamResponse) as Json;
    const second = StreamResponse.toJSON((await stream.next()).value as StreamResponse) as Json;
    expect([outline(first), outline(second)]).toEqual(['task:TASK_STATE_SUBMITTED', 'status:TASK_STATE_WORKING']);
    await stream.return(undefined);
    // Drop the stream and come back: the task is still working, then completes.
    const resubscribed = await collect(client.resubscribeTask(SubscribeToTaskRequest.fromJSON({ id: first.task.id })));
    expect(resubscribed.map(outline).slice(-1)).toEqual(['status:TASK_STATE_COMPLETED']);
    expect(Date.now() - started).toBeGreaterThanOrEqual(2 * STREAM_TIMEOUT_SECONDS * 1000);
  });
});

describe('requests the way the conformance kit sends them', () => {
  const rpc = async (path: string, method: string, params: Json) => {
    const response = await fetch(`${keel.url}${path}`, {
      method: 'POST',
      headers: { 'content-type': 'application/json', 'a2a-version': '1.0', authorization: `Bearer ${token}` },
      body: JSON.stringify({ jsonrpc: '2.0', id: 1, method, params }),
    });
    return { status: response.status, type: response.headers.get('content-type'), body: (await response.json()) as Json };
  };

  it('JSON-RPC at the interface URL with a trailing slash, params by their proto field names', async () => {
    const message = { message: { message_id: unique('tck-input-required'), role: 'ROLE_USER', parts: [{ text: 'first' }] } };
    const created = await rpc('/a2a/conformance/', 'SendMessage', message);
    expect(created.status).toBe(200);
    expect(created.type).toMatch(/^application\/json/);
    const task = created.body.result.task as Json;
    expect(task.status.state).toBe('TASK_STATE_INPUT_REQUIRED');
    await rpc('/a2a/conformance/', 'SendMessage', { message: { message_id: unique('tck-complete-task'), task_id: task.id, role: 'ROLE_USER', parts: [{ text: 'second' }] } });
    // history_length is honoured (ProtoJSON accepts the proto name), metadata keys are left alone.
    const read = await rpc('/a2a/conformance/', 'GetTask', { id: task.id, history_length: 1 });
    expect(read.body.result.status.state).toBe('TASK_STATE_COMPLETED');
    expect(read.body.result.history).toHaveLength(1);
    const listed = await rpc('/a2a/conformance', 'ListTasks', { context_id: task.contextId, page_size: 1 });
    expect(listed.body.result).toMatchObject({ pageSize: 1, totalSize: 1 });
  });

  it('SubscribeToTask on a task waiting for input stays open until the task ends', async () => {
    const client = await sdkClient(keel.url, 'conformance', token, 'HTTP+JSON');
    const { task } = await send(client, textMessage('wait', { messageId: unique('tck-input-required') }));
    const subscription = readSse(
      await fetch(`${keel.url}/a2a/conformance/tasks/${task!.id}:subscribe`, {
        method: 'POST',
        headers: { 'a2a-version': '1.0', authorization: `Bearer ${token}` },
      }),
    );
    await new Promise((resolve) => setTimeout(resolve, 200));
    await send(client, textMessage('go on', { taskId: task!.id, messageId: unique('tck-complete-task') }));
    const events = (await subscription).map((event) => outline(event.data as Json));
    expect(events).toEqual(['task:TASK_STATE_INPUT_REQUIRED', 'status:TASK_STATE_WORKING', 'status:TASK_STATE_COMPLETED']);
  });

  it('a part whose media type the agent does not accept is ContentTypeNotSupportedError', async () => {
    const refused = await rpc('/a2a/conformance/', 'SendMessage', {
      message: { messageId: unique('tck-send-003'), role: 'ROLE_USER', parts: [{ raw: 'dGNr', mediaType: 'application/x-unsupported-tck-type' }] },
    });
    expect(refused.body.error).toMatchObject({ code: -32005, data: [{ reason: 'CONTENT_TYPE_NOT_SUPPORTED' }] });
  });

  it('the required extension of conformance-ext is enforced (-32008) and accepted when requested', async () => {
    const body = JSON.stringify({ jsonrpc: '2.0', id: 1, method: 'SendMessage', params: { message: { messageId: unique('tck-complete-task'), role: 'ROLE_USER', parts: [{ text: 'x' }] } } });
    const headers = { 'content-type': 'application/json', 'a2a-version': '1.0', authorization: `Bearer ${token}` };
    const without = (await (await fetch(`${keel.url}/a2a/conformance-ext`, { method: 'POST', headers, body })).json()) as Json;
    expect(without.error).toMatchObject({ code: -32008 });
    const response = await fetch(`${keel.url}/a2a/conformance-ext`, { method: 'POST', headers: { ...headers, 'a2a-extensions': 'urn:a2a:tck:required-extension' }, body });
    expect(((await response.json()) as Json).result.task.status.state).toBe('TASK_STATE_COMPLETED');
    expect(response.headers.get('a2a-extensions')).toBe('urn:a2a:tck:required-extension');
  });
});
