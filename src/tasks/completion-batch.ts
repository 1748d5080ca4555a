import type { DatabasePool } from 'slonik';
import { GroupCommit } from '../db/group-commit.js';
import type { KeelLogger } from '../log/logger.js';
import type { Sealer } from '../sealing/sealer.js';
import type { CompletionInput, CompletionResult } from './complete-run.js';
import { completeRunsTogether } from './complete-runs-together.js';

// Group commit of completions (docs/decisions/0026-group-commit.md): the completions of runs that
// end at the same moment in this process are one transaction, two statements for the common case
// (completeRunsTogether: lock all, write all), so they pay one round trip per statement, one
// COMMIT and one WAL flush between them. A batch that fails rolls back as a whole, and each of its
// completions is written again alone (a batch of one in a transaction of its own), so one bad
// run (a result that cannot be stored) fails alone and the others complete.

export class CompletionBatch {
  private readonly group: GroupCommit<CompletionInput, CompletionResult>;

  constructor(pool: DatabasePool, sealer: Sealer, logger: KeelLogger, options: { maxBatch: number; lanes?: number; onBatch?: (size: number) => void }) {
    this.group = new GroupCommit({
      writeBatch: (inputs) => pool.transaction((transaction) => completeRunsTogether(transaction, sealer, logger, inputs)),
      // A lone completion (or one written again after its batch failed) takes the same two
      // statements: the common path needs no more round trips for one run than for many.
      writeOne: async (input) => (await pool.transaction((transaction) => completeRunsTogether(transaction, sealer, logger, [input])))[0]!,
      rolledBack: (input) => input.rolledBack?.(),
      maxBatch: options.maxBatch,
      ...(options.lanes ? { lanes: options.lanes } : {}),
      ...(options.onBatch ? { onBatch: options.onBatch } : {}),
    });
  }

  /** Completes the run with whatever other completions are ready; resolves once its transaction committed. */
  complete(input: CompletionInput): Promise<CompletionResult> {
    return this.group.submit(input);
  }
}
