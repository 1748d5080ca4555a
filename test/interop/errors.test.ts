import { randomUUID } from 'node:crypto';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createClient } from '../../src/auth/client-repository.js';
import {
  BAD_REQUEST_TYPE,
  BINDINGS,
  callA2A,
  expectA2AError,
  expectA2AResult,
  expectRestError,
  expectRpcError,
  halfWrittenRows,
  rawRest,
  rawRpc,
  rowCounts,
  type Binding,
  type ExpectedError,
  type Json,
  type WireResponse,
} from '../support/a2a-wire.js';
import { startTestKeel, type TestKeel } from '../support/test-keel.js';

// Every error code of a2a-v1.md reached by a real request, on both bindings, with its ErrorInfo
// (reason, domain) in JSON-RPC `error.data` and in the REST `{error: {code, status, message,
// details}}` body with its HTTP status; plus malformed JSON, wrong types, oversized bodies,
// unknown methods and broken bytes. The rule (docs/architecture.md, "A2A server"): bad input gets
// the specified error, never a 500 and never a half-written row.
//
// Three codes cannot be reached by any request to Keel; each has a test of what Keel does instead:
// -32003 PushNotificationNotSupportedError: the specification (3.3.4, Capability Validation) makes
//   it the answer of the push-config methods when `AgentCard.capabilities.pushNotifications` is
//   false or absent. Keel declares push for every agent and implements the four methods, so the
//   condition never holds.
// -32006 InvalidAgentResponseError: "an agent returned a response that does not conform to the
//   specification for the current method" (3.3.2). It is what a client (or a proxy) reports about a
//   remote agent's answer. Keel's agents run in Keel: their provider output becomes Tasks, Messages
//   and artifacts that Keel itself builds, and no A2A method of Keel's server relays a remote
//   agent's response, so there is no foreign response to find non-conforming.
// -32007 ExtendedAgentCardNotConfiguredError: "if the agent declares support but has not
//   configured an extended card, it MUST return" it (3.3.4). Keel declares
//   `capabilities.extendedAgentCard: true` only because it builds an extended card for every
//   agent, so GetExtendedAgentCard always has one to return.

const LIMIT = 4096;
const REQUIRED_EXTENSION = 'urn:a2a:tck:required-extension';
const OPTIONAL_EXTENSION = 'urn:keel:test:optional-extension';
const PUSH_URL = 'https://93.184.215.14/keel-hook';

const E = {
  parse: { code: -32700, reason: 'PARSE_ERROR', httpStatus: 400, status: 'INVALID_ARGUMENT' },
  invalidRequest: { code: -32600, reason: 'INVALID_REQUEST', httpStatus: 400, status: 'INVALID_ARGUMENT' },
  methodNotFound: { code: -32601, reason: 'METHOD_NOT_FOUND', httpStatus: 404, status: 'NOT_FOUND' },
  invalidParams: { code: -32602, reason: 'INVALID_ARGUMENT', httpStatus: 400, status: 'INVALID_ARGUMENT' },
  taskNotFound: { code: -32001, reason: 'TASK_NOT_FOUND', httpStatus: 404, status: 'NOT_FOUND' },
  taskNotCancelable: { code: -32002, reason: 'TASK_NOT_CANCELABLE', httpStatus: 409, status: 'FAILED_PRECONDITION' },
  unsupportedOperation: { code: -32004, reason: 'UNSUPPORTED_OPERATION', httpStatus: 400, status: 'FAILED_PRECONDITION' },
  resultNotRetainable: { code: -32004, reason: 'RESULT_NOT_RETAINABLE', httpStatus: 400, status: 'FAILED_PRECONDITION' },
  // An unsupported media type, of the request body or of a message part: 415 on HTTP+JSON (specification 5.4's table).
  contentTypeNotSupported: { code: -32005, reason: 'CONTENT_TYPE_NOT_SUPPORTED', httpStatus: 415, status: 'INVALID_ARGUMENT' },
  extensionRequired: { code: -32008, reason: 'EXTENSION_SUPPORT_REQUIRED', httpStatus: 400, status: 'FAILED_PRECONDITION' },
  versionNotSupported: { code: -32009, reason: 'VERSION_NOT_SUPPORTED', httpStatus: 400, status: 'FAILED_PRECONDITION' },
  payloadTooLarge: { code: -32600, reason: 'PAYLOAD_TOO_LARGE', httpStatus: 413 },
} satisfies Record<string, ExpectedError>;

let keel: TestKeel;
let token: string;

type MessageExtra = { contextId?: string; taskId?: string; messageId?: string };
const message = (text: string, extra: MessageExtra = {}) => ({ messageId: extra.messageId ?? `m-${randomUUID()}`, role: 'ROLE_USER', parts: [{ text }], ...extra });
const send = (text: string, extra: MessageExtra & { returnImmediately?: boolean } = {}) => {
  const { returnImmediately, ...rest } = extra;
  return { message: message(text, rest), ...(returnImmediately !== undefined ? { configuration: { returnImmediately } } : {}) };
};

function call(binding: Binding, method: string, params: Record<string, unknown>, options: { agent?: string; headers?: Record<string, string | null>; id?: unknown } = {}): Promise<WireResponse> {
  return callA2A(keel.url, options.agent ?? 'echo', binding, method, params, { token, ...options });
}

/** A call that must fail with `expected` and write no row at all. */
async function expectRefused(binding: Binding, method: string, params: Record<string, unknown>, expected: ExpectedError, options: Parameters<typeof call>[3] = {}): Promise<Json> {
  const before = await rowCounts(keel.context.pool);
  const response = await call(binding, method, params, options);
  const error = expectA2AError(binding, response, expected, options.id ?? 1);
  expect(await rowCounts(keel.context.pool), `rows after ${method} ${JSON.stringify(params)}`).toEqual(before);
  return error;
}

