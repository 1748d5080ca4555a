import fc from 'fast-check';
import pg from 'pg';
import { pino } from 'pino';
import { sql } from 'slonik';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { z } from 'zod';
import { createPushConfig, deletePushConfig } from '../../../src/push/push-config-repository.js';
import { completeRun } from '../../../src/writes/complete-run.js';
import { CompletionBatch } from '../../../src/writes/completion-batch.js';
import { createTasksInNewContexts } from '../../../src/writes/task-creation.js';
import { fastTask, heldCompletion, type FastTask } from '../../support/fast-tasks.js';
import { createTestClient, createTestDatabase, type TestDatabase } from '../../support/test-database.js';
import { testSealer } from '../../support/test-sealer.js';

// Every journal event goes to exactly the push configs active when it committed (docs/push.md),
// whichever way the completion writes it: a fast run's held statement, a batch of completions in
// one transaction, or one completion alone; while configs are created and deleted around it, and
// while another transaction holds the task row the way a config's foreign-key check does.
//
// The order of commits is read from the database itself: test-only triggers number, from one
// sequence, each config's creation and deletion and each journal row, each at the moment its
// transaction holds the task row (a config change raises the task's counter first, sql/0024; a
// journal writer locks the task before it inserts). Holding that row until commit, two such
// transactions take their numbers in the order they commit.

const sealer = testSealer();
const logger = pino<'notice'>({ level: 'silent', customLevels: { notice: 35 } });
const claim = { workerId: 'interleaving-worker', leaseMs: 60_000 };
const URL = 'https://receiver.example/hook';

let db: TestDatabase;
let owner = '';

beforeAll(async () => {
  db = await createTestDatabase();
  owner = await createTestClient(db, 'interleavings');
  const setup = new pg.Client({ connectionString: db.url });
  await setup.connect();
  await setup.query(`
    CREATE SEQUENCE test_commit_order;
    CREATE TABLE test_commit_log (n bigint NOT NULL, kind text NOT NULL, task_id uuid NOT NULL, config_id text, sequence int);
    CREATE FUNCTION test_log_config() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
      INSERT INTO test_commit_log VALUES (nextval('test_commit_order'), CASE WHEN TG_OP = 'INSERT' THEN 'create' ELSE 'delete' END, NEW.task_id, NEW.id, NULL);
      RETURN NULL;
    END $$;
    CREATE FUNCTION test_log_event() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
      INSERT INTO test_commit_log VALUES (nextval('test_commit_order'), 'event', NEW.task_id, NULL, NEW.sequence);
      RETURN NULL;
    END $$;
    -- Named to fire after sql/0024's triggers (row triggers fire in name order), once the task row is held.
    CREATE TRIGGER zz_test_config_created AFTER INSERT ON push_configs FOR EACH ROW EXECUTE FUNCTION test_log_config();
    CREATE TRIGGER zz_test_config_deleted AFTER UPDATE OF deleted_at ON push_configs
      FOR EACH ROW WHEN (OLD.deleted_at IS NULL AND NEW.deleted_at IS NOT NULL) EXECUTE FUNCTION test_log_config();
    CREATE TRIGGER zz_test_event AFTER INSERT ON a2a_events FOR EACH ROW EXECUTE FUNCTION test_log_event();
  `);
  await setup.end();
});
afterAll(async () => db?.drop());

type Path = 'held' | 'batched' | 'single';
type ConfigOp = { kind: 'create' | 'delete'; task: number; config: number; delayMs: number };
type Case = { path: Path; tasks: number; before: ConfigOp[]; during: ConfigOp[]; holdMs: number | null; completionDelayMs: number };

const op = (tasks: number) =>
  fc.record({ kind: fc.constantFrom<'create' | 'delete'>('create', 'delete'), task: fc.nat(tasks - 1), config: fc.nat(2), delayMs: fc.nat(15) });

const cases = fc.integer({ min: 1, max: 3 }).chain((tasks) =>
  fc.record<Case>({
    path: fc.constantFrom<Path>('held', 'batched', 'single'),
    tasks: fc.constant(tasks),
    before: fc.array(op(tasks), { maxLength: 3 }),
    during: fc.array(op(tasks), { minLength: 1, maxLength: 6 }),
    holdMs: fc.option(fc.integer({ min: 5, max: 60 }), { nil: null }),
    completionDelayMs: fc.nat(15),
  }),
);

const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));

