import { sql, type DatabasePool } from 'slonik';
import { z } from 'zod';
import type { TerminationReason } from '../../machines/run.machine.js';
import type { KeelLogger } from '../log/logger.js';
import type { PrivacyLevel } from '../privacy/privacy-level.js';
import type { Sealer } from '../sealing/sealer.js';
import { appendRunOutputs } from './run-output-repository.js';
import { settleRun, type RunTotals, type SettleResult } from './run-repository.js';

export type CompletionInput = {
  runId: string;
  workerId: string;
  reason: Extract<TerminationReason, 'completed' | 'max_iterations' | 'budget_exhausted'>;
  answer: string | null;
  totals: RunTotals;
};

const lockedRun = z.object({ status: z.string(), claimed_by: z.string().nullable(), answer_level: z.string(), revision: z.number() });

/**
 * Completion is one transaction: under the run-row lock, reread the answer ceiling, write the
 * answer at that level, and move the run to COMPLETED. If the answer cannot be written the run is
 * not completed (the transaction rolls back and the caller fails the run).
 */
export async function completeRun(pool: DatabasePool, sealer: Sealer, logger: KeelLogger, input: CompletionInput): Promise<SettleResult> {
  return pool.transaction(async (transaction) => {
    const run = await transaction.maybeOne(sql.type(lockedRun)`
      SELECT status, claimed_by, answer_level, revision FROM runs WHERE id = ${input.runId} FOR UPDATE`);
    if (!run || run.status !== 'running' || run.claimed_by !== input.workerId) {
      return settleRun(transaction, logger, input.runId, { status: 'completed', reason: input.reason, workerId: input.workerId, totals: input.totals });
    }
    if (input.answer !== null) {
      await appendRunOutputs(transaction, sealer, input.runId, run.revision + 1, run.answer_level as PrivacyLevel, [
        { kind: 'answer', artifactId: 'answer', append: false, lastChunk: true, content: { artifactId: 'answer', name: 'answer', parts: [{ text: input.answer }] } },
      ]);
    }
    return settleRun(transaction, logger, input.runId, { status: 'completed', reason: input.reason, workerId: input.workerId, totals: input.totals });
  });
}