/** The field violations of an invalid-params error, on either binding. */
function violations(error: Json): string[] {
  const details: Json[] = error.data ?? error.details;
  const badRequest = details.find((detail: Json) => detail['@type'] === BAD_REQUEST_TYPE);
  return (badRequest?.fieldViolations ?? []).map((violation: Json) => violation.field as string);
}

async function sendTask(binding: Binding, agent: string, params: Record<string, unknown>): Promise<Json> {
  const result = expectA2AResult(binding, await call(binding, 'SendMessage', params, { agent }));
  expect(result.task, JSON.stringify(result)).toBeDefined();
  return result.task;
}

beforeAll(async () => {
  keel = await startTestKeel({
    overrides: {
      KEEL_SERVER_BODY_LIMIT_BYTES: String(LIMIT),
      // A cancelled run is noticed at the next heartbeat; a short one lets the slow runs stop quickly.
      KEEL_RUNS_HEARTBEAT_SECONDS: '0.5',
      KEEL_PROVIDERS: {
        echo: { type: 'echo' },
        slow: { type: 'scripted', steps: [{ delayMs: 30_000, reply: 'late' }] },
        'echo-metadata': { type: 'echo', privacy: { answerLevel: 'metadata' } },
      },
      KEEL_AGENTS: [
        { id: 'echo', name: 'Echo', provider: 'echo', privacy: { answerLevel: 'full' } },
        { id: 'slow', name: 'Slow', provider: 'slow', privacy: { answerLevel: 'full' } },
        { id: 'metadata-agent', name: 'Metadata (agent)', provider: 'echo', privacy: { answerLevel: 'metadata' } },
        { id: 'metadata-provider', name: 'Metadata (provider)', provider: 'echo-metadata' },
        { id: 'none-agent', name: 'None', provider: 'echo', privacy: { answerLevel: 'none' } },
        {
          id: 'needs-ext',
          name: 'Needs an extension',
          provider: 'echo',
          privacy: { answerLevel: 'full' },
          extensions: [
            { uri: REQUIRED_EXTENSION, description: 'required by the TCK', required: true },
            { uri: OPTIONAL_EXTENSION, description: 'optional', required: false },
          ],
        },
      ],
    },
  });
  const created = await createClient(keel.context.pool, 'errors');
  if (!created.ok) throw new Error(created.reason);
  token = created.token;
});
afterAll(async () => keel?.dispose());

