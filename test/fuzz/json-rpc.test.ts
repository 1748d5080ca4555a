import { randomUUID } from 'node:crypto';
import fc from 'fast-check';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createClient } from '../../src/auth/client-repository.js';
import { MAX_JSON_DEPTH } from '../../src/protocol/wire.js';
import { callWithUnknownFields, deepValue, encode, encoding, envelope, headers, METHODS, serialize, type Raw, type World } from './a2a-arbitraries.js';
import { expectRowsAccountedFor, expectRpcAnswer, Ledger, parseAsServer, type RpcFacts } from './a2a-oracle.js';
import { answerKey, BODY_LIMIT, check, describeRequest, Tally, expectNoErrorsLogged, expectReady, fuzzSeed, runs, send, startFuzzKeel, startSink, type FuzzKeel, type RawRequest } from './fuzz-support.js';

// Bad input on the JSON-RPC binding (POST /a2a/echo), property-based: whatever the body, headers
// and size, the answer is a well-formed JSON-RPC error with a code of a2a-v1.md or a valid result,
// never a 5xx; Keel stays ready; and afterwards every row is whole and accounted for by the
// successful answers. The seed is printed; KEEL_FUZZ_SEED replays a run.

const seed = fuzzSeed('json-rpc.test.ts');
let fuzz: FuzzKeel;
let sink: Awaited<ReturnType<typeof startSink>>;
let world: World;
let clientId: string;
const ledger = new Ledger();
const tally = new Tally();

const JSON_HEADERS: Array<[string, string]> = [
  ['content-type', 'application/json'],
  ['a2a-version', '1.0'],
];

function rpcRequest(body: Buffer, headerList: Array<[string, string]>, versionQuery = ''): RawRequest {
  return { method: 'POST', path: `/a2a/echo${versionQuery ? `?${versionQuery}` : ''}`, headers: headerList, body };
}

/** Sends one request, checks the answer, and records what a success created. */
async function exchange(request: RawRequest, facts: Omit<RpcFacts, 'parsed' | 'body'>): Promise<ReturnType<typeof expectRpcAnswer>> {
  const body = request.body!;
  const fullFacts: RpcFacts = { ...facts, body, parsed: parseAsServer(body) };
  const response = await send(fuzz.keel.url, request);
  tally.add(answerKey(response));
  const success = expectRpcAnswer(response, fullFacts, describeRequest(request));
  if (success) ledger.record(success.method, success.result, success.params);
  return success;
}

const goodFacts = { headers: { authValid: true, versionValid: true, versionQuery: '', contentType: 'json' as const } };
const withToken = (list: Array<[string, string]>): Array<[string, string]> => [...list, ['authorization', `Bearer ${world.token}`]];

beforeAll(async () => {
  fuzz = await startFuzzKeel();
  sink = await startSink();
  const created = await createClient(fuzz.keel.context.pool, 'fuzz-rpc');
  if (!created.ok) throw new Error(created.reason);
  clientId = created.client.id;
  world = { taskIds: [], contextIds: [], pushUrl: sink.url, token: created.token };
  // A few real tasks (two contexts) and a push config for the generated ids to find.
  const taskIds: string[] = [];
  for (const [index, contextId] of [randomUUID(), randomUUID(), null, null].entries()) {
    const params = { message: { messageId: `seed-${index}`, role: 'ROLE_USER', parts: [{ text: `seed ${index}` }], ...(contextId ? { contextId } : {}) } };
    const body = Buffer.from(JSON.stringify({ jsonrpc: '2.0', id: index, method: 'SendMessage', params }));
    const success = await exchange(rpcRequest(body, withToken(JSON_HEADERS)), goodFacts);
    const task = (success!.result as { task: { id: string } }).task;
    taskIds.push(task.id);
  }
  world = { ...world, taskIds, contextIds: [...new Set(ledger.tasks.values())] };
  const config = { taskId: taskIds[0], id: 'cfg-a', url: sink.url };
  await exchange(rpcRequest(Buffer.from(JSON.stringify({ jsonrpc: '2.0', id: 'c', method: 'CreateTaskPushNotificationConfig', params: config })), withToken(JSON_HEADERS)), goodFacts);
  expect(ledger.configs.size).toBe(1);
});

afterAll(async () => {
  tally.print('json-rpc.test.ts');
  await fuzz?.keel.dispose();
  await sink?.close();
});

