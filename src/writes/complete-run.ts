import type { DatabasePool } from 'slonik';
import type { KeelLogger } from '../log/logger.js';
import type { Sealer } from '../sealing/sealer.js';
import { completeRunsTogether } from './complete-runs-together.js';
import type { CompletionInput, CompletionResult } from './completion-input.js';

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
