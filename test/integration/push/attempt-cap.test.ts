import { sql } from 'slonik';
import { afterEach, describe, expect, it } from 'vitest';
import { findPushConfigs, resumePushConfig } from '../../../src/push/push-admin.js';
import { startTestKeel, type TestKeel } from '../../support/test-keel.js';
import { waitFor } from '../../support/wait-for.js';
import {
  PUSH_TEST_OVERRIDES,
  PUSH_TEST_TIMINGS,
  attemptsOf,
  configState,
  deliveriesOf,
  newClientToken,
  perDelivery,
  sendWithPush,
  startReceiver,
  waitForSettled,
  waitForTerminalEvent,
  type Receiver,
} from './push-support.js';

// push.maxAttempts (8) bounds the requests of one delivery, whatever happens between them: a pause
// and a resume, a worker killed after counting an attempt, the environment of the process. A
// delivery whose attempts are used up ends `dead`; it is never attempted a ninth time.

const keels: TestKeel[] = [];
const receivers: Receiver[] = [];
afterEach(async () => {
  for (const receiver of receivers.splice(0)) await receiver.close();
  for (const keel of keels.splice(0)) await keel.dispose();
});

async function start(options: Parameters<typeof startTestKeel>[0] = {}) {
  const keel = await startTestKeel({ pushTestTimings: PUSH_TEST_TIMINGS, overrides: PUSH_TEST_OVERRIDES, ...options });
  keels.push(keel);
  return { keel, pool: keel.context.pool, token: await newClientToken(keel.context.pool) };
}

describe('the attempt cap across a pause', () => {
  it('a 401 on the eighth attempt pauses the config and ends the delivery dead: after the resume it is not sent again, the rest go in order', async () => {
    const { keel, pool, token } = await start();
    // Seven 503s, then a 401 on the last allowed attempt; every later request is welcome.
    const receiver = await startReceiver(perDelivery((attempt) => ({ status: attempt < 8 ? 503 : 401 })));
    receivers.push(receiver);
    const { taskId } = await sendWithPush(keel.url, token, 'echo', 'eight', { id: 'eight', url: receiver.url });
    await waitForTerminalEvent(pool, taskId);
    await waitFor(async () => (await configState(pool, taskId, 'eight'))?.state === 'paused', 'the config to pause', 30_000);
    const [head, ...behind] = await deliveriesOf(pool, taskId);
    expect(behind.length).toBeGreaterThanOrEqual(1);
    expect(receiver.byDelivery(head!.id)).toHaveLength(8);
    // What the operator sees while the config is paused: the delivery is over, the rest wait.
    const paused = await deliveriesOf(pool, taskId);
    expect(paused[0]).toMatchObject({ state: 'dead', attempts: 8, last_outcome: 'dead: 8 attempts, the last answered 401 (authentication failed)' });
    expect(paused.slice(1).every((row) => row.state === 'pending' && row.attempts === 0)).toBe(true);
    expect(await configState(pool, taskId, 'eight')).toMatchObject({ state: 'paused', state_reason: 'authentication failed' });

    receiver.setResponder(() => ({ status: 200 }));
    expect(await resumePushConfig(keel.context, taskId, 'eight')).toMatchObject({ ok: true });
    const settled = await waitForSettled(pool, taskId);
    expect(settled[0]).toMatchObject({ id: head!.id, state: 'dead', attempts: 8 });
    expect(settled.slice(1).map((row) => row.state)).toEqual(behind.map(() => 'delivered'));
    // Eight requests of the head, never a ninth; then the rest, once each, in journal order.
    expect(receiver.byDelivery(head!.id)).toHaveLength(8);
    expect(receiver.requests.slice(8).map((request) => request.deliveryId)).toEqual(behind.map((row) => row.id));
    const attempts = await attemptsOf(pool, head!.id);
    expect(attempts.map((attempt) => [attempt.attempt, attempt.status_code, attempt.outcome])).toEqual([
      ...[1, 2, 3, 4, 5, 6, 7].map((n) => [n, 503, 'retry']),
      [8, 401, 'dead'],
    ]);
    const [summary] = await findPushConfigs(pool, `${taskId}/eight`);
    expect(summary).toMatchObject({ state: 'active', pending: 0, failed: 1, delivered: behind.length });
  });

  it('a delivery whose eighth attempt was counted (its worker killed mid-request) ends dead when it is due again, without a request', async () => {
    const { keel, pool, token } = await start();
    const receiver = await startReceiver((request) => ({ status: request.index === 0 ? 401 : 200 }));
    receivers.push(receiver);
    const { taskId } = await sendWithPush(keel.url, token, 'echo', 'counted', { id: 'counted', url: receiver.url });
    await waitForTerminalEvent(pool, taskId);
    await waitFor(async () => (await configState(pool, taskId, 'counted'))?.state === 'paused', 'the config to pause');
    const [head, ...behind] = await deliveriesOf(pool, taskId);
    // As a worker leaves it when it dies after counting the eighth attempt: eight counted, due.
    await pool.query(sql.unsafe`UPDATE push_deliveries SET attempts = 8, next_attempt_at = now() WHERE id = ${head!.id}`);
    expect(await resumePushConfig(keel.context, taskId, 'counted')).toMatchObject({ ok: true });
    const settled = await waitForSettled(pool, taskId);
    expect(settled[0]).toMatchObject({ id: head!.id, state: 'dead', attempts: 8, last_outcome: 'dead: 8 attempts' });
    expect(settled.slice(1).map((row) => row.state)).toEqual(behind.map(() => 'delivered'));
    expect(receiver.byDelivery(head!.id)).toHaveLength(1);
  });
});

describe('the bounds hold whatever the environment', () => {
  it("the old test-only variables in a start's environment change nothing: a failing delivery gets push.maxAttempts attempts", async () => {
    // startKeel reads agents' and sealing's variables from its environment (process.env for
    // `keel start`); KEEL_TEST_PUSH_* there once set the attempt limit (1 to 100) and timeout.
    const { keel, pool, token } = await start({
      pushTestTimings: undefined,
      overrides: { ...PUSH_TEST_OVERRIDES, KEEL_PUSH_MAX_ATTEMPTS: '3' },
      env: { KEEL_TEST_PUSH_MAX_ATTEMPTS: '1', KEEL_TEST_PUSH_TIMEOUT_SECONDS: '300' },
    });
    const receiver = await startReceiver(() => ({ status: 503 }));
    receivers.push(receiver);
    const { taskId } = await sendWithPush(keel.url, token, 'echo', 'env', { id: 'env', url: receiver.url });
    const settled = await waitForSettled(pool, taskId);
    expect(settled.map((row) => [row.state, row.attempts])).toEqual(settled.map(() => ['dead', 3]));
    for (const row of settled) expect(receiver.byDelivery(row.id)).toHaveLength(3);
  });
});
