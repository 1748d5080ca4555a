import { createServer, type Server as HttpServer } from 'node:http';
import { randomUUID } from 'node:crypto';
import type { AddressInfo } from 'node:net';
import {
  CancelTaskRequest,
  DeleteTaskPushNotificationConfigRequest,
  GetTaskPushNotificationConfigRequest,
  GetTaskRequest,
  ListTaskPushNotificationConfigsRequest,
  ListTasksRequest,
  SendMessageRequest,
  StreamResponse,
  SubscribeToTaskRequest,
  Task,
  TaskPushNotificationConfig,
  type SendMessageRequest as SendMessageRequestType,
} from '@a2a-js/sdk';
import { ServiceParameters, withA2AExtensions } from '@a2a-js/sdk/client';
import { status as GrpcStatus, type Client as GrpcClient } from '@grpc/grpc-js';
import { sql } from 'slonik';
import { z } from 'zod';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createClient } from '../../src/auth/client-repository.js';
import { EVENT_ID_KEY } from '../../src/a2a/grpc-binding.js';
import { readJournal } from '../../src/tasks/journal.js';
import { sdkClient, textMessage } from '../support/a2a-client.js';
import { decodeServiceError, grpcMetadata, rawBytesUnary, rawGrpcClient, rawUnary, sdkFailure, type DecodedGrpcError } from '../support/grpc-client.js';
import { TEST_TOOLS_MODULE } from '../support/run-helpers.js';
import { startTestKeel, type TestKeel } from '../support/test-keel.js';
import { waitForRunStatus } from '../support/wait-for.js';

// The gRPC binding driven by the official client's gRPC transport (@a2a-js/sdk/client/grpc), as a
// remote client would use it: it reads the agent's card over HTTP, takes the GRPC interface and
// sends the interface's tenant. Every method of lf.a2a.v1.A2AService; authentication, ownership
// and the error table of specification 5.4 as gRPC statuses with ErrorInfo in
// grpc-status-details-bin; streams from the journal, resumed with `last-event-id`; service
// parameters as metadata. A raw grpc-js client (with the SDK's service definition) checks what the
// official client hides: response metadata, other A2A-Versions, bytes that are no message.

type Json = Record<string, any>; // eslint-disable-line @typescript-eslint/no-explicit-any

const REQUIRED_EXTENSION = 'urn:keel:test:required-extension';
const OPTIONAL_EXTENSION = 'urn:keel:test:optional-extension';
const DOMAIN = 'a2a-protocol.org';
const STEP_MS = 400;

const overrides = {
  KEEL_GRPC_PORT: '0',
  KEEL_PRIVACY_LEVEL: 'full',
  KEEL_RUNS_PROVIDER_ATTEMPTS: '1',
  KEEL_SECURITY_ADDRESS_GUARD_ALLOW_HOSTS: '127.0.0.1',
  KEEL_SECURITY_ADDRESS_GUARD_ALLOW_HTTP: 'true',
  KEEL_TOOL_MODULES: JSON.stringify([TEST_TOOLS_MODULE]),
  KEEL_PROVIDERS: {
    echo: { type: 'echo' },
    steps: {
      type: 'scripted',
      steps: [
        { artifact: { artifactId: 'draft', name: 'draft', text: 'part one ' }, toolCalls: [{ name: 'lookup', arguments: {} }], delayMs: STEP_MS },
        { artifact: { artifactId: 'draft', text: 'part two', append: true, lastChunk: true }, toolCalls: [{ name: 'lookup', arguments: {} }], delayMs: STEP_MS },
        { reply: 'all steps done', delayMs: STEP_MS },
      ],
    },
    slow: { type: 'scripted', steps: [{ delayMs: 30_000, reply: 'late' }] },
  },
  KEEL_AGENTS: [
    { id: 'echo', name: 'Echo', provider: 'echo' },
    { id: 'steps', name: 'Steps', provider: 'steps', tools: ['lookup'] },
    { id: 'slow', name: 'Slow', provider: 'slow' },
    {
      id: 'ext',
      name: 'Extension',
      provider: 'echo',
      extensions: [
        { uri: REQUIRED_EXTENSION, description: 'required by this agent', required: true },
        { uri: OPTIONAL_EXTENSION, description: 'optional' },
      ],
    },
  ],
};

