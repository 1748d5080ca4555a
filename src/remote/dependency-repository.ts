import { createHash, randomBytes, timingSafeEqual } from 'node:crypto';
import { sql, type CommonQueryMethods } from 'slonik';
import { z } from 'zod';
import { allowedFrom, targetOf } from '../../machines/transitions.js';
import { dependencyMachine, type DependencyEvent } from '../../machines/dependency.machine.js';
import type { Sealer } from '../sealing/sealer.js';
import { newRowId } from '../db/row-id.js';

// dependencies, inbox_registrations, inbox_callbacks. Transitions of a dependency are guarded
// writes with allowed-from states read from machines/dependency.machine.ts.

const from = (event: DependencyEvent['type']) => sql.array(allowedFrom(dependencyMachine, event), 'text');
const to = (event: DependencyEvent['type']) => targetOf(dependencyMachine, event);

export const dependencyResultContext = (id: string) => ({ table: 'dependencies', column: 'result', rowId: id });
export const callbackBodyContext = (id: string) => ({ table: 'inbox_callbacks', column: 'body', rowId: id });

export const dependencyRow = z.object({
  id: z.string(),
  run_id: z.string(),
  tool_call_id: z.string(),
  tool_name: z.string(),
  remote_agent: z.string(),
  state: z.enum(['pending', 'waiting', 'resolved', 'failed']),
  remote_task_id: z.string().nullable(),
  remote_context_id: z.string().nullable(),
  /** The messageId of the message sent to the remote, recorded before the send (null before migration 0011). */
  message_id: z.string().nullable(),
  outcome: z.string().nullable(),
  polls: z.number(),
  next_poll_at: z.number(),
  created_at: z.number(),
  resolved_at: z.number().nullable(),
});
export type DependencyRow = z.infer<typeof dependencyRow>;

const hashCredential = (credential: string) => createHash('sha256').update(credential).digest();

export type NewDependency = { runId: string; toolCallId: string; toolName: string; remoteAgent: string; messageId: string };

/** A pending dependency (and, for a remote that takes push, its registration with a fresh callback credential). */
export async function createDependency(
  db: CommonQueryMethods,
  input: NewDependency & { remoteTaskId?: string; remoteContextId?: string; withRegistration: boolean },
): Promise<{ dependencyId: string; registration: { id: string; credential: string } | null }> {
  const dependencyId = newRowId();
  const state = input.remoteTaskId ? to('ACKNOWLEDGED') : 'pending';
  await db.query(sql.unsafe`
    INSERT INTO dependencies (id, run_id, tool_call_id, tool_name, remote_agent, state, remote_task_id, remote_context_id, message_id)
    VALUES (${dependencyId}, ${input.runId}, ${input.toolCallId}, ${input.toolName}, ${input.remoteAgent}, ${state},
      ${input.remoteTaskId ?? null}, ${input.remoteContextId ?? null}, ${input.messageId})
    ON CONFLICT (run_id, tool_call_id) DO NOTHING`);
  if (!input.withRegistration) return { dependencyId, registration: null };
  return { dependencyId, registration: await createRegistration(db, dependencyId) };
}

export async function createRegistration(db: CommonQueryMethods, dependencyId: string): Promise<{ id: string; credential: string }> {
  const id = newRowId();
  const credential = randomBytes(32).toString('base64url');
  await db.query(sql.unsafe`
    INSERT INTO inbox_registrations (id, dependency_id, credential_hash) VALUES (${id}, ${dependencyId}, ${sql.binary(hashCredential(credential))})`);
  return { id, credential };
}

/** The dependency of a run's tool call (the same call retried after a crash finds its earlier dependency). */
export async function findDependency(db: CommonQueryMethods, runId: string, toolCallId: string): Promise<DependencyRow | null> {
  return db.maybeOne(sql.type(dependencyRow)`SELECT * FROM dependencies WHERE run_id = ${runId} AND tool_call_id = ${toolCallId}`);
}

export async function getDependency(db: CommonQueryMethods, id: string): Promise<DependencyRow | null> {
  return db.maybeOne(sql.type(dependencyRow)`SELECT * FROM dependencies WHERE id = ${id}`);
}