describe('JSON-RPC bad input (fast-check)', () => {
  it('every request gets a well-formed JSON-RPC error or a valid result, never a 5xx', async () => {
    await check(
      seed,
      fc.asyncProperty(envelope(world), encoding, headers(world, 'application/json'), async (value, how, head) => {
        const request = rpcRequest(encode(value, how), head.list, head.facts.versionQuery);
        await exchange(request, { headers: head.facts });
        await expectReady(fuzz.keel.url);
      }),
      runs(500),
    );
  });

  it('unknown fields anywhere in the params change nothing in the answer', async () => {
    await check(
      seed,
      fc.asyncProperty(callWithUnknownFields(world), fc.nat(), async ({ method, params, withUnknown }, id) => {
        const outcome = async (value: unknown) => {
          const body = Buffer.from(serialize({ jsonrpc: '2.0', id, method, params: value }));
          const request = rpcRequest(body, withToken(JSON_HEADERS));
          const response = await send(fuzz.keel.url, request);
          expectRpcAnswer(response, { ...goodFacts, body, parsed: parseAsServer(body) }, describeRequest(request));
          const answer = response.body as { error?: { code: number; data: Array<{ reason?: string }> }; result?: unknown };
          return answer.error ? `error ${answer.error.code} ${answer.error.data[0]?.reason}` : 'result';
        };
        expect(await outcome(withUnknown), `${method} ${serialize(withUnknown).slice(0, 500)}`).toBe(await outcome(params));
      }),
      runs(60),
    );
  });

  it('a body over the limit is PAYLOAD_TOO_LARGE, one under it never is; nesting past the depth limit is invalid params', async () => {
    const where = fc.constantFrom('metadata', 'data', 'unknown', 'params', 'id', 'whole');
    await check(
      seed,
      fc.asyncProperty(fc.integer({ min: BODY_LIMIT - 300, max: BODY_LIMIT + 300 }), deepValue, where, async (size, deep, place) => {
        // A valid SendMessage padded to exactly `size` bytes.
        // A message id of its own per request: one id with another body is refused (decision 0064).
        const messageId = randomUUID();
        const shell = (text: string) =>
          Buffer.from(JSON.stringify({ jsonrpc: '2.0', id: 1, method: 'SendMessage', params: { message: { messageId, role: 'ROLE_USER', parts: [{ text }] }, configuration: { returnImmediately: true } } }));
        const padded = shell('x'.repeat(Math.max(0, size - shell('').length)));
        const sized = await exchange(rpcRequest(padded, withToken(JSON_HEADERS)), goodFacts);
        expect(sized === null, `a ${padded.length} B body`).toBe(padded.length > BODY_LIMIT);

        const message = { messageId: `deep-${randomUUID()}`, role: 'ROLE_USER', parts: [{ text: 'deep' }] };
        const params =
          place === 'metadata'
            ? { message, metadata: { deep } }
            : place === 'data'
              ? { message: { ...message, parts: [{ data: deep }] } }
              : place === 'unknown'
                ? { message, xDeep: deep }
                : place === 'params'
                  ? deep
                  : { message };
        const value = place === 'whole' ? deep : { jsonrpc: '2.0', id: place === 'id' ? deep : 2, method: 'SendMessage', params };
        const body = encode(value, { kind: 'json' });
        const response = await send(fuzz.keel.url, rpcRequest(body, withToken(JSON_HEADERS)));
        const facts = { ...goodFacts, body, parsed: parseAsServer(body) };
        const success = expectRpcAnswer(response, facts, `${place} ${deep.text.slice(0, 40)}…`);
        if (success) ledger.record(success.method, success.result, success.params);
        if (body.length > BODY_LIMIT || facts.parsed === undefined) return;
        // The levels of params above the deep value, where it is placed inside them.
        const above: Record<string, number> = { metadata: 2, data: 4, unknown: 1 };
        const code = (response.body as { error?: { code: number } }).error?.code;
        const context = `${place} nested ${nesting(deep)}: ${response.text.slice(0, 300)}`;
        if (place in above) expect(code, context).toBe(above[place]! + nesting(deep) > MAX_JSON_DEPTH ? -32602 : undefined);
        else expect(code, context).toBe(place === 'params' ? -32602 : -32600);
      }),
      runs(40),
    );
    await expectReady(fuzz.keel.url);
  });

  it('concurrent bursts of bad requests are each answered well and leave Keel ready', async () => {
    const oneRequest = fc.record({ value: envelope(world), how: encoding });
    await check(
      seed,
      fc.asyncProperty(fc.array(oneRequest, { minLength: 5, maxLength: 20 }), async (batch) => {
        // Deletes are left out: the ledger tells a deleted config by the order of answers.
        const safe = batch.filter(({ value }) => (value as { method?: unknown } | null)?.method !== 'DeleteTaskPushNotificationConfig');
        await Promise.all(safe.map(({ value, how }) => exchange(rpcRequest(encode(value, how), withToken(JSON_HEADERS)), goodFacts)));
        await expectReady(fuzz.keel.url);
      }),
      runs(12),
    );
  });

  it('answers the A2A 0.3 method names and unknown methods with -32601 and the request id', async () => {
    await check(
      seed,
      fc.asyncProperty(fc.oneof(fc.constantFrom('message/send', 'tasks/get', 'tasks/cancel', 'tasks/resubscribe', 'tasks/pushNotificationConfig/set', 'agent/getAuthenticatedExtendedCard'), fc.string()), fc.oneof(fc.integer(), fc.string()), async (method, id) => {
        fc.pre(!(METHODS as readonly string[]).includes(method));
        const body = Buffer.from(JSON.stringify({ jsonrpc: '2.0', id, method, params: {} }));
        const response = await send(fuzz.keel.url, rpcRequest(body, withToken(JSON_HEADERS)));
        expectRpcAnswer(response, { ...goodFacts, body, parsed: parseAsServer(body) }, method);
        expect(response.body).toMatchObject({ id, error: { code: -32601 } });
      }),
      runs(30),
    );
  });

  it('leaves no half-written row, every row accounted for by an answer, and nothing logged as an error', async () => {
    await expectReady(fuzz.keel.url);
    await expectRowsAccountedFor(fuzz.keel.context.pool, ledger, clientId);
    expectNoErrorsLogged(fuzz.errors);
  });
});

/** How deep a Raw nested value is (its text starts with its opening brackets). */
function nesting(value: Raw): number {
  return (value.text.match(/^(\[|\{"a":|\[\{"a":)*/)?.[0] ?? '').replace(/"a":/g, '').length;
}
