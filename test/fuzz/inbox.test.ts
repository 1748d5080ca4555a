import { randomUUID } from 'node:crypto';
import fc from 'fast-check';
import { sql } from 'slonik';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { z } from 'zod';
import { createDependency } from '../../src/remote/dependency-repository.js';
import { createRun } from '../../src/runs/run-repository.js';
import { deepValue, encode, encoding, hugeString, segment, type Encoding } from './a2a-arbitraries.js';
import { answerKey, BODY_LIMIT, check, describeRequest, expectNoErrorsLogged, expectReady, fuzzSeed, runs, send, startFuzzKeel, Tally, type FuzzKeel, type RawRequest } from './fuzz-support.js';

// Bad input on the inbox, POST /a2a/inbox/:registrationId (src/remote/inbox-routes.ts), where
// remote agents push the events of Keel's own dependencies: random registration ids, Authorization
// headers and bodies. Answers are 400, 401, 404, 413 (a body over the limit) or 429 (the
// registration's bound), or 200; never a 5xx. A callback row is stored for a valid Bearer
// credential of the registration with a valid StreamResponse only, one per 200, within the bound.

const seed = fuzzSeed('inbox.test.ts');
const BOUND = 25;
const MAX_DEPTH = 100;
let fuzz: FuzzKeel;
let registration: { id: string; credential: string };
let other: { id: string; credential: string };
const accepted = { a: 0, b: 0 };
const tally = new Tally();

beforeAll(async () => {
  const started = Date.now();
  fuzz = await startFuzzKeel({ KEEL_INBOX_MAX_PENDING_PER_REGISTRATION: String(BOUND) });
  const { pool, sealer } = fuzz.keel.context;
  const registrations: Array<{ id: string; credential: string }> = [];
  for (const name of ['a', 'b']) {
    const run = await createRun(pool, sealer, { agent: 'echo', auditLevel: 'full', answerLevel: 'full', request: { messages: [{ role: 'user', content: `waits on ${name}` }] } });
    const dependency = await createDependency(pool, { runId: run.id, toolCallId: `call-${name}`, toolName: 'remote_agent', remoteAgent: 'remote', messageId: `m-${name}`, withRegistration: true });
    registrations.push(dependency.registration!);
  }
  [registration, other] = registrations as [typeof registration, typeof other];
  console.info(`[fuzz] inbox setup ${Date.now() - started} ms`);
});

afterAll(async () => {
  tally.print('inbox.test.ts');
  const started = Date.now();
  await fuzz?.keel.dispose();
  console.info(`[fuzz] inbox dispose ${Date.now() - started} ms`);
});

/** A path and the registration it names ('a', 'b' or none). */
type Target = { path: string; registration: 'a' | 'b' | null; routed: boolean };
/** Headers and the registration whose credential they carry as a valid Bearer ('a', 'b' or none). */
type Auth = { header: Array<[string, string]>; credentialOf: 'a' | 'b' | null };
type Body = { value: unknown; how: Encoding; contentType: string | null; plainType: boolean };

const target: fc.Arbitrary<Target> = fc.oneof(
  { arbitrary: fc.constant(null).map(() => ({ path: `/a2a/inbox/${registration.id}`, registration: 'a' as const, routed: true })), weight: 14 },
  { arbitrary: fc.constant(null).map(() => ({ path: `/a2a/inbox/${other.id}`, registration: 'b' as const, routed: true })), weight: 1 },
  // Postgres reads a uuid in any case: the same registration.
  { arbitrary: fc.constant(null).map(() => ({ path: `/a2a/inbox/${registration.id.toUpperCase()}`, registration: 'a' as const, routed: true })), weight: 2 },
  {
    arbitrary: fc
      .oneof(
        fc.uuid(),
        fc.constantFrom('', ' ', '00000000-0000-0000-0000-000000000000', 'not-a-uuid', '%00', '..x', 'ä', 'x'.repeat(2_000)),
        fc.string({ maxLength: 40 }),
        fc.constant(null).map(() => `${registration.id} `),
        fc.constant(null).map(() => `{${registration.id}}`),
      )
      // Past Fastify's 100-character limit for a path parameter the inbox route does not match.
      .map((id) => ({ path: `/a2a/inbox/${segment(id, 'encoded')}`, registration: null, routed: segment(id, 'encoded').length <= 100 })),
    weight: 4,
  },
  { arbitrary: fc.constantFrom('/a2a/inbox', '/a2a/inbox/x/y', '/a2a/inbox/x:cancel/z').map((path) => ({ path, registration: null, routed: false })), weight: 1 },
);

