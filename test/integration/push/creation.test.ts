import { sql } from 'slonik';
import { z } from 'zod';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { BAD_REQUEST_TYPE, BINDINGS, callA2A, expectA2AError, expectA2AResult, rowCounts, type Binding, type WireResponse } from '../../support/a2a-wire.js';
import { TEST_TOOLS_MODULE } from '../../support/run-helpers.js';
import { createEmptyDatabase } from '../../support/test-database.js';
import { startTestKeel, type TestKeel } from '../../support/test-keel.js';
import { waitFor } from '../../support/wait-for.js';
import {
  PUSH_TEST_OVERRIDES,
  PUSH_TEST_TIMINGS,
  attemptsOf,
  configState,
  createPushConfigRpc,
  deliveriesOf,
  newClientToken,
  sendWithPush,
  startReceiver,
  taskState,
  waitForSettled,
  waitForTerminalEvent,
  type Receiver,
} from './push-support.js';

// Creating a push config: only the Bearer scheme is accepted (refused otherwise with -32602 / 400
// naming the field, nothing stored, for SendMessage no task either), and only `Authorization:
// Bearer` is ever sent, also for a config stored earlier with another scheme (stopped instead).
// A config id that exists for the task is refused and the stored config is left as it was.

const configRow = z.object({ url: z.string(), auth_scheme: z.string().nullable(), credentials: z.instanceof(Buffer).nullable(), credentials_hint: z.string().nullable(), token: z.instanceof(Buffer).nullable(), created_at: z.number(), updated_at: z.number() });

const receivers: Receiver[] = [];
afterAll(async () => {
  for (const receiver of receivers) await receiver.close();
});

function expectFieldRefusal(binding: Binding, response: WireResponse, field: string, description: string) {
  const error = expectA2AError(binding, response, { code: -32602, reason: 'INVALID_ARGUMENT', httpStatus: 400, status: 'INVALID_ARGUMENT' });
  const details = (binding === 'JSONRPC' ? error.data : error.details) as Array<Record<string, unknown>>;
  const badRequest = details.find((detail) => detail['@type'] === BAD_REQUEST_TYPE) as { fieldViolations: Array<{ field: string; description: string }> } | undefined;
  expect(badRequest, JSON.stringify(details)).toBeDefined();
  expect(badRequest!.fieldViolations).toEqual([{ field, description: expect.stringContaining(description) }]);
  expect(String(error.message)).toContain(field);
}

describe('the authentication scheme at creation', () => {
  let keel: TestKeel;
  let token = '';
  let receiver: Receiver;

  beforeAll(async () => {
    keel = await startTestKeel({ pushTestTimings: PUSH_TEST_TIMINGS, overrides: { ...PUSH_TEST_OVERRIDES } });
    token = await newClientToken(keel.context.pool);
    receiver = await startReceiver();
    receivers.push(receiver);
  });
  afterAll(async () => keel?.dispose());

  const otherSchemes = ['Basic', 'Digest', 'Token', 'Bearer2', 'ApiKey'];

  it.each(BINDINGS)('CreateTaskPushNotificationConfig (%s) refuses every scheme but Bearer, naming authentication.scheme; no config is stored', async (binding) => {
    const { taskId } = await sendWithPush(keel.url, token, 'echo', 'no config yet');
    await waitForTerminalEvent(keel.context.pool, taskId);
    const before = await rowCounts(keel.context.pool);
    for (const scheme of otherSchemes) {
      const response = await callA2A(keel.url, 'echo', binding, 'CreateTaskPushNotificationConfig', {
        taskId,
        id: `c-${scheme}`,
        url: receiver.url,
        authentication: { scheme, credentials: 'dXNlcjpwYXNzd29yZA==' },
      }, { token });
      expectFieldRefusal(binding, response, 'authentication.scheme', 'only the Bearer scheme is supported');
    }
    expect(await rowCounts(keel.context.pool)).toEqual(before);
    expect(await keel.context.pool.oneFirst(sql.type(z.object({ n: z.number() }))`SELECT count(*)::int AS n FROM push_configs WHERE task_id = ${taskId}`)).toBe(0);
  });

  it.each(BINDINGS)('SendMessage (%s) with an embedded config naming another scheme is refused before any task exists', async (binding) => {
    const before = await rowCounts(keel.context.pool);
    const response = await callA2A(keel.url, 'echo', binding, 'SendMessage', {
      message: { messageId: `scheme-${binding}-${Date.now()}`, role: 'ROLE_USER', parts: [{ text: 'hello' }] },
      configuration: { returnImmediately: true, taskPushNotificationConfig: { id: 'embedded', url: receiver.url, authentication: { scheme: 'Basic', credentials: 'dXNlcjpwYXNzd29yZA==' } } },
    }, { token });
    expectFieldRefusal(binding, response, 'configuration.taskPushNotificationConfig.authentication.scheme', 'only the Bearer scheme is supported');
    // No task, run, context or config: the refusal came before anything was written or queued.
    expect(await rowCounts(keel.context.pool)).toEqual(before);
    expect(receiver.requests).toHaveLength(0);
  });

  it('accepts Bearer in any case (RFC 7235): stored and shown as Bearer, sent as `Authorization: Bearer <credentials>`', async () => {
    const { taskId } = await sendWithPush(keel.url, token, 'echo', 'lower-case scheme', {
      id: 'lower',
      url: receiver.url,
      authentication: { scheme: 'bearer', credentials: 'lower-case-scheme-credential' },
    });
    const created = await createPushConfigRpc(keel.url, token, 'echo', (await sendWithPush(keel.url, token, 'echo', 'upper-case scheme')).taskId, {
      id: 'upper',
      url: receiver.url,
      authentication: { scheme: 'BEARER', credentials: 'upper-case-scheme-credential' },
    });
    expect(created).toMatchObject({ authentication: { scheme: 'Bearer', credentials: '…tial' } });
    const schemes = await keel.context.pool.anyFirst(sql.type(z.object({ auth_scheme: z.string().nullable() }))`
      SELECT auth_scheme FROM push_configs WHERE id IN ('lower', 'upper') ORDER BY id`);
    expect(schemes).toEqual(['Bearer', 'Bearer']);
    await waitForSettled(keel.context.pool, taskId, 'lower');
    const sent = receiver.requests.filter((request) => request.headers.authorization?.endsWith('lower-case-scheme-credential'));
    expect(sent.length).toBeGreaterThan(0);
    expect(new Set(sent.map((request) => request.headers.authorization))).toEqual(new Set(['Bearer lower-case-scheme-credential']));
  });
});

