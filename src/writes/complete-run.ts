import { sql, type CommonQueryMethods, type DatabasePool } from 'slonik';
import { z } from 'zod';
import type { AnswerPresentation } from '../../machines/agent-loop.machine.js';
import type { CompletionReason, TerminationReason } from '../../machines/run.machine.js';
import type { KeelLogger } from '../log/logger.js';
import { answerIsRetainable } from '../privacy/resolve-ceilings.js';
import type { PrivacyLevel } from '../privacy/privacy-level.js';
import type { Sealer } from '../sealing/sealer.js';
import { DEFAULT_PROJECTION_OPTIONS, journalEventsSince, writeJournalEvents, type JournalWrite, type ProjectionOptions } from '../tasks/journal-writer.js';
import { openSealed, scrubTaskContent, type TaskRow } from '../tasks/task-repository.js';
import type { Artifact, Message, TaskState } from '../protocol/wire.js';
import type { SerializedRow } from '../runs/audit-trail.js';
import { appendRunOutputs, deleteRunOutputs, listRunOutputs, type NewRunOutput, type StoredRunOutput } from '../runs/run-output-repository.js';
import type { RunRow } from '../runs/run-row.js';
import { settleRun, type RunTotals, type SettleResult } from '../runs/run-repository.js';
import { journaledTaskRow, journalHeadOf, type KnownRows } from './completion-record.js';
import { completeRunsTogether } from './complete-runs-together.js';

/**
 * What the completion of a held run expects its run and task rows to be (a fast run: as its
 * insert wrote them; complete-held-runs.ts): the rows its completion record is built from.
 */
export type HeldRows = KnownRows & { startedAt: number };

export type CompletionInput = {
  runId: string;
  workerId: string;
  reason: CompletionReason;
  answer: string | null;
  presentation?: AnswerPresentation;
  totals: RunTotals;
  /** Runs inside the completion transaction first (the audit trail's last events). */
  beforeSettle?: (transaction: CommonQueryMethods) => Promise<unknown>;
  /**
   * The audit trail's last events as rows that can ride in the statement writing the task's result
   * (AuditTrail.takeUnrefusableRows; null when one could be refused); what it does not take,
   * beforeSettle writes. Given the transaction they ride in, which gives them back if it rolls back
   * (before a retry too); a statement committed on its own passes none, and `rolledBack` gives back.
   */
  takeAuditRows?: (transaction?: CommonQueryMethods) => SerializedRow[] | null;
  /** The run serves this A2A task (runs.task_id), so task and run are locked together. */
  taskId: string | null;
  /** False when the run stored no artifacts: nothing to merge into the result or to journal. */
  hasOutputs: boolean;
  /**
   * Artifacts that are part of the result itself (a statechart agent's output), written under the
   * completion's lock at the revision its settle reaches, then merged and journaled with the rest.
   */
  resultOutputs?: readonly NewRunOutput[];
  /** The push outbox's bounds, for the deliveries written with the journal. */
  projection?: ProjectionOptions;
  /**
   * The run and task rows as this process knows them without reading (a fast run's insert): the
   * completion is then written by one statement that checks them under its lock
   * (complete-held-runs.ts, decision 0029), and by the transaction only when they changed.
   */
  held?: HeldRows;
  /**
   * The transaction these writes rode in rolled back (a batch it shared with other runs failed):
   * what it took from the run (its audit rows) is given back before the completion is written again.
   */
  rolledBack?: () => void;
};

/**
 * A run's end as its own transaction journaled it: the journal write (events, deliveries, the
 * NOTIFY) and the task row as that transaction left it, built from what it wrote, for answering a
 * blocking request in this process once the COMMIT has returned.
 */
export type JournaledEnd = { write: JournalWrite; task: TaskRow };

/**
 * What a completion tells its caller of the run it settled: what the caller and the journal's
 * answer read, so a completion need not return (and parse) the whole row.
 */
export type SettledRun = Pick<RunRow, 'id' | 'task_id' | 'status' | 'termination_reason' | 'failure_detail'>;

/** The settle, and the journal write that came with it (null when nothing was journaled). */
export type CompletionResult = ({ settled: true; run: SettledRun } | Extract<SettleResult, { settled: false }>) & { journaled: JournaledEnd | null };

const lockedRun = z.object({
  status: z.string(),
  claimed_by: z.string().nullable(),
  answer_level: z.string(),
  revision: z.number(),
  task_id: z.string().nullable(),
  started_at: z.number().nullable(),
  // Whether the run stored artifacts (read only when the caller says it may have).
  has_outputs: z.boolean(),
});
const lockedTask = z.object({
  context_id: z.string(),
  owner: z.string(),
  agent: z.string(),
  task_answer_level: z.string(),
  metadata: z.record(z.unknown()),
  task_created_at: z.number(),
  status_message: z.instanceof(Buffer).nullable(),
  artifacts: z.instanceof(Buffer).nullable(),
  history: z.instanceof(Buffer).nullable(),
  direct_message: z.boolean(),
  projected_revision: z.number(),
  last_sequence: z.number(),
  projected_state: z.string(),
});
type LockedTask = z.infer<typeof lockedTask>;
type Locked = { run: z.infer<typeof lockedRun>; task: LockedTask | null };

