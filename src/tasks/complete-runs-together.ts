import { sql, type CommonQueryMethods } from 'slonik';
import { z } from 'zod';
import { PREPARED } from '../db/prepared-statements.js';
import type { KeelLogger } from '../log/logger.js';
import type { PrivacyLevel } from '../privacy/privacy-level.js';
import { answerIsRetainable } from '../privacy/resolve-ceilings.js';
import type { TaskState } from '../protocol/wire.js';
import { SameTextStatement } from '../db/same-text-statement.js';
import { completeRunsStatement, SETTLE_COLUMNS, settleRow } from '../runs/run-repository.js';
import { AUDIT_COLUMNS, auditRowsOf, insertAuditRowsStatement, type AuditRow, type SerializedRow } from '../runs/audit-trail.js';
import { runRow } from '../runs/run-row.js';
import type { Sealer } from '../sealing/sealer.js';
import { answerResult, completeRunWithin, journaledTaskRow, type CompletionInput, type CompletionResult } from './complete-run.js';
import {
  DEFAULT_PROJECTION_OPTIONS,
  insertJournalRowsStatement,
  JOURNAL_COLUMNS,
  journalEventsSince,
  journalRows,
  notifyAllStatement,
  recordEventDeliveries,
  type JournalRow,
} from './journal-writer.js';
import { prepareTaskResult, TASK_RESULT_COLUMNS, taskResultRow, writeTaskResultsStatement } from './task-repository.js';

// The completions of runs that end together, written by one statement in one transaction (group
// commit, docs/decisions/0026-group-commit.md): one statement locks every run and task row of the
// batch (in run id order, so two batches never wait on each other crosswise), one statement writes
// every result, settle, journal row, watermark and NOTIFY. The writes are the ones completeRun
// makes for each run on its own (the same result sealing, the same journal events through
// journal-writer.ts, the same delivery ids), with the transaction's clock read once: every settle
// of the batch is stamped with the transaction's now(), as each would be in its own. A run that
// needs more than the common path (no task, stored outputs to merge, a ceiling that keeps no
// result, a run no longer held) is completed by completeRunWithin in the same transaction.

