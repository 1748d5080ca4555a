import { sql, type CommonQueryMethods, type DatabasePool, type FragmentSqlToken } from 'slonik';
import { z } from 'zod';
import type { Sealer } from '../sealing/sealer.js';
import { GroupCommit, type BatchOptions } from '../db/group-commit.js';
import { PREPARED } from '../db/prepared-statements.js';
import { rowShape, type ShapedRow } from '../db/row-shape.js';
import { SameTextStatement } from '../db/same-text-statement.js';
import { FIRST_CLAIM_REVISION, INSERTED_REVISION } from '../runs/run-row.js';
import { insertRunsStatement, RUN_COLUMNS, runValues, type CreateRunInput, type FastStart } from '../runs/run-repository.js';
import {
  insertJournalRowsStatement,
  JOURNAL_COLUMNS,
  journalEventsSince,
  journalRows,
  writeJournalEvents,
  type CommittedRun,
  type JournalEventDraft,
  type JournalHead,
  type JournalRow,
  type ProjectionOptions,
} from '../tasks/journal-writer.js';
import { insertTasksStatement, TASK_COLUMNS, taskValues, type NewTask, type TaskStart } from '../tasks/task-repository.js';
import type { FastRun } from '../runs/fast-runs.js';
import type { HeldRows } from './completion-input.js';
import { newRunLink } from '../tracing/run-trace.js';

// A new task in a new context: the context, the run (QUEUED, or claimed by this process on the
// fast path) and the task row, with the task's WORKING event for a fast run. The creations of
// concurrent requests are written together, one statement for all of them (group commit,
// docs/decisions/0026-group-commit.md). A creation whose message key its owner used before
// writes nothing: the task row's INSERT skips it and every other row follows the task rows the
// INSERT returned (docs/decisions/0064-idempotent-messages-decided-at-insert.md).

export type TaskCreation = {
  task: NewTask;
  run: CreateRunInput & { id: string };
  /** The fast path (docs/decisions/0025-fast-path.md): this process claims the run at insert and runs it. */
  fast: FastStart | null;
};

/** A fast run's task is inserted with one journal event, its WORKING. */
const FAST_START_SEQUENCE = 1;

/** The journal's head of a task just inserted: nothing journaled, SUBMITTED. */
function freshHead(taskId: string, contextId: string): JournalHead {
  return {
    taskId,
    contextId,
    projectedRevision: INSERTED_REVISION,
    lastSequence: 0,
    projectedState: 'TASK_STATE_SUBMITTED',
    directMessage: false,
    statusMessage: () => null,
    artifacts: () => [],
  };
}

/** A fast run as its insert left it: RUNNING since `at`, at the claim's revision. */
function claimedAtInsert(runId: string, at: number): CommittedRun {
  return { runId, status: 'running', revision: FIRST_CLAIM_REVISION, startedAt: at, statusChangedAt: at, terminationReason: null, failureDetail: null };
}

/**
 * The WORKING event that opens a fast run's journal: what the projector would write for the
 * claim (journalEventsSince, from a fresh task to a run RUNNING since `at`).
 */
function startedEvent(taskId: string, contextId: string, at: number): JournalEventDraft {
  const [event] = journalEventsSince(freshHead(taskId, contextId), claimedAtInsert(taskId, at), []);
  return event!;
}

/**
 * A fast run's run and task rows as its insert left them (both ways of inserting it: the batched
 * creation and the transaction that journalFastStart writes in), for its completion to check
 * instead of reading them (complete-held-runs.ts).
 */
export function heldRowsOfFastRun(run: FastRun): HeldRows {
  return {
    runRevision: FIRST_CLAIM_REVISION,
    answerLevel: run.answerLevel,
    startedAt: run.at,
    projectedRevision: FIRST_CLAIM_REVISION,
    lastSequence: FAST_START_SEQUENCE,
    projectedState: 'TASK_STATE_WORKING',
    task: { contextId: run.task.contextId, owner: run.task.owner, metadata: run.task.metadata, history: run.task.history, agent: run.agent, createdAt: run.at },
  };
}