let keel: TestKeel;
let token = '';
let otherToken = '';
let raw: GrpcClient;
let receiver: HttpServer;
let hookUrl = '';

beforeAll(async () => {
  // Push configs point here, so nothing a test registers sends a request off this machine.
  receiver = createServer((_request, response) => response.writeHead(204).end());
  await new Promise<void>((resolve) => receiver.listen(0, '127.0.0.1', resolve));
  hookUrl = `http://127.0.0.1:${(receiver.address() as AddressInfo).port}/hook`;
  keel = await startTestKeel({ overrides });
  const mine = await createClient(keel.context.pool, 'grpc-interop');
  const theirs = await createClient(keel.context.pool, 'grpc-other');
  if (!mine.ok || !theirs.ok) throw new Error('clients');
  token = mine.token;
  otherToken = theirs.token;
  raw = rawGrpcClient(keel.grpcAddress!);
});
afterAll(async () => {
  raw?.close();
  await keel?.dispose();
  await new Promise((resolve) => receiver?.close(resolve));
});

const grpcClient = (agent = 'echo', as: string | null = token) => sdkClient(keel.url, agent, as, 'GRPC');
const auth = (extra: Record<string, string | null> = {}) => grpcMetadata({ authorization: `Bearer ${token}`, 'a2a-version': '1.0', ...extra });

const taskJson = (task: unknown) => Task.toJSON(task as Task) as Json;
const eventsJson = async (events: AsyncGenerator<StreamResponse>, stopAfter?: (event: Json) => boolean): Promise<Json[]> => {
  const out: Json[] = [];
  for await (const event of events) {
    out.push(StreamResponse.toJSON(event) as Json);
    if (stopAfter?.(out[out.length - 1]!)) break;
  }
  return out;
};

/** `task:<state>`, `status:<state>`, `artifact:<id>:<parts>`. */
const outline = (event: Json): string => {
  if (event.task) return `task:${event.task.status.state}`;
  if (event.statusUpdate) return `status:${event.statusUpdate.status.state}`;
  if (event.artifactUpdate) return `artifact:${event.artifactUpdate.artifact.artifactId}:${JSON.stringify(event.artifactUpdate.artifact.parts)}`;
  return `message:${JSON.stringify(event.message.parts)}`;
};
const eventIdOf = (event: Json): number | undefined => (event.statusUpdate ?? event.artifactUpdate)?.metadata?.[EVENT_ID_KEY];

const expectError = (decoded: DecodedGrpcError, code: GrpcStatus, reason: string) => {
  expect({ code: decoded.code, reason: decoded.reason, domain: decoded.domain }).toEqual({ code, reason, domain: DOMAIN });
};

const agentOfTask = (id: string) => keel.context.pool.oneFirst(sql.type(z.object({ agent: z.string() }))`SELECT agent FROM a2a_tasks WHERE id = ${id}`);

describe('the card', () => {
  it("lists the GRPC interface last, at the bound address, with the agent as its tenant", async () => {
    for (const agent of ['echo', 'steps']) {
      const card = (await (await fetch(`${keel.url}/a2a/${agent}/.well-known/agent-card.json`)).json()) as Json;
      expect(card.supportedInterfaces.map((entry: Json) => entry.protocolBinding)).toEqual(['JSONRPC', 'HTTP+JSON', 'GRPC']);
      expect(card.supportedInterfaces[2]).toEqual({ url: keel.grpcAddress, protocolBinding: 'GRPC', protocolVersion: '1.0', tenant: agent });
    }
    const root = (await (await fetch(`${keel.url}/.well-known/agent-card.json`)).json()) as Json;
    expect(root.supportedInterfaces[2]).toMatchObject({ protocolBinding: 'GRPC', tenant: 'echo' });
  });
});

