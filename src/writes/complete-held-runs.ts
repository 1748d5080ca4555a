import { sql, type CommonQueryMethods, type FragmentSqlToken } from 'slonik';
import { z } from 'zod';
import { PREPARED } from '../db/prepared-statements.js';
import { rowShape, type ShapedRow } from '../db/row-shape.js';
import { answerIsRetainable } from '../privacy/resolve-ceilings.js';
import { SameTextStatement } from '../db/same-text-statement.js';
import { AUDIT_COLUMNS, insertAuditRowsStatement, type AuditRow } from '../runs/audit-trail.js';
import { completeRunsStatement, SETTLE_COLUMNS } from '../runs/run-repository.js';
import { runRow } from '../runs/run-row.js';
import type { Sealer } from '../sealing/sealer.js';
import type { CompletionInput, CompletionResult, HeldRows, SettledRun } from './completion-input.js';
import { completionRecord, journaledEndOf, type CompletionRecord } from './completion-record.js';
import { insertJournalRowsStatement, JOURNAL_COLUMNS, notifyAllStatement, type JournalRow } from '../tasks/journal-writer.js';
import { TASK_RESULT_COLUMNS, writeTaskResultsStatement } from '../tasks/task-repository.js';

// The completion of runs whose rows this process knows without reading them (decision 0029): a
// fast run's run and task as its insert left them. One statement, committed on its own (or with
// new tasks' creations, decision 0048), locks the run and task rows, checks that they are still
// exactly as the process expects, and writes for the runs that pass what the completion
// transaction (complete-runs-together.ts) writes: the audit rows, the result, the settle and the
// journal rows. It NOTIFYs only the tasks a stream
// watches (decision 0047): the process wakes its own waiters when the statement returns, and a
// stream elsewhere marked the task, which the lock here reads. It reads nothing first, so
// a lone task's completion is one round trip and one commit, not four round trips. A run that
// fails the check (cancelled, a ceiling tightened, an interim message journaled, a push config to
// deliver to) gets nothing written and is completed by the transaction, which reads under its lock.

/** A completion whose run and task rows the process knows without reading them. */
export type HeldCompletion = CompletionInput & { held: HeldRows };

/** Whether a completion can be written without reading first: its rows are known, nothing stored to merge, a result may be kept, its audit rows cannot be refused. */
export function writableHeld(input: CompletionInput): input is HeldCompletion {
  return (
    input.held !== undefined &&
    input.taskId !== null &&
    !input.hasOutputs &&
    (input.resultOutputs?.length ?? 0) === 0 &&
    answerIsRetainable(input.held.answerLevel) &&
    input.takeAuditRows !== undefined
  );
}

/** The statement's rows: the held count on each, and one settled run per row (none when nothing was held). */
export const outcomeRow = z.object({
  held: z.number(),
  id: z.string().nullable(),
  task_id: z.string().nullable(),
  status: runRow.shape.status.nullable(),
  termination_reason: runRow.shape.termination_reason,
  failure_detail: runRow.shape.failure_detail,
});

export type HeldItem = {
  /** The completion's place among the inputs. */
  index: number;
  input: HeldCompletion;
  record: CompletionRecord;
};

/**
 * Each held completion's record (completion-record.ts): its audit rows taken, its result sealed,
 * its journal events built, stamped with this process's clock after the run's start (both its own
 * stamps). A completion whose audit rows could be refused is left out (the transaction writes it:
 * nothing was taken).
 */
export function prepareHeldCompletions(sealer: Sealer, inputs: readonly HeldCompletion[]): HeldItem[] {
  const items: HeldItem[] = [];
  for (const [index, input] of inputs.entries()) {
    const audit = input.takeAuditRows!();
    // A row Postgres could refuse needs a savepoint: the transaction writes it (nothing was taken).
    if (audit === null) continue;
    const at = Math.max(Date.now(), input.held.startedAt + 1);
    items.push({ index, input, record: completionRecord(sealer, input, input.held, at, [], audit) });
  }
  return items;
}