describe.each(BINDINGS)('A2A errors over %s', (binding) => {
  let completed: Json;
  let running: Json;

  beforeAll(async () => {
    completed = await sendTask(binding, 'echo', send('finished'));
    expect(completed.status.state).toBe('TASK_STATE_COMPLETED');
    running = await sendTask(binding, 'slow', send('takes a while', { returnImmediately: true }));
    expect(['TASK_STATE_SUBMITTED', 'TASK_STATE_WORKING']).toContain(running.status.state);
  });
  afterAll(async () => {
    expectA2AResult(binding, await call(binding, 'CancelTask', { id: running.id }, { agent: 'slow' }));
  });

  describe('-32602 invalid params (wrong types), with a BadRequest naming the field', () => {
    const invalidMessages: Array<[string, Record<string, unknown>, string]> = [
      ['parts not an array', { message: { messageId: 'x', role: 'ROLE_USER', parts: 'hello' } }, 'message.parts'],
      ['a part with both text and data', { message: { messageId: 'x', role: 'ROLE_USER', parts: [{ text: 'a', data: { b: 1 } }] } }, 'message.parts.0'],
      ['a part with none of text, raw, url, data', { message: { messageId: 'x', role: 'ROLE_USER', parts: [{ mediaType: 'text/plain' }] } }, 'message.parts.0'],
      ['no parts', { message: { messageId: 'x', role: 'ROLE_USER', parts: [] } }, 'message.parts'],
      ['missing messageId', { message: { role: 'ROLE_USER', parts: [{ text: 'a' }] } }, 'message.messageId'],
      ['messageId a number', { message: { messageId: 7, role: 'ROLE_USER', parts: [{ text: 'a' }] } }, 'message.messageId'],
      ['a 0.3 role', { message: { messageId: 'x', role: 'user', parts: [{ text: 'a' }] } }, 'message.role'],
      ['a client sending ROLE_AGENT', { message: { messageId: 'x', role: 'ROLE_AGENT', parts: [{ text: 'a' }] } }, 'message.role'],
      ['no message', { configuration: { returnImmediately: true } }, 'message'],
      ['a 0.3 kind-tagged part', { message: { messageId: 'x', role: 'ROLE_USER', parts: [{ kind: 'text' }] } }, 'message.parts.0'],
      ['returnImmediately a string', { message: message('a'), configuration: { returnImmediately: 'yes' } }, 'configuration.returnImmediately'],
      ['historyLength negative', { message: message('a'), configuration: { historyLength: -1 } }, 'configuration.historyLength'],
      ['raw not base64', { message: { messageId: 'x', role: 'ROLE_USER', parts: [{ raw: '***' }] } }, 'message.parts.0.raw'],
      ['metadata an array', { message: message('a'), metadata: [1, 2] }, 'metadata'],
    ];
    it.each(invalidMessages)('SendMessage: %s', async (_name, params, field) => {
      const error = await expectRefused(binding, 'SendMessage', params, E.invalidParams);
      expect(violations(error)).toContain(field);
    });

    it('SendStreamingMessage answers a plain error, not a stream', async () => {
      const error = await expectRefused(binding, 'SendStreamingMessage', { message: { messageId: 'x', role: 'ROLE_USER', parts: 'hello' } }, E.invalidParams);
      expect(violations(error)).toContain('message.parts');
    });

    const invalidLists: Array<[string, Record<string, unknown>, string]> = [
      ['pageSize 0', { pageSize: 0 }, 'pageSize'],
      ['pageSize 101', { pageSize: 101 }, 'pageSize'],
      ['pageSize not an integer', { pageSize: 2.5 }, 'pageSize'],
      ['a pageToken ListTasks never issued', { pageToken: 'not-a-page-token' }, 'pageToken'],
      ['a pageToken that decodes to the wrong shape', { pageToken: Buffer.from(JSON.stringify([1, 'x', 'y'])).toString('base64url') }, 'pageToken'],
      ['a pageToken whose timestamp no date can hold', { pageToken: Buffer.from(`[1,1e999,"${randomUUID()}"]`).toString('base64url') }, 'pageToken'],
      ['a pageToken whose timestamp is out of range', { pageToken: Buffer.from(`[1,9e15,"${randomUUID()}"]`).toString('base64url') }, 'pageToken'],
      ['an unknown status', { status: 'TASK_STATE_DONE' }, 'status'],
      ['statusTimestampAfter not a timestamp', { statusTimestampAfter: 'yesterday' }, 'statusTimestampAfter'],
      ['historyLength negative', { historyLength: -1 }, 'historyLength'],
    ];
    it.each(invalidLists)('ListTasks: %s', async (_name, params, field) => {
      const error = await expectRefused(binding, 'ListTasks', params, E.invalidParams);
      expect(violations(error)).toContain(field);
    });

    it('ListTasks pageSize 1 and 100 are the accepted bounds', async () => {
      for (const pageSize of [1, 100]) {
        expect(expectA2AResult(binding, await call(binding, 'ListTasks', { pageSize })).pageSize).toBe(pageSize);
      }
    });

    it('GetTask: a negative historyLength', async () => {
      const error = await expectRefused(binding, 'GetTask', { id: completed.id, historyLength: -1 }, E.invalidParams);
      expect(violations(error)).toContain('historyLength');
    });

    it('SendMessage: a taskId with the contextId of another context', async () => {
      const error = await expectRefused(binding, 'SendMessage', send('mismatch', { taskId: completed.id, contextId: `other-${randomUUID()}` }), E.invalidParams);
      expect(violations(error)).toContain('message.contextId');
      // Also on a task still running: the mismatch is named before anything else.
      await expectRefused(binding, 'SendMessage', send('mismatch', { taskId: running.id, contextId: completed.contextId }), E.invalidParams, { agent: 'slow' });
    });

    it('CreateTaskPushNotificationConfig: a URL that is not one, or that the address guard refuses', async () => {
      for (const url of ['not a url', 'http://127.0.0.1:9/hook', 'https://10.0.0.1/hook', 'ftp://93.184.215.14/x']) {
        await expectRefused(binding, 'CreateTaskPushNotificationConfig', { taskId: running.id, url }, E.invalidParams, { agent: 'slow' });
      }
    });
  });

  describe('JSON-RPC only: params of the wrong JSON type', () => {
    it.runIf(binding === 'JSONRPC')('an id of the wrong type, a missing id, params an array', async () => {
      await expectRefused(binding, 'GetTask', { id: 42 }, E.invalidParams);
      await expectRefused(binding, 'GetTask', {}, E.invalidParams);
      const before = await rowCounts(keel.context.pool);
      const response = await rawRpc(keel.url, 'echo', { jsonrpc: '2.0', id: 3, method: 'SendMessage', params: [send('positional')] }, { token });
      expectRpcError(response, E.invalidParams, 3);
      expect(await rowCounts(keel.context.pool)).toEqual(before);
    });
  });

  describe('-32001 TaskNotFoundError', () => {
    const unknown = randomUUID();
    const cases: Array<[string, string, (ids: { completed: string; unknown: string }) => Record<string, unknown>]> = [
      ['GetTask (UUID)', 'GetTask', ({ unknown }) => ({ id: unknown })],
      ['GetTask (not a UUID)', 'GetTask', () => ({ id: 'not-a-uuid' })],
      ['CancelTask', 'CancelTask', ({ unknown }) => ({ id: unknown })],
      ['CancelTask (not a UUID)', 'CancelTask', () => ({ id: 'task-123' })],
      ['SubscribeToTask', 'SubscribeToTask', ({ unknown }) => ({ id: unknown })],
      ['SubscribeToTask (not a UUID)', 'SubscribeToTask', () => ({ id: 'nope' })],
      ['CreateTaskPushNotificationConfig', 'CreateTaskPushNotificationConfig', ({ unknown }) => ({ taskId: unknown, url: PUSH_URL })],
      ['GetTaskPushNotificationConfig', 'GetTaskPushNotificationConfig', ({ unknown }) => ({ taskId: unknown, id: 'cfg' })],
      ['ListTaskPushNotificationConfigs', 'ListTaskPushNotificationConfigs', ({ unknown }) => ({ taskId: unknown })],
      ['DeleteTaskPushNotificationConfig', 'DeleteTaskPushNotificationConfig', ({ unknown }) => ({ taskId: unknown, id: 'cfg' })],
      ['SendMessage with an unknown taskId', 'SendMessage', ({ unknown }) => send('continue', { taskId: unknown })],
      ['SendMessage with a taskId that is not a UUID', 'SendMessage', () => send('continue', { taskId: 'task-that-never-was' })],
      ['SendStreamingMessage with an unknown taskId', 'SendStreamingMessage', ({ unknown }) => send('continue', { taskId: unknown })],
      ['GetTask through another agent\'s endpoint', 'GetTask', ({ completed }) => ({ id: completed })],
    ];
    it.each(cases)('%s', async (name, method, params) => {
      const agent = name.includes('another agent') ? 'slow' : 'echo';
      const error = await expectRefused(binding, method, params({ completed: completed.id, unknown }), E.taskNotFound, { agent });
      expect(error.message).toMatch(/not found/);
    });
  });

  it('-32005 ContentTypeNotSupportedError (415): a part whose media type the agent does not accept (CORE-SEND-003)', async () => {
    const card = (await (await fetch(`${keel.url}/a2a/echo/.well-known/agent-card.json`)).json()) as Json;
    expect(card.defaultInputModes).not.toContain('image/png');
    const png = { messageId: 'png', role: 'ROLE_USER', parts: [{ text: 'look' }, { raw: Buffer.from('not really a png').toString('base64'), mediaType: 'image/png', filename: 'a.png' }] };
    const error = await expectRefused(binding, 'SendMessage', { message: png }, E.contentTypeNotSupported);
    expect(error.message).toMatch(/image\/png/);
    await expectRefused(binding, 'SendStreamingMessage', { message: png }, E.contentTypeNotSupported);
    // Accepted media types (parameters ignored) are served.
    const json = { ...png, messageId: 'json', parts: [{ data: { a: 1 }, mediaType: 'application/json; charset=utf-8' }, { text: 'hi', mediaType: 'text/plain' }] };
    expect(expectA2AResult(binding, await call(binding, 'SendMessage', { message: json })).task.status.state).toBe('TASK_STATE_COMPLETED');
  });

  it('-32602 for a push-config pageToken the method never issued', async () => {
    for (const pageToken of ['%%%', Buffer.from('a\u0000b').toString('base64url'), 'AAAA']) {
      await expectRefused(binding, 'ListTaskPushNotificationConfigs', { taskId: running.id, pageToken }, E.invalidParams, { agent: 'slow' });
    }
  });

  it('-32002 TaskNotCancelableError (409): CancelTask of a completed task', async () => {
    await expectRefused(binding, 'CancelTask', { id: completed.id }, E.taskNotCancelable);
    const task = expectA2AResult(binding, await call(binding, 'GetTask', { id: completed.id }));
    expect(task.status.state).toBe('TASK_STATE_COMPLETED');
  });

  describe('-32004 UnsupportedOperationError', () => {
    it('SubscribeToTask on a terminal task (a plain error, not a stream)', async () => {
      const response = await call(binding, 'SubscribeToTask', { id: completed.id });
      expect(response.headers.get('content-type') ?? '').not.toMatch(/event-stream/);
      expectA2AError(binding, response, E.unsupportedOperation);
    });

    it('SendMessage and SendStreamingMessage to a terminal task\'s taskId', async () => {
      await expectRefused(binding, 'SendMessage', send('more', { taskId: completed.id }), E.unsupportedOperation);
      await expectRefused(binding, 'SendMessage', send('more', { taskId: completed.id, contextId: completed.contextId }), E.unsupportedOperation);
      await expectRefused(binding, 'SendStreamingMessage', send('more', { taskId: completed.id }), E.unsupportedOperation);
      // The task is as it was: no message added to its history.
      const task = expectA2AResult(binding, await call(binding, 'GetTask', { id: completed.id }));
      expect(task.history).toHaveLength(1);
    });

    it('SendMessage to a task that is working, not waiting for input', async () => {
      await expectRefused(binding, 'SendMessage', send('more', { taskId: running.id }), E.unsupportedOperation, { agent: 'slow' });
    });
  });

  describe('-32004 RESULT_NOT_RETAINABLE: refused before any row exists', () => {
    const agents = ['metadata-agent', 'metadata-provider', 'none-agent'];
    it.each(agents)('%s: blocking, returnImmediately, streaming, in a new and an existing context, with a push config', async (agent) => {
      const variants: Array<[string, Record<string, unknown>]> = [
        ['SendMessage', send('keep nothing')],
        ['SendMessage', send('keep nothing', { returnImmediately: true })],
        ['SendMessage', send('keep nothing', { returnImmediately: false, contextId: completed.contextId })],
        ['SendMessage', { ...send('keep nothing', { returnImmediately: true, contextId: `fresh-${randomUUID()}` }), configuration: { returnImmediately: true, taskPushNotificationConfig: { url: PUSH_URL } } }],
        ['SendStreamingMessage', send('keep nothing')],
      ];
      for (const [method, params] of variants) {
        const error = await expectRefused(binding, method, params, E.resultNotRetainable, { agent });
        expect(error.message).toMatch(/privacy/);
      }
    });
  });

  describe('-32008 ExtensionSupportRequiredError', () => {
    it('every method of an agent with a required extension, called without A2A-Extensions', async () => {
      for (const [method, params] of [
        ['SendMessage', send('hi')],
        ['SendStreamingMessage', send('hi')],
        ['GetTask', { id: completed.id }],
        ['ListTasks', {}],
        ['GetExtendedAgentCard', {}],
      ] as Array<[string, Record<string, unknown>]>) {
        const error = await expectRefused(binding, method, params, E.extensionRequired, { agent: 'needs-ext' });
        expect(JSON.stringify(error)).toContain(REQUIRED_EXTENSION);
      }
      // Requesting only the optional one is not enough.
      await expectRefused(binding, 'SendMessage', send('hi'), E.extensionRequired, { agent: 'needs-ext', headers: { 'a2a-extensions': OPTIONAL_EXTENSION } });
    });

    it('succeeds when the extension is requested, and echoes the activated extensions', async () => {
      const response = await call(binding, 'SendMessage', send('with the extension'), { agent: 'needs-ext', headers: { 'a2a-extensions': REQUIRED_EXTENSION } });
      expect(expectA2AResult(binding, response).task.status.state).toBe('TASK_STATE_COMPLETED');
      expect(response.headers.get('a2a-extensions')).toBe(REQUIRED_EXTENSION);
      const both = await call(binding, 'ListTasks', {}, { agent: 'needs-ext', headers: { 'a2a-extensions': ` ${OPTIONAL_EXTENSION}, urn:unknown:ext,${REQUIRED_EXTENSION}` } });
      expectA2AResult(binding, both);
      expect((both.headers.get('a2a-extensions') ?? '').split(',').map((uri) => uri.trim()).sort()).toEqual([OPTIONAL_EXTENSION, REQUIRED_EXTENSION].sort());
    });
  });

  describe('-32009 VersionNotSupportedError', () => {
    it.each([
      ['A2A-Version: 0.3', { 'a2a-version': '0.3' }],
      ['no A2A-Version (meaning 0.3)', { 'a2a-version': null }],
      ['A2A-Version: 2.0', { 'a2a-version': '2.0' }],
      ['A2A-Version: 1.1 (a minor version Keel does not speak)', { 'a2a-version': '1.1' }],
      ['A2A-Version: garbage', { 'a2a-version': 'latest' }],
    ] as Array<[string, Record<string, string | null>]>)('%s', async (_name, headers) => {
      for (const [method, params] of [
        ['SendMessage', send('hi')],
        ['GetTask', { id: completed.id }],
      ] as Array<[string, Record<string, unknown>]>) {
        const error = await expectRefused(binding, method, params, E.versionNotSupported, { headers });
        expect(error.message).toMatch(/1\.0/);
      }
    });

    it('the version as a request parameter (no header), and a patch version, are accepted', async () => {
      const viaQuery =
        binding === 'JSONRPC'
          ? await fetch(`${keel.url}/a2a/echo?A2A-Version=1.0`, {
              method: 'POST',
              headers: { authorization: `Bearer ${token}`, 'content-type': 'application/json' },
              body: JSON.stringify({ jsonrpc: '2.0', id: 1, method: 'GetTask', params: { id: completed.id } }),
            })
          : await fetch(`${keel.url}/a2a/echo/tasks/${completed.id}?A2A-Version=1.0`, { headers: { authorization: `Bearer ${token}` } });
      expect(viaQuery.status).toBe(200);
      const body = (await viaQuery.json()) as Json;
      expect((body.result ?? body).id).toBe(completed.id);
      expectA2AResult(binding, await call(binding, 'GetTask', { id: completed.id }, { headers: { 'a2a-version': '1.0.2' } }));
    });
  });

  describe('codes Keel cannot reach (see the header comment), and what it does instead', () => {
    it('-32003: push is declared in every card and the four push methods work', async () => {
      for (const agent of ['echo', 'slow', 'needs-ext']) {
        const card = (await (await fetch(`${keel.url}/a2a/${agent}/.well-known/agent-card.json`)).json()) as Json;
        expect(card.capabilities.pushNotifications).toBe(true);
      }
      const id = `cfg-${binding}`;
      const created = expectA2AResult(binding, await call(binding, 'CreateTaskPushNotificationConfig', { taskId: running.id, id, url: PUSH_URL }, { agent: 'slow' }));
      expect(created).toMatchObject({ id, taskId: running.id, url: PUSH_URL });
      expect(expectA2AResult(binding, await call(binding, 'GetTaskPushNotificationConfig', { taskId: running.id, id }, { agent: 'slow' }))).toMatchObject({ id });
      const listed = expectA2AResult(binding, await call(binding, 'ListTaskPushNotificationConfigs', { taskId: running.id }, { agent: 'slow' }));
      expect(listed.configs.map((config: Json) => config.id)).toContain(id);
      expect(expectA2AResult(binding, await call(binding, 'DeleteTaskPushNotificationConfig', { taskId: running.id, id }, { agent: 'slow' }))).toEqual({});
      // Delete is idempotent.
      expect(expectA2AResult(binding, await call(binding, 'DeleteTaskPushNotificationConfig', { taskId: running.id, id }, { agent: 'slow' }))).toEqual({});
    });

    it('-32007: every agent that declares an extended card returns one', async () => {
      for (const agent of ['echo', 'slow', 'metadata-agent']) {
        const card = (await (await fetch(`${keel.url}/a2a/${agent}/.well-known/agent-card.json`)).json()) as Json;
        expect(card.capabilities.extendedAgentCard).toBe(true);
        const extended = expectA2AResult(binding, await call(binding, 'GetExtendedAgentCard', {}, { agent }));
        expect(extended).toMatchObject({ name: card.name, supportedInterfaces: card.supportedInterfaces });
      }
    });
  });

  describe('inputs that are not errors', () => {
    it('unknown fields in params (and in nested objects) are ignored', async () => {
      const params = {
        message: { ...message('with extras'), futureField: { nested: true }, parts: [{ text: 'with extras', futurePartField: 1 }] },
        configuration: { returnImmediately: false, futureOption: 'x' },
        futureTopLevel: [1, 2, 3],
      };
      const result = expectA2AResult(binding, await call(binding, 'SendMessage', params));
      expect(result.task.status.state).toBe('TASK_STATE_COMPLETED');
      expect(JSON.stringify(result)).not.toContain('future');
      expect(expectA2AResult(binding, await call(binding, 'GetTask', { id: completed.id, futureField: 'x' })).id).toBe(completed.id);
      expectA2AResult(binding, await call(binding, 'ListTasks', { futureFilter: 'x' }));
      expectA2AResult(binding, await call(binding, 'GetExtendedAgentCard', { futureField: 1 }));
    });

    it('application/json is accepted as well as application/a2a+json', async () => {
      const response = await call(binding, 'SendMessage', send('plain json'), { headers: { 'content-type': 'application/json; charset=utf-8' } });
      expect(expectA2AResult(binding, response).task.status.state).toBe('TASK_STATE_COMPLETED');
    });

    it('a body just under the size limit is served', async () => {
      const text = 'x'.repeat(LIMIT - 400);
      const response = await call(binding, 'SendMessage', send(text));
      expect(expectA2AResult(binding, response).task.status.state).toBe('TASK_STATE_COMPLETED');
    });
  });

  describe('bodies that are too large', () => {
    it('answers -32600 (JSON-RPC) or 413 (REST) and writes nothing', async () => {
      for (const size of [LIMIT + 1, LIMIT * 4, 1024 * 1024]) {
        const before = await rowCounts(keel.context.pool);
        const response = await call(binding, 'SendMessage', send('y'.repeat(size)));
        if (binding === 'JSONRPC') expectRpcError(response, E.payloadTooLarge, null);
        else expectRestError(response, E.payloadTooLarge);
        expect(response.body.error.message).toContain(String(LIMIT));
        expect(await rowCounts(keel.context.pool)).toEqual(before);
      }
    });
  });

  describe('bytes that are not UTF-8, and NUL characters', () => {
    const bodyWith = (bytes: Buffer, text: string) => {
      const json = binding === 'JSONRPC' ? JSON.stringify({ jsonrpc: '2.0', id: 1, method: 'SendMessage', params: send(text) }) : JSON.stringify(send(text));
      const [head, tail] = json.split('@@');
      return Buffer.concat([Buffer.from(head!, 'utf8'), bytes, Buffer.from(tail!, 'utf8')]);
    };
    const post = (body: Buffer) => (binding === 'JSONRPC' ? rawRpc(keel.url, 'echo', body, { token }) : rawRest(keel.url, 'echo', 'POST', '/message:send', body, { token }));

    it.each([
      ['an invalid byte', Buffer.from([0xff])],
      ['a truncated sequence', Buffer.from([0xe2, 0x82])],
      ['an overlong encoding', Buffer.from([0xc0, 0xaf])],
      ['a UTF-16 surrogate in UTF-8', Buffer.from([0xed, 0xa0, 0x80])],
    ])('%s inside a string gives a clean error or a valid result', async (_name, bytes) => {
      const response = await post(bodyWith(bytes, 'before @@ after'));
      expect(response.status, response.text).toBeLessThan(500);
      if (response.status === 200 && binding === 'HTTP+JSON') expect(response.body.task.status.state).toBe('TASK_STATE_COMPLETED');
      if (binding === 'JSONRPC' && response.body?.result) expect(response.body.result.task.status.state).toBe('TASK_STATE_COMPLETED');
    });

    it('an invalid byte outside any string is a parse error', async () => {
      const before = await rowCounts(keel.context.pool);
      const json = binding === 'JSONRPC' ? '{"jsonrpc":"2.0","id":1,"method":"SendMessage","params":@@}' : '{"message":@@}';
      const [head, tail] = json.split('@@');
      const response = await post(Buffer.concat([Buffer.from(head!), Buffer.from([0xff, 0xfe]), Buffer.from(tail!)]));
      if (binding === 'JSONRPC') expectRpcError(response, E.parse, null);
      else expectRestError(response, E.parse);
      expect(await rowCounts(keel.context.pool)).toEqual(before);
    });

    it.each([
      ['a NUL character', 'a\u0000b'],
      ['a lone high surrogate', 'a\ud800b'],
      ['a lone low surrogate', 'a\udc00b'],
    ])('%s anywhere in a request never gives a 500 nor writes a row', async (_name, nul) => {
      const before = await rowCounts(keel.context.pool);
      const attempts: Array<[string, Record<string, unknown>, string?]> = [
        ['SendMessage', send('x', { messageId: nul })],
        ['SendMessage', send('x', { contextId: nul })],
        ['SendMessage', { ...send('x'), metadata: { [nul]: nul } }],
        ['SendMessage', send('x', { taskId: nul })],
        ['GetTask', { id: nul }],
        ['ListTasks', { contextId: nul }],
        ['ListTasks', { pageToken: nul }],
        ['CreateTaskPushNotificationConfig', { taskId: running.id, id: nul, url: PUSH_URL }, 'slow'],
        ['CreateTaskPushNotificationConfig', { taskId: running.id, url: PUSH_URL, token: nul, authentication: { scheme: 'Bearer', credentials: nul } }, 'slow'],
        ['GetTaskPushNotificationConfig', { taskId: running.id, id: nul }, 'slow'],
        ['DeleteTaskPushNotificationConfig', { taskId: running.id, id: nul }, 'slow'],
        ['ListTaskPushNotificationConfigs', { taskId: running.id, pageToken: Buffer.from(nul).toString('base64url') }, 'slow'],
      ];
      for (const [method, params, agent] of attempts) {
        const response = await call(binding, method, params, { agent: agent ?? 'echo' });
        expect(response.status, `${method} ${JSON.stringify(params)}: ${response.text}`).toBeLessThan(500);
        expect(response.body?.error?.code, `${method} ${JSON.stringify(params)}: ${response.text}`).not.toBe(binding === 'JSONRPC' ? -32603 : 500);
      }
      expect(await rowCounts(keel.context.pool)).toEqual(before);
      // In the content of a message it is only text: the task is served.
      const served = expectA2AResult(binding, await call(binding, 'SendMessage', { ...send(nul), metadata: undefined }));
      expect(served.task.status.state).toBe('TASK_STATE_COMPLETED');
    });

    it.runIf(binding === 'HTTP+JSON')('malformed percent-encoding in a path is a clean 4xx', async () => {
      for (const [method, path] of [
        ['GET', '/tasks/%E0%A4%A'],
        ['GET', '/tasks/abc%ZZ'],
        ['POST', '/tasks/%:cancel'],
        ['GET', `/tasks/${running.id}/pushNotificationConfigs/%C0%AF`],
        ['DELETE', `/tasks/${running.id}/pushNotificationConfigs/a%00b`],
        ['GET', `/tasks/${running.id}/pushNotificationConfigs/a%00b`],
      ]) {
        const response = await rawRest(keel.url, 'slow', method!, path!, undefined, { token });
        expect(response.status, `${method} ${path}: ${response.text}`).toBeGreaterThanOrEqual(400);
        expect(response.status, `${method} ${path}: ${response.text}`).toBeLessThan(500);
      }
    });
  });
});