describe('every method over gRPC with the official client', () => {
  it('SendMessage (blocking), GetTask, ListTasks', async () => {
    const client = await grpcClient();
    expect(client.protocolVersion).toBe('1.0');
    const task = taskJson(await client.sendMessage(textMessage('hello over grpc')));
    expect(task.status.state).toBe('TASK_STATE_COMPLETED');
    expect(JSON.stringify(task.artifacts)).toContain('echo: hello over grpc');
    expect(await agentOfTask(task.id)).toBe('echo');

    const read = taskJson(await client.getTask(GetTaskRequest.fromJSON({ id: task.id, historyLength: 1 })));
    expect(read).toMatchObject({ id: task.id, contextId: task.contextId, status: { state: 'TASK_STATE_COMPLETED' } });
    expect(read.history).toHaveLength(1);
    expect(read.artifacts).toEqual(task.artifacts);

    const listed = await client.listTasks(ListTasksRequest.fromJSON({ contextId: task.contextId, includeArtifacts: true }));
    expect(listed.tasks.map((entry) => entry.id)).toEqual([task.id]);
    expect(listed).toMatchObject({ nextPageToken: '', pageSize: 50, totalSize: 1 });
  });

  it('a follow-up in the same context and the tenant that routes each call to its agent', async () => {
    const steps = await grpcClient('steps');
    const first = taskJson(await steps.sendMessage(textMessage('go', { returnImmediately: true })));
    expect(await agentOfTask(first.id)).toBe('steps');
    // The echo agent does not see the steps agent's task, even for the same client.
    expectNotFound(await sdkFailure((await grpcClient('echo')).getTask(GetTaskRequest.fromJSON({ id: first.id }))));
    await waitForRunStatus(keel.context.pool, first.id, ['completed']);
    const echo = await grpcClient('echo');
    const one = taskJson(await echo.sendMessage(textMessage('one')));
    const two = taskJson(await echo.sendMessage(textMessage('two', { contextId: one.contextId })));
    expect(two.contextId).toBe(one.contextId);
    expect(two.id).not.toBe(one.id);
  });

  it('CancelTask, then TaskNotCancelableError', async () => {
    const client = await grpcClient('slow');
    const task = taskJson(await client.sendMessage(textMessage('take your time', { returnImmediately: true })));
    await waitForRunStatus(keel.context.pool, task.id, ['running']);
    const cancelled = taskJson(await client.cancelTask(CancelTaskRequest.fromJSON({ id: task.id })));
    expect(cancelled.status.state).toBe('TASK_STATE_CANCELED');
    const again = await sdkFailure(client.cancelTask(CancelTaskRequest.fromJSON({ id: task.id })));
    expectError(again, GrpcStatus.FAILED_PRECONDITION, 'TASK_NOT_CANCELABLE');
    expect(again.errorMetadata).toMatchObject({ taskId: task.id });
  });

  it('the four push notification config methods', async () => {
    const client = await grpcClient();
    const task = taskJson(await client.sendMessage(textMessage('push me')));
    const created = await client.createTaskPushNotificationConfig(
      TaskPushNotificationConfig.fromJSON({ taskId: task.id, id: 'grpc-hook', url: hookUrl, token: 'a-push-token-of-some-length' }),
    );
    // The token is never sent back, only its last four characters (docs/push.md).
    expect(TaskPushNotificationConfig.toJSON(created)).toEqual({ id: 'grpc-hook', taskId: task.id, url: hookUrl, token: expect.stringMatching(/^[^a]+ngth$/) });
    const read = await client.getTaskPushNotificationConfig(GetTaskPushNotificationConfigRequest.fromJSON({ taskId: task.id, id: 'grpc-hook' }));
    expect(TaskPushNotificationConfig.toJSON(read)).toEqual(TaskPushNotificationConfig.toJSON(created));
    const listed = await client.listTaskPushNotificationConfig(ListTaskPushNotificationConfigsRequest.fromJSON({ taskId: task.id }));
    expect(listed.configs.map((config) => config.id)).toEqual(['grpc-hook']);
    expect(listed.nextPageToken).toBe('');
    await client.deleteTaskPushNotificationConfig(DeleteTaskPushNotificationConfigRequest.fromJSON({ taskId: task.id, id: 'grpc-hook' }));
    // Idempotent, and gone afterwards.
    await client.deleteTaskPushNotificationConfig(DeleteTaskPushNotificationConfigRequest.fromJSON({ taskId: task.id, id: 'grpc-hook' }));
    expect((await client.listTaskPushNotificationConfig(ListTaskPushNotificationConfigsRequest.fromJSON({ taskId: task.id }))).configs).toEqual([]);
    const gone = await sdkFailure(client.getTaskPushNotificationConfig(GetTaskPushNotificationConfigRequest.fromJSON({ taskId: task.id, id: 'grpc-hook' })));
    expect({ code: gone.code, reason: gone.reason }).toEqual({ code: GrpcStatus.INVALID_ARGUMENT, reason: 'INVALID_ARGUMENT' });
  });

  it('GetExtendedAgentCard', async () => {
    const client = await grpcClient('steps');
    const card = await client.getAgentCard();
    expect(card.name).toBe('Steps');
    expect(card.documentationUrl).toBe(`${keel.url}/a2a/steps/.well-known/agent-card.json`);
    expect(card.supportedInterfaces.find((entry) => entry.protocolBinding === 'GRPC')).toMatchObject({ url: keel.grpcAddress, tenant: 'steps' });
  });
});