/**
 * The result of each held completion, in the inputs' order, from the rows its statement returned:
 * the completion as committed, or null for a run whose rows were not as expected (nothing of it
 * was written; its audit rows are given back through `rolledBack`, and the caller completes it in
 * a transaction).
 */
export function heldCompletionResults(
  inputs: readonly CompletionInput[],
  items: readonly HeldItem[],
  rows: ReadonlyArray<z.infer<typeof outcomeRow>>,
): Array<CompletionResult | null> {
  const written = new Map<string, SettledRun>();
  for (const { id, task_id, status, termination_reason, failure_detail } of rows) {
    if (id !== null && status !== null) written.set(id, { id, task_id, status, termination_reason, failure_detail });
  }
  const results: Array<CompletionResult | null> = inputs.map(() => null);
  for (const { index, input, record } of items) {
    const settled = written.get(input.runId);
    if (!settled) {
      // Its rows had changed: nothing of it was written, so what it took is given back.
      input.rolledBack?.();
      continue;
    }
    // A held task has no push config (the statement checks it): no deliveries.
    results[index] = { settled: true, run: settled, journaled: journaledEndOf(record, settled, []) };
  }
  return results;
}

/**
 * Completes the held runs in one statement (heldCompletionResults says what each result is). A
 * statement that fails writes nothing; the caller writes each completion again.
 */
export async function completeHeldRuns(
  pool: CommonQueryMethods,
  sealer: Sealer,
  inputs: readonly HeldCompletion[],
): Promise<Array<CompletionResult | null>> {
  return writeHeldItems(pool, inputs, prepareHeldCompletions(sealer, inputs));
}

/** Writes held completions as prepareHeldCompletions left them, in one statement; the results as completeHeldRuns gives them. */
export async function writeHeldItems(pool: CommonQueryMethods, inputs: readonly HeldCompletion[], items: readonly HeldItem[]): Promise<Array<CompletionResult | null>> {
  const rows = items.length === 0 ? [] : await pool.any(heldCompletionStatement.with(heldCompletionRows(items)));
  return heldCompletionResults(inputs, items, rows);
}

/** What each held run is expected to be: run, task, owner, revision, level, journal watermark, sealed history (row-shape.ts). */
const EXPECTED_ROW = rowShape([
  ['run_id', 'uuid'],
  ['task_id', 'uuid'],
  ['worker', 'text'],
  ['token', 'uuid'],
  ['revision', 'int8'],
  ['level', 'text'],
  ['last_sequence', 'int4'],
  ['projected_revision', 'int8'],
  ['projected_state', 'text'],
  ['history', 'bytea'],
]);

export type HeldCompletionRows = [
  expected: readonly ShapedRow[],
  audit: readonly AuditRow[],
  results: readonly ShapedRow[],
  settles: readonly ShapedRow[],
  journal: readonly JournalRow[],
  notices: readonly string[],
];

/**
 * The held completions' CTEs, in a statement of their own or with creations (task-write-batch.ts):
 * `held` locks the runs and tasks that are exactly as expected (run id order, each run before its
 * task, as every batch locks), and every write is limited to them, so a run that
 * fails the check is left untouched. The statement is prepared (decision 0030): its plan is made
 * again as the connection's runs of it grow tenfold, so a plan made on empty tables does not stay;
 * its text is built once (same-text-statement.ts). A task that ever had a push config fails it
 * too (its deliveries, bounded per config, are written by the transaction): told by the counter a
 * config's creation and deletion raise on the task row (sql/0024), which Postgres rechecks on the
 * row's newest version once the lock is granted, where a subquery on push_configs would see the
 * database as it was when the statement began. The counts
 * are checked inside the statement, so a write that fell short fails the whole statement instead
 * of committing part of a completion. `watched` is read under the task's lock: a stream that
 * marked the task before gets the NOTIFY, one that marks it after reads the journal after this
 * commit.
 */
