import { sql, type CommonQueryMethods } from 'slonik';
import { z } from 'zod';
import { PREPARED } from '../db/prepared-statements.js';
import type { ShapedRow } from '../db/row-shape.js';
import type { KeelLogger } from '../log/logger.js';
import type { PrivacyLevel } from '../privacy/privacy-level.js';
import { answerIsRetainable } from '../privacy/resolve-ceilings.js';
import type { TaskState } from '../protocol/wire.js';
import { SameTextStatement } from '../db/same-text-statement.js';
import { completeRunsStatement, SETTLE_COLUMNS } from '../runs/run-repository.js';
import { AUDIT_COLUMNS, insertAuditRowsStatement, type AuditRow } from '../runs/audit-trail.js';
import { appendRunOutputs, listRunOutputs, type StoredRunOutput } from '../runs/run-output-repository.js';
import { runRow } from '../runs/run-row.js';
import type { Sealer } from '../sealing/sealer.js';
import { completeRunAlone } from './uncommon-ends.js';
import type { CompletionInput, CompletionResult, KnownRows } from './completion-input.js';
import { completionRecord, journaledEndOf, type CompletionRecord } from './completion-record.js';
import { DEFAULT_PROJECTION_OPTIONS, insertJournalRowsStatement, JOURNAL_COLUMNS, notifyAllStatement, recordEventDeliveries, type JournalRow } from '../tasks/journal-writer.js';
import { TASK_RESULT_COLUMNS, writeTaskResultsStatement } from '../tasks/task-repository.js';

// The completions of runs that end together, written in one transaction (group commit,
// docs/decisions/0026-group-commit.md), and a completion alone the same way (completeRun): one
// statement locks every run and task row of the batch (in run id order, so two batches never wait
// on each other crosswise) and reads the transaction's clock; each run's completion record
// (completion-record.ts) is built from the rows as locked, with the artifacts the run stored, and
// one statement writes every record's audit rows, result, settle, journal rows and NOTIFY, then
// the push outbox of each task's configs as they are after the lock. Every settle of the batch is
// stamped with the transaction's now(), as each would be in its own. A completion that is not a
// run holding a task whose result may be kept (no task, a run no longer held, a ceiling that keeps
// no result) is written by completeRunAlone in the same transaction.

const lockedRow = z.object({
  run_id: z.string(),
  status: z.string(),
  claimed_by: z.string().nullable(),
  claim_token: z.string().nullable(),
  answer_level: z.string(),
  revision: z.number(),
  task_id: z.string().nullable(),
  started_at: z.number().nullable(),
  context_id: z.string(),
  owner: z.string(),
  agent: z.string(),
  metadata: z.record(z.unknown()),
  task_created_at: z.number(),
  history: z.instanceof(Buffer).nullable(),
  projected_revision: z.number(),
  last_sequence: z.number(),
  projected_state: z.string(),
  tx_now: z.number(),
});
type LockedRow = z.infer<typeof lockedRow>;

/** A settled run as the caller reads it (SettledRun), with its task's push configs and the statement's counts. */
const settledRow = runRow
  .pick({ id: true, task_id: true, status: true, termination_reason: true, failure_detail: true })
  .extend({ push_configs: z.array(z.string()), results: z.number(), events: z.number(), notified: z.number() });

/** Whether a completion is written by the batch's statement: it holds its run, the run serves the task, a result may be kept. */
function batchable(input: CompletionInput, row: LockedRow | undefined): row is LockedRow {
  return (
    row !== undefined &&
    input.taskId !== null &&
    row.task_id === input.taskId &&
    row.status === 'running' &&
    row.claimed_by === input.holder.workerId &&
    row.claim_token === input.holder.token &&
    answerIsRetainable(row.answer_level as PrivacyLevel)
  );
}

/** The rows as locked, as a completion record knows them. */
function knownRows(row: LockedRow): KnownRows {
  return {
    runRevision: row.revision,
    answerLevel: row.answer_level as PrivacyLevel,
    startedAt: row.started_at,
    projectedRevision: row.projected_revision,
    lastSequence: row.last_sequence,
    projectedState: row.projected_state as TaskState,
    task: { contextId: row.context_id, owner: row.owner, agent: row.agent, metadata: row.metadata, history: row.history, createdAt: row.task_created_at },
  };
}

/** Locks the run and task rows of the runs serving tasks, in run id order, with the transaction's clock. */
async function lockRunsAndTasks(transaction: CommonQueryMethods, runIds: readonly string[]): Promise<Map<string, LockedRow>> {
  if (runIds.length === 0) return new Map();
  const rows = await transaction.any(sql.type(lockedRow)`${PREPARED}
    SELECT r.id AS run_id, r.status, r.claimed_by, r.claim_token, r.answer_level, r.revision, r.task_id, r.started_at,
      t.context_id, t.owner, t.agent, t.metadata, t.created_at AS task_created_at, t.history,
      t.projected_revision, t.last_sequence, t.projected_state, now() AS tx_now
    FROM runs r JOIN a2a_tasks t ON t.id = r.task_id
    WHERE r.id = ANY(${sql.array([...runIds], 'uuid')})
    ORDER BY r.id
    FOR UPDATE OF r, t`);
  return new Map(rows.map((row) => [row.run_id, row]));
}

/**
 * The artifacts a run stored, with the result's own (a statechart agent's output) written first
 * at the revision its settle reaches, for the record to merge and journal; none to read when the
 * run stored none.
 */