const printable = fc.string({ unit: 'grapheme-ascii', maxLength: 60 });
const auth: fc.Arbitrary<Auth> = fc.oneof(
  { arbitrary: fc.constantFrom('Bearer ', 'bearer ', 'BEARER    ').map((scheme) => ({ header: [['authorization', `${scheme}${registration.credential}`]] as Array<[string, string]>, credentialOf: 'a' as const })), weight: 14 },
  { arbitrary: fc.constant(null).map(() => ({ header: [['authorization', `Bearer ${other.credential}`]] as Array<[string, string]>, credentialOf: 'b' as const })), weight: 2 },
  {
    arbitrary: fc
      .oneof(
        fc.constant(null).map(() => [['authorization', `Bearer ${registration.credential}x`]] as Array<[string, string]>),
        fc.constant(null).map(() => [['authorization', `Bearer ${registration.credential} x`]] as Array<[string, string]>),
        fc.constant(null).map(() => [['authorization', `Basic ${registration.credential}`]] as Array<[string, string]>),
        fc.constant(null).map(() => [['authorization', registration.credential]] as Array<[string, string]>),
        fc.constant(null).map(() => [['x-a2a-notification-token', registration.credential]] as Array<[string, string]>),
        fc.constant<Array<[string, string]>>([]),
        fc.constantFrom('', 'Bearer', 'Bearer ', 'Bearer  ', 'Bearer \t x').map((value) => [['authorization', value]] as Array<[string, string]>),
        printable.map((value) => [['authorization', `Bearer ${value}`]] as Array<[string, string]>),
        printable.map((value) => [['authorization', value]] as Array<[string, string]>),
      )
      .map((header) => ({ header, credentialOf: null })),
    weight: 4,
  },
);

const kind = fc.constantFrom('task', 'message', 'statusUpdate', 'artifactUpdate');
const member = fc.oneof(
  { arbitrary: fc.dictionary(fc.string({ maxLength: 8 }), fc.jsonValue({ maxDepth: 2 }), { maxKeys: 4 }), weight: 4 },
  { arbitrary: fc.constant({ id: randomUUID(), contextId: 'c', status: { state: 'TASK_STATE_COMPLETED', timestamp: new Date().toISOString() } }), weight: 2 },
  { arbitrary: fc.constantFrom<unknown>(null, [], [1], 'task', 0, true), weight: 2 },
  { arbitrary: deepValue, weight: 1 },
  { arbitrary: hugeString.map((text) => ({ text })), weight: 1 },
);
const streamResponse = fc.oneof(
  { arbitrary: fc.tuple(kind, member).map(([name, value]) => ({ [name]: value })), weight: 8 },
  { arbitrary: fc.tuple(kind, member, fc.dictionary(fc.string({ maxLength: 8 }).map((key) => `x${key}`), fc.jsonValue({ maxDepth: 2 }), { maxKeys: 2 })).map(([name, value, extra]) => ({ ...extra, [name]: value })), weight: 2 },
  { arbitrary: fc.uniqueArray(kind, { minLength: 2, maxLength: 4 }).map((names) => Object.fromEntries(names.map((name) => [name, {}]))), weight: 2 },
  { arbitrary: fc.constantFrom<unknown>({}, [], null, 'task', 1, [{ task: {} }], { kind: 'task' }, { result: { task: {} } }, { jsonrpc: '2.0', result: { task: {} } }), weight: 2 },
  { arbitrary: deepValue, weight: 1 },
);
const body: fc.Arbitrary<Body> = fc.record({
  value: streamResponse,
  how: encoding,
  type: fc.oneof(
    { arbitrary: fc.constantFrom('application/json', 'application/a2a+json').map((value) => ({ contentType: value as string | null, plainType: true })), weight: 10 },
    { arbitrary: fc.constantFrom('text/plain', 'application/octet-stream').map((value) => ({ contentType: value as string | null, plainType: true })), weight: 1 },
    { arbitrary: fc.oneof(fc.constantFrom<string | null>(null, '', ';', 'application/'), printable).map((value) => ({ contentType: value, plainType: false })), weight: 1 },
  ),
}).map(({ value, how, type }) => ({ value, how, ...type }));

