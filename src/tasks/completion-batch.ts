import type { DatabasePool } from 'slonik';
import { GroupCommit } from '../db/group-commit.js';
import { isConnectionError } from '../db/pool.js';
import type { KeelLogger } from '../log/logger.js';
import type { Sealer } from '../sealing/sealer.js';
import { completeHeldRuns, writableHeld } from './complete-held-runs.js';
import type { CompletionInput, CompletionResult } from './complete-run.js';
import { completeRunsTogether } from './complete-runs-together.js';

// Group commit of completions (docs/decisions/0026-group-commit.md): the completions of runs that
// end at the same moment in this process are written together. Those whose rows the process knows
// (fast runs, decision 0029) go first, in one statement of their own that checks those rows under
// its lock (complete-held-runs.ts): one round trip and one commit. The others, and any whose rows
// had changed, are one transaction of two statements (completeRunsTogether: lock all, write all).
// A batch that fails before anything of it committed rolls back as a whole, and each of its
// completions is written again alone, so one bad run (a result that cannot be stored) fails alone
// and the others complete.

/** A completion's outcome inside a batch: its own error when it failed after others of its batch committed. */
type Outcome = { ok: true; result: CompletionResult } | { ok: false; error: unknown };

export class CompletionBatch {
  private readonly group: GroupCommit<CompletionInput, Outcome>;

  constructor(pool: DatabasePool, sealer: Sealer, logger: KeelLogger, options: { maxBatch: number; lanes?: number; onBatch?: (size: number) => void }) {
    const inTransaction = (inputs: readonly CompletionInput[]) => pool.transaction((transaction) => completeRunsTogether(transaction, sealer, logger, inputs));

    const writeAll = async (inputs: readonly CompletionInput[]): Promise<Outcome[]> => {
      const outcomes: Array<Outcome | null> = inputs.map(() => null);
      const held = inputs.flatMap((input, index) => (writableHeld(input) ? [index] : []));
      if (held.length > 0) {
        // A failure here wrote nothing: it propagates, and GroupCommit writes each completion again alone.
        const written = await completeHeldRuns(
          pool,
          sealer,
          held.map((index) => inputs[index] as CompletionInput & { held: NonNullable<CompletionInput['held']> }),
        );
        held.forEach((index, at) => {
          const result = written[at];
          if (result) outcomes[index] = { ok: true, result };
        });
      }
      const rest = outcomes.flatMap((outcome, index) => (outcome === null ? [index] : []));
      if (rest.length === 0) return outcomes as Outcome[];
      const committedAlready = rest.length < inputs.length;
      try {
        const written = await inTransaction(rest.map((index) => inputs[index]!));
        rest.forEach((index, at) => (outcomes[index] = { ok: true, result: written[at]! }));
      } catch (error) {
        // Nothing of the batch committed: GroupCommit handles it (each again alone, or a lost
        // connection's error to each caller).
        if (!committedAlready) throw error;
        // Some completions of the batch committed: the others are handled here as GroupCommit would.
        for (const index of rest) {
          const input = inputs[index]!;
          input.rolledBack?.();
          if (isConnectionError(error)) {
            outcomes[index] = { ok: false, error };
            continue;
          }
          outcomes[index] = await inTransaction([input]).then(
            ([result]) => ({ ok: true as const, result: result! }),
            (failure: unknown) => ({ ok: false as const, error: failure }),
          );
        }
      }
      return outcomes as Outcome[];
    };

    this.group = new GroupCommit({
      writeBatch: writeAll,
      // A lone completion takes the same path: one statement when its rows are known, else the two of the transaction.
      writeOne: async (input) => (await writeAll([input]))[0]!,
      rolledBack: (input) => input.rolledBack?.(),
      maxBatch: options.maxBatch,
      ...(options.lanes ? { lanes: options.lanes } : {}),
      ...(options.onBatch ? { onBatch: options.onBatch } : {}),
    });
  }

  /** Completes the run with whatever other completions are ready; resolves once its write committed. */
  async complete(input: CompletionInput): Promise<CompletionResult> {
    const outcome = await this.group.submit(input);
    if (!outcome.ok) throw outcome.error;
    return outcome.result;
  }
}