async function storedOutputs(transaction: CommonQueryMethods, sealer: Sealer, input: CompletionInput, row: LockedRow): Promise<StoredRunOutput[]> {
  const resultOutputs = input.resultOutputs ?? [];
  if (resultOutputs.length > 0) await appendRunOutputs(transaction, sealer, input.runId, row.revision + 1, row.answer_level as PrivacyLevel, resultOutputs);
  return input.hasOutputs || resultOutputs.length > 0 ? listRunOutputs(transaction, sealer, input.runId) : [];
}

export async function completeRunsTogether(transaction: CommonQueryMethods, sealer: Sealer, logger: KeelLogger, inputs: readonly CompletionInput[]): Promise<CompletionResult[]> {
  const locked = await lockRunsAndTasks(
    transaction,
    inputs.filter((input) => input.taskId !== null).map((input) => input.runId),
  );
  const results: Array<CompletionResult | null> = inputs.map(() => null);
  const batch: Array<{ index: number; input: CompletionInput; record: CompletionRecord }> = [];
  const taken = new Set<string>();
  for (const [index, input] of inputs.entries()) {
    const row = locked.get(input.runId);
    // A run named twice is written once here; the other completion finds it settled.
    if (!batchable(input, row) || taken.has(input.runId)) continue;
    taken.add(input.runId);
    const outputs = await storedOutputs(transaction, sealer, input, row);
    const audit = input.takeAuditRows?.(transaction) ?? [];
    await input.beforeSettle?.(transaction);
    batch.push({ index, input, record: completionRecord(sealer, input, knownRows(row), row.tx_now, outputs, audit) });
  }

  if (batch.length > 0) {
    const written = await writeCompletionRecords(
      transaction,
      batch.map(({ record }) => record),
    );
    for (const { index, input, record } of batch) {
      const settled = written.get(record.runId);
      if (!settled) throw new Error(`completion of run ${record.runId}: the batch did not settle it`);
      const { push_configs: configs, results: _results, events: _events, notified: _notified, ...run } = settled;
      const options = input.projection ?? DEFAULT_PROJECTION_OPTIONS;
      const deliveryIds = await recordEventDeliveries(transaction, { taskId: record.taskId, lastSequence: record.known.lastSequence }, record.events, configs, options);
      results[index] = { settled: true, run, journaled: journaledEndOf(record, run, deliveryIds) };
    }
  }

  // Everything else, one by one in the same transaction, exactly as alone.
  for (const [index, input] of inputs.entries()) {
    if (results[index] === null) results[index] = await completeRunAlone(transaction, sealer, logger, input);
  }
  return results as CompletionResult[];
}

type RecordRows = [audit: readonly AuditRow[], results: readonly ShapedRow[], settles: readonly ShapedRow[], journal: readonly JournalRow[], notices: readonly string[]];

/**
 * The batch's one writing statement: its records' audit rows, results with watermarks, settles,
 * journal rows and NOTIFYs, returning the settled runs with their tasks' push configs (read after
 * the lock, so every config committed before it is there, decision 0051). One text for any batch
 * (rows as arrays): prepared on each connection (decision 0030) and built once (decision 0035).
 */
export const commonCompletionStatement = new SameTextStatement(
  ([audit, results, settles, journal, notices]: RecordRows) => sql.type(settledRow)`${PREPARED}
    WITH audited AS (${insertAuditRowsStatement(audit)} RETURNING 1),
    results AS (${writeTaskResultsStatement(results)} RETURNING t.id),
    settled AS (${completeRunsStatement(settles)} RETURNING r.id, r.task_id, r.status, r.termination_reason, r.failure_detail),
    journal AS (${insertJournalRowsStatement(journal)} RETURNING 1),
    counts AS (
      SELECT (SELECT count(*) FROM results)::int AS results, (SELECT count(*) FROM journal)::int AS events,
        (${notifyAllStatement(notices)}) AS notified)
    SELECT s.*, c.results, c.events, c.notified,
      ARRAY(SELECT p.id FROM push_configs p WHERE p.task_id = s.task_id AND p.deleted_at IS NULL AND p.state IN ('active', 'paused') ORDER BY p.id) AS push_configs
    FROM settled s CROSS JOIN counts c`,
  [AUDIT_COLUMNS, TASK_RESULT_COLUMNS, SETTLE_COLUMNS, JOURNAL_COLUMNS, 'list'],
);

/**
 * Writes completion records of runs whose rows the caller locked, in one statement; the settled
 * runs by id. A statement that wrote fewer rows than its records hold fails the transaction.
 */
export async function writeCompletionRecords(transaction: CommonQueryMethods, records: readonly CompletionRecord[]): Promise<Map<string, z.infer<typeof settledRow>>> {
  const journal = records.flatMap((record) => record.journal.rows);
  const notices = records.flatMap((record) => (record.journal.notice === null ? [] : [record.journal.notice]));
  const rows = await transaction.any(
    commonCompletionStatement.with([
      records.flatMap((record) => record.audit),
      records.map((record) => record.result),
      records.map((record) => record.settle),
      journal,
      notices,
    ]),
  );
  const first = rows[0];
  if (rows.length !== records.length || !first || first.results !== records.length || first.events !== journal.length || first.notified !== notices.length) {
    throw new Error(
      `batched completion wrote ${first?.results ?? 0} of ${records.length} results, settled ${rows.length}, journaled ${first?.events ?? 0} of ${journal.length} events`,
    );
  }
  return new Map(rows.map((row) => [row.id, row]));
}