describe('JSON-RPC envelope errors', () => {
  const post = (body: unknown, headers: Record<string, string | null> = {}) => rawRpc(keel.url, 'echo', body, { token, headers });

  it('-32700 for malformed JSON, with id null', async () => {
    const before = await rowCounts(keel.context.pool);
    for (const body of ['{"jsonrpc": "2.0", "method": ', '{', "{'jsonrpc': '2.0'}", '{"jsonrpc":"2.0","id":1,"method":"GetTask","params":{}} trailing', '']) {
      expectRpcError(await post(body), E.parse, null);
    }
    expect(await rowCounts(keel.context.pool)).toEqual(before);
  });

  it('-32600 for a body that is not a request object', async () => {
    for (const body of ['"a string"', '42', 'null', 'true']) expectRpcError(await post(body), E.invalidRequest, null);
  });

  it('-32600 for a batch (an array), empty or not', async () => {
    const before = await rowCounts(keel.context.pool);
    expectRpcError(await post([]), E.invalidRequest, null);
    const error = expectRpcError(await post([{ jsonrpc: '2.0', id: 1, method: 'SendMessage', params: send('in a batch') }]), E.invalidRequest, null);
    expect(error.message).toMatch(/batch/);
    expect(await rowCounts(keel.context.pool)).toEqual(before);
  });

  it('-32600 for a wrong or missing jsonrpc, a method that is not a string, an id of the wrong type', async () => {
    expectRpcError(await post({ jsonrpc: '1.0', id: 1, method: 'ListTasks', params: {} }), E.invalidRequest, 1);
    expectRpcError(await post({ id: 2, method: 'ListTasks', params: {} }), E.invalidRequest, 2);
    expectRpcError(await post({ jsonrpc: 2.0, id: 3, method: 'ListTasks', params: {} }), E.invalidRequest, 3);
    expectRpcError(await post({ jsonrpc: '2.0', id: 4, method: 5, params: {} }), E.invalidRequest, 4);
    expectRpcError(await post({ jsonrpc: '2.0', id: 5, params: {} }), E.invalidRequest, 5);
    expectRpcError(await post({ jsonrpc: '2.0', id: { nested: 1 }, method: 'ListTasks', params: {} }), E.invalidRequest, null);
    expectRpcError(await post({ jsonrpc: '2.0', id: [1], method: 'ListTasks', params: {} }), E.invalidRequest, null);
  });

  it('-32005 ContentTypeNotSupportedError for a body that is not JSON by its content type (JSONRPC-SSE-002)', async () => {
    const before = await rowCounts(keel.context.pool);
    const body = JSON.stringify({ jsonrpc: '2.0', id: 1, method: 'SendMessage', params: send('typed as text') });
    expectRpcError(await post(body, { 'content-type': 'text/plain' }), E.contentTypeNotSupported, null);
    expectRpcError(await post(body, { 'content-type': 'application/x-www-form-urlencoded' }), E.contentTypeNotSupported, null);
    // What the conformance kit sends: text/plain and a body that is not JSON either.
    expectRpcError(await post("{'jsonrpc': '2.0', 'id': 1, 'method': 'SendMessage'}", { 'content-type': 'text/plain' }), E.contentTypeNotSupported, null);
    expect(await rowCounts(keel.context.pool)).toEqual(before);
  });

  it('-32601 for unknown methods, the 0.3 names included, with the request id', async () => {
    const before = await rowCounts(keel.context.pool);
    for (const method of ['message/send', 'message/stream', 'tasks/get', 'tasks/cancel', 'tasks/resubscribe', 'tasks/pushNotificationConfig/set', 'agent/getAuthenticatedExtendedCard', 'sendMessage', 'SENDMESSAGE', 'NoSuchMethod', '']) {
      const response = await post({ jsonrpc: '2.0', id: `req-${method}`, method, params: method.startsWith('message') ? { message: { kind: 'message', messageId: 'x', role: 'user', parts: [{ kind: 'text', text: 'hi' }] } } : {} });
      expectRpcError(response, E.methodNotFound, `req-${method}`);
    }
    expect(await rowCounts(keel.context.pool)).toEqual(before);
  });

  it('the id is echoed as sent, string or number', async () => {
    expectRpcError(await post({ jsonrpc: '2.0', id: 'abc', method: 'GetTask', params: { id: randomUUID() } }), E.taskNotFound, 'abc');
    expectRpcError(await post({ jsonrpc: '2.0', id: 0, method: 'GetTask', params: { id: randomUUID() } }), E.taskNotFound, 0);
  });

  it('an unknown agent is a 404 with -32601', async () => {
    const response = await rawRpc(keel.url, 'no-such-agent', { jsonrpc: '2.0', id: 1, method: 'ListTasks', params: {} }, { token });
    expectRpcError(response, { ...E.methodNotFound, rpcHttpStatus: 404 }, 1);
  });

  it('ProtoJSON enum numbers are read as the proto numbers them', async () => {
    // TaskState: COMPLETED = 3, FAILED = 4, CANCELED = 5, INPUT_REQUIRED = 6, REJECTED = 7, AUTH_REQUIRED = 8.
    const completed = expectRpcResult(await post({ jsonrpc: '2.0', id: 1, method: 'ListTasks', params: { status: 3, pageSize: 100 } }));
    expect(completed.tasks.length).toBeGreaterThan(0);
    expect(completed.tasks.every((task: Json) => task.status.state === 'TASK_STATE_COMPLETED')).toBe(true);
    const inputRequired = expectRpcResult(await post({ jsonrpc: '2.0', id: 1, method: 'ListTasks', params: { status: 6 } }));
    expect(inputRequired.tasks).toEqual([]);
    expectRpcError(await post({ jsonrpc: '2.0', id: 1, method: 'ListTasks', params: { status: 9 } }), E.invalidParams);
    // Role: USER = 1.
    const sent = expectRpcResult(await post({ jsonrpc: '2.0', id: 1, method: 'SendMessage', params: { message: { messageId: 'n1', role: 1, parts: [{ text: 'numeric role' }] } } }));
    expect(sent.task.history[0].role).toBe('ROLE_USER');
  });
});

