import { sql, type CommonQueryMethods, type DatabasePool } from 'slonik';
import { z } from 'zod';
import type { Sealer } from '../sealing/sealer.js';
import type { Message } from '../protocol/wire.js';
import { openSealed, taskColumnContext } from './task-repository.js';

// Retention: runs older than `privacy.retention.agentRun` days are removed with everything that
// hangs off them (task row, history, journal, push configs and deliveries, audit rows, outputs),
// in batches so no statement holds locks for long. A purged task answers TaskNotFoundError.

export type PurgeReport = { runs: number; contexts: number };

export async function purgeExpiredRuns(pool: DatabasePool, olderThanDays: number, batchSize = 1000): Promise<PurgeReport> {
  let runs = 0;
  for (;;) {
    const deleted = await pool.oneFirst(sql.type(z.object({ n: z.number() }))`
      WITH doomed AS (
        SELECT id FROM runs
        WHERE coalesce(settled_at, updated_at) < now() - ${sql.interval({ days: olderThanDays })}
        ORDER BY coalesce(settled_at, updated_at) LIMIT ${batchSize}
        FOR UPDATE SKIP LOCKED
      ), gone AS (DELETE FROM runs WHERE id IN (SELECT id FROM doomed) RETURNING id)
      SELECT count(*)::int AS n FROM gone`);
    runs += deleted;
    if (deleted < batchSize) break;
  }
  // Contexts hold no content, but an empty one has nothing left to belong to.
  const contexts = await pool.oneFirst(sql.type(z.object({ n: z.number() }))`
    WITH gone AS (
      DELETE FROM contexts c WHERE NOT EXISTS (SELECT 1 FROM a2a_tasks t WHERE t.owner = c.owner AND t.context_id = c.id)
        AND c.updated_at < now() - ${sql.interval({ days: olderThanDays })}
      RETURNING 1)
    SELECT count(*)::int AS n FROM gone`);
  return { runs, contexts };
}

const historyRow = z.object({ id: z.string(), history: z.instanceof(Buffer).nullable(), answer_level: z.string() });

export type PruneResult = { ok: true; tasks: number; kept: number; removed: number } | { ok: false; reason: 'not_found' };

/**
 * Trims a context's history to its latest `keepLatest` messages. Only history is touched: every
 * task keeps its artifacts and final status, so a task that says COMPLETED keeps its result.
 */
export async function pruneContextHistory(pool: DatabasePool, sealer: Sealer, owner: string, contextId: string, keepLatest: number): Promise<PruneResult> {
  return pool.transaction(async (transaction: CommonQueryMethods) => {
    const exists = await transaction.exists(sql.unsafe`SELECT 1 FROM contexts WHERE owner = ${owner} AND id = ${contextId}`);
    if (!exists) return { ok: false as const, reason: 'not_found' as const };
    const rows = await transaction.any(sql.type(historyRow)`
      SELECT id, history, answer_level FROM a2a_tasks WHERE owner = ${owner} AND context_id = ${contextId}
      ORDER BY created_at, id FOR UPDATE`);
    const histories = rows.map((row) => ({ row, messages: openSealed<Message[]>(sealer, row.id, 'history', row.history, []) }));
    const total = histories.reduce((sum, entry) => sum + entry.messages.length, 0);
    let toDrop = Math.max(0, total - keepLatest);
    let removed = 0;
    for (const entry of histories) {
      if (toDrop === 0) break;
      const drop = Math.min(toDrop, entry.messages.length);
      if (drop === 0) continue;
      const kept = entry.messages.slice(drop);
      toDrop -= drop;
      removed += drop;
      await transaction.query(sql.unsafe`
        UPDATE a2a_tasks SET history = ${kept.length === 0 ? null : sql.binary(sealer.sealJson(taskColumnContext(entry.row.id, 'history'), kept))}, updated_at = now()
        WHERE id = ${entry.row.id}`);
    }
    return { ok: true as const, tasks: rows.length, kept: total - removed, removed };
  });
}
