import { sql, type CommonQueryMethods } from 'slonik';
import { z } from 'zod';
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
      return { ...meta, content: event.content };
    case 'redacted':
      return { ...meta, content: redactValue(event.content) };
    case 'metadata':
      return { ...meta, content: summarizeValue(event.content) };
  }
}

/**
 * Buffers a run's events and writes them with one multi-row insert at each flush. Recording is
 * fail-soft (a lost audit row never fails a run), except `recordNow`, which reports whether the
 * event was stored: a write tool whose audit event cannot be stored does not run.
 */
export class AuditTrail {
  private readonly pending: Array<{ sequence: number; kind: string; payload: Record<string, unknown>; at: number }> = [];
  private nextSequence: number;
  private oldestPendingAt = 0;

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

  /** The run's audit ceiling may tighten mid-run (a fallback provider); later events follow it. */
  setLevel(level: PrivacyLevel): void {
    this.level = level;
  }

  record(event: AuditEvent): void {
    const payload = auditPayload(this.level, event);
    if (payload === null) return;
    if (this.pending.length === 0) this.oldestPendingAt = Date.now();
    this.pending.push({ sequence: this.nextSequence, kind: event.kind, payload, at: Date.now() });
    this.nextSequence += 1;
  }

  /** Flushes at a step boundary only when enough is buffered or it has waited long enough: a fast run writes its trail once, with its settle. */
  async flushIfDue(db: CommonQueryMethods, maxAgeMs = 1000, maxEvents = 50): Promise<boolean> {
    if (this.pending.length === 0) return true;
    if (this.pending.length < maxEvents && Date.now() - this.oldestPendingAt < maxAgeMs) return true;
    return this.flush(db);
  }

  /** Writes what is buffered; never throws. */
  async flush(db: CommonQueryMethods): Promise<boolean> {
    try {
      await this.flushStrict(db);
      return true;
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
    return transaction.transaction((nested) => this.flushStrict(nested)).then(
      () => true,
      (error: unknown) => {
        this.logger.warn({ err: error, runId: this.runId }, 'audit events could not be stored');
        return false;
      },
    );
  }

  private async flushStrict(db: CommonQueryMethods): Promise<void> {
    if (this.pending.length === 0) return;
    const batch = this.pending.splice(0, this.pending.length);
    await db.query(sql.unsafe`
      INSERT INTO run_events (run_id, sequence, kind, payload, created_at)
      SELECT ${this.runId}::uuid, sequence, kind, payload, to_timestamp(at / 1000.0)
      FROM ${sql.unnest(
        batch.map((event) => [event.sequence, event.kind, JSON.stringify(event.payload), event.at]),
        ['int4', 'text', 'jsonb', 'float8'],
      )} AS t(sequence, kind, payload, at)
      ON CONFLICT (run_id, sequence) DO NOTHING`);
  }

  /** Records and stores at once; false means the event is not in the trail. */
  async recordNow(db: CommonQueryMethods, event: AuditEvent): Promise<boolean> {
    if (this.level === 'none') return true;
    this.record(event);
    return this.flush(db);
  }
}
