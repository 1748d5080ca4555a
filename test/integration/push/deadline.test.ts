import { sql } from 'slonik';
import { z } from 'zod';
import { afterEach, describe, expect, it } from 'vitest';
import { beginAttempt } from '../../../src/push/delivery-repository.js';
import { deliveriesOfConfig, findPushConfigs, resumePushConfig } from '../../../src/push/push-admin.js';
import { startTestKeel, type TestKeel } from '../../support/test-keel.js';
import { waitFor } from '../../support/wait-for.js';
import {
  PUSH_TEST_OVERRIDES,
  attemptsOf,
  configState,
  deliveriesOf,
  newClientToken,
  sendWithPush,
  sleep,
  startReceiver,
  waitForSettled,
  type Receiver,
} from './push-support.js';

// The delivery deadline (`push.deadlineHours` after the event): a delivery still pending then is
// not attempted any more and ends `expired`, visible with its outcome in the outbox and to the
// operator (`keel push show`). The deadline here is a few seconds, a fraction of an hour.

const DEADLINE_SECONDS = 3;
const keels: TestKeel[] = [];
const receivers: Receiver[] = [];
// Each test's Keel is disposed when the test ends: three alive at once, beside another file's,
// held more connections than the machine's Postgres allows.
afterEach(async () => {
  for (const receiver of receivers.splice(0)) await receiver.close();
  for (const keel of keels.splice(0)) await keel.dispose();
});

async function startKeelWithDeadline(overrides: Record<string, unknown> = {}): Promise<TestKeel> {
  const keel = await startTestKeel({ overrides: { ...PUSH_TEST_OVERRIDES, KEEL_PUSH_DEADLINE_HOURS: String(DEADLINE_SECONDS / 3600), ...overrides } });
  keels.push(keel);
  return keel;
}

const deadlineRow = z.object({ id: z.string(), deadline: z.number(), created_at: z.number() });

async function deadlines(keel: TestKeel, taskId: string) {
  return keel.context.pool.any(sql.type(deadlineRow)`SELECT id, deadline, created_at FROM push_deliveries WHERE task_id = ${taskId} ORDER BY event_sequence`);
}