export function heldCompletionCtes([expected, audit, results, settles, journal, notices]: HeldCompletionRows): FragmentSqlToken {
  const held = sql.identifier(['held']);
  const streamed = sql.identifier(['streamed']);
  return sql.fragment`held AS MATERIALIZED (
      SELECT r.id AS run_id, t.id AS task_id, t.watched
      FROM ${EXPECTED_ROW.unnest(expected, 'e')}
      JOIN runs r ON r.id = e.run_id
      JOIN a2a_tasks t ON t.id = e.task_id AND t.id = r.task_id
      WHERE r.status = 'running' AND r.claimed_by = e.worker AND r.claim_token = e.token AND r.revision = e.revision AND r.answer_level = e.level
        AND t.answer_level = e.level AND t.last_sequence = e.last_sequence AND t.projected_revision = e.projected_revision
        AND t.projected_state = e.projected_state AND t.history IS NOT DISTINCT FROM e.history
        AND t.status_message IS NULL AND t.artifacts IS NULL AND NOT t.direct_message
        AND t.push_config_changes = 0
      ORDER BY r.id
      FOR UPDATE OF r, t),
    audited AS (${insertAuditRowsStatement(audit, held)} RETURNING 1),
    results AS (${writeTaskResultsStatement(results, held)} RETURNING t.id),
    settled AS (${completeRunsStatement(settles, held)} RETURNING r.id, r.task_id, r.status, r.termination_reason, r.failure_detail),
    journal AS (${insertJournalRowsStatement(journal, held)} RETURNING task_id),
    streamed AS (SELECT task_id FROM held WHERE watched),
    notified AS (${notifyAllStatement(notices, streamed)}),
    counts AS (
      SELECT (SELECT count(*) FROM held)::int AS held, (SELECT count(*) FROM results)::int AS results,
        (SELECT count(*) FROM settled)::int AS settled, (SELECT notified FROM notified) AS notified,
        (SELECT count(*) FROM streamed)::int AS streamed)`;
}

/** The cells of a row of each of the held completions' sets (same-text-statement.ts). */
export const HELD_COMPLETION_SHAPES = [EXPECTED_ROW.width, AUDIT_COLUMNS, TASK_RESULT_COLUMNS, SETTLE_COLUMNS, JOURNAL_COLUMNS, 'list'] as const;

/**
 * The held completions' outcome: the held count (or the statement fails, when a write fell short
 * of it) and each settled run, one per row, with `more` columns after them.
 */
export function heldOutcome(more: FragmentSqlToken = sql.fragment``): FragmentSqlToken {
  return sql.fragment`SELECT CASE WHEN c.results = c.held AND c.settled = c.held AND c.notified = c.streamed THEN c.held
        ELSE ('held completion wrote ' || c.results || ' results, ' || c.settled || ' settles and ' || c.notified || ' notices for ' || c.held || ' held runs, ' || c.streamed || ' watched')::int END AS held,
      s.*${more}
    FROM counts c LEFT JOIN settled s ON true`;
}

export const heldCompletionStatement = new SameTextStatement(
  (rows: HeldCompletionRows) => sql.type(outcomeRow)`${PREPARED}
    WITH ${heldCompletionCtes(rows)}
    ${heldOutcome()}`,
  HELD_COMPLETION_SHAPES,
);

/** The held completions' rows, in the statement's sets. */
export function heldCompletionRows(items: readonly HeldItem[]): HeldCompletionRows {
  return [
    items.map(({ input }) =>
      EXPECTED_ROW.row({
        run_id: input.runId,
        task_id: input.taskId!,
        worker: input.holder.workerId,
        token: input.holder.token,
        revision: input.held.runRevision,
        level: input.held.answerLevel,
        last_sequence: input.held.lastSequence,
        projected_revision: input.held.projectedRevision,
        projected_state: input.held.projectedState,
        history: input.held.task.history,
      }),
    ),
    items.flatMap(({ record }) => record.audit),
    items.map(({ record }) => record.result),
    items.map(({ record }) => record.settle),
    items.flatMap(({ record }) => record.journal.rows),
    items.flatMap(({ record }) => (record.journal.notice === null ? [] : [record.journal.notice])),
  ];
}
