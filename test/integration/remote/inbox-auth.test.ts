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
  type FakeDelegation,
  type FakeRemote,
} from './remote-support.js';

// POST /a2a/inbox/:registrationId authenticates with the registration's own Bearer credential and
// nothing else: without it, with a wrong one, with another registration's, or with the credential
// in X-A2A-Notification-Token: 401 and no row. The body must be a StreamResponse (else 400, no row);
// no A2A-Version is required. The remote here is a fake that takes push and keeps its task WORKING.

let keel: TestKeel;
let fake: FakeRemote;
let first: FakeDelegation;
let second: FakeDelegation;

beforeAll(async () => {
  fake = await startFakeRemote({ push: true });
  keel = await startTestKeel({ overrides: delegatingOverrides([{ id: 'fake', cardUrl: fake.cardUrl }]) });
  const token = await newToken(keel.context.pool);
  first = await delegateToFake(keel, token, 'fake', fake);
  second = await delegateToFake(keel, token, 'fake', fake);
});
afterAll(async () => {
  await keel?.dispose();
  await fake?.close();
});

const pool = () => keel.context.pool;
const body = () => workingCallback(first.send.taskId, first.send.contextId);

async function expectRefused(response: { status: number; headers: Headers; text: string }) {
  expect(response.status).toBe(401);
  expect(response.headers.get('www-authenticate')).toMatch(/^Bearer/);
  expect(response.text).not.toContain(first.credential);
}

describe('inbox authentication', () => {
  it('each registration has its own random credential, handed to the remote as Bearer', () => {
    expect(first.send.pushConfig?.url).toBe(`${keel.config.server.publicUrl}/a2a/inbox/${first.registrationId}`);
    expect(first.send.pushConfig?.authentication?.scheme).toBe('Bearer');
    expect(first.credential).not.toBe(second.credential);
    expect(first.registrationId).not.toBe(second.registrationId);
  });

  it('without Authorization: 401 and no row', async () => {
    await expectRefused(await postCallback(first.inboxUrl, body()));
    expect(await countRows(pool(), 'inbox_callbacks')).toBe(0);
  });

  it('with a wrong Bearer, another scheme, or an empty one: 401 and no row', async () => {
    await expectRefused(await postCallback(first.inboxUrl, body(), { bearer: 'not-the-credential' }));
    await expectRefused(await postCallback(first.inboxUrl, body(), { bearer: `${first.credential}x` }));
    await expectRefused(await postCallback(first.inboxUrl, body(), { authorization: `Basic ${first.credential}` }));
    await expectRefused(await postCallback(first.inboxUrl, body(), { authorization: 'Bearer' }));
    await expectRefused(await postCallback(first.inboxUrl, body(), { authorization: first.credential }));
    expect(await countRows(pool(), 'inbox_callbacks')).toBe(0);
  });

  it('another registration’s credential, an unknown registration, a path that is no id: 401 and no row', async () => {
    await expectRefused(await postCallback(first.inboxUrl, body(), { bearer: second.credential }));
    await expectRefused(await postCallback(first.inboxUrl.replace(first.registrationId, '00000000-0000-4000-8000-000000000000'), body(), { bearer: first.credential }));
    await expectRefused(await postCallback(first.inboxUrl.replace(first.registrationId, 'not-a-registration'), body(), { bearer: first.credential }));
    expect(await countRows(pool(), 'inbox_callbacks')).toBe(0);
  });

  it('X-A2A-Notification-Token alone, even carrying the right credential: 401 and no row', async () => {
    await expectRefused(await postCallback(first.inboxUrl, body(), { notificationToken: first.credential }));
    expect(await countRows(pool(), 'inbox_callbacks')).toBe(0);
  });

  it('the right Bearer with a body that is not a StreamResponse: 400 and no row', async () => {
    const bad = [
      'not json',
      JSON.stringify([body()]),
      JSON.stringify({}),
      JSON.stringify({ statusUpdate: 'COMPLETED' }),
      JSON.stringify({ ...body(), task: { id: first.send.taskId } }),
      JSON.stringify({ somethingElse: {} }),
    ];
    for (const raw of bad) {
      const response = await postCallback(first.inboxUrl, raw, { bearer: first.credential });
      expect(response.status, raw).toBe(400);
    }
    expect(await countRows(pool(), 'inbox_callbacks')).toBe(0);
  });

  it('the right Bearer: stored before the 2xx, without A2A-Version, a wrong X-A2A-Notification-Token ignored', async () => {
    const response = await postCallback(first.inboxUrl, body(), { bearer: first.credential, notificationToken: 'ignored' });
    expect(response.status).toBe(200);
    // 2xx means received: the row is there the moment the answer is.
    const rows = await callbacksOfRegistration(pool(), first.registrationId);
    expect(rows).toHaveLength(1);
    expect(rows[0]).toMatchObject({ registration_id: first.registrationId, kind: 'statusUpdate' });
    expect(await callbacksOfRegistration(pool(), second.registrationId)).toEqual([]);
    // The remote still says WORKING: the callback is processed and nothing resolves.
    await waitFor(async () => (await callbacksOfRegistration(pool(), first.registrationId))[0]!.processed_at !== null, 'the callback to be reconciled');
    expect(await countRows(pool(), 'inbox_callbacks')).toBe(1);
  });
});
