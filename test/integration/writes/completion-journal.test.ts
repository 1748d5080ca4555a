import { testClaim, testHolder } from '../../support/run-helpers.js';
import { sql, type DatabasePool } from 'slonik';
import { z } from 'zod';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { AnswerPresentation } from '../../../machines/agent-loop.machine.js';
import { silentLogger } from '../../../src/log/logger.js';
import { deliveryIdOf } from '../../../src/push/delivery-id.js';
import { claimQueuedRun } from '../../../src/runs/run-repository.js';
import { completeRun } from '../../../src/writes/complete-run.js';
import { failHeldRun } from '../../../src/writes/uncommon-ends.js';
import { readJournal } from '../../../src/tasks/journal.js';
import { projectRun } from '../../../src/tasks/task-projector.js';
import { startTestKeel, type TestKeel } from '../../support/test-keel.js';
import { LOOPBACK, newClientToken, PUSH_TEST_OVERRIDES, sendWithPush } from '../push/push-support.js';

// A run's end is journaled by the transaction that settles it (decision 0022): the terminal journal
// rows and their push deliveries are written by the completion itself, at the run's revision, with
// a synchronous commit, whether or not a projector ever runs; the projector, run again on that
// revision, writes nothing; and what the completion wrote is exactly what a projection of the same
// revision writes (one source for both).
//
// The Keel here serves the API only: nothing in it claims, settles or projects a run by itself, so
// every journal row below was written by the transaction the test makes.

let keel: TestKeel;
let pool: DatabasePool;
let token = '';
const WORKER = 'test-worker';
const HOOK = { id: 'hook', url: `http://${LOOPBACK}:9/hook` };
const totals = { iterations: 1, toolCalls: 0, inputTokens: 0, outputTokens: 0 };

beforeAll(async () => {
  keel = await startTestKeel({ overrides: PUSH_TEST_OVERRIDES, start: { role: 'api' } });
  pool = keel.context.pool;
  token = await newClientToken(pool);
  // Which transaction wrote each journal row, delivery and run status, and in which commit mode
  // (a test-only trigger in this file's own database).
  await pool.query(sql.unsafe`
    CREATE TABLE write_log (id serial PRIMARY KEY, table_name text NOT NULL, xid bigint NOT NULL, detail text, synchronous_commit text NOT NULL)`);
  await pool.query(sql.unsafe`
    CREATE FUNCTION log_write() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
      -- The detail is the first argument's column that is not null (state, else kind, of an event).
      INSERT INTO write_log (table_name, xid, detail, synchronous_commit) VALUES (TG_TABLE_NAME, txid_current(),
        coalesce(to_jsonb(NEW) ->> TG_ARGV[0], to_jsonb(NEW) ->> TG_ARGV[1]), current_setting('synchronous_commit'));
      RETURN NULL;
    END $$`);
  await pool.query(sql.unsafe`CREATE TRIGGER log_write AFTER INSERT ON a2a_events FOR EACH ROW EXECUTE FUNCTION log_write('state', 'kind')`);
  await pool.query(sql.unsafe`CREATE TRIGGER log_write AFTER INSERT ON push_deliveries FOR EACH ROW EXECUTE FUNCTION log_write('event_sequence', 'event_sequence')`);
  await pool.query(sql.unsafe`CREATE TRIGGER log_write AFTER UPDATE OF status ON runs FOR EACH ROW EXECUTE FUNCTION log_write('status', 'status')`);
});

afterAll(async () => keel?.dispose());

const logRow = z.object({ id: z.number(), table_name: z.string(), xid: z.number(), detail: z.string().nullable(), synchronous_commit: z.string() });
const writesSince = async (afterId: number) => pool.any(sql.type(logRow)`SELECT id, table_name, xid, detail, synchronous_commit FROM write_log WHERE id > ${afterId} ORDER BY id`);
const lastLogId = async () => pool.oneFirst(sql.type(z.object({ n: z.number() }))`SELECT coalesce(max(id), 0)::int AS n FROM write_log`);

const eventRow = z.object({ sequence: z.number(), run_revision: z.number(), kind: z.string(), state: z.string().nullable() });
const eventRows = (taskId: string) =>
  pool.any(sql.type(eventRow)`SELECT sequence, run_revision, kind, state FROM a2a_events WHERE task_id = ${taskId} ORDER BY sequence`);
const deliveryRow = z.object({ id: z.string(), config_id: z.string(), event_sequence: z.number(), terminal: z.boolean() });
const deliveryRows = (taskId: string) =>
  pool.any(sql.type(deliveryRow)`SELECT id, config_id, event_sequence, terminal FROM push_deliveries WHERE task_id = ${taskId} ORDER BY event_sequence`);