/**
 * The run row, and the task row with it (run first, task second: the order every transition takes
 * through the state trigger), in one statement, with what journaling the run's end needs: the
 * task's watermark and stored content.
 */
async function lockRunAndTask(transaction: CommonQueryMethods, runId: string, taskId: string | null, hasOutputs: boolean): Promise<Locked | null> {
  const outputs = hasOutputs ? sql.fragment`EXISTS (SELECT 1 FROM run_outputs o WHERE o.run_id = r.id AND o.kind IN ('artifact', 'status'))` : sql.fragment`false`;
  if (taskId === null) {
    const run = await transaction.maybeOne(sql.type(lockedRun)`
      SELECT r.status, r.claimed_by, r.answer_level, r.revision, r.task_id, r.started_at, ${outputs} AS has_outputs
      FROM runs r WHERE r.id = ${runId} FOR UPDATE`);
    return run && { run, task: null };
  }
  const row = await transaction.maybeOne(sql.type(lockedRun.merge(lockedTask))`
    SELECT r.status, r.claimed_by, r.answer_level, r.revision, r.task_id, r.started_at, ${outputs} AS has_outputs,
      t.context_id, t.owner, t.agent, t.answer_level AS task_answer_level, t.metadata, t.created_at AS task_created_at,
      t.status_message, t.artifacts, t.history, t.direct_message, t.projected_revision, t.last_sequence, t.projected_state
    FROM runs r JOIN a2a_tasks t ON t.id = r.task_id
    WHERE r.id = ${runId} FOR UPDATE OF r, t`);
  if (!row) return null;
  const { status, claimed_by, answer_level, revision, task_id, started_at, has_outputs, ...task } = row;
  return { run: { status, claimed_by, answer_level, revision, task_id, started_at, has_outputs }, task };
}

/** The task's content after a failure's settle: opened for the journal's events, sealed as the row holds it. */
type EndContent = {
  statusMessage: () => Message | null;
  artifacts: () => Artifact[];
  sealed: { statusMessage: Buffer | null; artifacts: Buffer | null; history: Buffer | null };
  directMessage: boolean;
  answerLevel: string;
};

/**
 * Journals a failed run's end in the transaction that settled it
 * (docs/decisions/0022-completion-writes-the-journal.md): the events from the task's watermark up
 * to the settled revision, built and written by the code the projector uses (journal-writer.ts),
 * so a later projection of this revision finds it journaled and writes nothing, and an event
 * journaled by either names the same delivery. A completion's own journal is its record's
 * (completion-record.ts).
 */
async function journalEnd(
  transaction: CommonQueryMethods,
  sealer: Sealer,
  task: LockedTask,
  settled: RunRow,
  content: EndContent,
  outputs: readonly StoredRunOutput[],
  options: ProjectionOptions,
): Promise<JournaledEnd> {
  const taskId = settled.task_id!;
  const known = {
    projectedRevision: task.projected_revision,
    lastSequence: task.last_sequence,
    projectedState: task.projected_state as TaskState,
    task: { contextId: task.context_id, owner: task.owner, agent: task.agent, metadata: task.metadata, createdAt: task.task_created_at },
  };
  const head = journalHeadOf(taskId, known, content);
  const run = {
    runId: settled.id,
    status: settled.status,
    revision: settled.revision,
    startedAt: settled.started_at,
    statusChangedAt: settled.status_changed_at,
    terminationReason: settled.termination_reason,
    failureDetail: settled.failure_detail,
  };
  const write = await writeJournalEvents(transaction, sealer, head, run, journalEventsSince(head, run, outputs), options);
  return { write, task: journaledTaskRow(known.task, settled, write, content) };
}

/** The task's content as the locked row holds it (a settle that writes no result leaves it as it is). */
const storedContent = (sealer: Sealer, taskId: string, task: LockedTask): EndContent => ({
  statusMessage: () => openSealed<Message | null>(sealer, taskId, 'status_message', task.status_message, null),
  artifacts: () => openSealed<Artifact[]>(sealer, taskId, 'artifacts', task.artifacts, []),
  sealed: { statusMessage: task.status_message, artifacts: task.artifacts, history: task.history },
  directMessage: task.direct_message,
  answerLevel: task.task_answer_level,
});

/**
 * Completion is one transaction (docs/architecture.md, "The write path"): under the run-row lock,
 * reread the answer ceiling, write the sealed result (to the task row for an A2A task, else to
 * run_outputs), and move run and task to COMPLETED together. A ceiling that no longer lets the
 * result be kept fails the run instead (`result_not_retainable`) with nothing stored. If the result
 * cannot be written the transaction rolls back and the caller fails the run: a COMPLETED task
 * always has its result. The same transaction journals the run's end (its events and push
 * deliveries, at the settled revision) and NOTIFYs, committing synchronously. A completion alone is
 * a batch of one (complete-runs-together.ts): the same record, the same statements.
 */