/**
 * Journals a fast run's WORKING event in the transaction that inserted its task (with its
 * context's earlier turns or a push config: not a batched creation), through the journal's
 * writer, so a push config created in that transaction gets its delivery. Returns the deliveries.
 */
export async function journalFastStart(
  transaction: CommonQueryMethods,
  sealer: Sealer,
  task: { id: string; contextId: string },
  at: number,
  options: ProjectionOptions,
): Promise<string[]> {
  const head = freshHead(task.id, task.contextId);
  const run = claimedAtInsert(task.id, at);
  const written = await writeJournalEvents(transaction, sealer, head, run, journalEventsSince(head, run, []), options);
  return written.deliveryIds;
}

const created = z.object({ tasks: z.number(), events: z.number(), created: z.array(z.string()) });

/** A new context's row (row-shape.ts), with the task it is created for. */
const CONTEXT_ROW = rowShape([
  ['owner', 'uuid'],
  ['id', 'text'],
  ['task_id', 'uuid'],
]);

/** The CTE of the task rows an INSERT did insert (`task_id`): the rows that hang off a task follow it. */
const NEW_TASKS = sql.identifier(['new_tasks']);

export type CreationRows = [contexts: readonly ShapedRow[], runs: readonly ShapedRow[], tasks: readonly ShapedRow[], events: readonly JournalRow[]];

/** The cells of a row of each of the creations' sets (same-text-statement.ts). */
export const CREATION_SHAPES = [CONTEXT_ROW.width, RUN_COLUMNS, TASK_COLUMNS, JOURNAL_COLUMNS] as const;

/**
 * The creations' CTEs: tasks, then the contexts, runs and events of the tasks inserted, as
 * multi-row inserts. Foreign keys are checked at the end of the statement, when contexts, runs,
 * tasks and events all exist.
 */
export function creationCtes([contexts, runs, tasks, events]: CreationRows): FragmentSqlToken {
  return sql.fragment`new_tasks AS (${insertTasksStatement(tasks)} RETURNING id AS task_id),
    new_contexts AS (
      INSERT INTO contexts (owner, id)
      SELECT c.owner, c.id FROM ${CONTEXT_ROW.unnest(contexts, 'c')}
      WHERE c.task_id IN (SELECT task_id FROM new_tasks)
      RETURNING id),
    new_runs AS (${insertRunsStatement(runs, NEW_TASKS)} RETURNING id),
    new_events AS (${insertJournalRowsStatement(events, NEW_TASKS)} RETURNING task_id)`;
}

/** What the creations' CTEs wrote, as the statements that hold them select it: counts, and the tasks inserted. */
export const CREATED_COUNTS = sql.fragment`(SELECT count(*) FROM new_tasks)::int AS tasks, (SELECT count(*) FROM new_events)::int AS events,
    ARRAY(SELECT task_id::text FROM new_tasks) AS created`;

/**
 * The creations' statement: one text for any batch (rows as arrays, the CTEs always there),
 * prepared on each connection and built once (same-text-statement.ts).
 */
export const creationStatement = new SameTextStatement(
  (rows: CreationRows) => sql.type(created)`${PREPARED}
    WITH ${creationCtes(rows)}
    SELECT ${CREATED_COUNTS}`,
  CREATION_SHAPES,
);

/**
 * The creations' rows. A fast run's task is written WORKING with its journal's first event and the
 * watermark past the claim. That event is not NOTIFYd
 * (docs/decisions/0046-a-new-task-is-announced-by-its-end.md): every waiter waits on a task id, and
 * no one but this process can hold the id of a task that does not exist yet; this process's own
 * wait is for the end, and a stream opened once the task exists reads the event from the journal.
 */
export function creationRows(sealer: Sealer, creations: readonly TaskCreation[]): CreationRows {
  const fast = creations.filter((creation) => creation.fast !== null);
  // Each fast task's journal from a fresh head: its WORKING event at the claim's revision.
  const events = fast.flatMap(
    ({ task, fast: start }) =>
      journalRows(sealer, freshHead(task.id, task.contextId), claimedAtInsert(task.id, start!.at), [startedEvent(task.id, task.contextId, start!.at)]).rows,
  );
  return [
    creations.map(({ task }) => CONTEXT_ROW.row({ owner: task.owner, id: task.contextId, task_id: task.id })),
    creations.map((creation) => runValues(sealer, creation.run, creation.fast)),
    creations.map((creation) => taskValues(sealer, creation.task, creation.fast && { at: creation.fast.at, journaled: { revision: FIRST_CLAIM_REVISION, lastSequence: FAST_START_SEQUENCE } })),
    events,
  ];
}

