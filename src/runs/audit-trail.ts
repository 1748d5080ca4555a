import { sql, type CommonQueryMethods, type FragmentSqlToken, type IdentifierSqlToken } from 'slonik';
import { z } from 'zod';
import { rowShape, type ShapedRow } from '../db/row-shape.js';
import { onRollback } from '../db/transaction.js';
import type { KeelLogger } from '../log/logger.js';
import type { PrivacyLevel } from '../privacy/privacy-level.js';
import { redactValue } from '../privacy/redact.js';
import { summarizeValue } from '../privacy/summarize.js';

// The audit trail of a run (run_events), kept at the run's audit level:
//   full      meta + content as it was
//   redacted  meta + content with secrets and emails masked
//   metadata  meta + a content-free summary (kinds, counts, lengths, names)
//   none      nothing at all
// `meta` never carries content: only names, counts, classes, durations and ids.

export type AuditEvent = { kind: string; meta?: Record<string, unknown>; content?: unknown };

export function auditPayload(level: PrivacyLevel, event: AuditEvent): Record<string, unknown> | null {
  if (level === 'none') return null;
  const meta = event.meta ?? {};
  if (event.content === undefined) return meta;
  switch (level) {
    case 'full':
      return withContent(meta, event.content);
    case 'redacted':
      return withContent(meta, redactValue(event.content));
    case 'metadata':
      return withContent(meta, summarizeValue(event.content));
  }
}

/**
 * `{ ...meta, content }` built so that every payload of one kind shares a hidden class: a literal
 * that starts with a spread gets one of its own on Node 20, and so does an object grown from `{}`
 * once the empty object's transitions are full (docs/decisions/0050-no-leading-spread-on-the-hot-path.md).
 * The payload is stored as jsonb, so where `content` sits among the keys does not matter.
 */
function withContent(meta: Record<string, unknown>, content: unknown): Record<string, unknown> {
  const payload: Record<string, unknown> = { content: undefined, ...meta };
  payload.content = content;
  return payload;
}

export type SerializedRow = [sequence: number, kind: string, payload: string, at: number];

const serializedRow = (event: { sequence: number; kind: string; payload: Record<string, unknown>; at: number }): SerializedRow => [
  event.sequence,
  event.kind,
  JSON.stringify(event.payload),
  event.at,
];

const PRINTABLE_ASCII = /^[\x20-\x7e]*$/;
const REFUSED_ESCAPE = /\\u(0000|d[89a-f])/i;

/** Whether Postgres cannot refuse the row's text: printable ASCII, no \u0000, no lone surrogate. */
function cannotBeRefused(row: SerializedRow): boolean {
  return PRINTABLE_ASCII.test(row[1]) && PRINTABLE_ASCII.test(row[2]) && !REFUSED_ESCAPE.test(row[2]);
}

/** An audit row of a run, as insertAuditRowsStatement writes it (row-shape.ts). */
export const AUDIT_ROW = rowShape([
  ['run_id', 'uuid'],
  ['sequence', 'int4'],
  ['kind', 'text'],
  ['payload', 'jsonb'],
  ['at', 'float8'],
]);
export type AuditRow = ShapedRow;

/** How many cells an AuditRow has. */
export const AUDIT_COLUMNS = AUDIT_ROW.width;

/** A run's serialized rows as audit rows. */
export function auditRowsOf(runId: string, rows: readonly SerializedRow[]): AuditRow[] {
  return rows.map(([sequence, kind, payload, at]) => AUDIT_ROW.row({ run_id: runId, sequence, kind, payload, at }));
}

/**
 * The INSERT of audit rows (of one run or of several, written together), for a statement of its
 * own or a CTE of a larger one. Rows stored already are skipped by their keys (a trail given back
 * after a rollback). With `onlyRunsOf`, only the rows of the runs that CTE of the same statement
 * names (`run_id`).
 */