describe('streams from the journal', () => {
  it('SendStreamingMessage to completion: the task as created, then every journal event with its id', async () => {
    const client = await grpcClient('steps');
    const events = await eventsJson(client.sendMessageStream(textMessage('stream it')));
    expect(events.map(outline)).toEqual([
      'task:TASK_STATE_SUBMITTED',
      'status:TASK_STATE_WORKING',
      'artifact:draft:[{"text":"part one "}]',
      'artifact:draft:[{"text":"part two"}]',
      expect.stringMatching(/^artifact:.*-answer:\[\{"text":"all steps done"\}\]$/),
      'status:TASK_STATE_COMPLETED',
    ]);
    const taskId = events[0]!.task.id as string;
    const journal = await readJournal(keel.context.pool, keel.context.sealer, taskId, 0);
    expect(events.slice(1).map(eventIdOf)).toEqual(journal.map((event) => event.sequence));
  });

  it('SubscribeToTask: the current task first, then the rest until it completes', async () => {
    const client = await grpcClient('steps');
    const task = taskJson(await client.sendMessage(textMessage('watch it', { returnImmediately: true })));
    const events = await eventsJson(client.resubscribeTask(SubscribeToTaskRequest.fromJSON({ id: task.id })));
    expect(events[0]!.task.id).toBe(task.id);
    expect(events.slice(1).every((event) => !event.task)).toBe(true);
    expect(outline(events[events.length - 1]!)).toBe('status:TASK_STATE_COMPLETED');
    const completed = taskJson(await client.getTask(GetTaskRequest.fromJSON({ id: task.id })));
    expect(completed.status.state).toBe('TASK_STATE_COMPLETED');
  });

  it('a client that lost its stream resumes after the last event id it saw, missing nothing', async () => {
    const client = await grpcClient('steps');
    // The stream is dropped after the first artifact (the client cancels the call).
    const before = await eventsJson(client.sendMessageStream(textMessage('resume me')), (event) => Boolean(event.artifactUpdate));
    const taskId = before[0]!.task.id as string;
    const lastSeen = eventIdOf(before[before.length - 1]!)!;
    expect(lastSeen).toBeGreaterThan(0);
    const after = await eventsJson(
      client.resubscribeTask(SubscribeToTaskRequest.fromJSON({ id: taskId }), { serviceParameters: { 'last-event-id': String(lastSeen) } }),
    );
    // No snapshot on a resumed stream: the journal after that id, to the end.
    expect(after.map(outline)).toEqual([
      'artifact:draft:[{"text":"part two"}]',
      expect.stringMatching(/^artifact:.*-answer:/),
      'status:TASK_STATE_COMPLETED',
    ]);
    const journal = await readJournal(keel.context.pool, keel.context.sealer, taskId, 0);
    expect([...before.slice(1), ...after].map(eventIdOf)).toEqual(journal.map((event) => event.sequence));
  });
});

