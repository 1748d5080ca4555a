import { sql, type CommonQueryMethods } from 'slonik';
import { z } from 'zod';
import type { PrivacyLevel } from '../privacy/privacy-level.js';
import { redactValue } from '../privacy/redact.js';
import type { Sealer } from '../sealing/sealer.js';
import type { Artifact, Message, StreamResponse } from '../protocol/wire.js';

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

/**
 * The event a push delivery is about to send, with its row locked (FOR SHARE) until the caller's
 * transaction ends: a tightening scrub takes the row FOR UPDATE, so it waits for an attempt that
 * is beginning, and an attempt that begins after it reads the scrubbed row.
 */
export async function readJournalEventToSend(db: CommonQueryMethods, sealer: Sealer, taskId: string, sequence: number): Promise<JournalEvent | null> {
  const row = await db.maybeOne(sql.type(eventRow)`
    SELECT sequence, kind, state, payload FROM a2a_events WHERE task_id = ${taskId} AND sequence = ${sequence} FOR SHARE`);
  if (!row) return null;
  const opened = sealer.openJson<StreamResponse>(eventContext(taskId, row.sequence), row.payload);
  if (!opened.ok) throw new Error(`journal event ${taskId}/${row.sequence} cannot be opened (${opened.reason})`);
  return { sequence: row.sequence, kind: row.kind, state: row.state, response: opened.value };
}

/**
 * The highest sequence after `afterSequence`, up to `lastSequence`, that is not in the journal
 * (a tightened ceiling removed its event; decision 0014), or null when none is missing. Sequences
 * are written without gaps, so a count settles the common case in one index range.
 */
export async function lastMissingSequence(db: CommonQueryMethods, taskId: string, afterSequence: number, lastSequence: number): Promise<number | null> {
  if (lastSequence <= afterSequence) return null;
  const present = await db.oneFirst(sql.type(z.object({ n: z.number() }))`
    SELECT count(*)::int AS n FROM a2a_events WHERE task_id = ${taskId} AND sequence > ${afterSequence} AND sequence <= ${lastSequence}`);
  if (present === lastSequence - afterSequence) return null;
  return db.oneFirst(sql.type(z.object({ missing: z.number() }))`
    SELECT max(s)::int AS missing FROM generate_series(${afterSequence + 1}::int, ${lastSequence}::int) AS s
    WHERE NOT EXISTS (SELECT 1 FROM a2a_events WHERE task_id = ${taskId} AND sequence = s)`);
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
 * A tightened answer ceiling reaches the journal too, in the transaction that tightens it (see
 * docs/decisions/0014-a-tightened-ceiling-rewrites-the-journal.md). At `redacted` the content of every
 * event is rewritten redacted: the status message (an INPUT_REQUIRED prompt, a final status message),
 * the artifact, the direct message. At `metadata` or `none` no content may stay: artifact and message
 * events are removed and status events keep their state without their message. A push delivery
 * sends its journal row as the row is when its attempt begins, so a pending delivery follows the
 * row (and goes with a removed one); deliveries already made cannot be recalled. Returns the number
 * of rows rewritten or removed.
 */
export async function scrubTaskJournal(db: CommonQueryMethods, sealer: Sealer, taskId: string, level: PrivacyLevel): Promise<number> {
  if (level === 'full') return 0;
  let changed = 0;
  if (level === 'none' || level === 'metadata') {
    changed += await db.oneFirst(sql.type(z.object({ n: z.number() }))`
      WITH gone AS (DELETE FROM a2a_events WHERE task_id = ${taskId} AND kind IN ('artifact', 'message') RETURNING 1)
      SELECT count(*)::int AS n FROM gone`);
  }
  const rows = await db.any(sql.type(eventRow)`
    SELECT sequence, kind, state, payload FROM a2a_events WHERE task_id = ${taskId} ORDER BY sequence FOR UPDATE`);
  for (const row of rows) {
    const opened = sealer.openJson<StreamResponse>(eventContext(taskId, row.sequence), row.payload);
    // A row no key of the ring opens shows nothing to anyone: there is nothing left to scrub in it.
    if (!opened.ok) continue;
    const scrubbed = scrubEventContent(opened.value, level);
    if (scrubbed.kind === 'unchanged') continue;
    await db.query(
      scrubbed.kind === 'removed'
        ? sql.unsafe`DELETE FROM a2a_events WHERE task_id = ${taskId} AND sequence = ${row.sequence}`
        : sql.unsafe`
          UPDATE a2a_events SET payload = ${sql.binary(sealer.sealJson(eventContext(taskId, row.sequence), scrubbed.response))}
          WHERE task_id = ${taskId} AND sequence = ${row.sequence}`,
    );
    changed += 1;
  }
  return changed;
}

/** What a tightened ceiling does to one journal event. */
export type ScrubbedEvent = { kind: 'unchanged' } | { kind: 'rewritten'; response: StreamResponse } | { kind: 'removed' };

/**
 * The event with its content brought down to `level`. Only the content is touched (the ids, state,
 * timestamp and flags of an event are not answers), leveled as the task row levels it, so a scrubbed
 * journal reads as if the run had been at `level` from the start; an event that is nothing but
 * content (an artifact, a direct message) is removed where no content may stay.
 */
export function scrubEventContent(response: StreamResponse, level: Exclude<PrivacyLevel, 'full'>): ScrubbedEvent {
  const keepsContent = level === 'redacted';
  let scrubbed: StreamResponse;
  if ('statusUpdate' in response) {
    const { message, ...status } = response.statusUpdate.status;
    if (message === undefined) return { kind: 'unchanged' };
    scrubbed = { statusUpdate: { ...response.statusUpdate, status: keepsContent ? { ...status, message: redactValue(message) as Message } : status } };
  } else if ('artifactUpdate' in response) {
    if (!keepsContent) return { kind: 'removed' };
    scrubbed = { artifactUpdate: { ...response.artifactUpdate, artifact: redactValue(response.artifactUpdate.artifact) as Artifact } };
  } else if ('message' in response) {
    if (!keepsContent) return { kind: 'removed' };
    scrubbed = { message: redactValue(response.message) as Message };
  } else {
    // The journal stores no task snapshots today; one would keep its ids and state only.
    const { artifacts, history, status: { message, ...status }, ...task } = response.task;
    scrubbed = {
      task: keepsContent
        ? {
            ...task,
            status: message === undefined ? status : { ...status, message: redactValue(message) as Message },
            ...(artifacts === undefined ? {} : { artifacts: redactValue(artifacts) as Artifact[] }),
            ...(history === undefined ? {} : { history: redactValue(history) as Message[] }),
          }
        : { ...task, status },
    };
  }
  return JSON.stringify(scrubbed) === JSON.stringify(response) ? { kind: 'unchanged' } : { kind: 'rewritten', response: scrubbed };
}