export function insertAuditRowsStatement(rows: readonly AuditRow[], onlyRunsOf: IdentifierSqlToken | null = null): FragmentSqlToken {
  return sql.fragment`
    INSERT INTO run_events (run_id, sequence, kind, payload, created_at)
    SELECT a.run_id, a.sequence, a.kind, a.payload, to_timestamp(a.at / 1000.0)
    FROM ${AUDIT_ROW.unnest(rows, 'a')}
    ${onlyRunsOf === null ? sql.fragment`` : sql.fragment`WHERE a.run_id IN (SELECT run_id FROM ${onlyRunsOf})`}
    ON CONFLICT (run_id, sequence) DO NOTHING`;
}

/**
 * The audit rows of one run written by the worker holding it, fenced (decision 0088): inserted only
 * while the run still holds the claim `token` (any status: the worker's own end, a suspension or a
 * cancel keep it; a requeue, a dead-letter and a claim made since do not). One statement; `held`
 * says whether the fence let them in.
 */
export function insertFencedAuditRowsStatement(runId: string, token: string, rows: readonly AuditRow[]) {
  return sql.type(z.object({ held: z.boolean() }))`
    WITH fence AS (SELECT EXISTS (SELECT 1 FROM runs WHERE id = ${runId} AND claim_token = ${token}) AS held),
    inserted AS (
      INSERT INTO run_events (run_id, sequence, kind, payload, created_at)
      SELECT a.run_id, a.sequence, a.kind, a.payload, to_timestamp(a.at / 1000.0)
      FROM ${AUDIT_ROW.unnest(rows, 'a')}
      WHERE (SELECT held FROM fence)
      ON CONFLICT (run_id, sequence) DO NOTHING
      RETURNING 1)
    SELECT held FROM fence`;
}

/**
 * Buffers a run's events and writes them with one multi-row insert at each flush. Recording is
 * fail-soft (a lost audit row never fails a run), except `recordNow`, which reports whether the
 * event was stored: a write tool whose audit event cannot be stored does not run.
 *
 * Whatever a transaction takes from the buffer it gives back when it rolls back, at every level:
 * each take inside a transaction or savepoint registers its giving back with that level
 * (`onRollback`, src/db/transaction.ts), so a retried transaction, or the caller of a savepoint
 * that was undone, finds the events buffered again with their sequence numbers. Only a statement
 * committed on its own (a held completion, complete-held-runs.ts) has no level: its caller gives
 * back with `restoreTaken`.
 */
type PendingEvent = { sequence: number; kind: string; payload: Record<string, unknown>; at: number };

/** Class 22, data exception: Postgres refused a row's text (a NUL escape, an untranslatable character), and would again. */
const DATA_EXCEPTION_CLASS = '22';

export class AuditTrail {
  private readonly pending: PendingEvent[] = [];
  /** Events taken by a statement committed on its own (no transaction level to give back on): `restoreTaken` gives them back. */
  private taken: PendingEvent[] = [];
  private nextSequence: number;
  private oldestPendingAt = 0;
  /** The last flush not in a caller's transaction, while on its way: the next waits for it, so the trail is stored in order. */
  private flushing: Promise<boolean> | null = null;
  /** The claim the trail's writes carry (fenceWith), and who hears of rows the fence refused. */
  private fence: { token: string; onRefused: (rows: number) => void } | null = null;

  constructor(
    private readonly runId: string,
    private level: PrivacyLevel,
    lastSequence: number,
    private readonly logger: KeelLogger,
  ) {
    this.nextSequence = lastSequence + 1;
  }

  static async open(db: CommonQueryMethods, runId: string, level: PrivacyLevel, logger: KeelLogger): Promise<AuditTrail> {
    const last = await db.oneFirst(sql.type(z.object({ last: z.number() }))`
      SELECT coalesce(max(sequence), 0) AS last FROM run_events WHERE run_id = ${runId}`);
    return new AuditTrail(runId, level, last, logger);
  }

  /** The level events are kept at now: what a caller says of content it did not keep. */
  get currentLevel(): PrivacyLevel {
    return this.level;
  }