function expectRpcResult(response: WireResponse): Json {
  return expectA2AResult('JSONRPC', response);
}

describe('HTTP+JSON envelope errors', () => {
  it('answers application/json, results and errors alike (HTTP_JSON-SVC-001, HTTP_JSON-ERR-001)', async () => {
    const isJson = (response: WireResponse) => expect(response.headers.get('content-type') ?? '', `${response.status} ${response.text}`).toMatch(/^application\/json(;|$)/);
    isJson(await rawRest(keel.url, 'echo', 'GET', '/tasks', undefined, { token }));
    isJson(await rawRest(keel.url, 'echo', 'POST', '/message:send', JSON.stringify(send('typed right')), { token }));
    isJson(await rawRest(keel.url, 'echo', 'GET', `/tasks/${randomUUID()}`, undefined, { token }));
    isJson(await rawRest(keel.url, 'echo', 'GET', '/no-such-operation', undefined, { token }));
    isJson(await rawRest(keel.url, 'echo', 'POST', '/message:send', 'x'.repeat(LIMIT * 4), { token }));
    isJson(await rawRest(keel.url, 'echo', 'GET', '/tasks', undefined, { token: 'not-a-token' }));
  });

  it('-32700 PARSE_ERROR (400) for malformed JSON', async () => {
    const before = await rowCounts(keel.context.pool);
    for (const body of ['{"message": ', '{', 'not json at all']) {
      expectRestError(await rawRest(keel.url, 'echo', 'POST', '/message:send', body, { token }), E.parse);
    }
    expectRestError(await rawRest(keel.url, 'slow', 'POST', `/tasks/${randomUUID()}/pushNotificationConfigs`, '{"url":', { token }), E.parse);
    expect(await rowCounts(keel.context.pool)).toEqual(before);
  });

  it('-32005 ContentTypeNotSupportedError (415) for a body that is not JSON by its content type', async () => {
    const before = await rowCounts(keel.context.pool);
    const body = JSON.stringify(send('typed as text'));
    for (const type of ['text/plain', 'text/plain; charset=utf-8', 'application/xml', 'multipart/form-data; boundary=x']) {
      const error = expectRestError(await rawRest(keel.url, 'echo', 'POST', '/message:send', body, { token, headers: { 'content-type': type } }), E.contentTypeNotSupported);
      expect(error.message).toMatch(/application\/a2a\+json/);
    }
    expectRestError(await rawRest(keel.url, 'echo', 'POST', '/message:stream', body, { token, headers: { 'content-type': 'text/plain' } }), E.contentTypeNotSupported);
    expect(await rowCounts(keel.context.pool)).toEqual(before);
  });

  it('a JSON body that is not an object is invalid params', async () => {
    for (const body of ['[]', '"x"', '42', 'null']) {
      expectRestError(await rawRest(keel.url, 'echo', 'POST', '/message:send', body, { token }), E.invalidParams);
    }
  });

  it('-32601 METHOD_NOT_FOUND: 404 for an unknown path, 405 for a known path with the wrong verb', async () => {
    for (const [method, path] of [
      ['GET', '/no/such/thing'],
      ['POST', '/message:send-now'],
      ['POST', '/v1/message:send'],
      ['GET', `/tasks/${randomUUID()}:archive`],
    ]) {
      expectRestError(await rawRest(keel.url, 'echo', method!, path!, method === 'POST' ? send('x') : undefined, { token }), E.methodNotFound);
    }
    for (const [method, path] of [
      ['GET', '/message:send'],
      ['DELETE', '/tasks'],
      ['PUT', `/tasks/${randomUUID()}`],
      ['GET', `/tasks/${randomUUID()}:cancel`],
      ['PATCH', `/tasks/${randomUUID()}/pushNotificationConfigs`],
    ]) {
      expectRestError(await rawRest(keel.url, 'echo', method!, path!, undefined, { token }), { ...E.methodNotFound, httpStatus: 405, status: undefined });
    }
  });

  it('an unknown agent is a 404', async () => {
    expectRestError(await rawRest(keel.url, 'no-such-agent', 'GET', '/tasks', undefined, { token }), { ...E.methodNotFound, status: undefined });
  });
});

describe('after all of that', () => {
  it('Keel is ready and no row is half-written', async () => {
    const ready = await fetch(`${keel.url}/readyz`);
    expect(ready.status).toBe(200);
    expect(await halfWrittenRows(keel.context.pool)).toEqual([]);
  });
});
