import { randomUUID } from 'node:crypto';
import fc from 'fast-check';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createClient } from '../../src/auth/client-repository.js';
import { call, callWithUnknownFields, encode, encoding, headers, oddQuery, restRequest, segment, strayPath, VERBS, type Call, type Encoding, type HeaderFacts, type SegmentMode, type World } from './a2a-arbitraries.js';
import { expectRestAnswer, expectRowsAccountedFor, Ledger, parseAsServer } from './a2a-oracle.js';
import { answerKey, BODY_LIMIT, check, describeRequest, expectNoErrorsLogged, expectReady, fuzzSeed, runs, send, startFuzzKeel, startSink, Tally, type FuzzKeel, type RawRequest } from './fuzz-support.js';

// Bad input on the HTTP+JSON binding (/a2a/echo/message:send, /tasks, /tasks/<id>, :cancel,
// :subscribe, the push config paths), property-based: every answer is `{error: {code, status,
// message, details}}` with a 4xx status, or the operation's result; never a 5xx; Keel stays
// ready; and afterwards every row is whole and accounted for. KEEL_FUZZ_SEED replays a run.

const seed = fuzzSeed('rest.test.ts');
const AGENT_BASE = '/a2a/echo';
let fuzz: FuzzKeel;
let sink: Awaited<ReturnType<typeof startSink>>;
let world: World;
let clientId: string;
const ledger = new Ledger();
const tally = new Tally();

const GOOD: HeaderFacts = { authValid: true, versionValid: true, versionQuery: '', contentType: 'json' };
const goodHeaders = (): Array<[string, string]> => [
  ['authorization', `Bearer ${world.token}`],
  ['a2a-version', '1.0'],
  ['content-type', 'application/a2a+json'],
];

type Built = { request: RawRequest; facts: Parameters<typeof expectRestAnswer>[1]; pathIds: { taskId?: string; id?: string } };

/** The REST request of a call with the given encodings, headers and extras. */
function build(c: Call, how: Encoding, head: { list: Array<[string, string]>; facts: HeaderFacts }, mode: SegmentMode, extraQuery: string, verb: string | null): Built {
  const query = [head.facts.versionQuery, extraQuery].filter(Boolean).join('&');
  const rest = restRequest(AGENT_BASE, c, mode, query, verb);
  const body = rest.hasBody ? encode(rest.bodyValue, how) : undefined;
  const list = body === undefined ? head.list.filter(([name]) => name !== 'content-type') : head.list;
  return {
    request: { method: rest.method, path: rest.path, headers: list, ...(body !== undefined ? { body } : {}) },
    facts: { headers: head.facts, op: rest.op, body, malformedPath: rest.malformedPath },
    pathIds: rest.pathIds,
  };
}

/** Sends one request, checks the answer, and records what a success created or deleted. */
async function exchange({ request, facts, pathIds }: Built): Promise<unknown> {
  const response = await send(fuzz.keel.url, request);
  tally.add(answerKey(response));
  const success = expectRestAnswer(response, facts, describeRequest(request));
  if (!success) return null;
  const params = facts.op === 'DeleteTaskPushNotificationConfig' ? pathIds : facts.body ? parseAsServer(facts.body) : undefined;
  ledger.record(facts.op, success.result, params);
  return success.result;
}

beforeAll(async () => {
  fuzz = await startFuzzKeel();
  sink = await startSink();
  const created = await createClient(fuzz.keel.context.pool, 'fuzz-rest');
  if (!created.ok) throw new Error(created.reason);
  clientId = created.client.id;
  world = { taskIds: [], contextIds: [], pushUrl: sink.url, token: created.token };
  const taskIds: string[] = [];
  for (const [index, contextId] of [randomUUID(), randomUUID(), null, null].entries()) {
    const params = { message: { messageId: `seed-${index}`, role: 'ROLE_USER', parts: [{ text: `seed ${index}` }], ...(contextId ? { contextId } : {}) } };
    const result = (await exchange(build({ method: 'SendMessage', params, mutated: false }, { kind: 'json' }, { list: goodHeaders(), facts: GOOD }, 'encoded', '', null))) as { task: { id: string } };
    taskIds.push(result.task.id);
  }
  world = { ...world, taskIds, contextIds: [...new Set(ledger.tasks.values())] };
  await exchange(build({ method: 'CreateTaskPushNotificationConfig', params: { taskId: taskIds[0], id: 'cfg-a', url: sink.url }, mutated: false }, { kind: 'json' }, { list: goodHeaders(), facts: GOOD }, 'encoded', '', null));
  expect(ledger.configs.size).toBe(1);
});