export async function completeRun(pool: DatabasePool, sealer: Sealer, logger: KeelLogger, input: CompletionInput): Promise<CompletionResult> {
  return pool.transaction(async (transaction) => (await completeRunsTogether(transaction, sealer, logger, [input]))[0]!);
}

/**
 * A completion the batch's statement does not write, in the caller's transaction: a run this
 * worker no longer holds (the settle refuses it), a run without a task (its answer goes to
 * run_outputs), or a ceiling that keeps no result (the run fails, nothing stored, the failure
 * journaled).
 */
export async function completeRunAlone(transaction: CommonQueryMethods, sealer: Sealer, logger: KeelLogger, input: CompletionInput): Promise<CompletionResult> {
  const options = input.projection ?? DEFAULT_PROJECTION_OPTIONS;
  const locked = await lockRunAndTask(transaction, input.runId, input.taskId, input.hasOutputs);
  const settle = async (): Promise<CompletionResult> => ({
    ...(await settleRun(transaction, logger, input.runId, { status: 'completed', reason: input.reason, workerId: input.workerId, totals: input.totals })),
    journaled: null,
  });
  if (!locked || locked.run.status !== 'running' || locked.run.claimed_by !== input.workerId) return settle();
  const { run, task } = locked;
  const level = run.answer_level as PrivacyLevel;

  if (run.task_id === null || task === null) {
    await input.beforeSettle?.(transaction);
    if (input.answer !== null) {
      await appendRunOutputs(transaction, sealer, input.runId, run.revision + 1, level, [
        { kind: 'answer', artifactId: 'answer', append: false, lastChunk: true, content: { artifactId: 'answer', name: 'answer', parts: [{ text: input.answer }] } },
      ]);
    }
    return settle();
  }
  if (answerIsRetainable(level)) {
    // A held run serving a task whose result may be kept is always the batch's (complete-runs-together.ts).
    throw new Error(`completion of run ${input.runId}: it serves task ${run.task_id}, not ${input.taskId ?? 'none'}`);
  }

  await input.beforeSettle?.(transaction);
  await deleteRunOutputs(transaction, input.runId);
  await scrubTaskContent(transaction, run.task_id);
  const failed = await settleRun(transaction, logger, input.runId, {
    status: 'failed',
    reason: 'result_not_retainable',
    workerId: input.workerId,
    totals: input.totals,
    failureDetail: { answerLevel: level },
  });
  if (!failed.settled) return { ...failed, journaled: null };
  // Nothing of the content is left to journal: no outputs, no status message, no artifacts.
  const scrubbed: EndContent = {
    statusMessage: () => null,
    artifacts: () => [],
    sealed: { statusMessage: null, artifacts: null, history: null },
    directMessage: task.direct_message,
    answerLevel: task.task_answer_level,
  };
  return { ...failed, journaled: await journalEnd(transaction, sealer, task, failed.run, scrubbed, [], options) };
}

export type FailureInput = {
  runId: string;
  workerId: string;
  reason: TerminationReason;
  errorClass?: string | null;
  failureDetail?: Record<string, unknown> | null;
  totals?: RunTotals;
  /** The run serves this A2A task (runs.task_id): then the failure is journaled with the settle. */
  taskId: string | null;
  /** False when the run stored no artifacts: none to journal. */
  hasOutputs: boolean;
  projection?: ProjectionOptions;
};

/**
 * The worker's own failure of the run it holds, the completion's other ending: a guarded settle to
 * `failed` which, for a run serving a task, journals the failure in the same transaction as the
 * completion does (the task's status message as the row holds it, or the one derived from the
 * termination reason). A run the worker no longer holds is refused, as settleRun refuses it.
 */
export async function failHeldRun(pool: DatabasePool, sealer: Sealer, logger: KeelLogger, input: FailureInput): Promise<CompletionResult> {
  const settleInput = {
    status: 'failed' as const,
    reason: input.reason,
    workerId: input.workerId,
    ...(input.errorClass === undefined ? {} : { errorClass: input.errorClass }),
    ...(input.failureDetail === undefined ? {} : { failureDetail: input.failureDetail }),
    ...(input.totals === undefined ? {} : { totals: input.totals }),
  };
  // A run without a task has no journal: the settle alone, one statement.
  if (input.taskId === null) return { ...(await settleRun(pool, logger, input.runId, settleInput)), journaled: null };
  const options = input.projection ?? DEFAULT_PROJECTION_OPTIONS;
  return pool.transaction(async (transaction): Promise<CompletionResult> => {
    const locked = await lockRunAndTask(transaction, input.runId, input.taskId, input.hasOutputs);
    const failed = await settleRun(transaction, logger, input.runId, settleInput);
    if (!failed.settled || !locked?.task || failed.run.task_id === null) return { ...failed, journaled: null };
    const outputs = locked.run.has_outputs ? await listRunOutputs(transaction, sealer, input.runId) : [];
    return { ...failed, journaled: await journalEnd(transaction, sealer, locked.task, failed.run, storedContent(sealer, failed.run.task_id, locked.task), outputs, options) };
  });
}
