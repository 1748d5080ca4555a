import { sql, type CommonQueryMethods } from 'slonik';
import { z } from 'zod';
import type { PrivacyLevel } from '../privacy/privacy-level.js';
import { redactValue } from '../privacy/redact.js';
import type { Sealer } from '../sealing/sealer.js';
import type { StreamResponse } from '../a2a/wire.js';

// a2a_events: the journal streams, blocking calls and push deliveries read. Payloads are sealed
// StreamResponses bound to (task, sequence).

export const JOURNAL_CHANNEL = 'keel_journal';

/** The NOTIFY payload: the task, its newest sequence, and whether that batch ended a wait. */
export function journalNotice(taskId: string, lastSequence: number, ends: boolean): string {
  return `${taskId} ${lastSequence} ${ends ? 1 : 0}`;
}

export type JournalNotice = { taskId: string; lastSequence: number; ends: boolean };

export function parseJournalNotice(payload: string): JournalNotice | null {
  const [taskId, sequence, ends] = payload.split(' ');
  if (!taskId || sequence === undefined || !/^\d+$/.test(sequence)) return null;
  return { taskId, lastSequence: Number(sequence), ends: ends === '1' };
}
export const eventContext = (taskId: string, sequence: number) => ({ table: 'a2a_events', column: 'payload', rowId: `${taskId}/${sequence}` });

const eventRow = z.object({ sequence: z.number(), kind: z.string(), state: z.string().nullable(), payload: z.instanceof(Buffer) });

export type JournalEvent = { sequence: number; kind: string; state: string | null; response: StreamResponse };

export async function readJournal(db: CommonQueryMethods, sealer: Sealer, taskId: string, afterSequence: number, limit = 500): Promise<JournalEvent[]> {
  const rows = await db.any(sql.type(eventRow)`
    SELECT sequence, kind, state, payload FROM a2a_events
    WHERE task_id = ${taskId} AND sequence > ${afterSequence} ORDER BY sequence LIMIT ${limit}`);
  return rows.map((row) => {
    const opened = sealer.openJson<StreamResponse>(eventContext(taskId, row.sequence), row.payload);
    if (!opened.ok) throw new Error(`journal event ${taskId}/${row.sequence} cannot be opened (${opened.reason})`);
    return { sequence: row.sequence, kind: row.kind, state: row.state, response: opened.value };
  });
}

/** Whether the journal announced, after `afterSequence`, a state that ends a blocking wait or a stream. */
export async function journalEndedAfter(db: CommonQueryMethods, taskId: string, afterSequence: number): Promise<boolean> {
  return db.oneFirst(sql.type(z.object({ ended: z.boolean() }))`
    SELECT EXISTS (
      SELECT 1 FROM a2a_events WHERE task_id = ${taskId} AND sequence > ${afterSequence} AND (kind = 'message' OR state IN (
        'TASK_STATE_COMPLETED', 'TASK_STATE_FAILED', 'TASK_STATE_CANCELED', 'TASK_STATE_REJECTED',
        'TASK_STATE_INPUT_REQUIRED', 'TASK_STATE_AUTH_REQUIRED'))
    ) AS ended`);
}

/**
 * A tightened answer ceiling reaches the journal too: artifact events already written are
 * rewritten at the new level, or removed when no content may be kept at all. (Deliveries already
 * made cannot be recalled; rows can.)
 */
export async function scrubTaskJournal(db: CommonQueryMethods, sealer: Sealer, taskId: string, level: PrivacyLevel): Promise<number> {
  if (level === 'full') return 0;
  if (level === 'none' || level === 'metadata') {
    return db.oneFirst(sql.type(z.object({ n: z.number() }))`
      WITH gone AS (DELETE FROM a2a_events WHERE task_id = ${taskId} AND kind IN ('artifact', 'message') RETURNING 1)
      SELECT count(*)::int AS n FROM gone`);
  }
  const rows = await db.any(sql.type(eventRow)`
    SELECT sequence, kind, state, payload FROM a2a_events WHERE task_id = ${taskId} AND kind IN ('artifact', 'message') FOR UPDATE`);
  for (const row of rows) {
    const opened = sealer.openJson<StreamResponse>(eventContext(taskId, row.sequence), row.payload);
    if (!opened.ok) continue;
    const scrubbed = redactValue(opened.value) as StreamResponse;
    await db.query(sql.unsafe`
      UPDATE a2a_events SET payload = ${sql.binary(sealer.sealJson(eventContext(taskId, row.sequence), scrubbed))}
      WHERE task_id = ${taskId} AND sequence = ${row.sequence}`);
  }
  return rows.length;
}
