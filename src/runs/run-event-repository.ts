import { sql, type CommonQueryMethods } from 'slonik';
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

export async function listRunEvents(db: CommonQueryMethods, runId: string): Promise<readonly RunEventRow[]> {
  return db.any(sql.type(runEventRow)`
    SELECT run_id, sequence, kind, payload, created_at FROM run_events WHERE run_id = ${runId} ORDER BY sequence`);
}
