import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { resumePushConfig } from '../../../src/push/push-admin.js';
import { startTestKeel, type TestKeel } from '../../support/test-keel.js';
import { waitFor } from '../../support/wait-for.js';
import {
  PUSH_TEST_OVERRIDES,
  PUSH_TEST_TIMINGS,
  answerAfterTerminalEvent,
  attemptsOf,
  configState,
  deliveriesOf,
  journalOf,
  newClientToken,
  sendWithPush,
  sleep,
  startReceiver,
  waitForSettled,
  waitForTerminalEvent,
  type Receiver,
  type Reply,
  type Responder,
} from './push-support.js';

// The outcome classes of one delivery attempt (docs/push.md, "Outcome classes"),
// each against a real HTTP receiver on loopback: 2xx delivered; 429/502/503/504, a redirect, a
// timeout or a connection error retried with backoff (Retry-After honoured up to the ceiling), at
// most 8 attempts; 401/403 pause the config until resumed; 404/410 stop it; anything else kills
// that delivery only. The echo agent gives every task three events: WORKING, its artifact,
// COMPLETED; the first delivery (WORKING) is the one each receiver scripts.

let keel: TestKeel;
let token = '';
const receivers: Receiver[] = [];

beforeAll(async () => {
  keel = await startTestKeel({ pushTestTimings: PUSH_TEST_TIMINGS, overrides: { ...PUSH_TEST_OVERRIDES } });
  token = await newClientToken(keel.context.pool);
});
afterAll(async () => {
  for (const receiver of receivers) await receiver.close();
  await keel?.dispose();
});

const pool = () => keel.context.pool;

/** A receiver whose first delivery (by X-Keel-Delivery-Id) gets `script(attempt)`; every other gets 200. */
async function receiverScriptingFirst(script: (attempt: number) => Reply): Promise<Receiver> {
  let first: string | null = null;
  let attempts = 0;
  const responder: Responder = (request) => {
    first ??= request.deliveryId;
    if (request.deliveryId !== first) return { status: 200 };
    attempts += 1;
    return script(attempts);
  };
  const receiver = await startReceiver(responder);
  receivers.push(receiver);
  return receiver;
}

async function pushedTask(receiver: Receiver, configId = 'hook') {
  const { taskId } = await sendWithPush(keel.url, token, 'echo', `class test ${configId}`, { id: configId, url: receiver.url });
  return taskId;
}

/** The journal's responses, in order, must be exactly what the receiver acknowledged, in order. */
async function expectJournalDelivered(taskId: string, receiver: Receiver) {
  const journal = await journalOf(pool(), keel.context.sealer, taskId);
  const acknowledged = new Map<string, unknown>();
  const rows = await deliveriesOf(pool(), taskId);
  for (const row of rows.filter((candidate) => candidate.state === 'delivered')) {
    const last = receiver.byDelivery(row.id).at(-1);
    expect(last, `delivery ${row.id} reached the receiver`).toBeDefined();
    acknowledged.set(row.id, last!.body);
  }
  const firstArrivals = [...new Set(receiver.requests.map((request) => request.deliveryId))];
  const sequenceOf = new Map(rows.map((row) => [row.id, row.event_sequence]));
  expect(firstArrivals.map((id) => sequenceOf.get(id))).toEqual(rows.map((row) => row.event_sequence));
  expect(rows.map((row) => acknowledged.get(row.id))).toEqual(journal.map((event) => event.response));
}

describe('2xx', () => {
  it('200: every event delivered once, on attempt 1, as the bare StreamResponse with the documented headers', async () => {
    const receiver = await receiverScriptingFirst(() => ({ status: 200 }));
    const taskId = await pushedTask(receiver);
    const rows = await waitForSettled(pool(), taskId);
    expect(rows.map((row) => [row.kind, row.event_state, row.state, row.attempts])).toEqual([
      ['status', 'TASK_STATE_WORKING', 'delivered', 1],
      ['artifact', null, 'delivered', 1],
      ['status', 'TASK_STATE_COMPLETED', 'delivered', 1],
    ]);
    expect(receiver.requests).toHaveLength(3);
    for (const request of receiver.requests) {
      expect(request.method).toBe('POST');
      expect(request.path).toBe('/hook');
      expect(request.headers['content-type']).toBe('application/a2a+json');
      expect(request.headers.authorization).toBeUndefined();
      expect(request.headers['x-a2a-notification-token']).toBeUndefined();
    }
    expect(receiver.requests.map((request) => request.deliveryId)).toEqual(rows.map((row) => row.id));
    await expectJournalDelivered(taskId, receiver);
    for (const row of rows) {
      expect(await attemptsOf(pool(), row.id)).toMatchObject([{ attempt: 1, status_code: 200, outcome: 'delivered', error_class: null }]);
    }
  });

  it('204 and 202 acknowledge too', async () => {
    let n = 0;
    const receiver = await startReceiver(() => ({ status: [204, 202][n++ % 2]! }));
    receivers.push(receiver);
    const taskId = await pushedTask(receiver);
    const rows = await waitForSettled(pool(), taskId);
    expect(rows.every((row) => row.state === 'delivered' && row.attempts === 1)).toBe(true);
  });
});