const lockedRow = z.object({
  run_id: z.string(),
  status: z.string(),
  claimed_by: z.string().nullable(),
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

/** Whether a completion can take the batch's common path: it holds its run, the run serves a task, nothing stored to merge, a result may be kept. */
function commonPath(input: CompletionInput, row: LockedRow | undefined): row is LockedRow {
  return (
    row !== undefined &&
    input.taskId !== null &&
    row.task_id === input.taskId &&
    !input.hasOutputs &&
    row.status === 'running' &&
    row.claimed_by === input.workerId &&
    answerIsRetainable(row.answer_level as PrivacyLevel)
  );
}

type Prepared = {
  input: CompletionInput;
  row: LockedRow;
  stored: ReturnType<typeof prepareTaskResult>;
  directMessage: boolean;
  revision: number;
  events: ReturnType<typeof journalEventsSince>;
  journal: ReturnType<typeof journalRows>;
  /** The audit rows riding in the batch's statement (what could be refused, beforeSettle wrote). */
  audit: SerializedRow[];
};

export async function completeRunsTogether(transaction: CommonQueryMethods, sealer: Sealer, logger: KeelLogger, inputs: readonly CompletionInput[]): Promise<CompletionResult[]> {
  // Only completions that may take the common path are locked here; the others (outputs to merge,
  // no task) are written by completeRunWithin below, which locks and reads their rows itself. A
  // run named twice takes no common path (each completion is written alone).
  const unique = new Set(inputs.map((input) => input.runId)).size === inputs.length;
  const ids = inputs.filter((input) => input.taskId !== null && !input.hasOutputs).map((input) => input.runId);
  const locked = !unique || ids.length === 0 ? [] : await transaction.any(sql.type(lockedRow)`${PREPARED}
    SELECT r.id AS run_id, r.status, r.claimed_by, r.answer_level, r.revision, r.task_id, r.started_at,
      t.context_id, t.owner, t.agent, t.metadata, t.created_at AS task_created_at, t.history,
      t.projected_revision, t.last_sequence, t.projected_state, now() AS tx_now
    FROM runs r JOIN a2a_tasks t ON t.id = r.task_id
    WHERE r.id = ANY(${sql.array(ids, 'uuid')})
    ORDER BY r.id
    FOR UPDATE OF r, t`);
  const byRun = new Map(locked.map((row) => [row.run_id, row]));

  const results: Array<CompletionResult | null> = inputs.map(() => null);
  const prepared: Array<Prepared & { index: number }> = [];
  for (const [index, input] of inputs.entries()) {
    const row = byRun.get(input.runId);
    if (!commonPath(input, row)) continue;
    const level = row.answer_level as PrivacyLevel;
    const audit = input.takeAuditRows?.(transaction) ?? [];
    await input.beforeSettle?.(transaction);
    const taskId = row.task_id!;
    const { artifacts, statusMessage, directMessage } = answerResult(taskId, row.context_id, input, []);
    const stored = prepareTaskResult(sealer, taskId, level, { artifacts, statusMessage, directMessage }, row.history);
    const revision = row.revision + 1;
    const head = {
      taskId,
      contextId: row.context_id,
      projectedRevision: row.projected_revision,
      lastSequence: row.last_sequence,
      projectedState: row.projected_state as TaskState,
      directMessage,
      statusMessage: () => stored.statusMessage,
      artifacts: () => stored.artifacts,
    };
    const run = { runId: input.runId, status: 'completed' as const, revision, startedAt: row.started_at, statusChangedAt: row.tx_now, terminationReason: input.reason, failureDetail: null };
    const events = journalEventsSince(head, run, []);
    prepared.push({ index, input, row, stored, directMessage, revision, events, journal: journalRows(sealer, head, run, events), audit });
  }

  if (prepared.length > 0) {
    const written = await writeCommonCompletions(transaction, prepared);
    for (const item of prepared) {
      const settled = written.get(item.input.runId);
      if (!settled) throw new Error(`completion of run ${item.input.runId}: the batch did not settle it`);
      const { push_configs: configs, results: _results, events: _events, notified: _notified, ...run } = settled;
      const taskId = item.row.task_id!;
      const options = item.input.projection ?? DEFAULT_PROJECTION_OPTIONS;
      const deliveryIds = await recordEventDeliveries(transaction, { taskId, lastSequence: item.row.last_sequence }, item.events, configs, options);
      const notice = item.journal.notice === null ? null : { taskId, lastSequence: item.journal.lastSequence, ends: item.journal.ends };
      const write = { events: item.events.length, revision: item.revision, deliveryIds, notice, state: 'TASK_STATE_COMPLETED' as const, statusTimestamp: item.row.tx_now, lastSequence: item.journal.lastSequence };
      const content = { sealed: item.stored.sealed, answerLevel: item.row.answer_level, directMessage: item.directMessage };
      results[item.index] = { settled: true, run, journaled: { write, task: journaledTaskRow(item.row, run, write, content) } };
    }
  }

  // Everything else, one by one in the same transaction, exactly as alone.
  for (const [index, input] of inputs.entries()) {
    if (results[index] === null) results[index] = await completeRunWithin(transaction, sealer, logger, input);
  }
  return results as CompletionResult[];
}

type CommonCompletionRows = [
  audit: readonly AuditRow[],
  results: ReadonlyArray<ReturnType<typeof taskResultRow>>,
  settles: ReadonlyArray<ReturnType<typeof settleRow>>,
  journal: readonly JournalRow[],
  notices: readonly string[],
];

/**
 * The batch's one writing statement: its audit rows, results with watermarks, settles, journal
 * rows and NOTIFYs, returning the settled runs with their tasks' push configs. One text for any
 * batch (rows as arrays): prepared on each connection (decision 0030) and built once (decision 0035).
 */
export const commonCompletionStatement = new SameTextStatement(
  ([audit, results, settles, journal, notices]: CommonCompletionRows) => sql.type(settledRow)`${PREPARED}
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

async function writeCommonCompletions(transaction: CommonQueryMethods, items: readonly Prepared[]): Promise<Map<string, z.infer<typeof settledRow>>> {
  const journal: JournalRow[] = items.flatMap((item) => item.journal.rows);
  const notices = items.flatMap((item) => (item.journal.notice === null ? [] : [item.journal.notice]));
  const rows = await transaction.any(
    commonCompletionStatement.with([
      items.flatMap((item) => auditRowsOf(item.input.runId, item.audit)),
      items.map(({ row, stored, directMessage, revision, journal: written }) =>
        taskResultRow({ taskId: row.task_id!, stored, directMessage, answerLevel: row.answer_level, revision, lastSequence: written.lastSequence }),
      ),
      items.map(({ input }) => settleRow({ runId: input.runId, workerId: input.workerId, reason: input.reason, totals: input.totals })),
      journal,
      notices,
    ]),
  );
  const first = rows[0];
  if (rows.length !== items.length || !first || first.results !== items.length || first.events !== journal.length || first.notified !== notices.length) {
    throw new Error(
      `batched completion wrote ${first?.results ?? 0} of ${items.length} results, settled ${rows.length}, journaled ${first?.events ?? 0} of ${journal.length} events`,
    );
  }
  return new Map(rows.map((row) => [row.id, row]));
}
