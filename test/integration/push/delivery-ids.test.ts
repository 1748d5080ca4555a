import { sql } from 'slonik';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { z } from 'zod';
import { deliveryIdOf } from '../../../src/push/delivery-id.js';
import { projectRun } from '../../../src/tasks/task-projector.js';
import { startTestKeel, type TestKeel } from '../../support/test-keel.js';
import { PUSH_TEST_OVERRIDES, PUSH_TEST_TIMINGS, deliveriesOf, newClientToken, sendWithPush, startReceiver, waitForSettled, type Receiver } from './push-support.js';

// Nothing a remote party can see is committed asynchronously, and an event projected twice reaches
// a receiver under one id. The journal's transaction NOTIFYs waiters and makes deliveries due: it
// must wait for its WAL flush (an asynchronous commit lost in a crash would have shown events whose
// rows are gone). A delivery's id is derived from its task, config and event, so a projection redone
// after such a loss writes the same ids, and the receiver's deduplication by
// `X-Keel-Delivery-Id` holds.

let keel: TestKeel;
let receiver: Receiver;
let token: string;

beforeAll(async () => {
  keel = await startTestKeel({ pushTestTimings: PUSH_TEST_TIMINGS, overrides: PUSH_TEST_OVERRIDES });
  receiver = await startReceiver();
  token = await newClientToken(keel.context.pool);
  // Every statement that writes journal rows or deliveries records the commit mode of its
  // transaction (a test-only trigger in this file's own database).
  const pool = keel.context.pool;
  await pool.query(sql.unsafe`CREATE TABLE commit_modes (table_name text NOT NULL, synchronous_commit text NOT NULL)`);
  await pool.query(sql.unsafe`
    CREATE FUNCTION record_commit_mode() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
      INSERT INTO commit_modes VALUES (TG_TABLE_NAME, current_setting('synchronous_commit'));
      RETURN NULL;
    END $$`);
  for (const table of ['a2a_events', 'push_deliveries', 'a2a_tasks']) {
    await pool.query(sql.unsafe`
      CREATE TRIGGER record_commit_mode AFTER INSERT OR UPDATE ON ${sql.identifier([table])} FOR EACH STATEMENT EXECUTE FUNCTION record_commit_mode()`);
  }
});

afterAll(async () => {
  await receiver?.close();
  await keel?.dispose();
});

const deliveryRow = z.object({ id: z.string(), config_id: z.string(), event_sequence: z.number() });

describe('what a remote party sees is durable, and named once', () => {
  it('journal rows, task state and deliveries are committed synchronously', async () => {
    const { taskId } = await sendWithPush(keel.url, token, 'echo', 'durable', { id: 'hook', url: receiver.url });
    await waitForSettled(keel.context.pool, taskId, 'hook');
    const modes = await keel.context.pool.any(sql.type(z.object({ table_name: z.string(), synchronous_commit: z.string() }))`
      SELECT DISTINCT table_name, synchronous_commit FROM commit_modes ORDER BY 1, 2`);
    expect(modes.map((mode) => mode.table_name).sort()).toEqual(['a2a_events', 'a2a_tasks', 'push_deliveries']);
    expect(modes.filter((mode) => mode.synchronous_commit !== 'on'), 'writes committed without waiting for the WAL flush').toEqual([]);
  });

  it('a delivery id is derived from its task, config and event: a projection redone writes the same ids', async () => {
    const { taskId } = await sendWithPush(keel.url, token, 'echo', 'twice', { id: 'hook', url: receiver.url });
    const settled = await waitForSettled(keel.context.pool, taskId, 'hook');
    expect(settled.length).toBeGreaterThanOrEqual(2);
    const pool = keel.context.pool;
    const before = await pool.any(sql.type(deliveryRow)`
      SELECT id, config_id, event_sequence FROM push_deliveries WHERE task_id = ${taskId} ORDER BY event_sequence`);
    for (const row of before) expect(row.id).toBe(deliveryIdOf(taskId, row.config_id, row.event_sequence));
    expect(new Set(before.map((row) => row.id)).size).toBe(before.length);
    // The projection as if it had been lost in a crash: journal rows, deliveries and the watermark
    // gone, the run's committed state kept. Projecting again yields the same events under the same ids.
    await pool.transaction(async (transaction) => {
      await transaction.query(sql.unsafe`DELETE FROM push_deliveries WHERE task_id = ${taskId}`);
      await transaction.query(sql.unsafe`DELETE FROM a2a_events WHERE task_id = ${taskId}`);
      await transaction.query(sql.unsafe`
        UPDATE a2a_tasks SET projected_revision = 1, last_sequence = 0, projected_state = 'TASK_STATE_SUBMITTED' WHERE id = ${taskId}`);
    });
    await projectRun(pool, keel.context.sealer, taskId);
    const after = await pool.any(sql.type(deliveryRow)`
      SELECT id, config_id, event_sequence FROM push_deliveries WHERE task_id = ${taskId} ORDER BY event_sequence`);
    expect(after.map((row) => row.id)).toEqual(before.map((row) => row.id));
    expect((await deliveriesOf(pool, taskId, 'hook')).length).toBe(before.length);
  });

  it('ids differ per config and per event, and are UUIDs of version 5', () => {
    const task = '0b9a2d3e-51f4-4c1b-9a7e-3c2d1e0f9a8b';
    const ids = [deliveryIdOf(task, 'a', 1), deliveryIdOf(task, 'a', 2), deliveryIdOf(task, 'b', 1), deliveryIdOf('1b9a2d3e-51f4-4c1b-9a7e-3c2d1e0f9a8b', 'a', 1)];
    expect(new Set(ids).size).toBe(4);
    for (const id of ids) expect(id).toMatch(/^[0-9a-f]{8}-[0-9a-f]{4}-5[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$/);
    expect(deliveryIdOf(task, 'a', 1)).toBe(ids[0]);
  });
});