describe('authentication and ownership', () => {
  it('refuses a call without a token and with a wrong one (UNAUTHENTICATED), before anything is written', async () => {
    const tasksBefore = await keel.context.pool.oneFirst(sql.type(z.object({ n: z.number() }))`SELECT count(*)::int AS n FROM a2a_tasks`);
    for (const credential of [null, `keel_${'A'.repeat(43)}`, 'not-a-keel-token']) {
      const client = await grpcClient('echo', credential);
      const refused = await sdkFailure(client.sendMessage(textMessage('let me in')));
      expect(refused.code).toBe(GrpcStatus.UNAUTHENTICATED);
      expect(refused.reason).toBe('UNAUTHENTICATED');
      const streamRefused = await sdkFailure(client.sendMessageStream(textMessage('let me in')));
      expect(streamRefused.code).toBe(GrpcStatus.UNAUTHENTICATED);
    }
    expect(await keel.context.pool.oneFirst(sql.type(z.object({ n: z.number() }))`SELECT count(*)::int AS n FROM a2a_tasks`)).toBe(tasksBefore);
  });

  it("another client's task is not found, by any method, exactly like one that never existed", async () => {
    const mine = await grpcClient('slow');
    const task = taskJson(await mine.sendMessage(textMessage('mine', { returnImmediately: true })));
    const theirs = await grpcClient('slow', otherToken);
    const attempts: Array<() => Promise<unknown> | AsyncGenerator<unknown>> = [
      () => theirs.getTask(GetTaskRequest.fromJSON({ id: task.id })),
      () => theirs.cancelTask(CancelTaskRequest.fromJSON({ id: task.id })),
      () => theirs.resubscribeTask(SubscribeToTaskRequest.fromJSON({ id: task.id })),
      () => theirs.listTaskPushNotificationConfig(ListTaskPushNotificationConfigsRequest.fromJSON({ taskId: task.id })),
      () => theirs.sendMessage(textMessage('butting in', { taskId: task.id })),
    ];
    for (const attempt of attempts) {
      const refused = await sdkFailure(attempt());
      expectNotFound(refused);
      expect(refused.errorMetadata).toEqual({ taskId: task.id });
    }
    expect((await theirs.listTasks(ListTasksRequest.fromJSON({}))).tasks).toEqual([]);
    const never = await sdkFailure(theirs.getTask(GetTaskRequest.fromJSON({ id: randomUUID() })));
    expect({ code: never.code, reason: never.reason }).toEqual({ code: GrpcStatus.NOT_FOUND, reason: 'TASK_NOT_FOUND' });
    await mine.cancelTask(CancelTaskRequest.fromJSON({ id: task.id }));
  });
});

function expectNotFound(decoded: DecodedGrpcError): void {
  expectError(decoded, GrpcStatus.NOT_FOUND, 'TASK_NOT_FOUND');
}