describe('retried', () => {
  it('503 three times then 200: delivered on attempt 4 with the same X-Keel-Delivery-Id each time, then the later events', async () => {
    const receiver = await receiverScriptingFirst((attempt) => ({ status: attempt <= 3 ? 503 : 200 }));
    const taskId = await pushedTask(receiver);
    const rows = await waitForSettled(pool(), taskId);
    const first = rows[0]!;
    expect(first).toMatchObject({ event_state: 'TASK_STATE_WORKING', state: 'delivered', attempts: 4 });
    const requests = receiver.byDelivery(first.id);
    expect(requests).toHaveLength(4);
    expect(new Set(requests.map((request) => request.deliveryId))).toEqual(new Set([first.id]));
    // The same body every time.
    expect(new Set(requests.map((request) => request.raw)).size).toBe(1);
    expect((await attemptsOf(pool(), first.id)).map((a) => [a.attempt, a.status_code, a.outcome])).toEqual([
      [1, 503, 'retry'],
      [2, 503, 'retry'],
      [3, 503, 'retry'],
      [4, 200, 'delivered'],
    ]);
    // The later events waited for the first to end.
    expect(receiver.requests.slice(0, 4).every((request) => request.deliveryId === first.id)).toBe(true);
    expect(rows.slice(1).every((row) => row.state === 'delivered' && row.attempts === 1)).toBe(true);
    await expectJournalDelivered(taskId, receiver);
  });

  it.each([502, 504])('%i then 200: retried', async (status) => {
    const receiver = await receiverScriptingFirst((attempt) => ({ status: attempt === 1 ? status : 200 }));
    const taskId = await pushedTask(receiver);
    const rows = await waitForSettled(pool(), taskId);
    expect(rows[0]).toMatchObject({ state: 'delivered', attempts: 2 });
    expect((await attemptsOf(pool(), rows[0]!.id)).map((a) => [a.status_code, a.outcome])).toEqual([
      [status, 'retry'],
      [200, 'delivered'],
    ]);
  });

  it('429 and 503 with Retry-After: the next attempt waits at least that long, capped by retryMaxSeconds (2 s)', async () => {
    const receiver = await receiverScriptingFirst((attempt) => {
      if (attempt === 1) return { status: 429, headers: { 'retry-after': '1' } };
      if (attempt === 2) return { status: 503, headers: { 'retry-after': '1' } };
      // An hour asked for: the backoff ceiling (retryMaxSeconds = 2) wins.
      if (attempt === 3) return { status: 429, headers: { 'retry-after': '3600' } };
      return { status: 200 };
    });
    const taskId = await pushedTask(receiver);
    const rows = await waitForSettled(pool(), taskId);
    const first = rows[0]!;
    expect(first).toMatchObject({ state: 'delivered', attempts: 4 });
    const at = receiver.byDelivery(first.id).map((request) => request.at);
    const gaps = at.slice(1).map((time, index) => time - at[index]!);
    // Without Retry-After the backoff here would be 10–80 ms.
    expect(gaps[0]).toBeGreaterThanOrEqual(1000);
    expect(gaps[1]).toBeGreaterThanOrEqual(1000);
    expect(gaps[2]).toBeGreaterThanOrEqual(2000);
    expect(gaps[2]).toBeLessThan(6000);
    expect((await attemptsOf(pool(), first.id)).map((a) => [a.status_code, a.outcome])).toEqual([
      [429, 'retry'],
      [503, 'retry'],
      [429, 'retry'],
      [200, 'delivered'],
    ]);
  });

  it('always 503: dead after maxAttempts (8) with exponential backoff; the next events go on', async () => {
    const receiver = await receiverScriptingFirst(() => ({ status: 503 }));
    const taskId = await pushedTask(receiver);
    const rows = await waitForSettled(pool(), taskId);
    const first = rows[0]!;
    expect(first).toMatchObject({ state: 'dead', attempts: 8, last_outcome: 'dead: 8 attempts' });
    const attempts = await attemptsOf(pool(), first.id);
    expect(attempts.map((a) => [a.attempt, a.status_code, a.outcome])).toEqual([
      ...[1, 2, 3, 4, 5, 6, 7].map((n) => [n, 503, 'retry']),
      [8, 503, 'dead'],
    ]);
    const requests = receiver.byDelivery(first.id);
    expect(requests).toHaveLength(8);
    // Backoff before retry n: min(base × 2^(n-1), max) with jitter in its upper half (base 20 ms, max 2 s).
    const gaps = requests.slice(1).map((request, index) => request.at - requests[index]!.at);
    gaps.forEach((gap, index) => expect(gap).toBeGreaterThanOrEqual(Math.min(2000, 20 * 2 ** index) / 2 - 5));
    expect(rows.slice(1).map((row) => row.state)).toEqual(['delivered', 'delivered']);
    expect(receiver.requests.slice(8).map((request) => request.deliveryId)).toEqual(rows.slice(1).map((row) => row.id));
    expect(await configState(pool(), taskId, 'hook')).toMatchObject({ state: 'active' });
  });

  it('a 302 to another host is not followed: the other host gets nothing, the delivery is retried', async () => {
    const other = await startReceiver();
    receivers.push(other);
    const receiver = await receiverScriptingFirst((attempt) =>
      attempt <= 2 ? { status: 302, headers: { location: other.url } } : { status: 200 },
    );
    const taskId = await pushedTask(receiver);
    const rows = await waitForSettled(pool(), taskId);
    expect(rows[0]).toMatchObject({ state: 'delivered', attempts: 3 });
    expect((await attemptsOf(pool(), rows[0]!.id)).map((a) => [a.status_code, a.outcome])).toEqual([
      [302, 'retry'],
      [302, 'retry'],
      [200, 'delivered'],
    ]);
    expect(other.requests).toHaveLength(0);
    expect(rows.every((row) => row.state === 'delivered')).toBe(true);
  });

  it('a receiver that never answers: each attempt times out after push.timeoutSeconds (0.5 s here) and is retried', async () => {
    const receiver = await receiverScriptingFirst((attempt) => (attempt <= 2 ? 'hang' : { status: 200 }));
    const taskId = await pushedTask(receiver);
    const rows = await waitForSettled(pool(), taskId);
    const first = rows[0]!;
    expect(first).toMatchObject({ state: 'delivered', attempts: 3 });
    const attempts = await attemptsOf(pool(), first.id);
    expect(attempts.map((a) => [a.status_code, a.error_class, a.outcome])).toEqual([
      [null, 'timeout', 'retry'],
      [null, 'timeout', 'retry'],
      [200, null, 'delivered'],
    ]);
    // One request at a time: an attempt starts only after the previous one ended.
    for (let i = 1; i < attempts.length; i += 1) expect(attempts[i]!.started_at).toBeGreaterThanOrEqual(attempts[i - 1]!.started_at + attempts[i - 1]!.duration_ms);
    expect(receiver.maxInFlight()).toBe(1);
    for (const attempt of attempts.slice(0, 2)) {
      expect(attempt.duration_ms).toBeGreaterThanOrEqual(450);
      expect(attempt.duration_ms).toBeLessThan(2000);
    }
    // Keel gave up on the connection (the receiver saw it close unanswered).
    await waitFor(async () => receiver.byDelivery(first.id).slice(0, 2).every((request) => request.aborted), 'the hung requests to be closed', 5000);
  });

  it('a connection error (nothing listening) is retried, then dead after 8 attempts', async () => {
    const closed = await startReceiver();
    const url = closed.url;
    await closed.close();
    const { taskId } = await sendWithPush(keel.url, token, 'echo', 'nobody home', { id: 'closed', url });
    await waitForTerminalEvent(pool(), taskId);
    const rows = await waitFor(async () => {
      const all = await deliveriesOf(pool(), taskId);
      return all[0]?.state === 'dead' ? all : null;
    }, 'the first delivery to die');
    expect(rows[0]).toMatchObject({ state: 'dead', attempts: 8, last_outcome: 'dead: 8 attempts' });
    const attempts = await attemptsOf(pool(), rows[0]!.id);
    expect(attempts).toHaveLength(8);
    expect(attempts.every((a) => a.status_code === null && a.error_class === 'connection')).toBe(true);
  });
});