/** How deep a JSON value nests (iteratively). */
function depthOf(value: unknown): number {
  let deepest = 0;
  const pending: Array<[unknown, number]> = [[value, 0]];
  while (pending.length) {
    const [item, depth] = pending.pop()!;
    if (typeof item !== 'object' || item === null) continue;
    deepest = Math.max(deepest, depth + 1);
    for (const child of Object.values(item)) pending.push([child, depth + 1]);
  }
  return deepest;
}

/** A StreamResponse by a2a-v1.md: exactly one of task, message, statusUpdate, artifactUpdate, an object. */
function isStreamResponse(bytes: Buffer): boolean {
  let parsed: unknown;
  try {
    parsed = JSON.parse(bytes.toString('utf8'));
  } catch {
    return false;
  }
  if (typeof parsed !== 'object' || parsed === null || Array.isArray(parsed) || depthOf(parsed) > MAX_DEPTH) return false;
  const present = ['task', 'message', 'statusUpdate', 'artifactUpdate'].filter((name) => (parsed as Record<string, unknown>)[name] !== undefined);
  const value = present.length === 1 ? (parsed as Record<string, unknown>)[present[0]!] : null;
  return typeof value === 'object' && value !== null && !Array.isArray(value);
}

async function callbackRows(): Promise<Array<{ registration_id: string; kind: string }>> {
  return [...(await fuzz.keel.context.pool.any(sql.type(z.object({ registration_id: z.string(), kind: z.string() }))`SELECT registration_id, kind FROM inbox_callbacks`))];
}

/** Sends one callback and checks the status against what the request deserves. */
async function deliver(to: Target, credential: Auth, payload: Body): Promise<number> {
  const bytes = encode(payload.value, payload.how);
  const request: RawRequest = {
    method: 'POST',
    path: to.path,
    headers: [...credential.header, ...(payload.contentType !== null ? ([['content-type', payload.contentType]] as Array<[string, string]>) : [])],
    body: bytes,
  };
  const response = await send(fuzz.keel.url, request);
  tally.add(answerKey(response));
  const where = `${describeRequest(request)}\n=> ${response.status} ${response.text.slice(0, 300)}`;
  expect(response.status, where).toBeLessThan(500);
  if (!to.routed) {
    // Not the inbox's route: /a2a/inbox is the JSON-RPC endpoint of an agent "inbox" (there is none),
    // /a2a/inbox/x/y an HTTP+JSON path of it. Whatever they answer, nothing is stored.
    expect(response.body, where).not.toEqual({ received: true });
    return response.status;
  }
  expect([200, 400, 401, 404, 413, 429], where).toContain(response.status);
  const authorized = to.registration !== null && to.registration === credential.credentialOf;
  const storable = authorized && bytes.length <= BODY_LIMIT && isStreamResponse(bytes);
  if (response.status === 200) {
    expect(storable, `stored a callback it should have refused: ${where}`).toBe(true);
    expect(response.body, where).toEqual({ received: true });
    accepted[to.registration!] += 1;
  }
  if (payload.plainType) {
    // What the request deserves, in the order the route checks it.
    const expected = bytes.length > BODY_LIMIT ? [413] : !authorized ? [401] : !isStreamResponse(bytes) ? [400] : [200, 429];
    expect(expected, where).toContain(response.status);
  }
  if (response.status === 401) expect(response.body, where).toEqual({ error: 'unauthorized' });
  return response.status;
}

