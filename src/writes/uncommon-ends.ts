import { sql, type CommonQueryMethods, type DatabasePool } from 'slonik';
import { z } from 'zod';
import type { KeelLogger } from '../log/logger.js';
import { answerIsRetainable } from '../privacy/resolve-ceilings.js';
import type { PrivacyLevel } from '../privacy/privacy-level.js';
import type { Sealer } from '../sealing/sealer.js';
import { DEFAULT_PROJECTION_OPTIONS, journalEventsSince, writeJournalEvents, type ProjectionOptions } from '../tasks/journal-writer.js';
import { openSealed, recordAgentStatusMessage, scrubTaskContent } from '../tasks/task-repository.js';
import type { Artifact, Message, TaskState } from '../protocol/wire.js';
import { appendRunOutputs, deleteRunOutputs, listRunOutputs, type StoredRunOutput } from '../runs/run-output-repository.js';
import type { RunRow } from '../runs/run-row.js';
import { settleRun } from '../runs/run-repository.js';
import { journaledTaskRow, journalHeadOf } from './completion-record.js';
import type { CompletionInput, CompletionResult, FailureInput, JournaledEnd } from './completion-input.js';

// The ends of a run that no completion record covers (completion-record.ts): a run the worker no
// longer holds (its settle is refused), a run without a task, a ceiling that keeps no result, and
// a failure the worker settles. Each is one transaction that locks the run and task rows first and
// journals the end through the projector's own writer (journal-writer.ts).

const lockedRun = z.object({
  status: z.string(),
  claimed_by: z.string().nullable(),
  claim_token: z.string().nullable(),
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
      SELECT r.status, r.claimed_by, r.claim_token, r.answer_level, r.revision, r.task_id, r.started_at, ${outputs} AS has_outputs
      FROM runs r WHERE r.id = ${runId} FOR UPDATE`);
    return run && { run, task: null };
  }
  const row = await transaction.maybeOne(sql.type(lockedRun.merge(lockedTask))`
    SELECT r.status, r.claimed_by, r.claim_token, r.answer_level, r.revision, r.task_id, r.started_at, ${outputs} AS has_outputs,
      t.context_id, t.owner, t.agent, t.answer_level AS task_answer_level, t.metadata, t.created_at AS task_created_at,
      t.status_message, t.artifacts, t.history, t.direct_message, t.projected_revision, t.last_sequence, t.projected_state
    FROM runs r JOIN a2a_tasks t ON t.id = r.task_id
    WHERE r.id = ${runId} FOR UPDATE OF r, t`);
  if (!row) return null;
  const { status, claimed_by, claim_token, answer_level, revision, task_id, started_at, has_outputs, ...task } = row;
  return { run: { status, claimed_by, claim_token, answer_level, revision, task_id, started_at, has_outputs }, task };
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
 * A completion the batch's statement does not write, in the caller's transaction: a run this
 * worker no longer holds (the settle refuses it), a run without a task (its answer goes to
 * run_outputs), or a ceiling that keeps no result (the run fails, nothing stored, the failure
 * journaled).
 */
export async function completeRunAlone(transaction: CommonQueryMethods, sealer: Sealer, logger: KeelLogger, input: CompletionInput): Promise<CompletionResult> {
  const options = input.projection ?? DEFAULT_PROJECTION_OPTIONS;
  const locked = await lockRunAndTask(transaction, input.runId, input.taskId, input.hasOutputs);
  const settle = async (): Promise<CompletionResult> => ({
    ...(await settleRun(transaction, logger, input.runId, { status: 'completed', reason: input.reason, holder: input.holder, totals: input.totals })),
    journaled: null,
  });
  if (!locked || locked.run.status !== 'running' || locked.run.claimed_by !== input.holder.workerId || locked.run.claim_token !== input.holder.token) return settle();
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
    holder: input.holder,
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
    holder: input.holder,
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
    let content = storedContent(sealer, failed.run.task_id, locked.task);
    if (input.statusText !== undefined) {
      // The failure's own status message, in the settle's transaction: it joins the history, as a
      // completion's final message does, and the journal's FAILED event carries it.
      const taskId = failed.run.task_id;
      const message: Message = { messageId: `${taskId}-failure-${failed.run.revision}`, role: 'ROLE_AGENT', parts: [{ text: input.statusText }], taskId };
      const written = await recordAgentStatusMessage(transaction, sealer, taskId, locked.run.answer_level as PrivacyLevel, message);
      if (written) content = { ...content, statusMessage: () => written.statusMessage, sealed: { ...content.sealed, ...written.sealed } };
    }
    return { ...failed, journaled: await journalEnd(transaction, sealer, locked.task, failed.run, content, outputs, options) };
  });
}