describe('paused: 401 and 403', () => {
  it.each([401, 403])('%i pauses the config ("authentication failed"); later events wait; resume delivers them in order', async (status) => {
    let answer = status;
    const receiver = await startReceiver(() => ({ status: answer }));
    receivers.push(receiver);
    const taskId = await pushedTask(receiver, `auth-${status}`);
    const configId = `auth-${status}`;
    await waitForTerminalEvent(pool(), taskId);
    await waitFor(async () => (await configState(pool(), taskId, configId))?.state === 'paused', 'the config to pause');
    expect(await configState(pool(), taskId, configId)).toMatchObject({ state: 'paused', state_reason: 'authentication failed' });
    // Several sweeps later, nothing else was attempted: the deliveries wait.
    await sleep(1500);
    expect(receiver.requests).toHaveLength(1);
    const waiting = await deliveriesOf(pool(), taskId);
    expect(waiting.map((row) => row.state)).toEqual(['pending', 'pending', 'pending']);
    expect((await attemptsOf(pool(), waiting[0]!.id)).map((a) => [a.status_code, a.outcome])).toEqual([[status, 'paused']]);

    answer = 200;
    expect(await resumePushConfig(keel.context, taskId, configId)).toMatchObject({ ok: true });
    const rows = await waitForSettled(pool(), taskId);
    expect(rows.map((row) => row.state)).toEqual(['delivered', 'delivered', 'delivered']);
    expect(await configState(pool(), taskId, configId)).toMatchObject({ state: 'active', state_reason: null });
    // The paused delivery went again first, with the same id, then the rest, in journal order.
    expect(receiver.requests.map((request) => request.deliveryId)).toEqual([rows[0]!.id, ...rows.map((row) => row.id)]);
    await expectJournalDelivered(taskId, receiver);
    // Resuming an active config is refused.
    expect(await resumePushConfig(keel.context, taskId, configId)).toMatchObject({ ok: false, reason: 'not_paused', state: 'active' });
  });
});