describe('push.deadlineHours', () => {
  it('a delivery waiting past its deadline (config paused) is never attempted: expired, shown as such', async () => {
    const keel = await startKeelWithDeadline();
    const token = await newClientToken(keel.context.pool);
    let status = 401;
    const receiver = await startReceiver(() => ({ status }));
    receivers.push(receiver);
    const { taskId } = await sendWithPush(keel.url, token, 'echo', 'late', { id: 'late', url: receiver.url });
    const pool = keel.context.pool;
    await waitFor(async () => (await configState(pool, taskId, 'late'))?.state === 'paused', 'the config to pause');
    await waitFor(async () => (await deliveriesOf(pool, taskId)).some((row) => row.event_state === 'TASK_STATE_COMPLETED'), 'every event to have its delivery');

    const rows = await deadlines(keel, taskId);
    expect(rows.length).toBeGreaterThanOrEqual(3);
    for (const row of rows) {
      expect(row.deadline - row.created_at).toBeGreaterThanOrEqual(DEADLINE_SECONDS * 1000 - 50);
      expect(row.deadline - row.created_at).toBeLessThanOrEqual(DEADLINE_SECONDS * 1000 + 50);
    }
    // Past every deadline, the receiver would now accept; the operator resumes the config.
    await sleep(Math.max(0, Math.max(...rows.map((row) => row.deadline)) - Date.now()) + 200);
    status = 200;
    const resumed = await resumePushConfig(keel.context, taskId, 'late');
    expect(resumed.ok).toBe(true);

    const settled = await waitForSettled(pool, taskId);
    expect(settled.map((row) => [row.state, row.last_outcome])).toEqual(settled.map(() => ['expired', 'expired: past its deadline']));
    // Only the request that paused the config was ever made; none after the deadline.
    expect(receiver.requests).toHaveLength(1);
    const attempts = (await Promise.all(settled.map((row) => attemptsOf(pool, row.id)))).flat();
    expect(attempts.map((attempt) => [attempt.status_code, attempt.outcome])).toEqual([[401, 'paused']]);

    // What `keel push show` prints: every delivery expired, counted as failed.
    const [summary] = await findPushConfigs(pool, `${taskId}/late`);
    expect(summary).toMatchObject({ pending: 0, delivered: 0, failed: settled.length });
    const { deliveries } = await deliveriesOfConfig(pool, taskId, 'late');
    expect(deliveries.every((delivery) => delivery.state === 'expired' && delivery.ended_at !== null)).toBe(true);
  });

  it('a delivery retried until its deadline ends expired (not dead, no attempt past the deadline); the events behind it too, none tried past its own', async () => {
    // Backoff of about a second: the deadline comes before the 8 attempts are used up.
    const keel = await startKeelWithDeadline({ KEEL_PUSH_RETRY_BASE_SECONDS: '1', KEEL_PUSH_RETRY_MAX_SECONDS: '1' });
    const token = await newClientToken(keel.context.pool);
    const receiver = await startReceiver(() => ({ status: 503 }));
    receivers.push(receiver);
    const { taskId } = await sendWithPush(keel.url, token, 'echo', 'unavailable', { id: 'busy', url: receiver.url });
    const pool = keel.context.pool;
    const settled = await waitForSettled(pool, taskId);
    expect(settled.map((row) => row.state)).toEqual(settled.map(() => 'expired'));
    const rows = await deadlines(keel, taskId);
    const first = settled[0]!;
    const attempts = await attemptsOf(pool, first.id);
    expect(attempts.length).toBeGreaterThanOrEqual(2);
    expect(attempts.length).toBeLessThan(8);
    expect(attempts.every((attempt) => attempt.status_code === 503 && attempt.outcome === 'retry')).toBe(true);
    const deadline = rows.find((row) => row.id === first.id)!.deadline;
    for (const attempt of attempts) expect(attempt.started_at).toBeLessThanOrEqual(deadline);
    // The events behind the head wait for it (nothing of theirs is sent while it is pending), then
    // go once it has expired, each only inside its own deadline. Their deadlines are milliseconds
    // after the head's, so they mostly expire without a request.
    const requested = receiver.requests.map((request) => request.deliveryId);
    const lastOfHead = requested.lastIndexOf(first.id);
    expect(requested.slice(0, lastOfHead).every((id) => id === first.id)).toBe(true);
    for (const behind of settled.slice(1)) {
      const own = rows.find((row) => row.id === behind.id)!.deadline;
      for (const attempt of await attemptsOf(pool, behind.id)) expect(attempt.started_at).toBeLessThanOrEqual(own);
    }
    expect(requested.every((id) => settled.some((row) => row.id === id))).toBe(true);
  });

  /** A task whose config `configId` paused on a 401; its head delivery waits, attempted once. */
  async function pausedHead(configId: string) {
    const keel = await startKeelWithDeadline({ KEEL_PUSH_DEADLINE_HOURS: '1' });
    const token = await newClientToken(keel.context.pool);
    const receiver = await startReceiver(() => ({ status: 401 }));
    receivers.push(receiver);
    const { taskId } = await sendWithPush(keel.url, token, 'echo', configId, { id: configId, url: receiver.url });
    const pool = keel.context.pool;
    // The config pauses on the 401 and its deliveries stay pending: none is attempted meanwhile.
    await waitFor(async () => (await configState(pool, taskId, configId))?.state === 'paused', 'the config to pause');
    const [head] = await deliveriesOf(pool, taskId);
    const counted = () => pool.oneFirst(sql.type(z.object({ attempts: z.number() }))`SELECT attempts FROM push_deliveries WHERE id = ${head!.id}`);
    return { pool, taskId, head, counted, receiver };
  }

  it("an attempt begins on the database's clock: a due delivery past its deadline is not begun, whatever the worker's clock said", async () => {
    const { pool, taskId, head, counted } = await pausedHead('clock');
    const attemptsBefore = (await attemptsOf(pool, head!.id)).length;
    const before = await counted();
    // The config is made active only inside the attempt's own transaction, so the worker never
    // sees it active and the head stays this test's to begin.
    const beginWhileActive = (leaseMs: number) =>
      pool.transaction(async (transaction) => {
        await transaction.query(sql.unsafe`UPDATE push_configs SET state = 'active' WHERE task_id = ${taskId} AND id = 'clock'`);
        const outcome = await beginAttempt(transaction, head!.id, leaseMs);
        await transaction.query(sql.unsafe`UPDATE push_configs SET state = 'paused' WHERE task_id = ${taskId} AND id = 'clock'`);
        return outcome;
      });

    // Due, but its deadline passed a moment ago on the database's clock (a worker whose own clock
    // lags would still have let it through): not begun, nothing counted.
    await pool.query(sql.unsafe`UPDATE push_deliveries SET next_attempt_at = now(), deadline = now() - interval '1 millisecond' WHERE id = ${head!.id}`);
    expect(await beginWhileActive(1000)).toEqual({ kind: 'past_deadline' });
    expect(await counted()).toBe(before);

    // Inside its deadline: begun, counted, started at the transaction's time, and leased.
    await pool.query(sql.unsafe`UPDATE push_deliveries SET deadline = now() + interval '1 hour' WHERE id = ${head!.id}`);
    const bounds = () => pool.oneFirst(sql.type(z.object({ now: z.number() }))`SELECT (extract(epoch FROM clock_timestamp()) * 1000)::float8 AS now`);
    const from = await bounds();
    const begun = await beginWhileActive(60_000);
    const to = await bounds();
    expect(begun).toEqual({ kind: 'begun', attempt: before + 1, startedAt: expect.any(Number) });
    if (begun.kind !== 'begun') throw new Error('not begun');
    expect(begun.startedAt).toBeGreaterThanOrEqual(from);
    expect(begun.startedAt).toBeLessThanOrEqual(to);
    expect(await counted()).toBe(before + 1);
    // Leased by that attempt: a second wake-up does not begin another.
    expect(await beginWhileActive(60_000)).toEqual({ kind: 'not_due' });
    expect((await attemptsOf(pool, head!.id)).length).toBe(attemptsBefore);
  });

  it('an attempt begins only while its config is active: a worker that read it active before a pause, a stop or a deletion sends nothing', async () => {
    const { pool, taskId, head, counted, receiver } = await pausedHead('meanwhile');
    const before = await counted();
    // Paused (its 401 made it due again at once, as the worker does): not begun, nothing counted.
    await pool.query(sql.unsafe`UPDATE push_deliveries SET next_attempt_at = now() WHERE id = ${head!.id}`);
    expect(await pool.transaction((transaction) => beginAttempt(transaction, head!.id, 60_000))).toEqual({ kind: 'config_not_active' });
    for (const change of [sql.fragment`state = 'stopped'`, sql.fragment`state = 'active', deleted_at = now()`]) {
      // Each change and the attempt in one transaction, so the worker never sees the config active.
      const outcome = await pool.transaction(async (transaction) => {
        await transaction.query(sql.unsafe`UPDATE push_configs SET ${change} WHERE task_id = ${taskId} AND id = 'meanwhile'`);
        return beginAttempt(transaction, head!.id, 60_000);
      });
      expect(outcome).toEqual({ kind: 'config_not_active' });
    }
    expect(await counted()).toBe(before);
    expect(await deliveriesOf(pool, taskId)).toEqual(expect.arrayContaining([expect.objectContaining({ id: head!.id, state: 'pending', attempts: before })]));
    expect(receiver.requests).toHaveLength(1);
  });
});
