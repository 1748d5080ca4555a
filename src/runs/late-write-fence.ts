import { sql, type DatabasePool } from 'slonik';
import { z } from 'zod';
import type { KeelLogger } from '../log/logger.js';
import { appendRunEvent } from './run-event-repository.js';
import type { Holder } from './run-repository.js';

// Fencing (docs/reliability.md, "Fencing"; decision 0088): every write a worker makes for the run
// it holds carries its claim's token, and the database refuses it once the run's claim changed (a
// requeue or a dead-letter by the reaper after the lease expired, another claim since). The worker
// that comes back late learns it from those refusals; this collects them during one drive of the
// run and records them once in the run's timeline, as a `late_write_refused` event naming the
// worker, its claim and what was refused.

/** A write of a held run the fence can refuse. */
export type FencedWrite = 'audit_rows' | 'completion' | 'failure' | 'suspension' | 'outputs' | 'progress' | 'non_idempotent_mark';

/** How long a refusal waits to be recorded while another worker drives the run (its trail owns the next sequence numbers). */
const RECORD_WITHIN_MS = 15 * 60_000;
const RECORD_RETRY_MS = 1000;

const fencedRun = z.object({ status: z.string(), claimed_by: z.string().nullable(), claim_token: z.string().nullable(), audit_level: z.string() });

/** What recording the refusals found: stored, nothing to store (the claim is still this one: a cancel refused the write), or the run held by another claim now. */
export type RefusalRecord = 'recorded' | 'not_fenced' | 'held_elsewhere';

/**
 * The refusals of one drive's writes, recorded in the run's timeline when the drive ends. A write
 * refused while the run still holds this claim (a cancel settled it: the claim stays) is not a
 * fencing refusal and is not recorded here (the cancel's own events say what happened).
 */
export class LateWriteFence {
  private readonly refused = new Map<FencedWrite, number>();

  constructor(
    readonly runId: string,
    readonly holder: Holder,
  ) {}

  /** A write of this claim was refused (`count`: its rows, for audit rows). */
  refuse(write: FencedWrite, count = 1): void {
    this.refused.set(write, (this.refused.get(write) ?? 0) + count);
  }

  get anyRefused(): boolean {
    return this.refused.size > 0;
  }

  /** What was refused, by write: `{ completion: 1, audit_rows: 4 }`. */
  refusedWrites(): Record<string, number> {
    return Object.fromEntries(this.refused);
  }

  /**
   * Records the refusals in the timeline once the run is driven by no other claim (the event
   * takes the next sequence number under the run's lock, which a trail being written elsewhere
   * would take too), trying again every second for up to fifteen minutes; logs what it recorded.
   */
  async record(pool: DatabasePool, logger: KeelLogger, withinMs = RECORD_WITHIN_MS): Promise<RefusalRecord> {
    if (!this.anyRefused) return 'not_fenced';
    const givesUpAt = Date.now() + withinMs;
    for (;;) {
      const outcome = await recordRefusal(pool, this.runId, this.holder, this.refusedWrites());
      if (outcome !== 'held_elsewhere' || Date.now() >= givesUpAt) {
        if (outcome === 'recorded') {
          logger.warn({ runId: this.runId, worker: this.holder.workerId, claim: this.holder.token, refused: this.refusedWrites() }, 'late writes of a lost claim were refused by its fence; the run was taken over');
        } else if (outcome === 'held_elsewhere') {
          logger.warn({ runId: this.runId, claim: this.holder.token, refused: this.refusedWrites() }, 'late writes were refused by the fence; the refusal could not be recorded while another worker drives the run');
        }
        return outcome;
      }
      await new Promise((resolve) => setTimeout(resolve, RECORD_RETRY_MS).unref());
    }
  }
}

/**
 * One try at recording a refusal: under the run row's lock, stored when the run's claim is no
 * longer `holder`'s and no worker holds it now. Meta only (worker, claim, what was refused, the
 * run as it stands), at every audit level but none.
 */
export async function recordRefusal(pool: DatabasePool, runId: string, holder: Holder, refused: Record<string, number>): Promise<RefusalRecord> {
  return pool.transaction(async (transaction) => {
    const run = await transaction.maybeOne(sql.type(fencedRun)`SELECT status, claimed_by, claim_token, audit_level FROM runs WHERE id = ${runId} FOR UPDATE`);
    if (run === null || run.claim_token === holder.token) return 'not_fenced';
    if (run.claimed_by !== null) return 'held_elsewhere';
    if (run.audit_level !== 'none') {
      await appendRunEvent(transaction, runId, 'late_write_refused', { worker: holder.workerId, claim: holder.token, refused, status: run.status });
    }
    return 'recorded';
  });
}