async function applyOp(fast: FastTask[], step: ConfigOp): Promise<void> {
  const taskId = fast[step.task]!.run.id;
  const id = `c${step.config}`;
  if (step.kind === 'create') await createPushConfig(db.pool, sealer, { taskId, id, owner, url: URL });
  else await deletePushConfig(db.pool, taskId, id);
}

/** Completes every task's run the way the case's path writes it. */
async function complete(path: Path, fast: FastTask[]): Promise<void> {
  if (path === 'single') {
    for (const task of fast) {
      const { held: _held, ...input } = heldCompletion(task);
      expect(await completeRun(db.pool, sealer, logger, input)).toMatchObject({ settled: true });
    }
    return;
  }
  const batch = new CompletionBatch(db.pool, sealer, logger, { maxBatch: 16 });
  const results = await Promise.all(
    fast.map((task) => {
      const input = heldCompletion(task);
      if (path === 'held') return batch.complete(input);
      const { held: _held, ...unheld } = input;
      return batch.complete(unheld);
    }),
  );
  for (const result of results) expect(result).toMatchObject({ settled: true });
}

const logRow = z.object({ n: z.number(), kind: z.string(), task_id: z.string(), config_id: z.string().nullable(), sequence: z.number().nullable() });
const deliveryRow = z.object({ task_id: z.string(), config_id: z.string(), event_sequence: z.number() });

/** The deliveries the commit order calls for: each event, to each config created before it and not deleted before it. */
function expectedDeliveries(log: ReadonlyArray<z.infer<typeof logRow>>): string[] {
  const active = new Map<string, Set<string>>();
  const expected: string[] = [];
  for (const row of [...log].sort((a, b) => a.n - b.n)) {
    const configs = active.get(row.task_id) ?? new Set<string>();
    active.set(row.task_id, configs);
    if (row.kind === 'create') configs.add(row.config_id!);
    else if (row.kind === 'delete') configs.delete(row.config_id!);
    else for (const config of configs) expected.push(`${row.task_id}/${config}/${row.sequence}`);
  }
  return expected.sort();
}

async function runCase(testCase: Case): Promise<void> {
  const fast = Array.from({ length: testCase.tasks }, (_, index) => fastTask({ sealer, owner, claim, text: `interleaving ${index}` }));
  await createTasksInNewContexts(
    db.pool,
    sealer,
    fast.map((task) => task.creation),
  );
  for (const step of testCase.before) await applyOp(fast, step);

  const holder = testCase.holdMs === null ? null : new pg.Client({ connectionString: db.url });
  if (holder) {
    await holder.connect();
    await holder.query('BEGIN');
    await holder.query('SELECT 1 FROM a2a_tasks WHERE id = ANY($1::uuid[]) ORDER BY id FOR KEY SHARE', [fast.map((task) => task.run.id)]);
  }
  try {
    const completion = sleep(testCase.completionDelayMs).then(() => complete(testCase.path, fast));
    const ops = (async () => {
      for (const step of testCase.during) {
        await sleep(step.delayMs);
        await applyOp(fast, step);
      }
    })();
    const released = holder
      ? sleep(testCase.holdMs!).then(async () => {
          await holder.query('COMMIT');
        })
      : Promise.resolve();
    await Promise.all([completion, ops, released]);
  } finally {
    await holder?.end();
  }

  const ids = fast.map((task) => task.run.id);
  const log = await db.pool.any(sql.type(logRow)`SELECT n::int AS n, kind, task_id, config_id, sequence FROM test_commit_log WHERE task_id = ANY(${sql.array(ids, 'uuid')})`);
  const deliveries = await db.pool.any(
    sql.type(deliveryRow)`SELECT task_id, config_id, event_sequence FROM push_deliveries WHERE task_id = ANY(${sql.array(ids, 'uuid')})`,
  );
  const written = deliveries.map((row) => `${row.task_id}/${row.config_id}/${row.event_sequence}`).sort();
  expect(written, JSON.stringify(testCase)).toEqual(expectedDeliveries(log));
  // Every task ended, its end journaled (the answer and COMPLETED after the WORKING of its insert).
  expect(log.filter((row) => row.kind === 'event').length).toBe(fast.length * 3);
}

describe('push configs created and deleted around completions', () => {
  it('every event goes to exactly the configs active when its journal row committed', { timeout: 240_000 }, async () => {
    await fc.assert(fc.asyncProperty(cases, runCase), { numRuns: 60 });
  });
});