describe('a duplicate config id', () => {
  let keel: TestKeel;
  let token = '';

  beforeAll(async () => {
    keel = await startTestKeel({ pushTestTimings: PUSH_TEST_TIMINGS, overrides: { ...PUSH_TEST_OVERRIDES } });
    token = await newClientToken(keel.context.pool);
  });
  afterAll(async () => keel?.dispose());

  it.each(BINDINGS)('CreateTaskPushNotificationConfig (%s) with an id the task has is refused (-32602 on id); the stored config is unchanged', async (binding) => {
    const first = await startReceiver();
    const second = await startReceiver();
    receivers.push(first, second);
    const { taskId } = await sendWithPush(keel.url, token, 'echo', 'duplicate id');
    await waitForTerminalEvent(keel.context.pool, taskId);
    const created = expectA2AResult(binding, await callA2A(keel.url, 'echo', binding, 'CreateTaskPushNotificationConfig', {
      taskId,
      id: 'same',
      url: first.url,
      token: 'first-token-0001',
      authentication: { scheme: 'Bearer', credentials: 'first-credential-0001' },
    }, { token }));
    expect(created).toMatchObject({ id: 'same', url: first.url });
    const stored = await keel.context.pool.one(sql.type(configRow)`SELECT url, auth_scheme, credentials, credentials_hint, token, created_at, updated_at FROM push_configs WHERE task_id = ${taskId} AND id = 'same'`);

    const again = await callA2A(keel.url, 'echo', binding, 'CreateTaskPushNotificationConfig', {
      taskId,
      id: 'same',
      url: second.url,
      token: 'second-token-0002',
      authentication: { scheme: 'Bearer', credentials: 'second-credential-0002' },
    }, { token });
    expectFieldRefusal(binding, again, 'id', 'exists for this task');

    const after = await keel.context.pool.any(sql.type(configRow)`SELECT url, auth_scheme, credentials, credentials_hint, token, created_at, updated_at FROM push_configs WHERE task_id = ${taskId}`);
    expect(after).toEqual([stored]);
    const shown = expectA2AResult(binding, await callA2A(keel.url, 'echo', binding, 'GetTaskPushNotificationConfig', { taskId, id: 'same' }, { token }));
    expect(shown).toEqual({ id: 'same', taskId, url: first.url, token: '…0001', authentication: { scheme: 'Bearer', credentials: '…0001' } });
  });
});

