import { sql } from 'slonik';
import { z } from 'zod';
import { afterEach, describe, expect, it } from 'vitest';
import { beginAttempt, type BegunAttempt } from '../../../src/push/delivery-repository.js';
import { deliveriesOfConfig, findPushConfigs, resumePushConfig } from '../../../src/push/push-admin.js';
import { startTestKeel, type TestKeel } from '../../support/test-keel.js';
import { waitFor } from '../../support/wait-for.js';
import {
  PUSH_TEST_OVERRIDES,
  PUSH_TEST_TIMINGS,
  attemptsOf,
  configState,
  deliveriesOf,
  newClientToken,
  sendWithPush,
  sleep,
  startReceiver,
  waitForSettled,
  waitForTerminalEvent,
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
  const keel = await startTestKeel({ pushTestTimings: PUSH_TEST_TIMINGS, overrides: { ...PUSH_TEST_OVERRIDES, KEEL_PUSH_DEADLINE_HOURS: String(DEADLINE_SECONDS / 3600), ...overrides } });
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
    expect(settled.map((row) => [row.state, row.last_outcome])).toEqual(settled.map(() => ['expired', 'expired: past its deadline']));
    const rows = await deadlines(keel, taskId);
    // Per delivery, whichever event is at the head when: every attempt began inside the delivery's
    // own deadline and was retried (never dead: fewer than 8), and its requests came after every
    // request of the deliveries ahead of it (journal order: the events behind a retrying head wait).
    let lastAhead = -1;
    for (const delivery of settled) {
      const own = rows.find((row) => row.id === delivery.id)!.deadline;
      const attempts = await attemptsOf(pool, delivery.id);
      expect(attempts.length).toBeLessThan(8);
      for (const attempt of attempts) {
        expect(attempt.started_at).toBeLessThanOrEqual(own);
        expect([attempt.status_code, attempt.outcome]).toEqual([503, 'retry']);
      }
      const indexes = receiver.byDelivery(delivery.id).map((request) => request.index);
      expect(indexes).toHaveLength(attempts.length);
      if (indexes.length === 0) continue;
      expect(Math.min(...indexes)).toBeGreaterThan(lastAhead);
      lastAhead = Math.max(...indexes);
    }
    // The head was retried until its deadline (a backoff of about a second, a deadline of three).
    expect((await attemptsOf(pool, settled[0]!.id)).length).toBeGreaterThanOrEqual(2);
  });

  it("an attempt that waits for its event row past its delivery's deadline is not begun: the head expires, the deliveries behind it keep their own deadlines and go in order", async () => {
    const keel = await startKeelWithDeadline({ KEEL_PUSH_DEADLINE_HOURS: '1' });
    const token = await newClientToken(keel.context.pool);
    const receiver = await startReceiver((request) => ({ status: request.index === 0 ? 401 : 200 }));
    receivers.push(receiver);
    const { taskId } = await sendWithPush(keel.url, token, 'echo', 'held', { id: 'held', url: receiver.url });
    const pool = keel.context.pool;
    await waitForTerminalEvent(pool, taskId);
    await waitFor(async () => (await configState(pool, taskId, 'held'))?.state === 'paused', 'the config to pause');
    const [head, ...behind] = await deliveriesOf(pool, taskId);
    expect(behind.length).toBeGreaterThanOrEqual(1);
    // The head has a few seconds left; the deliveries behind it an hour, their own deadlines.
    await pool.query(sql.unsafe`UPDATE push_deliveries SET deadline = now() + interval '3 seconds' WHERE id = ${head!.id}`);
    const rows = await deadlines(keel, taskId);
    const deadlineOf = (id: string) => rows.find((row) => row.id === id)!.deadline;

    // A tightening of the answer ceiling holds the head's journal row (FOR UPDATE) while the
    // resumed worker begins the head's attempt: it checked the deadline (inside it) and waits for
    // the row; the row is released only after the deadline has passed.
    let locked!: () => void;
    let release!: () => void;
    const isLocked = new Promise<void>((resolve) => (locked = resolve));
    const released = new Promise<void>((resolve) => (release = resolve));
    const holder = pool.transaction(async (transaction) => {
      await transaction.query(sql.unsafe`SELECT 1 FROM a2a_events WHERE task_id = ${taskId} AND sequence = ${head!.event_sequence} FOR UPDATE`);
      locked();
      await released;
    });
    await isLocked;
    expect(await resumePushConfig(keel.context, taskId, 'held')).toMatchObject({ ok: true });
    await waitFor(
      () =>
        pool.oneFirst(sql.type(z.object({ waiting: z.boolean() }))`
          SELECT EXISTS (SELECT 1 FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'
            AND query LIKE '%FROM a2a_events%FOR SHARE%') AS waiting`),
      "the head's attempt to wait for its event row",
      10_000,
    );
    const blockedAt = Date.now();
    await sleep(Math.max(0, deadlineOf(head!.id) - Date.now()) + 300);
    release();
    await holder;
    // The attempt was waiting before the deadline: what follows is the statement's decision.
    expect(blockedAt).toBeLessThan(deadlineOf(head!.id));

    const settled = await waitForSettled(pool, taskId);
    // Per delivery: the head expired with its one pre-pause attempt; each delivery behind it was
    // delivered inside its own deadline, in journal order after the head ended.
    expect(settled[0]).toMatchObject({ id: head!.id, state: 'expired', last_outcome: 'expired: past its deadline', attempts: 1 });
    expect(receiver.byDelivery(head!.id)).toHaveLength(1);
    for (const row of settled) {
      for (const attempt of await attemptsOf(pool, row.id)) expect(attempt.started_at).toBeLessThanOrEqual(deadlineOf(row.id));
      for (const request of receiver.byDelivery(row.id)) expect(request.at).toBeLessThanOrEqual(deadlineOf(row.id));
    }
    expect(settled.slice(1).map((row) => [row.id, row.state])).toEqual(behind.map((row) => [row.id, 'delivered']));
    expect(receiver.requests.slice(1).map((request) => request.deliveryId)).toEqual(behind.map((row) => row.id));
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
        const outcome = await beginAttempt(transaction, head!.id, { leaseMs, maxAttempts: 8 });
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
    // The head made due (as the worker does after a 401), the config changed, and the attempt, in
    // one transaction that is then rolled back: Keel's own worker never sees the head due or the
    // config stopped or deleted (a CI run's worker, seeing them committed, cancelled the head).
    const beginUnseen = async (change: ReturnType<typeof sql.fragment> | null): Promise<BegunAttempt> => {
      const rolledBack = await pool
        .transaction(async (transaction) => {
          await transaction.query(sql.unsafe`UPDATE push_deliveries SET next_attempt_at = now() WHERE id = ${head!.id}`);
          if (change) await transaction.query(sql.unsafe`UPDATE push_configs SET ${change} WHERE task_id = ${taskId} AND id = 'meanwhile'`);
          throw new RolledBack(await beginAttempt(transaction, head!.id, { leaseMs: 60_000, maxAttempts: 8 }));
        })
        .catch((error: unknown) => error);
      if (!(rolledBack instanceof RolledBack)) throw rolledBack;
      return rolledBack.outcome;
    };
    // Paused: not begun, nothing counted; then stopped, then active but deleted.
    for (const change of [null, sql.fragment`state = 'stopped'`, sql.fragment`state = 'active', deleted_at = now()`]) {
      expect(await beginUnseen(change)).toEqual({ kind: 'config_not_active' });
    }
    expect(await counted()).toBe(before);
    expect(await deliveriesOf(pool, taskId)).toEqual(expect.arrayContaining([expect.objectContaining({ id: head!.id, state: 'pending', attempts: before })]));
    expect(receiver.requests).toHaveLength(1);
  });
});

/** Carries a transaction's result out of it as it is rolled back. */
class RolledBack {
  constructor(readonly outcome: BegunAttempt) {}
}