describe('A2A errors as gRPC statuses (specification 5.4) with ErrorInfo', () => {
  const send = (json: Json): SendMessageRequestType => SendMessageRequest.fromJSON(json);

  it('TaskNotFoundError: NOT_FOUND', async () => {
    const id = randomUUID();
    const refused = await sdkFailure((await grpcClient()).getTask(GetTaskRequest.fromJSON({ id })));
    expectNotFound(refused);
    expect(refused.errorMetadata).toEqual({ taskId: id });
    expect(refused.message).toBe(`task ${id} not found`);
  });

  it('invalid params: INVALID_ARGUMENT with a BadRequest naming the field', async () => {
    const client = await grpcClient();
    const refused = await sdkFailure(client.sendMessage(send({ message: { messageId: 'no-parts', role: 'ROLE_USER', parts: [] } })));
    expectError(refused, GrpcStatus.INVALID_ARGUMENT, 'INVALID_ARGUMENT');
    expect(refused.detailTypes).toEqual(['type.googleapis.com/google.rpc.ErrorInfo', 'type.googleapis.com/google.rpc.BadRequest']);
    // An empty repeated field is an absent one in proto3.
    expect(refused.fieldViolations).toEqual([{ field: 'message.parts', description: 'Required' }]);
    const noRole = await sdkFailure(client.sendMessage(send({ message: { messageId: 'no-role', parts: [{ text: 'x' }] } })));
    expect(noRole.fieldViolations.map((violation) => violation.field)).toEqual(['message.role']);
  });

  it('UnsupportedOperationError: UNIMPLEMENTED (a terminal task takes no subscription and no message)', async () => {
    const client = await grpcClient();
    const task = taskJson(await client.sendMessage(textMessage('done soon')));
    expectError(await sdkFailure(client.resubscribeTask(SubscribeToTaskRequest.fromJSON({ id: task.id }))), GrpcStatus.UNIMPLEMENTED, 'UNSUPPORTED_OPERATION');
    expectError(await sdkFailure(client.sendMessage(textMessage('more', { taskId: task.id }))), GrpcStatus.UNIMPLEMENTED, 'UNSUPPORTED_OPERATION');
  });

  it('ContentTypeNotSupportedError: INVALID_ARGUMENT, on the unary and the streaming send', async () => {
    const client = await grpcClient();
    const request = send({ message: { messageId: 'png', role: 'ROLE_USER', parts: [{ raw: Buffer.from('png').toString('base64'), mediaType: 'image/png' }] } });
    const refused = await sdkFailure(client.sendMessage(request));
    expectError(refused, GrpcStatus.INVALID_ARGUMENT, 'CONTENT_TYPE_NOT_SUPPORTED');
    expect(refused.errorMetadata).toMatchObject({ mediaType: 'image/png' });
    expectError(await sdkFailure(client.sendMessageStream(request)), GrpcStatus.INVALID_ARGUMENT, 'CONTENT_TYPE_NOT_SUPPORTED');
  });

  it('ExtensionSupportRequiredError: FAILED_PRECONDITION; with the extension requested the call goes through', async () => {
    const client = await grpcClient('ext');
    const refused = await sdkFailure(client.sendMessage(textMessage('no extension')));
    expectError(refused, GrpcStatus.FAILED_PRECONDITION, 'EXTENSION_SUPPORT_REQUIRED');
    expect(refused.errorMetadata).toEqual({ extensions: REQUIRED_EXTENSION });
    const withExtension = { serviceParameters: ServiceParameters.create(withA2AExtensions(REQUIRED_EXTENSION)) };
    const task = taskJson(await client.sendMessage(textMessage('with extension'), withExtension));
    expect(task.status.state).toBe('TASK_STATE_COMPLETED');
  });

  it('VersionNotSupportedError: UNIMPLEMENTED for an absent or other A2A-Version; 1.0.x is 1.0', async () => {
    for (const version of [null, '0.3', '1.1', '2.0']) {
      const outcome = await rawUnary(raw, 'getTask', GetTaskRequest.fromJSON({ id: randomUUID() }), auth({ 'a2a-version': version }));
      const decoded = decodeServiceError(outcome.error);
      expectError(decoded, GrpcStatus.UNIMPLEMENTED, 'VERSION_NOT_SUPPORTED');
      expect(decoded.errorMetadata).toEqual({ supported: '1.0' });
    }
    const patch = await rawUnary(raw, 'getTask', GetTaskRequest.fromJSON({ id: randomUUID() }), auth({ 'a2a-version': '1.0.3' }));
    expect(decodeServiceError(patch.error).reason).toBe('TASK_NOT_FOUND');
  });
});