describe('inbox bad input (fast-check)', () => {
  it('every callback is answered 200, 400, 401, 404, 413 or 429, never a 5xx, and only a valid one is stored', async () => {
    await check(
      seed,
      fc.asyncProperty(target, auth, body, async (to, credential, payload) => {
        const before = (await callbackRows()).length;
        const status = await deliver(to, credential, payload);
        expect((await callbackRows()).length, `rows after a ${status}`).toBe(before + (status === 200 && to.routed ? 1 : 0));
        await expectReady(fuzz.keel.url);
      }),
      runs(400),
    );
  });

  it('concurrent callbacks, valid ones among them, never overrun the bound', async () => {
    await check(
      seed,
      fc.asyncProperty(fc.array(fc.tuple(target, auth, body), { minLength: 5, maxLength: 25 }), async (batch) => {
        // Make room first, as a reconcile would, so the valid ones race for the bound.
        await fuzz.keel.context.pool.query(sql.unsafe`UPDATE inbox_callbacks SET processed_at = now() WHERE processed_at IS NULL AND random() < 0.5`);
        await Promise.all(batch.map(([to, credential, payload]) => deliver(to, credential, payload)));
        const pending = await fuzz.keel.context.pool.anyFirst(sql.type(z.object({ count: z.number() }))`
          SELECT count(*)::int AS count FROM inbox_callbacks WHERE processed_at IS NULL GROUP BY registration_id`);
        for (const count of pending) expect(count, 'unprocessed callbacks of one registration').toBeLessThanOrEqual(BOUND);
        await expectReady(fuzz.keel.url);
      }),
      runs(20),
    );
  });

  it('a StreamResponse nested past the depth limit is refused with 400, one within it is stored', async () => {
    const { pool } = fuzz.keel.context;
    await check(
      seed,
      fc.asyncProperty(kind, deepValue, async (name, deep) => {
        await pool.query(sql.unsafe`UPDATE inbox_callbacks SET processed_at = now() WHERE processed_at IS NULL`);
        const payload: Body = { value: { [name]: { history: deep } }, how: { kind: 'json' }, contentType: 'application/json', plainType: true };
        const status = await deliver({ path: `/a2a/inbox/${registration.id}`, registration: 'a', routed: true }, { header: [['authorization', `Bearer ${registration.credential}`]], credentialOf: 'a' }, payload);
        const bytes = encode(payload.value, payload.how);
        expect(status, deep.text.slice(0, 60)).toBe(bytes.length > BODY_LIMIT ? 413 : isStreamResponse(bytes) ? 200 : 400);
      }),
      runs(25),
    );
  });

  it('the bound holds against concurrent callbacks naming the registration in upper and lower case', async () => {
    const { pool } = fuzz.keel.context;
    await check(
      seed,
      fc.asyncProperty(fc.array(fc.boolean(), { minLength: 4, maxLength: 12 }), fc.integer({ min: 1, max: 3 }), async (cases, room) => {
        // Leave `room` places under the bound, then race more valid callbacks than that for them.
        await pool.query(sql.unsafe`UPDATE inbox_callbacks SET processed_at = now() WHERE processed_at IS NULL`);
        for (let index = 0; index < BOUND - room; index += 1) {
          await deliver({ path: `/a2a/inbox/${registration.id}`, registration: 'a', routed: true }, { header: [['authorization', `Bearer ${registration.credential}`]], credentialOf: 'a' }, { value: { statusUpdate: { n: index } }, how: { kind: 'json' }, contentType: 'application/json', plainType: true });
        }
        const statuses = await Promise.all(
          cases.map((upper, index) =>
            deliver(
              { path: `/a2a/inbox/${upper ? registration.id.toUpperCase() : registration.id}`, registration: 'a', routed: true },
              { header: [['authorization', `Bearer ${registration.credential}`]], credentialOf: 'a' },
              { value: { task: { n: index } }, how: { kind: 'json' }, contentType: 'application/json', plainType: true },
            ),
          ),
        );
        expect(statuses.filter((status) => status === 200).length, statuses.join(',')).toBe(Math.min(room, cases.length));
        const pending = await pool.oneFirst(sql.type(z.object({ count: z.number() }))`SELECT count(*)::int AS count FROM inbox_callbacks WHERE processed_at IS NULL`);
        expect(pending).toBe(BOUND);
      }),
      runs(10),
    );
  });

  it('stores exactly one row per 200, all for the registration whose credential came with them; nothing logged as an error', async () => {
    const rows = await callbackRows();
    expect(rows.filter((row) => row.registration_id === registration.id).length, 'rows of registration a').toBe(accepted.a);
    expect(rows.filter((row) => row.registration_id === other.id).length, 'rows of registration b').toBe(accepted.b);
    expect(rows.length, 'no row of any other registration').toBe(accepted.a + accepted.b);
    expect(accepted.a).toBeGreaterThan(0);
    for (const row of rows) expect(['task', 'message', 'statusUpdate', 'artifactUpdate']).toContain(row.kind);
    expectNoErrorsLogged(fuzz.errors);
  });
});