  /**
   * Every write of the trail from now on carries the claim `token` (decision 0088): rows written
   * after the run's claim changed (a requeue, a dead-letter, another claim) are refused, dropped
   * (never given back: they are a late worker's) and counted to `onRefused`.
   */
  fenceWith(token: string, onRefused: (rows: number) => void): void {
    this.fence = { token, onRefused };
  }

  /** The run's audit ceiling may tighten mid-run (a fallback provider); later events follow it. */
  setLevel(level: PrivacyLevel): void {
    this.level = level;
  }

  record(event: AuditEvent): void {
    this.buffer(event);
  }

  /**
   * Records an event that belongs to what `transaction` writes (a suspension): if that level is
   * undone, the event is forgotten, so a retry that records it again stores it once.
   */
  recordWithin(transaction: CommonQueryMethods, event: AuditEvent): void {
    const recorded = this.buffer(event);
    if (recorded !== null) onRollback(transaction, () => this.forget(recorded));
  }

  private buffer(event: AuditEvent): PendingEvent | null {
    const payload = auditPayload(this.level, event);
    if (payload === null) return null;
    if (this.pending.length === 0) this.oldestPendingAt = Date.now();
    const pending = { sequence: this.nextSequence, kind: event.kind, payload, at: Date.now() };
    this.pending.push(pending);
    this.nextSequence += 1;
    return pending;
  }

  /** Flushes at a step boundary only when enough is buffered or it has waited long enough: a fast run writes its trail once, with its settle. */
  async flushIfDue(db: CommonQueryMethods, maxAgeMs = 1000, maxEvents = 50): Promise<boolean> {
    if (this.pending.length === 0) return true;
    if (this.pending.length < maxEvents && Date.now() - this.oldestPendingAt < maxAgeMs) return true;
    return this.flush(db);
  }

  /**
   * Writes what is buffered; never throws. A flush still on its way (a heartbeat's, on another
   * pool connection) is waited for first, so the trail is written in the order it was recorded:
   * when recordNow returns true, the events before its own are no longer on their way (stored,
   * or logged as lost), and a step that runs next cannot be ahead of them. Without the wait, a
   * worker killed once the step began could leave the heartbeat's insert unsent: the trail before
   * the step gone, the step's own event stored (issue 39, the worker-kill test's missing `claimed`).
   */
  flush(db: CommonQueryMethods): Promise<boolean> {
    const before = this.flushing;
    const flushing = before === null ? this.flushNow(db) : before.then(() => this.flushNow(db));
    this.flushing = flushing;
    return flushing.finally(() => {
      if (this.flushing === flushing) this.flushing = null;
    });
  }

  private async flushNow(db: CommonQueryMethods): Promise<boolean> {
    try {
      return await this.flushStrict(db);
    } catch (error) {
      this.logger.warn({ err: error, runId: this.runId }, 'audit events could not be stored');
      return false;
    }
  }

  /**
   * Writes what is buffered inside a caller's transaction, in a savepoint of its own, so a failed
   * audit insert never aborts the transaction it rides in (recording stays fail-soft).
   */
  async flushWithin(transaction: CommonQueryMethods): Promise<boolean> {
    if (this.pending.length === 0) return true;
    const rows = this.pending.map(serializedRow);
    if (rows.every(cannotBeRefused)) {
      // Printable ASCII with no NUL or lone-surrogate escape: valid jsonb in every server encoding,
      // for a row whose run is locked by the caller and whose key conflicts are ignored. No data
      // error can refuse it, so the savepoint (one round trip and a subtransaction) is skipped.
      this.take(transaction);
      return this.insertRows(transaction, rows);
    }
    let batch: PendingEvent[] = [];
    return transaction
      .transaction(async (nested) => {
        batch = this.take(nested);
        return this.insertRows(nested, batch.map(serializedRow));
      })
      .then(
        (stored) => stored,
        (error: unknown) => {
          // The savepoint gave the events back. Rows Postgres refused would be refused again: they
          // are dropped (logged). Any other failure leaves them buffered for a later write.
          const code = (error as { code?: unknown } | null)?.code;
          if (typeof code === 'string' && code.startsWith(DATA_EXCEPTION_CLASS)) for (const event of batch) this.forget(event);
          this.logger.warn({ err: error, runId: this.runId }, 'audit events could not be stored');
          return false;
        },
      );
  }