const watermark = (taskId: string) =>
  pool.one(sql.type(z.object({ projected_revision: z.number(), last_sequence: z.number(), projected_state: z.string(), run_revision: z.number() }))`
    SELECT t.projected_revision, t.last_sequence, t.projected_state, r.revision AS run_revision FROM a2a_tasks t JOIN runs r ON r.id = t.run_id WHERE t.id = ${taskId}`);

/** A task with a push config, claimed by the test as a worker would claim it (no projection of the claim). */
async function claimedTask(text: string): Promise<string> {
  const { taskId } = await sendWithPush(keel.url, token, 'echo', text, HOOK);
  expect(await claimQueuedRun(pool, taskId, testClaim(WORKER))).not.toBeNull();
  return taskId;
}

const complete = (taskId: string, answer: string, presentation: AnswerPresentation = 'artifact') =>
  completeRun(pool, keel.context.sealer, silentLogger(), { runId: taskId, holder: testHolder(WORKER), reason: 'completed', answer, presentation, taskId, hasOutputs: false, totals });

describe('the completion transaction journals the run it settles', () => {
  it('writes the terminal journal rows and their deliveries itself, at the run revision, committed synchronously', async () => {
    const taskId = await claimedTask('journal me');
    const before = await lastLogId();
    const settled = await complete(taskId, 'journaled by the completion');
    expect(settled.settled).toBe(true);

    // Once the completion has committed, the journal and the outbox hold its end: nothing else ran.
    const run = await watermark(taskId);
    const events = await eventRows(taskId);
    expect(events.map((event) => [event.sequence, event.kind, event.state])).toEqual([
      [1, 'status', 'TASK_STATE_WORKING'],
      [2, 'artifact', null],
      [3, 'status', 'TASK_STATE_COMPLETED'],
    ]);
    expect(events.every((event) => event.run_revision === run.run_revision)).toBe(true);
    expect(run).toMatchObject({ projected_revision: run.run_revision, last_sequence: 3, projected_state: 'TASK_STATE_COMPLETED' });
    const deliveries = await deliveryRows(taskId);
    expect(deliveries.map((delivery) => [delivery.event_sequence, delivery.terminal])).toEqual([
      [1, false],
      [2, false],
      [3, true],
    ]);
    for (const delivery of deliveries) expect(delivery.id).toBe(deliveryIdOf(taskId, 'hook', delivery.event_sequence));
    const journal = await readJournal(pool, keel.context.sealer, taskId, 0);
    expect(JSON.stringify(journal[1]!.response)).toContain('journaled by the completion');

    // One transaction wrote the run's COMPLETED status, the journal rows and the deliveries, and it
    // waited for its WAL flush.
    const writes = await writesSince(before);
    expect(writes.map((write) => `${write.table_name}:${write.detail}`)).toEqual([
      'runs:completed',
      'a2a_events:TASK_STATE_WORKING',
      'a2a_events:artifact',
      'a2a_events:TASK_STATE_COMPLETED',
      'push_deliveries:1',
      'push_deliveries:2',
      'push_deliveries:3',
    ]);
    expect(new Set(writes.map((write) => write.xid)).size).toBe(1);
    expect(writes.every((write) => write.synchronous_commit === 'on')).toBe(true);
    expect(settled.journaled?.write).toMatchObject({ events: 3, revision: run.run_revision, notice: { taskId, lastSequence: 3, ends: true } });
  });

  it('journals a failure the worker settles the same way', async () => {
    const taskId = await claimedTask('fail me');
    const before = await lastLogId();
    const failed = await failHeldRun(pool, keel.context.sealer, silentLogger(), {
      runId: taskId,
      holder: testHolder(WORKER),
      reason: 'policy_denied',
      failureDetail: { guardrail: 'no-secrets' },
      taskId,
      hasOutputs: false,
    });
    expect(failed.settled).toBe(true);
    expect((await eventRows(taskId)).map((event) => event.state)).toEqual(['TASK_STATE_WORKING', 'TASK_STATE_FAILED']);
    expect((await deliveryRows(taskId)).map((delivery) => delivery.event_sequence)).toEqual([1, 2]);
    const writes = await writesSince(before);
    expect(writes.map((write) => `${write.table_name}:${write.detail}`)).toEqual([
      'runs:failed',
      'a2a_events:TASK_STATE_WORKING',
      'a2a_events:TASK_STATE_FAILED',
      'push_deliveries:1',
      'push_deliveries:2',
    ]);
    expect(new Set(writes.map((write) => write.xid)).size).toBe(1);
    const journal = await readJournal(pool, keel.context.sealer, taskId, 0);
    expect(JSON.stringify(journal[1]!.response)).toContain('declined by a policy');
  });

  it('continues the journal after a projected claim: only what the projector has not written', async () => {
    const taskId = await claimedTask('after the claim');
    expect((await projectRun(pool, keel.context.sealer, taskId)).events).toBe(1);
    expect((await complete(taskId, 'second half')).settled).toBe(true);
    const events = await eventRows(taskId);
    expect(events.map((event) => [event.sequence, event.state ?? event.kind])).toEqual([
      [1, 'TASK_STATE_WORKING'],
      [2, 'artifact'],
      [3, 'TASK_STATE_COMPLETED'],
    ]);
    expect(events[0]!.run_revision).toBeLessThan(events[2]!.run_revision);
    expect((await deliveryRows(taskId)).map((delivery) => delivery.event_sequence)).toEqual([1, 2, 3]);
  });
});