describe('stopped: 404 and 410', () => {
  it.each([404, 410])('%i stops the config and cancels its pending deliveries', async (status) => {
    // Answered once the task has ended (within the push timeout): all three events have deliveries.
    const receiver = await startReceiver(answerAfterTerminalEvent(pool(), () => ({ status }), 400));
    receivers.push(receiver);
    const configId = `gone-${status}`;
    const taskId = await pushedTask(receiver, configId);
    const rows = await waitForSettled(pool(), taskId);
    expect(await configState(pool(), taskId, configId)).toMatchObject({ state: 'stopped', state_reason: `receiver answered ${status}` });
    expect(rows[0]).toMatchObject({ state: 'cancelled', attempts: 1 });
    expect(rows.slice(1).map((row) => [row.state, row.attempts])).toEqual([
      ['cancelled', 0],
      ['cancelled', 0],
    ]);
    expect((await attemptsOf(pool(), rows[0]!.id)).map((a) => [a.status_code, a.outcome])).toEqual([[status, 'stopped']]);
    await sleep(1000);
    expect(receiver.requests).toHaveLength(1);
    // A stopped config cannot be resumed.
    expect(await resumePushConfig(keel.context, taskId, configId)).toMatchObject({ ok: false, reason: 'not_paused', state: 'stopped' });
  });
});

describe('failed without retry: any other status', () => {
  it.each([400, 500])('%i: that delivery is dead, the config stays active and the next event is delivered', async (status) => {
    const receiver = await receiverScriptingFirst(() => ({ status }));
    const configId = `bad-${status}`;
    const taskId = await pushedTask(receiver, configId);
    const rows = await waitForSettled(pool(), taskId);
    expect(rows[0]).toMatchObject({ state: 'dead', attempts: 1, last_outcome: `dead: receiver answered ${status}` });
    expect((await attemptsOf(pool(), rows[0]!.id)).map((a) => [a.status_code, a.outcome])).toEqual([[status, 'dead']]);
    expect(rows.slice(1).map((row) => row.state)).toEqual(['delivered', 'delivered']);
    expect(await configState(pool(), taskId, configId)).toMatchObject({ state: 'active' });
    expect(receiver.requests.map((request) => request.deliveryId)).toEqual(rows.map((row) => row.id));
  });
});
