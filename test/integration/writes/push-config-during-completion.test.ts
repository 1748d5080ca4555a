import pg from 'pg';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startTestKeel, type TestKeel } from '../../support/test-keel.js';
import { waitFor } from '../../support/wait-for.js';
import {
  createPushConfigRpc,
  deliveriesOf,
  newClientToken,
  PUSH_TEST_OVERRIDES,
  sendWithPush,
  startReceiver,
  waitForSettled,
  type Receiver,
} from '../push/push-support.js';

// A push config created while a fast run's completion waits for its task row gets the run's end
// (docs/push.md: a delivery row goes with its journal event to every config active when that
// event commits). The completion of a fast run is one statement (the held completion, decision
// 0029) that may only skip the deliveries because the task had no config: that must be decided on
// the task row it locked, not by a subquery that sees the database as it was when the statement
// began. Reproduced as it happens: another transaction holds the lock a config's foreign-key check
// takes (FOR KEY SHARE on the task row), the completion waits for it, and the config commits
// meanwhile.

const providers = { slow: { type: 'scripted', steps: [{ reply: 'slow done', delayMs: 2500 }] } };
const agents = [{ id: 'slow', name: 'Slow', provider: 'slow' }];

let keel: TestKeel;
let token = '';
let receiver: Receiver;

beforeAll(async () => {
  keel = await startTestKeel({ overrides: { ...PUSH_TEST_OVERRIDES, KEEL_PROVIDERS: providers, KEEL_AGENTS: agents } });
  token = await newClientToken(keel.context.pool);
  receiver = await startReceiver();
});
afterAll(async () => {
  await receiver?.close();
  await keel?.dispose();
});

/** Backends waiting for a lock the holder holds (the completion behind it). */
async function blockedByHolder(client: pg.Client): Promise<number> {
  const result = await client.query<{ waiting: number }>(`SELECT count(*)::int AS waiting FROM pg_stat_activity WHERE pg_backend_pid() = ANY(pg_blocking_pids(pid))`);
  return result.rows[0]!.waiting;
}

describe('a push config created while a fast run completes', () => {
  it('gets the answer and COMPLETED events', async () => {
    const { taskId } = await sendWithPush(keel.url, token, 'slow', 'race me');
    const holder = new pg.Client({ connectionString: keel.databaseUrl });
    await holder.connect();
    try {
      await holder.query('BEGIN');
      const locked = await holder.query<{ state: string }>('SELECT state FROM a2a_tasks WHERE id = $1 FOR KEY SHARE', [taskId]);
      // Taken while the run is still working (its provider takes 2.5 s), or the test proves nothing.
      expect(locked.rows[0]?.state).toBe('TASK_STATE_WORKING');
      // The run ends after its delay; its completion then waits for the task row.
      await waitFor(async () => (await blockedByHolder(holder)) > 0, 'the completion to wait for the task row', 15_000).catch(async (error: unknown) => {
        const activity = await holder.query(`SELECT wait_event_type, wait_event, state, left(query, 120) AS query FROM pg_stat_activity WHERE datname = current_database()`);
        const run = await holder.query('SELECT status, claimed_by, revision FROM runs WHERE id = $1', [taskId]);
        throw new Error(`${String(error)}; run ${JSON.stringify(run.rows)}; activity ${JSON.stringify(activity.rows)}`);
      });
      await createPushConfigRpc(keel.url, token, 'slow', taskId, { id: 'late', url: receiver.url });
      await holder.query('COMMIT');
    } finally {
      await holder.end();
    }
    const deliveries = await waitForSettled(keel.context.pool, taskId, 'late');
    expect(deliveries.map((delivery) => [delivery.kind, delivery.event_state, delivery.state])).toEqual([
      ['artifact', null, 'delivered'],
      ['status', 'TASK_STATE_COMPLETED', 'delivered'],
    ]);
    await waitFor(async () => receiver.requests.length === 2, 'both events at the receiver');
    expect(receiver.requests.map((request) => Object.keys(request.body))).toEqual([['artifactUpdate'], ['statusUpdate']]);
    expect(await deliveriesOf(keel.context.pool, taskId)).toHaveLength(2);
  });
});