describe('a duplicate config id embedded in a follow-up SendMessage', () => {
  let keel: TestKeel;
  let token = '';

  beforeAll(async () => {
    keel = await startTestKeel({
      pushTestTimings: PUSH_TEST_TIMINGS,
      overrides: {
        ...PUSH_TEST_OVERRIDES,
        KEEL_TOOL_MODULES: JSON.stringify([TEST_TOOLS_MODULE]),
        KEEL_PROVIDERS: { asker: { type: 'scripted', steps: [{ toolCalls: [{ name: 'ask_user', arguments: {} }] }, { reply: 'red it is' }] } },
        KEEL_AGENTS: [{ id: 'asker', name: 'Asker', provider: 'asker', tools: ['ask_user'] }],
      },
    });
    token = await newClientToken(keel.context.pool);
  });
  afterAll(async () => keel?.dispose());

  it.each(BINDINGS)('(%s) is refused (-32602 on its id) before the reply is taken: the task still waits, the config is unchanged', async (binding) => {
    const first = await startReceiver();
    const second = await startReceiver();
    receivers.push(first, second);
    const { taskId } = await sendWithPush(keel.url, token, 'asker', 'pick a colour', { id: 'hook', url: first.url, authentication: { scheme: 'Bearer', credentials: 'first-credential-0001' } });
    await waitFor(async () => (await taskState(keel.context.pool, taskId)) === 'TASK_STATE_INPUT_REQUIRED', 'the task to ask for input');
    const stored = await keel.context.pool.any(sql.type(configRow)`SELECT url, auth_scheme, credentials, credentials_hint, token, created_at, updated_at FROM push_configs WHERE task_id = ${taskId}`);

    const response = await callA2A(keel.url, 'asker', binding, 'SendMessage', {
      message: { messageId: `follow-up-${binding}`, role: 'ROLE_USER', taskId, parts: [{ data: { colour: 'red' } }] },
      configuration: { returnImmediately: true, taskPushNotificationConfig: { id: 'hook', url: second.url, authentication: { scheme: 'Bearer', credentials: 'second-credential-0002' } } },
    }, { token });
    expectFieldRefusal(binding, response, 'configuration.taskPushNotificationConfig.id', 'exists for this task');

    expect(await keel.context.pool.any(sql.type(configRow)`SELECT url, auth_scheme, credentials, credentials_hint, token, created_at, updated_at FROM push_configs WHERE task_id = ${taskId}`)).toEqual(stored);
    expect(await taskState(keel.context.pool, taskId)).toBe('TASK_STATE_INPUT_REQUIRED');
    const run = await keel.context.pool.oneFirst(sql.type(z.object({ status: z.string() }))`SELECT r.status FROM runs r JOIN a2a_tasks t ON t.run_id = r.id WHERE t.id = ${taskId}`);
    expect(run).toBe('waiting_for_input');
    expect(second.requests).toHaveLength(0);
  });
});

describe('a config stored earlier with another scheme', () => {
  let database: Awaited<ReturnType<typeof createEmptyDatabase>>;
  let creator: TestKeel | undefined;
  let deliverer: TestKeel | undefined;
  const masterKey = Buffer.alloc(32, 13).toString('base64');

  beforeAll(async () => {
    database = await createEmptyDatabase();
  });
  afterAll(async () => {
    await creator?.dispose();
    await deliverer?.dispose();
    await database?.drop();
  });

  it('never sends its credential (under its scheme or as Bearer): the config is stopped with the reason, its deliveries cancelled', async () => {
    const receiver = await startReceiver();
    receivers.push(receiver);
    const prefix = `ktscheme${Math.random().toString(16).slice(2, 10)}`;
    const env = { KEEL_MASTER_KEY: masterKey, KEEL_QUEUE_PREFIX: prefix };
    // Keel A runs no workers (role api): the configs are written, nothing is attempted yet.
    creator = await startTestKeel({ pushTestTimings: PUSH_TEST_TIMINGS, databaseUrl: database.url, env, overrides: { ...PUSH_TEST_OVERRIDES }, start: { role: 'api' } });
    const token = await newClientToken(creator.context.pool);
    const { taskId } = await sendWithPush(creator.url, token, 'echo', 'legacy scheme', {
      id: 'legacy',
      url: receiver.url,
      authentication: { scheme: 'Bearer', credentials: 'legacy-basic-credential' },
    });
    await createPushConfigRpc(creator.url, token, 'echo', taskId, { id: 'bearer', url: receiver.url, authentication: { scheme: 'Bearer', credentials: 'still-a-bearer-credential' } });
    // As an installation that accepted any scheme might have stored it.
    await creator.context.pool.query(sql.unsafe`UPDATE push_configs SET auth_scheme = 'Basic' WHERE task_id = ${taskId} AND id = 'legacy'`);
    await creator.dispose();
    creator = undefined;

    deliverer = await startTestKeel({ pushTestTimings: PUSH_TEST_TIMINGS, databaseUrl: database.url, env, overrides: { ...PUSH_TEST_OVERRIDES } });
    const pool = deliverer.context.pool;
    await waitForSettled(pool, taskId);
    const state = await waitFor(async () => {
      const current = await configState(pool, taskId, 'legacy');
      return current?.state === 'stopped' ? current : null;
    }, 'the legacy config to stop');
    expect(state.state_reason).toBe('authentication scheme "Basic" is not supported: only Bearer is sent');
    const legacy = await deliveriesOf(pool, taskId, 'legacy');
    expect(legacy.length).toBeGreaterThanOrEqual(3);
    expect(legacy.every((row) => row.state === 'cancelled')).toBe(true);
    expect((await Promise.all(legacy.map((row) => attemptsOf(pool, row.id)))).flat()).toEqual([]);

    // Nothing carried the legacy credential; the Bearer config next to it delivered everything.
    expect(receiver.requests.filter((request) => (request.headers.authorization ?? '').includes('legacy-basic-credential'))).toEqual([]);
    expect(receiver.requests.every((request) => request.headers.authorization === 'Bearer still-a-bearer-credential')).toBe(true);
    const bearer = await deliveriesOf(pool, taskId, 'bearer');
    expect(bearer.length).toBe(legacy.length);
    expect(bearer.every((row) => row.state === 'delivered')).toBe(true);
  });
});