  private async flushStrict(db: CommonQueryMethods): Promise<boolean> {
    if (this.pending.length === 0) return true;
    const batch = this.take(db);
    return this.insertRows(db, batch.map(serializedRow));
  }

  /**
   * Takes what is buffered for a write on `db`. A transaction or savepoint gives it back if it is
   * undone; a statement on the pool commits or fails alone, and a failed flush loses its rows
   * (logged: recording is fail-soft).
   */
  private take(db: CommonQueryMethods): PendingEvent[] {
    const batch = this.pending.splice(0, this.pending.length);
    onRollback(db, () => this.giveBack(batch));
    return batch;
  }

  /** Buffers events again ahead of anything recorded since, with their sequence numbers. */
  private giveBack(events: readonly PendingEvent[]): void {
    if (events.length === 0) return;
    if (this.pending.length === 0) this.oldestPendingAt = Date.now();
    this.pending.unshift(...events);
  }

  /**
   * Drops a buffered event. Its sequence number is not reused: a COMMIT whose answer was lost may
   * have stored it, and a later event under its number would be skipped as already stored.
   */
  private forget(event: PendingEvent): void {
    const index = this.pending.indexOf(event);
    if (index >= 0) this.pending.splice(index, 1);
  }

  /** Inserts rows taken from the buffer; false when the fence refused them (they are dropped, and counted to it). */
  private async insertRows(db: CommonQueryMethods, rows: SerializedRow[]): Promise<boolean> {
    const fence = this.fence;
    if (fence === null) {
      await db.query(sql.unsafe`${this.insertFragment(rows)}`);
      return true;
    }
    const held = await db.oneFirst(insertFencedAuditRowsStatement(this.runId, fence.token, auditRowsOf(this.runId, rows)));
    if (!held) fence.onRefused(rows.length);
    return held;
  }

  private insertFragment(rows: SerializedRow[]): FragmentSqlToken {
    return insertAuditRowsStatement(auditRowsOf(this.runId, rows));
  }

  /**
   * The buffered events as rows for an insert the caller writes itself (a statement covering the
   * trails of several runs), taken out of the buffer: empty when nothing is buffered, null when a
   * row could be refused (nothing is taken; flushWithin writes them in a savepoint). `transaction`:
   * the transaction or savepoint the insert rides in, which gives them back if it is undone;
   * without one (a statement committed on its own), the caller gives them back with restoreTaken.
   */
  takeUnrefusableRows(transaction?: CommonQueryMethods): SerializedRow[] | null {
    if (this.pending.length === 0) return [];
    const rows = this.pending.map(serializedRow);
    if (!rows.every(cannotBeRefused)) return null;
    const batch = this.pending.splice(0, this.pending.length);
    if (transaction === undefined || !onRollback(transaction, () => this.giveBack(batch))) this.taken.push(...batch);
    return rows;
  }

  /**
   * A write the trail rode in was not kept. What statements committed on their own took is buffered
   * again (a transaction's level gave back its own already), ahead of anything recorded since, with
   * the sequence numbers; then only the buffered events `keep` accepts stay (a run's end that was
   * not stored). Events a statement did commit are skipped on insert by their keys, so giving them
   * back stores nothing twice.
   */
  restoreTaken(keep?: (event: { kind: string }) => boolean): void {
    const restored = this.taken;
    this.taken = [];
    this.giveBack(restored);
    if (keep === undefined) return;
    for (let index = this.pending.length - 1; index >= 0; index -= 1) if (!keep(this.pending[index]!)) this.pending.splice(index, 1);
  }

  /** Records and stores at once; false means the event is not in the trail. */
  async recordNow(db: CommonQueryMethods, event: AuditEvent): Promise<boolean> {
    if (this.level === 'none') return true;
    this.record(event);
    return this.flush(db);
  }
}