describe('service parameters as metadata, tenants and bytes (raw gRPC)', () => {
  it('echoes the activated extensions in the response metadata, and only those the agent declares', async () => {
    const request = SendMessageRequest.fromJSON({ tenant: 'ext', message: { messageId: randomUUID(), role: 'ROLE_USER', parts: [{ text: 'hi' }] } });
    const outcome = await rawUnary(raw, 'sendMessage', request, auth({ 'a2a-extensions': `${REQUIRED_EXTENSION}, ${OPTIONAL_EXTENSION},urn:unknown:extension` }));
    expect(outcome.error).toBeNull();
    expect(outcome.headers.get('a2a-extensions')).toEqual([`${REQUIRED_EXTENSION}, ${OPTIONAL_EXTENSION}`]);
    // A refusal after the gate carries the echo too.
    const missing = await rawUnary(raw, 'getTask', GetTaskRequest.fromJSON({ tenant: 'ext', id: randomUUID() }), auth({ 'a2a-extensions': REQUIRED_EXTENSION }));
    expect(decodeServiceError(missing.error).reason).toBe('TASK_NOT_FOUND');
    expect(missing.headers.get('a2a-extensions')).toEqual([REQUIRED_EXTENSION]);
    const none = await rawUnary(raw, 'getTask', GetTaskRequest.fromJSON({ id: randomUUID() }), auth());
    expect(none.headers.get('a2a-extensions')).toEqual([]);
  });

  it('an empty tenant is the first agent; an unknown one is NOT_FOUND', async () => {
    const outcome = await rawUnary(raw, 'sendMessage', SendMessageRequest.fromJSON({ message: { messageId: randomUUID(), role: 'ROLE_USER', parts: [{ text: 'x' }] } }), auth());
    expect(outcome.error).toBeNull();
    const taskId = (outcome.response as { payload: { value: { id: string } } }).payload.value.id;
    expect(await agentOfTask(taskId)).toBe('echo');
    const unknown = await rawUnary(raw, 'getTask', GetTaskRequest.fromJSON({ tenant: 'nobody', id: taskId }), auth());
    const decoded = decodeServiceError(unknown.error);
    expect(decoded.code).toBe(GrpcStatus.NOT_FOUND);
    expect(decoded.message).toBe('no agent nobody');
  });

  it('bytes that are no request message are INVALID_ARGUMENT, after authentication', async () => {
    const garbage = Buffer.from([0x0a, 0xff, 0x01]);
    const refused = decodeServiceError(await rawBytesUnary(raw, 'getTask', garbage, auth()));
    expectError(refused, GrpcStatus.INVALID_ARGUMENT, 'INVALID_ARGUMENT');
    expect(refused.message).toMatch(/^invalid params: \(params\): the request is not a valid protobuf message/);
    const anonymous = await rawBytesUnary(raw, 'getTask', garbage, grpcMetadata({ 'a2a-version': '1.0' }));
    expect(anonymous?.code).toBe(GrpcStatus.UNAUTHENTICATED);
  });

  it('a message over the size limit is RESOURCE_EXHAUSTED', async () => {
    const big = SendMessageRequest.fromJSON({ message: { messageId: randomUUID(), role: 'ROLE_USER', parts: [{ text: 'x'.repeat(keel.config.server.bodyLimitBytes + 1) }] } });
    const outcome = await rawUnary(raw, 'sendMessage', big, auth());
    expect(outcome.error?.code).toBe(GrpcStatus.RESOURCE_EXHAUSTED);
  });
});