/**
 * Which creations the statement inserted (false: a repeat of a message key, nothing written for
 * it); fails when it wrote other tasks or another number of events than those hold.
 */
export function checkCreated(written: { tasks: number; events: number; created: readonly string[] }, creations: readonly TaskCreation[]): boolean[] {
  const inserted = new Set(written.created);
  const results = creations.map((creation) => inserted.has(creation.task.id));
  const tasks = results.filter(Boolean).length;
  const fast = creations.filter((creation, index) => creation.fast !== null && results[index]).length;
  if (written.tasks !== tasks || tasks !== inserted.size || written.events !== fast) {
    throw new Error(`task creation wrote ${written.tasks} of ${tasks} tasks and ${written.events} of ${fast} events`);
  }
  return results;
}

/** Writes the creations from their rows (creationRows) in one statement (one round trip, atomic on its own); which were inserted. */
export async function writeCreationRows(db: CommonQueryMethods, creations: readonly TaskCreation[], rows: CreationRows): Promise<boolean[]> {
  return checkCreated(await db.one(creationStatement.with(rows)), creations);
}

/** Writes the creations in one statement; which were inserted. */
export async function createTasksInNewContexts(db: CommonQueryMethods, sealer: Sealer, creations: readonly TaskCreation[]): Promise<boolean[]> {
  return writeCreationRows(db, creations, creationRows(sealer, creations));
}

/**
 * The task and its run in one statement, in a transaction of the caller's (a task with its
 * context's earlier turns or a push config): false when the task's message key was used before,
 * and then nothing is written.
 */
export async function insertTaskWithRun(
  db: CommonQueryMethods,
  sealer: Sealer,
  task: NewTask,
  run: CreateRunInput & { id: string },
  fast: FastStart | null,
  start: TaskStart | null,
): Promise<boolean> {
  const written = await db.one(sql.type(z.object({ tasks: z.number(), runs: z.number() }))`
    WITH new_tasks AS (${insertTasksStatement([taskValues(sealer, task, start)])} RETURNING id AS task_id),
    new_runs AS (${insertRunsStatement([runValues(sealer, run, fast)], NEW_TASKS)} RETURNING id)
    SELECT (SELECT count(*) FROM new_tasks)::int AS tasks, (SELECT count(*) FROM new_runs)::int AS runs`);
  if (written.tasks !== written.runs) throw new Error(`task creation wrote ${written.tasks} tasks and ${written.runs} runs`);
  return written.tasks === 1;
}

/**
 * Writes new tasks: alone (TaskCreations) or with the held completions ready at the same moment
 * (TaskWriteBatch). Resolves to false when the task's message key was used before (nothing written).
 */
export type TaskCreator = { create(creation: TaskCreation): Promise<boolean> };

/**
 * The creations of concurrent requests, written together: a request waits at most for the batch
 * in flight to return, then goes with everything that arrived meanwhile. One creation that
 * fails in a batch is retried alone and fails alone.
 */
export class TaskCreations implements TaskCreator {
  private readonly group: GroupCommit<TaskCreation, boolean>;

  constructor(pool: DatabasePool, sealer: Sealer, options: BatchOptions) {
    const write = (creations: readonly TaskCreation[]) => createTasksInNewContexts(pool, sealer, creations);
    this.group = new GroupCommit<TaskCreation, boolean>({
      ...options,
      writeBatch: (creations) => write(creations),
      writeOne: async (creation) => (await write([creation]))[0]!,
      trace: { name: 'keel.write_batch', linkOf: (creation) => newRunLink(creation.run.trace, creation.task.id) },
    });
  }

  create(creation: TaskCreation): Promise<boolean> {
    return this.group.submit(creation);
  }
}
