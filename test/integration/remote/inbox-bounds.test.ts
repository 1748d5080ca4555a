import { sql } from 'slonik';
import { z } from 'zod';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startTestKeel, type TestKeel } from '../../support/test-keel.js';
import { waitFor } from '../../support/wait-for.js';
import {
  callbacksOfRegistration,
  countRows,
  delegateToFake,
  delegatingOverrides,
  newToken,
  postCallback,
  startFakeRemote,
  workingCallback,
  type CallbackResponse,
  type FakeDelegation,
  type FakeRemote,
} from './remote-support.js';

// The inbox is bounded: at most inbox.maxPendingPerRegistration unprocessed callbacks per
// registration and inbox.maxPendingTotal in all (3 and 5 here, set through the environment).
// Over either bound: 429 with Retry-After, and nothing stored beyond it, also when the callbacks
// arrive at once. The fake remote cannot be asked (GetTask answers 503), so nothing is processed
// and the callbacks stay pending until it can be asked again.

const PER_REGISTRATION = 3;
const TOTAL = 5;

let keel: TestKeel;
let fake: FakeRemote;
const delegations: FakeDelegation[] = [];

beforeAll(async () => {
  fake = await startFakeRemote({ push: true });
  fake.setGetTask('unavailable');
  keel = await startTestKeel({
    overrides: delegatingOverrides([{ id: 'fake', cardUrl: fake.cardUrl }], {
      env: { KEEL_INBOX_MAX_PENDING_PER_REGISTRATION: String(PER_REGISTRATION), KEEL_INBOX_MAX_PENDING_TOTAL: String(TOTAL) },
    }),
  });
  expect(keel.config.inbox).toEqual({ maxPendingPerRegistration: PER_REGISTRATION, maxPendingTotal: TOTAL, unacknowledgedGiveUpSeconds: 600 });
  const token = await newToken(keel.context.pool);
  for (let index = 0; index < 4; index += 1) delegations.push(await delegateToFake(keel, token, 'fake', fake));
});
afterAll(async () => {
  await keel?.dispose();
  await fake?.close();
});

const pool = () => keel.context.pool;
const post = (delegation: FakeDelegation) => postCallback(delegation.inboxUrl, workingCallback(delegation.send.taskId, delegation.send.contextId), { bearer: delegation.credential });
const unprocessed = () => pool().oneFirst(sql.type(z.object({ n: z.number() }))`SELECT count(*)::int AS n FROM inbox_callbacks WHERE processed_at IS NULL`);

function expectTooMany(response: CallbackResponse, why: RegExp) {
  expect(response.status).toBe(429);
  expect(Number(response.headers.get('retry-after'))).toBeGreaterThan(0);
  expect(response.text).toMatch(why);
}

describe('inbox bounds', () => {
  it('per registration: of 6 callbacks arriving at once, 3 are stored and 3 get 429 with Retry-After', async () => {
    const [one] = delegations;
    const responses = await Promise.all(Array.from({ length: 6 }, () => post(one!)));
    const statuses = responses.map((response) => response.status).sort();
    expect(statuses).toEqual([200, 200, 200, 429, 429, 429]);
    for (const response of responses.filter((candidate) => candidate.status === 429)) expectTooMany(response, /too many unprocessed callbacks for this registration/);
    expect(await callbacksOfRegistration(pool(), one!.registrationId)).toHaveLength(PER_REGISTRATION);

    // Still full: one more is refused and stores nothing.
    expectTooMany(await post(one!), /this registration/);
    expect(await countRows(pool(), 'inbox_callbacks')).toBe(PER_REGISTRATION);
  });

  it('in total: callbacks to three other registrations at once fill the last 2 places and no more', async () => {
    const [, two, three, four] = delegations;
    const responses = await Promise.all([post(two!), post(three!), post(four!), post(two!), post(three!), post(four!)]);
    const accepted = responses.filter((response) => response.status === 200);
    expect(accepted).toHaveLength(TOTAL - PER_REGISTRATION);
    for (const response of responses.filter((candidate) => candidate.status !== 200)) expectTooMany(response, /the inbox is full/);
    expect(await countRows(pool(), 'inbox_callbacks')).toBe(TOTAL);

    // A registration far below its own bound is refused while the inbox is full.
    let emptiest = four!;
    for (const delegation of [two!, three!, four!]) {
      if ((await callbacksOfRegistration(pool(), delegation.registrationId)).length === 0) emptiest = delegation;
    }
    expect((await callbacksOfRegistration(pool(), emptiest.registrationId)).length).toBeLessThan(PER_REGISTRATION);
    expectTooMany(await post(emptiest), /the inbox is full/);
    expect(await countRows(pool(), 'inbox_callbacks')).toBe(TOTAL);
    expect(await unprocessed()).toBe(TOTAL);
  });

  it('the bounds count unprocessed callbacks: once the remote can be asked again they are processed and the inbox takes more', async () => {
    fake.setGetTask('answer');
    await waitFor(async () => (await unprocessed()) === 0, 'the pending callbacks to be reconciled', 30_000);
    const [one] = delegations;
    expect((await post(one!)).status).toBe(200);
    expect(await countRows(pool(), 'inbox_callbacks')).toBe(TOTAL + 1);
  });
});