afterAll(async () => {
  tally.print('rest.test.ts');
  await fuzz?.keel.dispose();
  await sink?.close();
});

const segmentMode = fc.oneof({ arbitrary: fc.constant<SegmentMode>('encoded'), weight: 8 }, { arbitrary: fc.constantFrom<SegmentMode>('double', 'raw'), weight: 2 });
const verb = fc.oneof({ arbitrary: fc.constant<string | null>(null), weight: 12 }, { arbitrary: fc.constantFrom<string | null>(...VERBS), weight: 1 });

describe('HTTP+JSON bad input (fast-check)', () => {
  it('every request gets a REST error with a 4xx status or a valid result, never a 5xx', async () => {
    await check(
      seed,
      fc.asyncProperty(call(world), encoding, headers(world, 'application/a2a+json'), segmentMode, oddQuery, verb, async (c, how, head, mode, extra, method) => {
        await exchange(build(c, how, head, mode, extra, method));
        await expectReady(fuzz.keel.url);
      }),
      runs(500),
    );
  });

  it('a body over the limit is 413 PAYLOAD_TOO_LARGE on every body-taking path, one under it never is', async () => {
    const paths = fc.constantFrom('/message:send', '/message:stream', '/tasks/x:cancel', '/tasks/x/pushNotificationConfigs', '/no/such/path');
    await check(
      seed,
      fc.asyncProperty(fc.integer({ min: BODY_LIMIT - 300, max: BODY_LIMIT + 300 }), paths, async (size, path) => {
        // A message id of its own per request: one id with another body is refused (decision 0064).
        const messageId = randomUUID();
        const shell = (text: string) => Buffer.from(JSON.stringify({ message: { messageId, role: 'ROLE_USER', parts: [{ text }] }, configuration: { returnImmediately: true } }));
        const body = shell('x'.repeat(Math.max(0, size - shell('').length)));
        const request: RawRequest = { method: 'POST', path: `${AGENT_BASE}${path}`, headers: goodHeaders(), body };
        const response = await send(fuzz.keel.url, request);
        tally.add(answerKey(response));
        const ops = { '/message:send': 'SendMessage', '/message:stream': 'SendStreamingMessage', '/tasks/x:cancel': 'CancelTask', '/tasks/x/pushNotificationConfigs': 'CreateTaskPushNotificationConfig' } as const;
        const op = path in ops ? ops[path as keyof typeof ops] : null;
        const success = expectRestAnswer(response, { headers: GOOD, op, body, malformedPath: false }, describeRequest(request));
        if (success) ledger.record(op, success.result, parseAsServer(body));
        expect(response.status === 413, `${body.length} B to ${path}: ${response.status}`).toBe(body.length > BODY_LIMIT);
      }),
      runs(30),
    );
  });

  it('paths no operation has, with any verb, are 404 or 405 in the REST error shape', async () => {
    await check(
      seed,
      fc.asyncProperty(strayPath, fc.constantFrom(...VERBS), encoding, async (path, method, how) => {
        const hasBody = method === 'POST' || method === 'PUT' || method === 'PATCH';
        const body = hasBody ? encode({ message: { messageId: 'x', role: 'ROLE_USER', parts: [{ text: 'x' }] } }, how) : undefined;
        const request: RawRequest = { method, path: `${AGENT_BASE}${path}`, headers: goodHeaders().filter(([name]) => hasBody || name !== 'content-type'), ...(body ? { body } : {}) };
        const response = await send(fuzz.keel.url, request);
        tally.add(answerKey(response));
        expectRestAnswer(response, { headers: GOOD, op: null, body, malformedPath: false }, describeRequest(request));
      }),
      runs(40),
    );
  });

  it('unknown fields in the query or body change nothing in the answer', async () => {
    await check(
      seed,
      fc.asyncProperty(callWithUnknownFields(world), async ({ method, params, withUnknown }) => {
        const outcome = async (value: unknown) => {
          const built = build({ method, params: value, mutated: true }, { kind: 'json' }, { list: goodHeaders(), facts: GOOD }, 'encoded', '', null);
          const response = await send(fuzz.keel.url, built.request);
          expectRestAnswer(response, built.facts, describeRequest(built.request));
          const error = (response.body as { error?: { code: number; details: Array<{ reason?: string }> } } | undefined)?.error;
          return error ? `${response.status} ${error.details[0]?.reason}` : `${response.status}`;
        };
        expect(await outcome(withUnknown), `${method} ${JSON.stringify(withUnknown).slice(0, 500)}`).toBe(await outcome(params));
      }),
      runs(60),
    );
  });

  it('a push config id of any text round-trips through its path: created, read, deleted, gone', async () => {
    const configId = fc.oneof(fc.string({ minLength: 1, maxLength: 40, unit: 'binary' }), fc.constantFrom('a/b', 'a:b', '100%', '%41', '%2541', 'a%2Fb', '...', '.a', ' ', 'ä', '😀', 'x:cancel', 'x/pushNotificationConfigs'));
    await check(
      seed,
      fc.asyncProperty(configId, fc.nat(), async (id, which) => {
        // ("." and ".." cannot be path segments of a URL: a WHATWG client resolves them away.)
        fc.pre(id !== '.' && id !== '..');
        const taskId = world.taskIds[which % world.taskIds.length]!;
        // eslint-disable-next-line no-control-regex -- NUL is what no text column stores
        const storable = !/[\u0000\ud800-\udfff]/u.test(id);
        const createdResult = await exchange(build({ method: 'CreateTaskPushNotificationConfig', params: { taskId, id, url: sink.url }, mutated: false }, { kind: 'json' }, { list: goodHeaders(), facts: GOOD }, 'encoded', '', null));
        const created = createdResult as { id: string } | null;
        if (!storable) {
          expect(created, `${JSON.stringify(id)} holds text no column stores`).toBeNull();
          return;
        }
        // Created now, or by an earlier run with the same id (configs are not updated).
        if (created) expect(created.id).toBe(id);
        const read = await exchange(build({ method: 'GetTaskPushNotificationConfig', params: { taskId, id }, mutated: false }, { kind: 'json' }, { list: goodHeaders(), facts: GOOD }, 'encoded', '', null));
        const wasDeleted = ledger.deletedConfigs.has(`${taskId}\n${id}`);
        expect(read === null, `GET of ${JSON.stringify(id)} (deleted before: ${wasDeleted})`).toBe(wasDeleted);
        if (read) expect((read as { id: string }).id).toBe(id);
        expect(await exchange(build({ method: 'DeleteTaskPushNotificationConfig', params: { taskId, id }, mutated: false }, { kind: 'json' }, { list: goodHeaders(), facts: GOOD }, 'encoded', '', null))).toEqual({});
        expect(await exchange(build({ method: 'GetTaskPushNotificationConfig', params: { taskId, id }, mutated: false }, { kind: 'json' }, { list: goodHeaders(), facts: GOOD }, 'encoded', '', null))).toBeNull();
      }),
      runs(40),
    );
  });

  it('a request line past the HTTP server limit is refused by Node with a 4xx, and Keel stays ready', async () => {
    for (const path of [`${AGENT_BASE}/tasks/${'a'.repeat(20_000)}`, `${AGENT_BASE}/tasks?contextId=${'a'.repeat(20_000)}`, `${AGENT_BASE}/tasks/${segment('😀'.repeat(3_000), 'encoded')}`]) {
      const response = await send(fuzz.keel.url, { method: 'GET', path, headers: goodHeaders() }).catch(() => null);
      // Node answers 431 (Request Header Fields Too Large) itself, before Fastify; some clients see the socket close.
      if (response) {
        expect([414, 431], `${path.length}: ${response.text}`).toContain(response.status);
        // In the HTTP+JSON binding's error shape, not Node's or Fastify's.
        expect((JSON.parse(response.text) as { error: { code: number } }).error.code).toBe(response.status);
      }
    }
    await expectReady(fuzz.keel.url);
  });

  it('leaves no half-written row, every row accounted for by an answer, and nothing logged as an error', async () => {
    await expectReady(fuzz.keel.url);
    await expectRowsAccountedFor(fuzz.keel.context.pool, ledger, clientId);
    expectNoErrorsLogged(fuzz.errors);
  });
});