describe('the projector on a revision the completion journaled', () => {
  it('writes nothing: no second journal row, no second delivery', async () => {
    const taskId = await claimedTask('project me again');
    expect((await complete(taskId, 'once')).settled).toBe(true);
    const events = await eventRows(taskId);
    const deliveries = await deliveryRows(taskId);
    const before = await lastLogId();
    for (let attempt = 0; attempt < 3; attempt += 1) {
      expect(await projectRun(pool, keel.context.sealer, taskId)).toMatchObject({ taskId, events: 0, deliveryIds: [] });
    }
    // The in-process scheduler (what a process runs after each commit) finds nothing either.
    keel.projector.wake(taskId);
    await keel.projector.idle();
    expect(await writesSince(before)).toEqual([]);
    expect(await eventRows(taskId)).toEqual(events);
    expect(await deliveryRows(taskId)).toEqual(deliveries);
  });

  it('racing the completion, leaves every event journaled once', async () => {
    for (let round = 0; round < 5; round += 1) {
      const taskId = await claimedTask(`race ${round}`);
      const [settled] = await Promise.all([complete(taskId, `raced ${round}`), projectRun(pool, keel.context.sealer, taskId), projectRun(pool, keel.context.sealer, taskId)]);
      expect(settled.settled).toBe(true);
      const events = await eventRows(taskId);
      expect(events.map((event) => event.state ?? event.kind)).toEqual(['TASK_STATE_WORKING', 'artifact', 'TASK_STATE_COMPLETED']);
      expect(events.map((event) => event.sequence)).toEqual([1, 2, 3]);
      expect((await deliveryRows(taskId)).map((delivery) => delivery.event_sequence)).toEqual([1, 2, 3]);
    }
  });
});

describe('one source for both writers', () => {
  const cases: Array<{ name: string; end: (taskId: string) => Promise<{ settled: boolean }> }> = [
    { name: 'an answer as an artifact', end: (taskId) => complete(taskId, 'as an artifact') },
    { name: 'an answer as a status message', end: (taskId) => complete(taskId, 'as a status message', 'status_message') },
    { name: 'an answer as a direct message', end: (taskId) => complete(taskId, 'as a direct message', 'direct_message') },
    {
      name: 'a failure',
      end: (taskId) => failHeldRun(pool, keel.context.sealer, silentLogger(), { runId: taskId, holder: testHolder(WORKER), reason: 'provider_failed', errorClass: 'server_error', taskId, hasOutputs: false }),
    },
  ];
  for (const { name, end } of cases) {
    it(`the completion's events are the projector's, byte for byte once opened, under the same delivery ids (${name})`, async () => {
      const taskId = await claimedTask(name);
      expect((await end(taskId)).settled).toBe(true);
      const journaled = await readJournal(pool, keel.context.sealer, taskId, 0);
      const rows = await eventRows(taskId);
      const deliveries = await deliveryRows(taskId);
      const mark = await watermark(taskId);
      // The journal as if the completion had never written it: the projector rebuilds it from the
      // committed run and task rows.
      await pool.transaction(async (transaction) => {
        await transaction.query(sql.unsafe`DELETE FROM push_deliveries WHERE task_id = ${taskId}`);
        await transaction.query(sql.unsafe`DELETE FROM a2a_events WHERE task_id = ${taskId}`);
        await transaction.query(sql.unsafe`UPDATE a2a_tasks SET projected_revision = 1, last_sequence = 0, projected_state = 'TASK_STATE_SUBMITTED' WHERE id = ${taskId}`);
      });
      expect((await projectRun(pool, keel.context.sealer, taskId)).events).toBe(journaled.length);
      expect(JSON.stringify(await readJournal(pool, keel.context.sealer, taskId, 0))).toBe(JSON.stringify(journaled));
      expect(await eventRows(taskId)).toEqual(rows);
      expect(await deliveryRows(taskId)).toEqual(deliveries);
      expect(await watermark(taskId)).toEqual(mark);
    });
  }
});