export async function acknowledgeDependency(db: CommonQueryMethods, id: string, remoteTaskId: string, remoteContextId: string | null): Promise<boolean> {
  const row = await db.maybeOneFirst(sql.type(z.object({ id: z.string() }))`
    UPDATE dependencies SET state = ${to('ACKNOWLEDGED')}, remote_task_id = ${remoteTaskId}, remote_context_id = ${remoteContextId}, updated_at = now()
    WHERE id = ${id} AND state = ANY(${from('ACKNOWLEDGED')}) RETURNING id`);
  return row !== null;
}

export async function setRemoteConfigId(db: CommonQueryMethods, registrationId: string, remoteConfigId: string): Promise<void> {
  await db.query(sql.unsafe`UPDATE inbox_registrations SET remote_config_id = ${remoteConfigId} WHERE id = ${registrationId}`);
}

/**
 * Resolution: one guarded update (waiting → resolved or failed) with the sealed tool result.
 * Returns false when another worker, a duplicate callback or the poller resolved it first.
 */
export async function resolveDependency(db: CommonQueryMethods, sealer: Sealer, id: string, event: 'RESOLVED' | 'FAILED', outcome: string, result: string): Promise<boolean> {
  const row = await db.maybeOneFirst(sql.type(z.object({ id: z.string() }))`
    UPDATE dependencies SET state = ${to(event)}, outcome = ${outcome}, result = ${sql.binary(sealer.sealJson(dependencyResultContext(id), result))},
      resolved_at = now(), updated_at = now()
    WHERE id = ${id} AND state = ANY(${from(event)}) RETURNING id`);
  return row !== null;
}

export async function schedulePoll(db: CommonQueryMethods, id: string, delayMs: number): Promise<void> {
  await db.query(sql.unsafe`
    UPDATE dependencies SET polls = polls + 1, next_poll_at = now() + ${sql.interval({ seconds: delayMs / 1000 })}, updated_at = now()
    WHERE id = ${id} AND state IN ('pending', 'waiting')`);
}

/**
 * Marks the dependency's callbacks processed: all of them, or only those received up to `upTo` (the
 * ones a GetTask sent after that instant has answered). Returns how many stay unprocessed.
 */
export async function markCallbacksProcessed(db: CommonQueryMethods, dependencyId: string, upTo?: string): Promise<number> {
  return db.oneFirst(sql.type(z.object({ later: z.number() }))`
    WITH mine AS (
      SELECT c.id, c.received_at FROM inbox_callbacks c JOIN inbox_registrations g ON g.id = c.registration_id
      WHERE g.dependency_id = ${dependencyId} AND c.processed_at IS NULL
    ), marked AS (
      UPDATE inbox_callbacks SET processed_at = now()
      WHERE id IN (SELECT id FROM mine ${upTo === undefined ? sql.fragment`` : sql.fragment`WHERE received_at <= ${upTo}::timestamptz`}) AND processed_at IS NULL
      RETURNING id
    )
    SELECT (count(*) - (SELECT count(*) FROM marked))::int AS later FROM mine`);
}

const callbackRow = z.object({ id: z.string(), body: z.instanceof(Buffer) });

/** The dependency's unprocessed callbacks (bodies sealed), newest first; at most `limit`. */
export async function unprocessedCallbacks(db: CommonQueryMethods, dependencyId: string, limit: number): Promise<ReadonlyArray<z.infer<typeof callbackRow>>> {
  return db.any(sql.type(callbackRow)`
    SELECT c.id, c.body FROM inbox_callbacks c JOIN inbox_registrations g ON g.id = c.registration_id
    WHERE g.dependency_id = ${dependencyId} AND c.processed_at IS NULL
    ORDER BY c.received_at DESC, c.id LIMIT ${limit}`);
}

/** Marks the given callbacks processed (answered by a reconcile that acted on them or refused them). */
export async function markCallbacksProcessedById(db: CommonQueryMethods, ids: readonly string[]): Promise<void> {
  if (ids.length === 0) return;
  await db.query(sql.unsafe`UPDATE inbox_callbacks SET processed_at = now() WHERE id = ANY(${sql.array(ids, 'uuid')}) AND processed_at IS NULL`);
}

