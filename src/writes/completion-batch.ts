import type { DatabasePool } from 'slonik';
import { GroupCommit, type BatchOptions } from '../db/group-commit.js';
import type { KeelLogger } from '../log/logger.js';
import type { Sealer } from '../sealing/sealer.js';
import { completeHeldRuns, writableHeld, type HeldCompletion } from './complete-held-runs.js';
import type { CompletionInput, CompletionResult } from './completion-input.js';
import type { HeldCompleter } from './task-write-batch.js';
import { completeRunsTogether } from './complete-runs-together.js';

// Group commit of completions (docs/decisions/0026-group-commit.md): the completions of runs that
// end at the same moment in this process are written together. Those whose rows the process knows
// (fast runs, decision 0029) are one statement per batch that checks those rows under its lock
// (complete-held-runs.ts): one round trip and one commit. The others, and any whose rows had
// changed, are one transaction of two statements per batch (completeRunsTogether: lock all, write
// all). Each kind is a group commit of its own, so a batch always commits as a whole or not at
// all; one that fails is written again completion by completion, so one bad run (a result that
// cannot be stored) fails alone and the others complete. In a process that also receives tasks,
// the held completions go with the new tasks' creations (task-write-batch.ts, decision 0048).

export class CompletionBatch {
  /** Completions written by one statement; null for one whose rows had changed (nothing written). */
  private readonly held: HeldCompleter;
  private readonly transactions: GroupCommit<CompletionInput, CompletionResult>;

  /** `held`: the writer of held completions shared with the creations (TaskWriteBatch); without it, a group commit of their own. */
  constructor(pool: DatabasePool, sealer: Sealer, logger: KeelLogger, options: BatchOptions, held?: HeldCompleter) {
    const common = {
      ...options,
      rolledBack: (input: CompletionInput) => input.rolledBack?.(),
      trace: { name: 'keel.completion_batch' },
    };
    if (held) this.held = held;
    else {
      const group = new GroupCommit<HeldCompletion, CompletionResult | null>({
        ...common,
        writeBatch: (inputs) => completeHeldRuns(pool, sealer, inputs),
        writeOne: async (input) => (await completeHeldRuns(pool, sealer, [input]))[0]!,
      });
      this.held = { completeHeld: (completion) => group.submit(completion) };
    }
    const inTransaction = (inputs: readonly CompletionInput[]) => pool.transaction((transaction) => completeRunsTogether(transaction, sealer, logger, inputs));
    this.transactions = new GroupCommit<CompletionInput, CompletionResult>({
      ...common,
      writeBatch: inTransaction,
      // A lone completion takes the same two statements: the common path needs no more round trips for one run than for many.
      writeOne: async (input) => (await inTransaction([input]))[0]!,
    });
  }

  /** Completes the run with whatever other completions are ready; resolves once its write committed. */
  async complete(input: CompletionInput): Promise<CompletionResult> {
    if (writableHeld(input)) {
      const written = await this.held.completeHeld(input);
      if (written) return written;
    }
    return this.transactions.submit(input);
  }
}
