import { sql, type CommonQueryMethods, type DatabasePool } from 'slonik';
import { z } from 'zod';

// run_events: the audit trail of a run, already reduced to the run's audit level by the caller.

const runEventRow = z.object({
  run_id: z.string(),
  sequence: z.number(),
  kind: z.string(),
  payload: z.unknown(),
  created_at: z.number(),
});
export type RunEventRow = z.infer<typeof runEventRow>;

/** Appends the next event of a run; the sequence is computed in the same statement. */
export async function appendRunEvent(db: CommonQueryMethods, runId: string, kind: string, payload: Record<string, unknown>): Promise<number> {
  return db.oneFirst(sql.type(z.object({ sequence: z.number() }))`
    INSERT INTO run_events (run_id, sequence, kind, payload)
    SELECT ${runId}, coalesce(max(sequence), 0) + 1, ${kind}, ${sql.jsonb(payload as never)}
    FROM run_events WHERE run_id = ${runId}
    RETURNING sequence`);
}

/**
 * Appends an event to the timeline of a run no worker writes any more (a cancelled run: its
 * discarded late result, its remote child cancelled), under the run row's lock, so writers after
 * the end (the cancel itself, the worker, the inbox) take their sequence numbers one at a time.
 * Meta only, never content: stored as it is at every audit level but none.
 */
export async function recordEndedRunEvent(db: DatabasePool, runId: string, kind: string, meta: Record<string, unknown>): Promise<boolean> {
  return db.transaction(async (transaction) => {
    const level = await transaction.maybeOneFirst(sql.type(z.object({ audit_level: z.string() }))`SELECT audit_level FROM runs WHERE id = ${runId} FOR UPDATE`);
    if (level === null || level === 'none') return false;
    await appendRunEvent(transaction, runId, kind, meta);
    return true;
  });
}

export async function listRunEvents(db: CommonQueryMethods, runId: string): Promise<readonly RunEventRow[]> {
  return db.any(sql.type(runEventRow)`
    SELECT run_id, sequence, kind, payload, created_at FROM run_events WHERE run_id = ${runId} ORDER BY sequence`);
}