/** The database's clock now, as text that keeps its microseconds (compared with received_at). */
export async function databaseNow(db: CommonQueryMethods): Promise<string> {
  return db.oneFirst(sql.type(z.object({ at: z.string() }))`SELECT clock_timestamp()::text AS at`);
}

const registrationRow = z.object({ id: z.string(), dependency_id: z.string(), credential_hash: z.instanceof(Buffer) });

export async function getRegistration(db: CommonQueryMethods, id: string): Promise<z.infer<typeof registrationRow> | null> {
  return db.maybeOne(sql.type(registrationRow)`SELECT id, dependency_id, credential_hash FROM inbox_registrations WHERE id = ${id}`);
}

export function credentialMatches(credential: string, hash: Buffer): boolean {
  const candidate = hashCredential(credential);
  return candidate.length === hash.length && timingSafeEqual(candidate, hash);
}

export type StoreCallbackResult = { ok: true; id: string } | { ok: false; reason: 'registration_full' | 'inbox_full' };

/**
 * Stores a callback durably within the bounds: the counts and the insert are checked together
 * under one advisory lock for the whole inbox (the total spans registrations, so a lock per
 * registration would let callbacks to different registrations overrun it together).
 */
export async function storeCallback(
  db: CommonQueryMethods,
  sealer: Sealer,
  registrationId: string,
  kind: string,
  body: unknown,
  bounds: { perRegistration: number; total: number },
): Promise<StoreCallbackResult> {
  return db.transaction(async (transaction) => {
    await transaction.query(sql.unsafe`SELECT pg_advisory_xact_lock(hashtext('keel:inbox_callbacks'))`);
    const counts = await transaction.one(sql.type(z.object({ mine: z.number(), total: z.number() }))`
      SELECT count(*) FILTER (WHERE registration_id = ${registrationId})::int AS mine, count(*)::int AS total
      FROM inbox_callbacks WHERE processed_at IS NULL`);
    if (counts.mine >= bounds.perRegistration) return { ok: false as const, reason: 'registration_full' as const };
    if (counts.total >= bounds.total) return { ok: false as const, reason: 'inbox_full' as const };
    const id = newRowId();
    await transaction.query(sql.unsafe`
      INSERT INTO inbox_callbacks (id, registration_id, body, kind)
      VALUES (${id}, ${registrationId}, ${sql.binary(sealer.sealJson(callbackBodyContext(id), body))}, ${kind})`);
    return { ok: true as const, id };
  });
}

/**
 * The dependencies of a run still open (its remote tasks not ended), made due at once: a cancelled
 * run cancels each in turn, by a reconcile enqueued now or, if that wake-up is lost, by the poller.
 */
export async function dueOpenDependenciesOfRun(db: CommonQueryMethods, runId: string): Promise<readonly string[]> {
  return db.anyFirst(sql.type(z.object({ id: z.string() }))`
    UPDATE dependencies SET next_poll_at = now()
    WHERE run_id = ${runId} AND state IN ('pending', 'waiting') RETURNING id`);
}

export async function openDependencies(db: CommonQueryMethods, limit: number): Promise<readonly DependencyRow[]> {
  return db.any(sql.type(dependencyRow)`
    SELECT * FROM dependencies WHERE state IN ('pending', 'waiting') AND next_poll_at <= now() ORDER BY next_poll_at LIMIT ${limit}`);
}

/** The tool result a resolved dependency stored (sealed), or null. */
export async function dependencyResult(db: CommonQueryMethods, sealer: Sealer, id: string): Promise<string | null> {
  const sealed = await db.maybeOneFirst(sql.type(z.object({ result: z.instanceof(Buffer).nullable() }))`SELECT result FROM dependencies WHERE id = ${id}`);
  if (!sealed) return null;
  const opened = sealer.openJson<string>(dependencyResultContext(id), sealed);
  return opened.ok ? opened.value : null;
}
