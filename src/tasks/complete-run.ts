import { sql, type CommonQueryMethods, type DatabasePool, type FragmentSqlToken } from 'slonik';
import { z } from 'zod';
import type { AnswerPresentation } from '../../machines/agent-loop.machine.js';
import type { CompletionReason } from '../../machines/run.machine.js';
import type { KeelLogger } from '../log/logger.js';
import { answerIsRetainable } from '../privacy/resolve-ceilings.js';
import type { PrivacyLevel } from '../privacy/privacy-level.js';
import type { Sealer } from '../sealing/sealer.js';
import { mergeArtifacts } from './merge-artifacts.js';
import { scrubTaskContent, writeTaskResult } from './task-repository.js';
import type { Artifact, Message } from '../protocol/wire.js';
import { appendRunOutputs, deleteRunOutputs, listRunOutputs } from '../runs/run-output-repository.js';
import { settleRun, type RunTotals, type SettleResult } from '../runs/run-repository.js';

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
   * The audit trail's last events as an INSERT that can ride in the statement writing the task's
   * result (AuditTrail.takeUnrefusableInsert); what it does not take, beforeSettle writes.
   */
  takeAuditInsert?: () => FragmentSqlToken | null;
  /** The run serves this A2A task (runs.task_id), so task and run are locked together. */
  taskId: string | null;
  /** False when the run stored no artifacts: nothing to merge into the result. */
  hasOutputs: boolean;
};

const lockedRun = z.object({
  status: z.string(),
  claimed_by: z.string().nullable(),
  answer_level: z.string(),
  revision: z.number(),
  task_id: z.string().nullable(),
  context_id: z.string().nullable(),
  history: z.instanceof(Buffer).nullable(),
});

/**
 * Completion is one transaction (docs/architecture.md, "The life of a request", transaction 3):
 * under the run-row lock, reread the answer ceiling, write the sealed result (to the task row for
 * an A2A task, else to run_outputs), and move run and task to COMPLETED together. A ceiling that no
 * longer lets the result be kept fails the run instead (`result_not_retainable`) with nothing
 * stored. If the result cannot be written the transaction rolls back and the caller fails the run:
 * a COMPLETED task always has its result.
 */
export async function completeRun(pool: DatabasePool, sealer: Sealer, logger: KeelLogger, input: CompletionInput): Promise<SettleResult> {
  return pool.transaction(async (transaction) => {
    // The run row, and the task row with it (run first, task second: the order every transition
    // takes through the state trigger), in one statement.
    const run = input.taskId
      ? await transaction.maybeOne(sql.type(lockedRun)`
          SELECT r.status, r.claimed_by, r.answer_level, r.revision, r.task_id, t.context_id, t.history
          FROM runs r JOIN a2a_tasks t ON t.id = r.task_id
          WHERE r.id = ${input.runId} FOR UPDATE OF r, t`)
      : await transaction.maybeOne(sql.type(lockedRun)`
          SELECT status, claimed_by, answer_level, revision, task_id, NULL::text AS context_id, NULL::bytea AS history
          FROM runs WHERE id = ${input.runId} FOR UPDATE`);
    const settle = () =>
      settleRun(transaction, logger, input.runId, { status: 'completed', reason: input.reason, workerId: input.workerId, totals: input.totals });
    if (!run || run.status !== 'running' || run.claimed_by !== input.workerId) return settle();
    const level = run.answer_level as PrivacyLevel;
    // A result written to the task row carries the audit rows in the same statement.
    const auditInsert = run.task_id !== null && answerIsRetainable(level) ? (input.takeAuditInsert?.() ?? null) : null;
    await input.beforeSettle?.(transaction);

    if (run.task_id === null) {
      if (input.answer !== null) {
        await appendRunOutputs(transaction, sealer, input.runId, run.revision + 1, level, [
          { kind: 'answer', artifactId: 'answer', append: false, lastChunk: true, content: { artifactId: 'answer', name: 'answer', parts: [{ text: input.answer }] } },
        ]);
      }
      return settle();
    }

    if (!answerIsRetainable(level)) {
      await deleteRunOutputs(transaction, input.runId);
      await scrubTaskContent(transaction, run.task_id);
      return settleRun(transaction, logger, input.runId, {
        status: 'failed',
        reason: 'result_not_retainable',
        workerId: input.workerId,
        totals: input.totals,
        failureDetail: { answerLevel: level },
      });
    }

    const presentation = input.presentation ?? 'artifact';
    const artifacts: Artifact[] = input.hasOutputs ? mergeArtifacts(await listRunOutputs(transaction, sealer, input.runId)) : [];
    if (presentation === 'artifact' && input.answer !== null) {
      artifacts.push({ artifactId: `${run.task_id}-answer`, name: 'answer', parts: [{ text: input.answer }] });
    }
    const statusMessage: Message | null =
      presentation !== 'artifact' && input.answer !== null
        ? { messageId: `${run.task_id}-answer`, role: 'ROLE_AGENT', parts: [{ text: input.answer }], contextId: run.context_id ?? undefined, taskId: run.task_id }
        : null;
    await writeTaskResult(transaction, sealer, run.task_id, level, { artifacts, statusMessage, directMessage: presentation === 'direct_message' }, run.history, auditInsert);
    return settle();
  });
}
